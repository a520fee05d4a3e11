// vpdpbusd, the x86 byte product: acc (int32 lanes) += the sum of each lane's 4 products of an
// unsigned byte of u and a signed byte of s. Written out once here for every caller (the int8
// weight products, decoding's integer scores): Highway 1.0.3 names neither AVX512-VNNI nor a
// target with AVX-VNNI, and Zen 4 has the 512-bit form without the VEX one. The caller checks
// the CPU has the form it calls (simd/cpu.h). Per Highway target, like simd-inl.h.
#if defined(QKV_SIMD_DPBUSD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_SIMD_DPBUSD_INL_H_
#undef QKV_SIMD_DPBUSD_INL_H_
#else
#define QKV_SIMD_DPBUSD_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace qkv::simd {
namespace HWY_NAMESPACE {

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// 256 bits: AVX-VNNI's VEX encoding (the {vex} prefix: without it, an assembler given AVX-512
// registers may pick the EVEX form, which needs AVX512-VNNI with AVX512VL).
HWY_INLINE __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
  asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
  return acc;
}
#endif

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// 512 bits: AVX512-VNNI.
HWY_INLINE __m512i dpbusd(__m512i acc, __m512i u, __m512i s) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  return acc;
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace qkv::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
