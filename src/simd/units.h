// The CPUs' bf16 units: qkv's own SIMD targets avx512_bf16 (x86-64) and neon_bf16 (AArch64)
// (src/simd/targets.cpp), above Highway's. Kernel files with a version for the units are
// compiled a second time by a translation unit of their own (src/attention/*_bf16.cpp) that
// includes them with QKV_BF16_UNITS defined (src/simd/units_pass.h); src/simd/units-inl.h sets
// up that pass.
#pragma once

#include "simd/dispatch.h"

namespace qkv::simd {

// Whether the kernels' bf16-unit versions run now: the CPU has AVX512-BF16 (beside AVX-512) or
// Arm's BF16, the build has the kernels, and set_target / QKV_TARGET forced avx512_bf16 or
// neon_bf16, or forced nothing while the CPU-feature registry gives bf16 to the bf16 dot unit
// (src/simd/cpu.h: QKV_UNITS=bf16=… forces that).
bool bf16_units();

}  // namespace qkv::simd

// The entry point of a kernel file that has a bf16-unit version, written once (after the
// file's per-target code, in its HWY_ONCE part):
//   QKV_ENTRY_WITH_BF16_UNITS(decode_forward, (const AttentionArgs& a, const Plan& plan),
//                             (a, plan), plan.bf16_units)
// defines `void decode_forward(const AttentionArgs& a, const Plan& plan)`: the units' version
// where `on_units` (the call's plan, src/attention/plan.h, chose the pass), else Highway's
// dispatch. In the units' translation unit it defines the units' version's entry,
// name_on_bf16_units, instead.
#if defined(QKV_BF16_UNITS)
#define QKV_ENTRY_WITH_BF16_UNITS(name, params, args, on_units) \
  void name##_on_bf16_units params { QKV_UNITS_NAMESPACE::name args; }
#else
namespace qkv::simd {
#if defined(QKV_HAVE_BF16_UNITS)
inline constexpr bool kBf16UnitKernels = true;
#else
inline constexpr bool kBf16UnitKernels = false;
#endif
}  // namespace qkv::simd
#define QKV_ENTRY_WITH_BF16_UNITS(name, params, args, on_units)              \
  void name##_on_bf16_units params; /* the units' translation unit */       \
  HWY_EXPORT(name);                                                          \
  void name params {                                                         \
    if constexpr (::qkv::simd::kBf16UnitKernels)                             \
      if (on_units) return name##_on_bf16_units args;                       \
    QKV_DISPATCH(name) args;                                                 \
  }
#endif
