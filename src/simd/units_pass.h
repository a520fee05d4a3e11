// Included first by each bf16-unit translation unit (src/attention/*_bf16.cpp), before the
// kernel file it compiles once more: marks the pass (src/simd/units-inl.h) and leaves Highway
// only the target the units build on — AVX3 on x86-64, NEON on AArch64 — beside the baseline
// ones, which compile nothing there.
#pragma once

#define QKV_BF16_UNITS 1
#undef HWY_DISABLED_TARGETS
#if defined(__aarch64__)
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#else
#define HWY_DISABLED_TARGETS (HWY_AVX3_DL | HWY_AVX2 | HWY_SSSE3)
#endif

// The namespace of the units' pass (src/simd/units-inl.h), for the entry points.
#if defined(__aarch64__)
#define QKV_UNITS_NAMESPACE N_NEON_BF16
#else
#define QKV_UNITS_NAMESPACE N_AVX3_BF16
#endif
