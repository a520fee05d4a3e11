// The tiles' per-target helpers for the bf16-unit kernels (src/simd/units-inl.h).
#define QKV_BF16_UNITS 1
#define HWY_DISABLED_TARGETS (HWY_AVX3_DL | HWY_AVX2 | HWY_SSSE3)
#include "attention/tiles.cpp"
