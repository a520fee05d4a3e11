// The tiled backward on the AVX512-BF16 units: flash_backward.cpp compiled once more, for
// Highway's AVX3 target with AVX512-BF16 (src/simd/units-inl.h); its entry point runs this
// version for bf16 keys and values while the avx512_bf16 target is in force.
#define QKV_BF16_UNITS 1
#define HWY_DISABLED_TARGETS (HWY_AVX3_DL | HWY_AVX2 | HWY_SSSE3)
#include "attention/flash_backward.cpp"
