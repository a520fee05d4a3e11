// The CPUs' bf16 units: qkv's own SIMD targets avx512_bf16 (x86-64) and neon_bf16 (AArch64)
// (src/simd/targets.cpp), above Highway's. Kernel files with a version for the units are
// compiled a second time by a translation unit of their own (src/attention/*_bf16.cpp) that
// includes them with QKV_BF16_UNITS defined (src/simd/units_pass.h); src/simd/units-inl.h sets
// up that pass.
#pragma once

namespace qkv::simd {

// Whether the kernels' bf16-unit versions run now: the CPU has AVX512-BF16 (beside AVX-512) or
// Arm's BF16, the build has the kernels, and set_target / QKV_TARGET forced avx512_bf16 or
// neon_bf16, or forced nothing while the CPU-feature registry gives bf16 to the bf16 dot unit
// (src/simd/cpu.h: QKV_UNITS=bf16=… forces that).
bool bf16_units();

}  // namespace qkv::simd
