// The namespace a kernel file's per-target code lives in: foreach_target.h compiles the file
// once per SIMD target, each time into `outer::HWY_NAMESPACE` (N_AVX2, N_AVX3, …). Opened with
// the names every kernel uses: simd (this target's src/simd/simd-inl.h), hn (Highway's ops),
// df and Vf (the fp32 tag and vector); closed by QKV_KERNEL_END().
#ifndef QKV_SIMD_KERNEL_NAMESPACE_H_
#define QKV_SIMD_KERNEL_NAMESPACE_H_

#include <hwy/highway.h>

#define QKV_KERNEL_BEGIN(outer)                \
  HWY_BEFORE_NAMESPACE();                      \
  namespace outer {                            \
  namespace HWY_NAMESPACE {                    \
  namespace simd = ::qkv::simd::HWY_NAMESPACE; \
  namespace hn = simd::hn;                     \
  using simd::df;                              \
  using simd::Vf;

#define QKV_KERNEL_END() \
  }                      \
  }                      \
  HWY_AFTER_NAMESPACE()

#endif  // QKV_SIMD_KERNEL_NAMESPACE_H_
