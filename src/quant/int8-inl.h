// Integer products with block-format weights (quant::Matmul::int8), as llama.cpp computes them:
// the activations of a matmul are rounded once to int8 per 32-block (Q8: d = max|x| / 127,
// q = x / d to nearest, ties to even), and each weight block's products with them are summed
// as integers, exactly; the two scales then multiply that sum in fp32:
//   Q8_0  dw · dx · Σ qw qx
//   Q4_0  dw · dx · Σ (qw − 8) qx
//   Q4_1  dw · dx · Σ qw qx  +  mw · dx · Σ qx     (dx · Σ qx is kept per block: `sums`)
// One loop does every product (quant/tile-inl.h); what differs is the unit a step runs on:
// a block at a time in an instruction set's bytes (on x86 from AVX2 one 256-bit vector of 32
// bytes, multiplied by vpmaddubsw + vpmaddwd or, where the CPU has AVX-VNNI, one vpdpbusd:
// unsigned × signed bytes, a signed weight's sign moved onto the activation, |qw| · sign(qw) qx;
// SSE4 the same in two 128-bit halves; AArch64 with the dot product extension two sdot;
// elsewhere plain loops the compiler widens to int16), or on the AVX-512 DL target two blocks
// at a time in one 512-bit vpdpbusd (PairUnit, Q4kPairUnit). The format is the block decoder's
// (decode_block): the same loop for Q8_0, Q4_0, Q4_1, Q4_K and Q6_K.
// Included by src/quant/matmul.cpp, once per target.
#if defined(QKV_QUANT_INT8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_QUANT_INT8_INL_H_
#undef QKV_QUANT_INT8_INL_H_
#else
#define QKV_QUANT_INT8_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "qkv/number_format.h"
#include "simd/dpbusd-inl.h"
#include "simd/half-inl.h"
#include "quant/int8.h"
#include "quant/k_quants.h"
#include "quant/pair_layout.h"
#include "quant/product_kernels.h"
#include "quant/tile-inl.h"

#if HWY_ARCH_ARM_A64 && !defined(QKV_QUANT_INT8_ONCE)
#define QKV_QUANT_INT8_ONCE
#include <arm_neon.h>  // (the SVE passes' Highway headers bring arm_sve.h only)
#endif

HWY_BEFORE_NAMESPACE();
namespace qkv::quant {
namespace HWY_NAMESPACE {
namespace int8 {

namespace hn = hwy::HWY_NAMESPACE;
using ::qkv::simd::HWY_NAMESPACE::half;
// Values per block of q8_0, q4_0 and q4_1 (number_format.h), and per sub-block of a K-quant.
inline constexpr int64_t kBlock = kKvBlockValues;

// One row of a matmul's activations rounded to int8 (K values, blocks of 32), and what the
// kernels read beside the values, all in one float buffer (floats_per_row of them):
//   d, sums    per block: the scale d and d · Σ q
//   q          the int8 values in order
//   The AVX-512 DL kernel's pairs of blocks (b, b + 1):
//   q4         the values as that kernel lays out a pair of Q4 blocks: b's values 0–15, b + 1's
//              0–15, b's 16–31, b + 1's 16–31 (low nibbles, then high ones)
//   scales     (d_b, 1, d_b+1, 1): times the weight blocks' (d, m) pairs
//   terms      per weight type, what multiplies the blocks' (d, m, d, m) to give the part of
//              the product the integer sums leave out: Q8_0 (−128 s, 0, −128 s', 0) (its
//              weights are offset by 128 to be unsigned), Q4_0 (−8 s, 0, −8 s', 0), Q4_1
//              (0, s, 0, s'), with s = d · Σ q of each block
struct Row {
  const float *d, *sums, *scales, *terms;
  const int8_t *q, *q4;
};
inline int64_t floats_per_row(int64_t K) { return 10 * (K / kBlock) + K / 2; }
inline Row row_at(const float* base, int64_t K) {
  const int64_t nb = K / kBlock;
  const auto* bytes = reinterpret_cast<const int8_t*>(base + 10 * nb);
  return {base, base + nb, base + 2 * nb, base + 4 * nb, bytes, bytes + K};
}
inline constexpr int kTermsQ8_0 = 0, kTermsQ4_0 = 4, kTermsQ4_1 = 8;  // offsets in a pair's 12
template <TensorType T>
inline constexpr bool kKQuant = T == TensorType::q4_k || T == TensorType::q6_k;
using ::qkv::kBlockBytes;  // a block's bytes (a K-quant's super-block's)
using ::qkv::kDataOffset;

// x (K values, whole blocks) into the row at `base`. A block with a value that is not finite
// gets d = NaN (its products are NaN, as the exact path's would be).
inline void quantize_row(const float* x, int64_t K, float* base) {
  const Row r = row_at(base, K);
  auto* d = const_cast<float*>(r.d);
  auto* sums = const_cast<float*>(r.sums);
  auto* q = const_cast<int8_t*>(r.q);
  const hn::CappedTag<float, 16> df;  // a block is whole vectors
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<int8_t, decltype(df)> d8;
  const size_t N = hn::Lanes(df);
  const auto largest = hn::Set(df, std::numeric_limits<float>::max());
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    auto amax = hn::Zero(df);
    auto bad = hn::FirstN(df, 0);  // no lane
    for (size_t j = 0; j < size_t(kBlock); j += N) {
      const auto a = hn::Abs(hn::LoadU(df, xb + j));
      bad = hn::Or(bad, hn::Not(hn::Le(a, largest)));  // inf or NaN
      amax = hn::Max(amax, a);
    }
    if (!hn::AllFalse(df, bad)) {
      std::fill(q + b * kBlock, q + (b + 1) * kBlock, int8_t{0});
      d[b] = sums[b] = NAN;
      continue;
    }
    const float scale = hn::GetLane(hn::MaxOfLanes(df, amax)) / 127;
    const auto inverse = hn::Set(df, scale != 0 ? 1 / scale : 0);
    auto sum = hn::Zero(di);
    for (size_t j = 0; j < size_t(kBlock); j += N) {
      const auto v = hn::NearestInt(hn::Mul(hn::LoadU(df, xb + j), inverse));  // |v| ≤ 127
      hn::StoreU(hn::DemoteTo(d8, v), d8, q + b * kBlock + j);
      sum = hn::Add(sum, v);
    }
    d[b] = scale;
    sums[b] = scale * static_cast<float>(hn::GetLane(hn::SumOfLanes(di, sum)));
  }
  auto* q4 = const_cast<int8_t*>(r.q4);
  auto* scales = const_cast<float*>(r.scales);
  auto* terms = const_cast<float*>(r.terms);
  for (int64_t p = 0; p < K / kBlock / 2; ++p) {
    const int64_t b = 2 * p;
    for (int j = 0; j < 16; ++j) {
      q4[64 * p + j] = q[b * kBlock + j];
      q4[64 * p + 16 + j] = q[(b + 1) * kBlock + j];
      q4[64 * p + 32 + j] = q[b * kBlock + 16 + j];
      q4[64 * p + 48 + j] = q[(b + 1) * kBlock + 16 + j];
    }
    const float s0 = sums[b], s1 = sums[b + 1];
    const float pair_scales[4] = {d[b], 1, d[b + 1], 1};
    const float pair_terms[12] = {-128 * s0, 0, -128 * s1, 0, -8 * s0, 0, -8 * s1, 0, 0, s0, 0, s1};
    std::copy(pair_scales, pair_scales + 4, scales + 4 * p);
    std::copy(pair_terms, pair_terms + 12, terms + 12 * p);
  }
}

// The kernel the products with weights of type T run on this target and CPU (tile_rows's
// choice of unit, below).
template <TensorType T>
HWY_INLINE ProductKernel int8_kernel() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
#if HWY_TARGET == HWY_AVX3_DL
  if constexpr (T != TensorType::q6_k)
    if (::qkv::quant::int8::vnni_wide()) return ProductKernel::int8_vpdpbusd;
#endif
#if HWY_TARGET == HWY_AVX2
  if (::qkv::quant::int8::avx_vnni()) return ProductKernel::int8_avx_vnni;
#endif
  return ProductKernel::int8_vpmaddubsw;
#else
#if HWY_ARCH_ARM_A64
  if (::qkv::quant::int8::dot_product_extension()) return ProductKernel::int8_sdot;
#endif
  return ProductKernel::int8_int16;
#endif
}

// ---- Instruction sets: a block's 32 values as bytes, and their products --------------------
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
      return ::qkv::simd::HWY_NAMESPACE::dpbusd(_mm256_setzero_si256(), u, s);
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
// assembled for the extension: the CPU is asked at run time (dot_product_extension()). The
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

// ---- Formats: a weight block as bytes for the integer products -----------------------------
// Block b (32 values) of a weight row in instruction set S: its values as bytes, signed for
// Q8_0 and Q6_K, unsigned for the others (Q4's nibbles as they are); the scales of its halves
// (values 0–15 and 16–31: the same but for Q6_K, whose 16-value groups have their own); and
// m, what multiplies the activations' d · Σ q (Row::sums) apart: Q4_0's −8 d, Q4_1's m, Q4_K's
// −dmin · min_j.
template <class S>
struct Decoded {
  typename S::Bytes v;
  float d0, d1, m;
};
template <TensorType T>
inline constexpr bool kSignedValues = T == TensorType::q8_0 || T == TensorType::q6_k;

// Where block b's bytes begin, about (a K-quant's block is an eighth of its super-block).
template <TensorType T>
HWY_INLINE const uint8_t* block_at(const uint8_t* row, int64_t b) {
  if constexpr (kKQuant<T>) return row + b * kBlockBytes<T> / 8;
  else return row + b * kBlockBytes<T>;
}

// A K-quant super-block's scales in fp32, unpacked once for its 8 sub-blocks: Q4_K's
// d · scale_j and −dmin · min_j; Q6_K's d · scale of its 16 groups.
struct SuperScales {
  float d[16], m[8];
};
template <class S, TensorType T>
HWY_INLINE void unpack_scales(const uint8_t* sb, SuperScales& s) {
  if constexpr (T == TensorType::q4_k) {
    const float d = S::scale_at(sb), dmin = S::scale_at(sb + 2);
    uint8_t scales[8], mins[8];
    q4_k_scales_mins(sb + kQ4kScales, scales, mins);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2  // (GCC vectorized the loop below a byte at a time)
    const auto widened = [](const uint8_t* b) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b));
      return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    };
    _mm256_storeu_ps(s.d, _mm256_mul_ps(widened(scales), _mm256_set1_ps(d)));
    _mm256_storeu_ps(s.m, _mm256_mul_ps(widened(mins), _mm256_set1_ps(-dmin)));
#else
    for (int j = 0; j < 8; ++j)
      s.d[j] = d * static_cast<float>(scales[j]), s.m[j] = -dmin * static_cast<float>(mins[j]);
#endif
  } else if constexpr (T == TensorType::q6_k) {
    const float d = S::scale_at(sb + kQ6kScale);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    for (int half = 0; half < 2; ++half) {
      const __m128i bytes =
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sb + kQ6kScales + 8 * half));
      _mm256_storeu_ps(
          s.d + 8 * half,
          _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), _mm256_set1_ps(d)));
    }
#else
    const auto* scales = reinterpret_cast<const int8_t*>(sb + kQ6kScales);
    for (int g = 0; g < 16; ++g) s.d[g] = d * static_cast<float>(scales[g]);
#endif
  }
}

// (For the K-quants, `k` holds the super-block's scales, unpack_scales's.)
template <class S, TensorType T>
HWY_INLINE Decoded<S> decode_block(const uint8_t* row, int64_t b, const SuperScales& k) {
  if constexpr (kKQuant<T>) {
    const uint8_t* sb = row + b / 8 * kBlockBytes<T>;
    const int j = static_cast<int>(b % 8);
    if constexpr (T == TensorType::q4_k) {
      return {S::bit_field(S::load(sb + kQ4kValues + 32 * (j / 2)), 4 * (j % 2), 15), k.d[j],
              k.d[j], k.m[j]};
    } else {
      const Q6kSubBlock s = q6_k_sub_block(sb, j);
      const int g = 8 * (j / 4) + 2 * (j % 4);  // its first 16-value group
      return {S::q6_values(S::bit_field(S::load(s.ql), s.nibble_shift, 15),
                           S::bit_field(S::load(s.qh), s.high_shift, 3)),
              k.d[g], k.d[g + 1], 0};
    }
  } else {
    const uint8_t* blk = row + b * kBlockBytes<T>;
    const float d = S::scale_at(blk);
    const uint8_t* values = blk + kDataOffset<T>;
    if constexpr (T == TensorType::q8_0) return {S::load(values), d, d, 0};
    if constexpr (T == TensorType::q4_0) return {S::q4_values(values), d, d, -8 * d};
    return {S::q4_values(values), d, d, S::scale_at(blk + 2)};  // (m after d)
  }
}

// ---- Units (quant/tile-inl.h) ----------------------------------------------------------------
// A block a step in any instruction set: each block's products summed in integers, scaled by
// the two blocks' d in fp32; the unsigned formats' m · d·Σq apart.
template <class S, TensorType T, int R>
struct BlockUnit {
  static constexpr int64_t kBlocks = 1;
  struct State {
    SuperScales k[R];  // (the K-quants')
  };
  struct Weights {
    Decoded<S> v[R];
  };
  struct Acc {
    typename S::Sums sums[R];
    float offsets[R];
    Acc() {
      for (int r = 0; r < R; ++r) sums[r] = S::zero(), offsets[r] = 0;
    }
  };
  static HWY_INLINE void decode(const uint8_t* w, int64_t rb, int64_t b, State& st, Weights& wv) {
    if (kKQuant<T> && b % 8 == 0)
      for (int r = 0; r < R; ++r) unpack_scales<S, T>(w + r * rb + b / 8 * kBlockBytes<T>, st.k[r]);
#pragma GCC unroll 4  // (rolled, the decoded blocks went through the stack)
    for (int r = 0; r < R; ++r) {
      hwy::Prefetch(block_at<T>(w + r * rb, b) + 2 * R * rb);  // two steps of R rows ahead
      wv.v[r] = decode_block<S, T>(w + r * rb, b, st.k[r]);
    }
  }
  static HWY_INLINE void accumulate(Acc& a, const Weights& wv, const Row& x, int64_t b) {
    const auto xv = S::load(x.q + b * kBlock);
    const float xd = x.d[b], xs = x.sums[b];
    for (int r = 0; r < R; ++r) {
      const Decoded<S>& v = wv.v[r];
      if constexpr (T == TensorType::q6_k) {
        a.sums[r] = S::add_scaled2(a.sums[r], S::dot_s8_s8(v.v, xv), v.d0 * xd, v.d1 * xd);
      } else if constexpr (kSignedValues<T>) {
        a.sums[r] = S::add_scaled(a.sums[r], S::dot_s8_s8(v.v, xv), v.d0 * xd);
      } else {
        a.sums[r] = S::add_scaled(a.sums[r], S::dot_u8_s8(v.v, xv), v.d0 * xd);
        a.offsets[r] += v.m * xs;
      }
    }
  }
  static HWY_INLINE void finish(const Acc& a, float* y) {
    for (int r = 0; r < R; ++r) y[r] = S::sum_of(a.sums[r]) + a.offsets[r];
  }
};

#if HWY_TARGET == HWY_AVX3_DL
// vpdpbusd on 512-bit vectors from zero (AVX512-VNNI, which a CPU with Highway's AVX3_DL
// features has; simd/dpbusd-inl.h).
HWY_INLINE __m512i dpbusd(__m512i u, __m512i s) {
  return ::qkv::simd::HWY_NAMESPACE::dpbusd(_mm512_setzero_si512(), u, s);
}

// 32 bytes of nibbles in both halves of a vector, its low nibbles kept in the first half and
// its high nibbles in place (16 times their value) in the second: one AND after a broadcast,
// where shifting the high ones down took three instructions. The products of the second half
// are scaled by 1/16 (kHighNibble) with their block's scale: exact, a power of two.
HWY_INLINE __m512i nibbles_in_place(__m512i both_halves) {
  return _mm512_and_si512(both_halves,
                          _mm512_inserti64x4(_mm512_set1_epi8(0x0F), _mm256_set1_epi8(-16), 1));
}
inline constexpr float kHighNibble = 1.0f / 16;

// Two blocks a step on AVX-512 DL, one 512-bit vpdpbusd: a pair of weight blocks fills the
// vector, its bytes unsigned (Q8_0's offset by 128, Q4's nibbles in place) against the row's
// values in the matching order (Row::q, Row::q4). Each weight row's pair (d, m, d', m') loads
// as one vector, converted once: its d spread to the lanes of its block (by a permute, the
// high nibbles' d by 16) scales the products with the activation row's (Row::scales); the R
// rows' (d, m, d', m') side by side in one vector (dm4) times Row::terms give what the unsigned
// sums leave out. Per row and pair: vpdpbusd, a convert, a multiply and an FMA, and the
// permute shared by a tile's activation rows.
template <TensorType T, int R>
struct PairUnit {
  static_assert(R <= 4, "the rows' (d, m) pairs share one vector");
  static constexpr int64_t kBlocks = 2;
  static constexpr int64_t kBytes = kBlockBytes<T>;  // a block's
  static constexpr int kTerms = T == TensorType::q8_0   ? kTermsQ8_0
                                : T == TensorType::q4_0 ? kTermsQ4_0
                                                        : kTermsQ4_1;  // (Q4_K's m as Q4_1's)
  // The activations' bytes in the order of the weights': Q8_0's and Q4_K's as they lie.
  static constexpr bool kBlocksInOrder = T == TensorType::q8_0 || T == TensorType::q4_k;
  // Row r's products' scales, as lanes of dm4 and, for nibbles, of dm4 / 16: Q8_0 block b in
  // lanes 0–7, b + 1 in 8–15; Q4 (b, b + 1, b, b + 1) by 4s, the second two the high nibbles;
  // Q4_K b in 0–7, b + 1 (the high nibbles) in 8–15 (lanes 16 and up of permutex2var name its
  // second vector). The activations' (d, 1, d', 1) take the same lanes of 0–3.
  static HWY_INLINE __m512i lanes(int r) {
    const __m512i first =
        T == TensorType::q8_0 ? _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0)
        : T == TensorType::q4_k
            ? _mm512_set_epi32(18, 18, 18, 18, 18, 18, 18, 18, 0, 0, 0, 0, 0, 0, 0, 0)
            : _mm512_set_epi32(18, 18, 18, 18, 16, 16, 16, 16, 2, 2, 2, 2, 0, 0, 0, 0);
    return _mm512_add_epi32(first, _mm512_set1_epi32(4 * r));
  }
  // (d, m, d', m') of the pair at b0 (m = 0 for Q8_0 and Q4_0, whose second half is data).
  static HWY_INLINE __m128 scales(const uint8_t* b0) {
    int32_t h0, h1;
    std::memcpy(&h0, b0, 4);
    std::memcpy(&h1, b0 + kBytes, 4);
    __m128i halves = _mm_insert_epi32(_mm_cvtsi32_si128(h0), h1, 1);
    if constexpr (T != TensorType::q4_1) halves = _mm_and_si128(halves, _mm_set1_epi32(0xFFFF));
    return _mm_cvtph_ps(halves);
  }
  // The pair's 64 weights as unsigned bytes.
  static HWY_INLINE __m512i weights(const uint8_t* b0) {
    if constexpr (T == TensorType::q8_0) {
      constexpr int64_t at = kDataOffset<T>;
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + at));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + kBytes + at));
      return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
                              _mm512_set1_epi8(static_cast<char>(0x80)));
    } else {
      constexpr int64_t at = kDataOffset<T>;
      const __m256i both = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + at))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + kBytes + at)), 1);
      return nibbles_in_place(_mm512_broadcast_i64x4(both));
    }
  }
  struct Weights {
    __m512i v[R];
    __m512 scale[R];  // row r's d spread to its products' lanes
    __m512 dm4;       // row r's (d, m, d', m') in lanes 4r … 4r + 3
  };
  // Weights::scale from dm4. (The high nibbles' d / 16 is exact: their products in place are
  // 16 times theirs, so a step gives the same bits as with the nibbles shifted down.)
  static HWY_INLINE void spread(Weights& wv) {
    if constexpr (T == TensorType::q8_0) {
      for (int r = 0; r < R; ++r) wv.scale[r] = _mm512_permutexvar_ps(lanes(r), wv.dm4);
    } else {
      const __m512 high = _mm512_mul_ps(wv.dm4, _mm512_set1_ps(kHighNibble));
      for (int r = 0; r < R; ++r) wv.scale[r] = _mm512_permutex2var_ps(wv.dm4, lanes(r), high);
    }
  }
  struct Acc {
    __m512 sums[R], rest;
    Acc() {
      for (int r = 0; r < R; ++r) sums[r] = _mm512_setzero_ps();
      rest = _mm512_setzero_ps();
    }
  };
  struct State {};
  static HWY_INLINE void decode(const uint8_t* w, int64_t rb, int64_t b, State&, Weights& wv) {
    wv.dm4 = _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      const uint8_t* b0 = w + r * rb + b * kBytes;
      hwy::Prefetch(b0 + 2 * R * rb);
      wv.dm4 =
          _mm512_mask_broadcast_f32x4(wv.dm4, static_cast<__mmask16>(0xF << (4 * r)), scales(b0));
      wv.v[r] = weights(b0);
    }
    spread(wv);
  }
  static HWY_INLINE void accumulate(Acc& a, const Weights& wv, const Row& x, int64_t b) {
    const int64_t p = b / 2;
    const __m512i xv = _mm512_loadu_si512(kBlocksInOrder ? x.q + 64 * p : x.q4 + 64 * p);
    const __m512 xscale =
        _mm512_permutexvar_ps(_mm512_and_si512(lanes(0), _mm512_set1_epi32(3)),
                              _mm512_castps128_ps512(_mm_loadu_ps(x.scales + 4 * p)));
    const __m512 terms = _mm512_broadcast_f32x4(_mm_loadu_ps(x.terms + 12 * p + kTerms));
    a.rest = _mm512_fmadd_ps(wv.dm4, terms, a.rest);
    for (int r = 0; r < R; ++r) {
      const __m512 products = _mm512_mul_ps(_mm512_cvtepi32_ps(dpbusd(wv.v[r], xv)), xscale);
      a.sums[r] = _mm512_fmadd_ps(products, wv.scale[r], a.sums[r]);
    }
  }
  static HWY_INLINE void finish(const Acc& a, float* y) {
    alignas(64) float part[16];
    _mm512_store_ps(part, a.rest);
    for (int r = 0; r < R; ++r)
      y[r] = _mm512_reduce_add_ps(a.sums[r]) +
             ((part[4 * r] + part[4 * r + 1]) + (part[4 * r + 2] + part[4 * r + 3]));
  }
};

// PairUnit over weights repacked for it (quant/pair_layout.h): a step's 4 rows lie together,
// their scales in one load (converted at once), Q8_0's values already unsigned, each row's Q4
// nibbles one broadcast load: the same products, fewer instructions to decode them.
template <TensorType T>
struct PackedPairUnit : PairUnit<T, pair_layout::kRows> {
  using Base = PairUnit<T, pair_layout::kRows>;
  static constexpr int64_t kStep = pair_layout::step_bytes(T);
  // Each step asks for the bytes 8 KB ahead: decoding streams the weights once, group after
  // group, and a shorter reach (4 steps, 640 bytes) left the products at 0.76 of a read loop's
  // pace from memory on Ice Lake, against 0.86 from 5 to 10 KB ahead.
  static constexpr int64_t kPrefetchSteps = pair_layout::kPrefetchBytes / kStep;
  static HWY_INLINE void decode(const uint8_t* w, int64_t, int64_t b, typename Base::State&,
                                typename Base::Weights& wv) {
    const uint8_t* s = w + b / 2 * kStep;
    hwy::Prefetch(s + kPrefetchSteps * kStep);
    if constexpr (T == TensorType::q4_1) {
      wv.dm4 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
    } else {  // (d, d') of each row into lanes 4r and 4r + 2, the m lanes zero
      const __m256 dd = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
      const __m512i to = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
      wv.dm4 = _mm512_maskz_permutexvar_ps(0x5555, to, _mm512_castps256_ps512(dd));
    }
    const uint8_t* values = s + pair_layout::scale_bytes(T);
    for (int r = 0; r < pair_layout::kRows; ++r) {
      const uint8_t* v = values + r * pair_layout::value_bytes(T);
      if constexpr (T == TensorType::q8_0) {
        wv.v[r] = _mm512_loadu_si512(v);
      } else {
        wv.v[r] = nibbles_in_place(
            _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v))));
      }
    }
    Base::spread(wv);
  }
};

// Q4_K's sub-blocks j and j + 1 share 32 bytes (low nibbles, high nibbles): both in one
// 512-bit vpdpbusd against the activations' blocks b, b + 1 as they lie (lanes 0–7 the low
// nibbles, 8–15 the high ones in place), as PairUnit multiplies them. At each super-block the
// rows' d · scale_j and −dmin · min_j are laid out as PairUnit's (d, m, d', m') of each pair of
// sub-blocks, so that a step loads them in one vector.
template <int R>
struct Q4kPairUnit : PairUnit<TensorType::q4_k, R> {
  using Base = PairUnit<TensorType::q4_k, R>;
  struct State {
    alignas(64) float dm[4][16];  // pair j / 2: row r's (d_j, m_j, d_j+1, m_j+1) in lanes 4r…
    State() { std::fill(&dm[0][0], &dm[0][0] + 4 * 16, 0.0f); }  // (lanes of rows past R)
  };
  static HWY_INLINE void decode(const uint8_t* w, int64_t rb, int64_t b, State& st,
                                typename Base::Weights& wv) {
    const int j = static_cast<int>(b % 8);  // the pair's first sub-block
    if (j == 0)
      for (int r = 0; r < R; ++r) {
        SuperScales k;
        unpack_scales<Avx2<false>, TensorType::q4_k>(w + r * rb + b / 8 * Base::kBytes, k);
        const __m256 d = _mm256_loadu_ps(k.d), m = _mm256_loadu_ps(k.m);
        const __m256 lo = _mm256_unpacklo_ps(d, m);  // (d0 m0 d1 m1 | d4 m4 d5 m5)
        const __m256 hi = _mm256_unpackhi_ps(d, m);  // (d2 m2 d3 m3 | d6 m6 d7 m7)
        _mm_store_ps(&st.dm[0][4 * r], _mm256_castps256_ps128(lo));
        _mm_store_ps(&st.dm[1][4 * r], _mm256_castps256_ps128(hi));
        _mm_store_ps(&st.dm[2][4 * r], _mm256_extractf128_ps(lo, 1));
        _mm_store_ps(&st.dm[3][4 * r], _mm256_extractf128_ps(hi, 1));
      }
    wv.dm4 = _mm512_load_ps(st.dm[j / 2]);
    for (int r = 0; r < R; ++r) {
      const uint8_t* q = w + r * rb + b / 8 * Base::kBytes + kQ4kValues + 32 * (j / 2);
      hwy::Prefetch(q + 2 * R * rb);
      wv.v[r] = nibbles_in_place(
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))));
    }
    Base::spread(wv);
  }
};
#endif

// ---- The unit of each format on this target and CPU (int8_kernel's choice) -----------------
#if HWY_TARGET == HWY_AVX3_DL
constexpr int kXRows = 3;  // activation rows a tile: × 4 weight rows, 12 zmm accumulators
#elif HWY_ARCH_X86
constexpr int kXRows = 2;  // × 4 weight rows: 8 accumulators (16 halves on SSE4)
#else
constexpr int kXRows = 1;  // (no tiles)
#endif

// y[i][0, R) = R weight rows (rb bytes apart) · activation row x[i], for i < XR, on `unit`
// (the call's plan, int8_kernel's choice); `packed`, the same 4 rows repacked for the pair
// unit (quant/pair_layout.h), or null.
template <TensorType T, int R, int XR>
HWY_INLINE void tile_rows(const uint8_t* w, int64_t rb, const uint8_t* packed, int64_t blocks,
                          ProductKernel unit, const Row* x, float* const* y) {
#if HWY_TARGET == HWY_AVX3_DL
  if (unit != ProductKernel::int8_vpdpbusd) {  // (int8=vpmaddubsw forced)
  } else if constexpr (T == TensorType::q4_k) {
    return tile<Q4kPairUnit<R>, XR>(w, rb, 0, blocks, x, y);
  } else if constexpr (!kKQuant<T>) {
    const int64_t paired = blocks / 2 * 2;
    if (R == pair_layout::kRows && packed) tile<PackedPairUnit<T>, XR>(packed, 0, 0, paired, x, y);
    else tile<PairUnit<T, R>, XR>(w, rb, 0, paired, x, y);
    if (paired == blocks) return;
    float last[XR][R], *out[XR];  // an odd last block, one at a time
    for (int i = 0; i < XR; ++i) out[i] = last[i];
    tile<BlockUnit<Avx2<false>, T, R>, XR>(w, rb, paired, blocks, x, out);
    for (int i = 0; i < XR; ++i)
      for (int r = 0; r < R; ++r) y[i][r] += last[i][r];
    return;
  }
#endif
  (void)packed;  // (read by the pair unit alone)
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#if HWY_TARGET == HWY_AVX2
  if (unit == ProductKernel::int8_avx_vnni)
    return tile<BlockUnit<Avx2<true>, T, R>, XR>(w, rb, 0, blocks, x, y);
#endif
  tile<BlockUnit<Avx2<false>, T, R>, XR>(w, rb, 0, blocks, x, y);
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
  tile<BlockUnit<Sse4, T, R>, XR>(w, rb, 0, blocks, x, y);
#else
#if HWY_ARCH_ARM_A64
  if (unit == ProductKernel::int8_sdot)
    return tile<BlockUnit<Sdot, T, R>, XR>(w, rb, 0, blocks, x, y);
#endif
  tile<BlockUnit<Widened, T, R>, XR>(w, rb, 0, blocks, x, y);
#endif
}

// The repacked group of 4 rows that begins at row r (a multiple of 4), or null.
template <TensorType T>
HWY_INLINE const uint8_t* packed_group(const uint8_t* packed, int64_t blocks, int64_t r) {
  if (!packed) return nullptr;
  return packed + r / pair_layout::kRows * pair_layout::group_bytes(T, blocks * kBlock);
}

// y[begin, end) (rows of the matrix at w, rb bytes a row; begin a multiple of 4) = its rows · x.
template <TensorType T>
HWY_NOINLINE void dot_range(const uint8_t* w, int64_t rb, const uint8_t* packed, int64_t blocks,
                            ProductKernel unit, int64_t begin, int64_t end, const Row& x,
                            float* y) {
  constexpr int kRows = 4;  // weight rows side by side
  int64_t r = begin;
  for (float* out = y + r; r + kRows <= end; r += kRows, out += kRows)
    tile_rows<T, kRows, 1>(w + r * rb, rb, packed_group<T>(packed, blocks, r), blocks, unit, &x,
                           &out);
  for (float* out = y + r; r < end; ++r, ++out)
    tile_rows<T, 1, 1>(w + r * rb, rb, nullptr, blocks, unit, &x, &out);
}

// y[i · ldy + begin, end) = rows [begin, end) of the matrix · activation row i, for the M rows
// quantized at `rows` (floats_per_row(K) floats apart). On x86, kXRows activation rows at a
// time share each decoded weight block (tile_rows).
template <TensorType T>
HWY_NOINLINE void dot_range_rows(const uint8_t* w, int64_t rb, const uint8_t* packed, int64_t K,
                                 ProductKernel unit, int64_t begin, int64_t end, const float* rows,
                                 int64_t M, float* y, int64_t ldy) {
  const int64_t blocks = K / kBlock, stride = floats_per_row(K);
  int64_t untiled = 0;  // the first activation row left to dot_range
  if constexpr (kXRows > 1) {
    // Whole tiles of kXRows activation rows × 4 weight rows; the rest (activation rows past a
    // whole kXRows, weight rows past a whole 4: a chunk's rows are 32 unless a matrix ends)
    // one row at a time.
    constexpr int kRows = 4;
    untiled = M > 1 ? M / kXRows * kXRows : 0;
    const int64_t tiled_end = begin + (end - begin) / kRows * kRows;
    for (int64_t i0 = 0; i0 < untiled; i0 += kXRows) {
      Row x[kXRows];
      for (int i = 0; i < kXRows; ++i) x[i] = row_at(rows + (i0 + i) * stride, K);
      for (int64_t r = begin; r < tiled_end; r += kRows) {
        float* out[kXRows];
        for (int i = 0; i < kXRows; ++i) out[i] = y + (i0 + i) * ldy + r;
        tile_rows<T, kRows, kXRows>(w + r * rb, rb, packed_group<T>(packed, blocks, r), blocks,
                                    unit, x, out);
      }
      if (tiled_end < end)
        for (int i = 0; i < kXRows; ++i)
          dot_range<T>(w, rb, packed, blocks, unit, tiled_end, end, x[i], y + (i0 + i) * ldy);
    }
  }
  for (int64_t i = untiled; i < M; ++i)
    dot_range<T>(w, rb, packed, blocks, unit, begin, end, row_at(rows + i * stride, K),
                 y + i * ldy);
}

}  // namespace int8
}  // namespace HWY_NAMESPACE
}  // namespace qkv::quant
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
