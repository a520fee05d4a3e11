// IEEE half precision read as float in kernels' inner loops: the scales and offsets of
// ggml's blocks (weight products in src/quant/, block caches in src/attention/), one place
// for every reader. Included once per SIMD target. (The scalar oracle is qkv::half_to_float.)
#if defined(QKV_SIMD_HALF_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_SIMD_HALF_INL_H_
#undef QKV_SIMD_HALF_INL_H_
#else
#define QKV_SIMD_HALF_INL_H_
#endif

#include <cstdint>
#include <cstring>

#include <hwy/highway.h>

#ifndef QKV_SIMD_HALF_ONCE
#define QKV_SIMD_HALF_ONCE
namespace qkv::simd::detail {

// IEEE half to float by integer arithmetic (no F16C needed, inlined into the loops): a
// normal half moves its exponent and mantissa into place and rescales by 2^−112; a
// subnormal is rebuilt as (0.5 + m · 2^−24·…) − 0.5 through a float with a fixed exponent.
inline float half(const uint8_t* p) {
  const uint32_t h = static_cast<uint32_t>(p[0] | p[1] << 8);
  const uint32_t w = h << 16, sign = w & 0x80000000u, two_w = w + w;
  auto as_float = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  auto as_bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  const float normal = as_float((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float subnormal = as_float((two_w >> 17) | (126u << 23)) - 0.5f;
  return as_float(sign | (two_w < (1u << 27) ? as_bits(subnormal) : as_bits(normal)));
}

}  // namespace qkv::simd::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace qkv::simd {
namespace HWY_NAMESPACE {

// A block's half-precision scale: one instruction where the CPU converts halves (F16C on
// AVX2 and later, AArch64's fcvt), the integer version elsewhere (SSE4).
HWY_INLINE float half(const uint8_t* p) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return _cvtsh_ss(static_cast<unsigned short>(p[0] | p[1] << 8));
#elif HWY_ARCH_ARM_A64
  __fp16 h;
  std::memcpy(&h, p, 2);
  return static_cast<float>(h);
#else
  return detail::half(p);
#endif
}

// The same for a half inside a block, with at least 6 readable bytes after it: on x86 the
// conversion reads its operand from memory, 8 bytes, one instruction instead of an insert
// and a convert.
HWY_INLINE float half_in_block(const uint8_t* p) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  return half(p);
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace qkv::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
