// A block's 32 values as bytes, and their products summed in integers, once per instruction
// set: the int8 weight products (src/quant/int8-inl.h) and decoding's integer Q·K
// (src/attention/decode_int8-inl.h) multiply bytes through these. Per Highway target, like
// simd-inl.h.
#if defined(QKV_SIMD_BYTE_PRODUCTS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_SIMD_BYTE_PRODUCTS_INL_H_
#undef QKV_SIMD_BYTE_PRODUCTS_INL_H_
#else
#define QKV_SIMD_BYTE_PRODUCTS_INL_H_
#endif

#include <cstdint>
#include <cstring>

#include <hwy/highway.h>

#include "simd/dpbusd-inl.h"
#include "simd/half-inl.h"

#if HWY_ARCH_ARM_A64 && !defined(QKV_SIMD_BYTE_PRODUCTS_ONCE)
#define QKV_SIMD_BYTE_PRODUCTS_ONCE
#include <arm_neon.h>  // (the SVE passes' Highway headers bring arm_sve.h only)
#endif

HWY_BEFORE_NAMESPACE();
namespace qkv::simd {
namespace HWY_NAMESPACE {
namespace int8 {

// Each gives Bytes (a block's values) and what makes them (load, q4_values: a Q4 block's 16
// bytes as its 32 nibbles, bit_field: (v >> shift) & mask per byte for the K-quants' fields,
// q6_values); the products of two blocks summed in integers (dot_u8_s8: unsigned weights ×
// signed activations; dot_s8_s8: both signed), as Products whose halves are the block's values
// 0–15 and 16–31; and fp32 Sums of them (zero, add_scaled: acc + float(p) · s, add_scaled2:
// the halves by s0 and s1, sum_of). scale_at reads an fp16 scale.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// x86 from AVX2: a block is one 256-bit vector, multiplied by vpmaddubsw + vpmaddwd, or with
// kVnni by AVX-VNNI's vpdpbusd (its VEX form, written out: the compiler may not pick it for
// this target, and must not pick it elsewhere — Zen 4 has AVX512-VNNI but no AVX-VNNI). Run
// with kVnni only where avx_vnni() says the CPU has it.
template <bool kVnni>
struct Avx2 {
  using Bytes = __m256i;
  using Products = __m256i;  // 8 int32 lanes: 0–3 from values 0–15
  using Sums = __m256;
  static HWY_INLINE float scale_at(const uint8_t* p) {
    return _cvtsh_ss(static_cast<unsigned short>(p[0] | p[1] << 8));
  }
  static HWY_INLINE Bytes load(const void* p) {
    return _mm256_loadu_si256(static_cast<const __m256i*>(p));
  }
  static HWY_INLINE Bytes q4_values(const uint8_t* q) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(15));
  }
  static HWY_INLINE Bytes bit_field(Bytes v, int shift, int mask) {
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)),
                            _mm256_set1_epi8(static_cast<char>(mask)));
  }
  static HWY_INLINE Bytes q6_values(Bytes low, Bytes high) {
    return _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32));
  }
  static HWY_INLINE Products dot_u8_s8(Bytes u, Bytes s) {
    if constexpr (kVnni) {
      return dpbusd(_mm256_setzero_si256(), u, s);
    } else {
      // |each pair sum| ≤ 2 · 128 · 127 < 2^15 for the values here (u ≤ 128): no saturation.
      return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
    }
  }
  // |w| · (x with w's sign), as the instructions want.
  static HWY_INLINE Products dot_s8_s8(Bytes w, Bytes x) {
    return dot_u8_s8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  }
  static HWY_INLINE Sums zero() { return _mm256_setzero_ps(); }
  static HWY_INLINE Sums add_scaled(Sums acc, Products p, float s) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s), acc);
  }
  static HWY_INLINE Sums add_scaled2(Sums acc, Products p, float s0, float s1) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0)),
                           acc);
  }
  static HWY_INLINE float sum_of(Sums v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  }
};
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
// SSE4 (SSSE3's pmaddubsw): a block as two 128-bit halves.
struct Sse4 {
  struct Bytes {
    __m128i lo, hi;
  };
  using Products = Bytes;  // int32 lanes
  struct Sums {
    __m128 lo, hi;
  };
  static HWY_INLINE float scale_at(const uint8_t* p) { return half(p); }
  static HWY_INLINE Bytes load(const void* p) {
    const auto* v = static_cast<const __m128i*>(p);
    return {_mm_loadu_si128(v), _mm_loadu_si128(v + 1)};
  }
  static HWY_INLINE Bytes q4_values(const uint8_t* q) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)), m = _mm_set1_epi8(15);
    return {_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m)};
  }
  static HWY_INLINE Bytes bit_field(Bytes v, int shift, int mask) {
    const __m128i n = _mm_cvtsi32_si128(shift), m = _mm_set1_epi8(static_cast<char>(mask));
    return {_mm_and_si128(_mm_srl_epi16(v.lo, n), m), _mm_and_si128(_mm_srl_epi16(v.hi, n), m)};
  }
  static HWY_INLINE Bytes q6_values(Bytes low, Bytes high) {
    const __m128i e = _mm_set1_epi8(32);
    return {_mm_sub_epi8(_mm_or_si128(low.lo, _mm_slli_epi16(high.lo, 4)), e),
            _mm_sub_epi8(_mm_or_si128(low.hi, _mm_slli_epi16(high.hi, 4)), e)};
  }
  static HWY_INLINE Products dot_u8_s8(Bytes u, Bytes s) {
    const __m128i one = _mm_set1_epi16(1);
    return {_mm_madd_epi16(_mm_maddubs_epi16(u.lo, s.lo), one),
            _mm_madd_epi16(_mm_maddubs_epi16(u.hi, s.hi), one)};
  }
  static HWY_INLINE Products dot_s8_s8(Bytes w, Bytes x) {
    return dot_u8_s8({_mm_sign_epi8(w.lo, w.lo), _mm_sign_epi8(w.hi, w.hi)},
                     {_mm_sign_epi8(x.lo, w.lo), _mm_sign_epi8(x.hi, w.hi)});
  }
  static HWY_INLINE Sums zero() { return {_mm_setzero_ps(), _mm_setzero_ps()}; }
  static HWY_INLINE Sums add_scaled(Sums acc, Products p, float s) {
    const __m128 v = _mm_set1_ps(s);
    return {_mm_add_ps(acc.lo, _mm_mul_ps(_mm_cvtepi32_ps(p.lo), v)),
            _mm_add_ps(acc.hi, _mm_mul_ps(_mm_cvtepi32_ps(p.hi), v))};
  }
  static HWY_INLINE Sums add_scaled2(Sums acc, Products p, float s0, float s1) {
    return {_mm_add_ps(acc.lo, _mm_mul_ps(_mm_cvtepi32_ps(p.lo), _mm_set1_ps(s0))),
            _mm_add_ps(acc.hi, _mm_mul_ps(_mm_cvtepi32_ps(p.hi), _mm_set1_ps(s1)))};
  }
  static HWY_INLINE float sum_of(Sums v) {
    const __m128 s = _mm_add_ps(v.lo, v.hi);
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  }
};
#else
#if HWY_ARCH_ARM_A64
// AArch64 with the dot product extension: sdot, four byte products into each int32 lane, a
// block two of them. The instruction is written as its encoding (.inst, the registers' numbers
// looked up from the names the compiler gives them), so that nothing else is compiled or
// assembled for the extension: the CPU is asked at run time (sdot_in_use(), simd/cpu.h). The
// unsigned values here (nibbles) are below 128: signed as well.
struct Sdot {
  struct Bytes {
    int8x16_t lo, hi;
  };
  struct Products {
    int32x4_t lo, hi;
  };
  using Sums = float32x4_t;
  static HWY_INLINE float scale_at(const uint8_t* p) { return half(p); }
  static HWY_INLINE Bytes load(const void* p) {
    const auto* b = static_cast<const int8_t*>(p);
    return {vld1q_s8(b), vld1q_s8(b + 16)};
  }
  static HWY_INLINE Bytes q4_values(const uint8_t* q) {
    const uint8x16_t v = vld1q_u8(q);
    return {vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15))),
            vreinterpretq_s8_u8(vshrq_n_u8(v, 4))};
  }
  static HWY_INLINE Bytes bit_field(Bytes v, int shift, int mask) {
    const int8x16_t right = vdupq_n_s8(static_cast<int8_t>(-shift));
    const uint8x16_t m = vdupq_n_u8(static_cast<uint8_t>(mask));
    const auto field = [&](int8x16_t b) {
      return vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vreinterpretq_u8_s8(b), right), m));
    };
    return {field(v.lo), field(v.hi)};
  }
  static HWY_INLINE Bytes q6_values(Bytes low, Bytes high) {
    const int8x16_t e = vdupq_n_s8(32);
    return {vsubq_s8(vorrq_s8(low.lo, vshlq_n_s8(high.lo, 4)), e),
            vsubq_s8(vorrq_s8(low.hi, vshlq_n_s8(high.hi, 4)), e)};
  }
  static HWY_INLINE int32x4_t sdot(int8x16_t a, int8x16_t b) {
    int32x4_t sum = vdupq_n_s32(0);  // sum += a · b, by groups of 4 bytes: SDOT (vector), 4S
    asm(".irp n,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,"
        "29,30,31\n.set .Lqkv_v\\n, \\n\n.endr\n"
        ".inst 0x4e809400 | (.Lqkv_%2 << 16) | (.Lqkv_%1 << 5) | .Lqkv_%0"
        : "+w"(sum)
        : "w"(a), "w"(b));
    return sum;
  }
  static HWY_INLINE Products dot_s8_s8(Bytes w, Bytes x) {
    return {sdot(w.lo, x.lo), sdot(w.hi, x.hi)};
  }
  static HWY_INLINE Products dot_u8_s8(Bytes u, Bytes s) { return dot_s8_s8(u, s); }
  static HWY_INLINE Sums zero() { return vdupq_n_f32(0.0f); }
  static HWY_INLINE Sums add_scaled(Sums acc, Products p, float s) {
    return vfmaq_n_f32(acc, vcvtq_f32_s32(vaddq_s32(p.lo, p.hi)), s);
  }
  static HWY_INLINE Sums add_scaled2(Sums acc, Products p, float s0, float s1) {
    return vfmaq_n_f32(vfmaq_n_f32(acc, vcvtq_f32_s32(p.lo), s0), vcvtq_f32_s32(p.hi), s1);
  }
  static HWY_INLINE float sum_of(Sums v) { return vaddvq_f32(v); }
};
#endif
// Elsewhere (a NEON CPU without the extension; other architectures): plain loops, which the
// compiler widens to int16 products and pairwise sums; a block's sum is one integer, scaled once.
struct Widened {
  struct Bytes {
    int8_t v[32];
  };
  struct Products {
    int32_t lo, hi;
  };
  using Sums = float;
  static HWY_INLINE float scale_at(const uint8_t* p) { return half(p); }
  static HWY_INLINE Bytes load(const void* p) {
    Bytes b;
    std::memcpy(b.v, p, 32);
    return b;
  }
  static HWY_INLINE Bytes q4_values(const uint8_t* q) {
    Bytes b;
    for (int j = 0; j < 16; ++j) b.v[j] = q[j] & 15, b.v[16 + j] = q[j] >> 4;
    return b;
  }
  static HWY_INLINE Bytes bit_field(Bytes v, int shift, int mask) {
    for (int8_t& x : v.v) x = static_cast<int8_t>((static_cast<uint8_t>(x) >> shift) & mask);
    return v;
  }
  static HWY_INLINE Bytes q6_values(Bytes low, Bytes high) {
    for (int j = 0; j < 32; ++j) low.v[j] = static_cast<int8_t>((low.v[j] | high.v[j] << 4) - 32);
    return low;
  }
  static HWY_INLINE Products dot_s8_s8(Bytes w, Bytes x) {
    int32_t half_sums[2] = {0, 0};
    for (int h = 0; h < 2; ++h)
      for (int j = 16 * h; j < 16 * (h + 1); ++j) half_sums[h] += w.v[j] * x.v[j];
    return {half_sums[0], half_sums[1]};
  }
  static HWY_INLINE Products dot_u8_s8(Bytes u, Bytes s) { return dot_s8_s8(u, s); }  // (u < 128)
  static HWY_INLINE Sums zero() { return 0; }
  static HWY_INLINE Sums add_scaled(Sums acc, Products p, float s) {
    return acc + static_cast<float>(p.lo + p.hi) * s;
  }
  static HWY_INLINE Sums add_scaled2(Sums acc, Products p, float s0, float s1) {
    return acc + static_cast<float>(p.lo) * s0 + static_cast<float>(p.hi) * s1;
  }
  static HWY_INLINE float sum_of(Sums v) { return v; }
};
#endif

}  // namespace int8
}  // namespace HWY_NAMESPACE
}  // namespace qkv::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
