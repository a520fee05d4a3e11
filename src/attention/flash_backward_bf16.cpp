// The tiled backward on the bf16 units: flash_backward.cpp compiled once more, for
// Highway's AVX3 target with AVX512-BF16, or its NEON target with BF16 on AArch64
// (src/simd/units-inl.h); its entry point runs this version for bf16 keys and values while the
// avx512_bf16 or neon_bf16 target is in force.
#include "simd/units_pass.h"
#include "attention/flash_backward.cpp"
