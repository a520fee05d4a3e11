// Integer products with block-format weights (quant::Matmul::int8), as llama.cpp computes them:
// the activations of a matmul are rounded once to int8 per 32-block (Q8: d = max|x| / 127,
// q = x / d to nearest, ties to even), and each weight block's products with them are summed
// as integers, exactly; the two scales then multiply that sum in fp32:
//   Q8_0  dw · dx · Σ qw qx
//   Q4_0  dw · dx · Σ (qw − 8) qx
//   Q4_1  dw · dx · Σ qw qx  +  mw · dx · Σ qx     (dx · Σ qx is kept per block: `sums`)
// Per target: on x86 from AVX2 a block is one 256-bit vector of 32 bytes, multiplied by
// vpmaddubsw + vpmaddwd, or where the CPU has AVX-VNNI by one vpdpbusd (unsigned × signed
// bytes; a signed weight's sign moves onto the activation, |qw| · sign(qw) qx); on the AVX-512
// DL target (AVX512-VNNI) two blocks are one 512-bit vpdpbusd; SSE4 as AVX2 in two 128-bit
// halves; AArch64 with the dot product extension two sdot per block; elsewhere (a NEON CPU
// without it, the emulated targets) widened to int16 pairs (Highway's
// ReorderWidenMulAccumulate) and summed per block.
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
#include "simd/half-inl.h"
#include "quant/int8.h"
#include "quant/k_quants.h"
#include "quant/product_kernels.h"

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
template <TensorType T>  // a block's bytes (a K-quant's super-block's)
inline constexpr int64_t kBlockBytes = block_size(static_cast<uint32_t>(T))->bytes;

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

// The kernel the products with weights of type T run on this target and CPU (the choices of
// tile_rows and dot_row_block below; written before the AVX-512 DL options so that code
// compiled without them may call it).
template <TensorType T>
HWY_INLINE ProductKernel int8_kernel() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
#if HWY_TARGET == HWY_AVX3_DL
  if constexpr (T != TensorType::q6_k) return ProductKernel::int8_vpdpbusd;
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

#if HWY_TARGET == HWY_AVX3_DL
// From here on, vpdpbusd in its AVX-512 form only, on 512-bit vectors (which have no VEX form):
// Highway 1.0.3 enables AVX-VNNI (the VEX form, which GCC prefers for the low 16 registers)
// on this target, and Zen 4 has AVX512-VNNI but no AVX-VNNI. (A CPU with Highway's AVX3_DL
// features has AVX512-VNNI.) Nothing below calls Highway: its functions here carry options
// these do not, and would not inline. A build for one CPU that has AVX-VNNI (-march=native,
// the sanitizer build, on Sapphire Rapids or Zen 5) keeps it: its intrinsics carry it, and
// would not inline here without it; either form runs on that CPU. (clang takes one target
// attribute per function, not a pragma on top of Highway's: Highway's is replaced by one with
// AVX512-VNNI added, and put back at the end.)
#if defined(__clang__)
HWY_POP_ATTRIBUTES
HWY_PUSH_ATTRIBUTES(HWY_TARGET_STR ",avx512vnni")
#else
#pragma GCC push_options
#ifdef __AVXVNNI__
#pragma GCC target("avx512vnni")
#else
#pragma GCC target("avx512vnni,no-avxvnni")
#endif
#endif
#endif

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
// ---- x86: unsigned × signed byte products ---------------------------------------------------
#if HWY_TARGET <= HWY_AVX2
// A block's fp16 scale (half-inl.h's, here within this file's own target options).
HWY_INLINE float scale_at(const uint8_t* p) {
  return _cvtsh_ss(static_cast<unsigned short>(p[0] | p[1] << 8));
}
using Bytes = __m256i;  // a block's 32 values
using Sums = __m256;    // fp32 partial sums, 8 lanes
HWY_INLINE Bytes load_bytes(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
// A Q4 block's 16 bytes as its 32 values 0–15: low nibbles are values 0–15, high ones 16–31.
HWY_INLINE Bytes q4_values(const uint8_t* q) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(15));
}
// (v >> shift) & mask per byte, for the K-quants' bit fields.
HWY_INLINE Bytes bit_field(Bytes v, int shift, int mask) {
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)),
                          _mm256_set1_epi8(static_cast<char>(mask)));
}
// Q6_K's values (low 4 bits | high 2 bits << 4) − 32, in [−32, 31].
HWY_INLINE Bytes q6_values(Bytes low, Bytes high) {
  return _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32));
}
// Σ u · s over groups of 4 bytes, as 8 int32 lanes: vpmaddubsw + vpmaddwd, or with kVnni
// AVX-VNNI's vpdpbusd (its VEX form, written out: the compiler may not pick it for this
// target, and must not pick it elsewhere — on avx512_dl a build at -O1 emitted the VEX form,
// which Zen 4 lacks). Run with kVnni only where avx_vnni() says the CPU has it.
template <bool kVnni = false>
HWY_INLINE __m256i dot_u8_s8(Bytes u, Bytes s) {
  if constexpr (kVnni) {
    __m256i sum = _mm256_setzero_si256();
    asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(sum) : "x"(u), "x"(s));
    return sum;
  } else {
    // |each pair sum| ≤ 2 · 128 · 127 < 2^15 for the values here (u ≤ 128): no saturation.
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
  }
}
// Signed × signed: |w| · (x with w's sign), as the instructions want.
template <bool kVnni = false>
HWY_INLINE __m256i dot_s8_s8(Bytes w, Bytes x) {
  return dot_u8_s8<kVnni>(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}
HWY_INLINE Sums sums_zero() { return _mm256_setzero_ps(); }
// acc + float(p) · scale
HWY_INLINE Sums add_scaled(Sums acc, __m256i p, float scale) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(scale), acc);
}
// acc + float(p) · (s0 for the lanes of the block's values 0–15, s1 for 16–31)
HWY_INLINE Sums add_scaled2(Sums acc, __m256i p, float s0, float s1) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0)),
                         acc);
}
HWY_INLINE float sum_of(Sums v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
#else  // SSE4 (SSSE3's pmaddubsw): a block as two 128-bit halves
HWY_INLINE float scale_at(const uint8_t* p) { return half(p); }
struct Bytes {
  __m128i lo, hi;
};
struct Sums {
  __m128 lo, hi;
};
HWY_INLINE Bytes load_bytes(const void* p) {
  const auto* v = static_cast<const __m128i*>(p);
  return {_mm_loadu_si128(v), _mm_loadu_si128(v + 1)};
}
HWY_INLINE Bytes q4_values(const uint8_t* q) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)), m = _mm_set1_epi8(15);
  return {_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m)};
}
HWY_INLINE Bytes bit_field(Bytes v, int shift, int mask) {
  const __m128i n = _mm_cvtsi32_si128(shift), m = _mm_set1_epi8(static_cast<char>(mask));
  return {_mm_and_si128(_mm_srl_epi16(v.lo, n), m), _mm_and_si128(_mm_srl_epi16(v.hi, n), m)};
}
HWY_INLINE Bytes q6_values(Bytes low, Bytes high) {
  const __m128i e = _mm_set1_epi8(32);
  return {_mm_sub_epi8(_mm_or_si128(low.lo, _mm_slli_epi16(high.lo, 4)), e),
          _mm_sub_epi8(_mm_or_si128(low.hi, _mm_slli_epi16(high.hi, 4)), e)};
}
struct Products {
  __m128i lo, hi;
};
template <bool kVnni = false>  // (no AVX-VNNI without AVX: always false here)
HWY_INLINE Products dot_u8_s8(Bytes u, Bytes s) {
  const __m128i one = _mm_set1_epi16(1);
  return {_mm_madd_epi16(_mm_maddubs_epi16(u.lo, s.lo), one),
          _mm_madd_epi16(_mm_maddubs_epi16(u.hi, s.hi), one)};
}
template <bool kVnni = false>
HWY_INLINE Products dot_s8_s8(Bytes w, Bytes x) {
  return dot_u8_s8({_mm_sign_epi8(w.lo, w.lo), _mm_sign_epi8(w.hi, w.hi)},
                   {_mm_sign_epi8(x.lo, w.lo), _mm_sign_epi8(x.hi, w.hi)});
}
HWY_INLINE Sums sums_zero() { return {_mm_setzero_ps(), _mm_setzero_ps()}; }
HWY_INLINE Sums add_scaled(Sums acc, Products p, float scale) {
  const __m128 s = _mm_set1_ps(scale);
  return {_mm_add_ps(acc.lo, _mm_mul_ps(_mm_cvtepi32_ps(p.lo), s)),
          _mm_add_ps(acc.hi, _mm_mul_ps(_mm_cvtepi32_ps(p.hi), s))};
}
HWY_INLINE Sums add_scaled2(Sums acc, Products p, float s0, float s1) {
  return {_mm_add_ps(acc.lo, _mm_mul_ps(_mm_cvtepi32_ps(p.lo), _mm_set1_ps(s0))),
          _mm_add_ps(acc.hi, _mm_mul_ps(_mm_cvtepi32_ps(p.hi), _mm_set1_ps(s1)))};
}
HWY_INLINE float sum_of(Sums v) {
  const __m128 s = _mm_add_ps(v.lo, v.hi);
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
#endif

// Block b (32 values) of a weight row, as the integer products take it: its values as bytes,
// signed for Q8_0 and Q6_K, unsigned for the others (Q4's nibbles as they are); the scales of
// its halves (values 0–15 and 16–31: the same but for Q6_K, whose 16-value groups have their
// own); and m, what multiplies the activations' d · Σ q (Row::sums) apart: Q4_0's −8 d, Q4_1's
// m, Q4_K's −dmin · min_j.
struct Decoded {
  Bytes v;
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
template <TensorType T>
HWY_INLINE void unpack_scales(const uint8_t* sb, SuperScales& s) {
  if constexpr (T == TensorType::q4_k) {
    const float d = scale_at(sb), dmin = scale_at(sb + 2);
    uint8_t scales[8], mins[8];
    q4_k_scales_mins(sb + kQ4kScales, scales, mins);
#if HWY_TARGET <= HWY_AVX2  // (GCC vectorized the loop below a byte at a time: slower)
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
    const float d = scale_at(sb + kQ6kScale);
#if HWY_TARGET <= HWY_AVX2
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
template <TensorType T>
HWY_INLINE Decoded decode_block(const uint8_t* row, int64_t b, const SuperScales& k) {
  if constexpr (kKQuant<T>) {
    const uint8_t* sb = row + b / 8 * kBlockBytes<T>;
    const int j = static_cast<int>(b % 8);
    if constexpr (T == TensorType::q4_k) {
      return {bit_field(load_bytes(sb + kQ4kValues + 32 * (j / 2)), 4 * (j % 2), 15), k.d[j],
              k.d[j], k.m[j]};
    } else {
      const Q6kSubBlock s = q6_k_sub_block(sb, j);
      const int g = 8 * (j / 4) + 2 * (j % 4);  // its first 16-value group
      return {q6_values(bit_field(load_bytes(s.ql), s.nibble_shift, 15),
                        bit_field(load_bytes(s.qh), s.high_shift, 3)),
              k.d[g], k.d[g + 1], 0};
    }
  } else {
    const uint8_t* blk = row + b * kBlockBytes<T>;
    const float d = scale_at(blk);
    if constexpr (T == TensorType::q8_0) return {load_bytes(blk + 2), d, d, 0};
    if constexpr (T == TensorType::q4_0) return {q4_values(blk + 2), d, d, -8 * d};
    return {q4_values(blk + 4), d, d, scale_at(blk + 2)};
  }
}

// y[i][r] = weight row r · activation row i, for XR rows of activations against R weight rows
// (rows rb bytes apart), each weight block decoded once for all XR (with kVnni: products by
// AVX-VNNI). One activation row (XR = 1) is a decoding step; several, a prompt's tile.
template <TensorType T, int R, int XR, bool kVnni = false>
HWY_INLINE void dot_tile(const uint8_t* w, int64_t rb, int64_t blocks, const Row* x,
                         float* const* y) {
  Sums acc[XR][R];
  float offsets[XR][R];
  for (int i = 0; i < XR; ++i)
    for (int r = 0; r < R; ++r) acc[i][r] = sums_zero(), offsets[i][r] = 0;
  SuperScales k[R];  // (the K-quants')
  for (int64_t b = 0; b < blocks; ++b) {
    if (kKQuant<T> && b % 8 == 0)
      for (int r = 0; r < R; ++r) unpack_scales<T>(w + r * rb + b / 8 * kBlockBytes<T>, k[r]);
    Decoded wv[R];
#pragma GCC unroll 4  // (rolled, the decoded blocks went through the stack)
    for (int r = 0; r < R; ++r) {
      hwy::Prefetch(block_at<T>(w + r * rb, b) + 2 * R * rb);  // two steps of R rows ahead
      wv[r] = decode_block<T>(w + r * rb, b, k[r]);
    }
    for (int i = 0; i < XR; ++i) {
      const Bytes xv = load_bytes(x[i].q + b * kBlock);
      const float xd = x[i].d[b], xs = x[i].sums[b];
      for (int r = 0; r < R; ++r) {
        if constexpr (kSignedValues<T>) {
          const auto p = dot_s8_s8<kVnni>(wv[r].v, xv);
          acc[i][r] = T == TensorType::q6_k
                          ? add_scaled2(acc[i][r], p, wv[r].d0 * xd, wv[r].d1 * xd)
                          : add_scaled(acc[i][r], p, wv[r].d0 * xd);
        } else {
          acc[i][r] = add_scaled(acc[i][r], dot_u8_s8<kVnni>(wv[r].v, xv), wv[r].d0 * xd);
          offsets[i][r] += wv[r].m * xs;
        }
      }
    }
  }
  for (int i = 0; i < XR; ++i)
    for (int r = 0; r < R; ++r) y[i][r] = sum_of(acc[i][r]) + offsets[i][r];
}
#else
// ---- Elsewhere: int16 pairs, a block's sum reduced to one integer ----------------------------
template <TensorType T, int R>
HWY_INLINE void dot_rows(const uint8_t* w, int64_t rb, int64_t blocks, const Row& x, float* y) {
  constexpr int64_t bytes = kBlockBytes<T>;
  const int8_t* xq = x.q;
  const float *xd = x.d, *xs = x.sums;
  const hn::CappedTag<int16_t, 16> d16;  // at most 16 lanes: a Q4 block's 16 bytes at a time
  const hn::Repartition<int32_t, decltype(d16)> d32;
  const hn::Rebind<int8_t, decltype(d16)> d8;
  const hn::Rebind<uint8_t, decltype(d16)> du8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d16));
  float sum[R], offsets[R];
  for (int r = 0; r < R; ++r) sum[r] = 0, offsets[r] = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int8_t* xb = xq + b * kBlock;
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w + r * rb + b * bytes;
      hwy::Prefetch(blk + 2 * R * rb);
      const uint8_t* q = blk + (T == TensorType::q4_1 ? 4 : 2);
      auto s0 = hn::Zero(d32), s1 = hn::Zero(d32);
      for (int64_t j = 0; j < kBlock; j += N) {
        const auto x = hn::PromoteTo(d16, hn::LoadU(d8, xb + j));
        auto v = hn::Zero(d16);
        if constexpr (T == TensorType::q8_0) {
          v = hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const int8_t*>(q) + j));
        } else {
          const auto bytes16 =
              hn::BitCast(d16, hn::PromoteTo(hn::RebindToUnsigned<decltype(d16)>(),
                                             hn::LoadU(du8, q + j % (kBlock / 2))));
          v = j < kBlock / 2 ? hn::And(bytes16, hn::Set(d16, 15)) : hn::ShiftRight<4>(bytes16);
          if constexpr (T == TensorType::q4_0) v = hn::Sub(v, hn::Set(d16, 8));
        }
        s0 = hn::ReorderWidenMulAccumulate(d32, v, x, s0, s1);
      }
      const int32_t dot = hn::GetLane(hn::SumOfLanes(d32, hn::Add(s0, s1)));
      sum[r] += half(blk) * xd[b] * static_cast<float>(dot);
      if constexpr (T == TensorType::q4_1) offsets[r] += half(blk + 2) * xs[b];
    }
  }
  for (int r = 0; r < R; ++r) y[r] = sum[r] + offsets[r];
}

// y[r] = row r · x for R rows of a K-quant matrix, a 32-value sub-block at a time, its integer
// sums in scalar code (as the x86 kernel, unvectorized).
template <TensorType T, int R>
HWY_INLINE void dot_rows_k(const uint8_t* w, int64_t rb, int64_t blocks, const Row& x, float* y) {
  constexpr int64_t bytes = kBlockBytes<T>;
  for (int r = 0; r < R; ++r) {
    float sum = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      const int j = static_cast<int>(b % 8);
      const uint8_t* sb = w + r * rb + b / 8 * bytes;
      const int8_t* xq = x.q + b * kBlock;
      if constexpr (T == TensorType::q4_k) {
        int scale, min;
        q4_k_scale_min(j, sb + kQ4kScales, scale, min);
        const uint8_t* q = sb + kQ4kValues + 32 * (j / 2);
        int32_t dot = 0;
        for (int l = 0; l < kBlock; ++l) dot += ((q[l] >> (4 * (j % 2))) & 15) * xq[l];
        sum += half(sb) * scale * x.d[b] * static_cast<float>(dot) - half(sb + 2) * min * x.sums[b];
      } else {
        const Q6kSubBlock s = q6_k_sub_block(sb, j);
        int32_t dot[2] = {0, 0};
        for (int l = 0; l < kBlock; ++l) {
          const int low = (s.ql[l] >> s.nibble_shift) & 15, high = (s.qh[l] >> s.high_shift) & 3;
          dot[l / 16] += ((low | high << 4) - 32) * xq[l];
        }
        sum += half(sb + kQ6kScale) * x.d[b] *
               static_cast<float>(s.scales[0] * dot[0] + s.scales[1] * dot[1]);
      }
    }
    y[r] = sum;
  }
}

#if HWY_ARCH_ARM_A64
// ---- AArch64 with the dot product extension: sdot ------------------------------------------
// Signed bytes times signed bytes, four products into each int32 lane: a block is two
// `sdot`s, its nibbles split by a mask and a shift (Q4_0's less 8). Compiled for the extension
// whatever the pass (NEON or SVE) and run where the CPU reports it (dot_product_extension()).
template <TensorType T, int R>
__attribute__((target("arch=armv8.2-a+dotprod"))) void dot_rows_sdot(const uint8_t* w, int64_t rb,
                                                                     int64_t blocks,
                                                                     const int8_t* xq,
                                                                     const float* xd,
                                                                     const float* xs, float* y) {
  constexpr int64_t bytes = kBlockBytes<T>;
  float32x4_t acc[R];
  float offsets[R];
  for (int r = 0; r < R; ++r) acc[r] = vdupq_n_f32(0.0f), offsets[r] = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int8x16_t x0 = vld1q_s8(xq + b * kBlock), x1 = vld1q_s8(xq + b * kBlock + 16);
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w + r * rb + b * bytes;
      __builtin_prefetch(blk + 2 * R * rb);
      int8x16_t w0, w1;
      if constexpr (T == TensorType::q8_0) {
        w0 = vld1q_s8(reinterpret_cast<const int8_t*>(blk + 2));
        w1 = vld1q_s8(reinterpret_cast<const int8_t*>(blk + 18));
      } else {
        const uint8x16_t q = vld1q_u8(blk + (T == TensorType::q4_1 ? 4 : 2));
        w0 = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15)));
        w1 = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
        if constexpr (T == TensorType::q4_0)
          w0 = vsubq_s8(w0, vdupq_n_s8(8)), w1 = vsubq_s8(w1, vdupq_n_s8(8));
      }
      const int32x4_t dots = vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, x0), w1, x1);
      __fp16 dm[2];  // (half() is this pass's, with options this function has not)
      std::memcpy(dm, blk, 4);
      acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(dots), static_cast<float>(dm[0]) * xd[b]);
      if constexpr (T == TensorType::q4_1) offsets[r] += static_cast<float>(dm[1]) * xs[b];
    }
  }
  for (int r = 0; r < R; ++r) y[r] = vaddvq_f32(acc[r]) + offsets[r];
}

// The K-quants with sdot, a 32-value sub-block at a time: Q4_K's nibbles (0–15, signed bytes as
// they are) by two sdots scaled by d · scale_j, −dmin · min_j by the activations' d · Σ q
// apart; Q6_K's values − 32, each 16-value half one sdot scaled by its own scale. A super-
// block's scales are unpacked once.
template <TensorType T, int R>
__attribute__((target("arch=armv8.2-a+dotprod"))) void dot_rows_k_sdot(const uint8_t* w, int64_t rb,
                                                                       int64_t blocks, const Row& x,
                                                                       float* y) {
  constexpr int64_t bytes = kBlockBytes<T>;
  float32x4_t acc[R];
  float offsets[R], d[R][16], m[R][8];
  for (int r = 0; r < R; ++r) acc[r] = vdupq_n_f32(0.0f), offsets[r] = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int j = static_cast<int>(b % 8);
    if (j == 0)
      for (int r = 0; r < R; ++r) {
        const uint8_t* sb = w + r * rb + b / 8 * bytes;
        __fp16 h[2];  // (half() is this pass's, with options this function has not)
        if constexpr (T == TensorType::q4_k) {
          std::memcpy(h, sb, 4);
          uint8_t scales[8], mins[8];
          q4_k_scales_mins(sb + kQ4kScales, scales, mins);
          for (int k = 0; k < 8; ++k)
            d[r][k] = static_cast<float>(h[0]) * scales[k],
            m[r][k] = -static_cast<float>(h[1]) * mins[k];
        } else {
          std::memcpy(h, sb + kQ6kScale, 2);
          const auto* scales = reinterpret_cast<const int8_t*>(sb + kQ6kScales);
          for (int g = 0; g < 16; ++g) d[r][g] = static_cast<float>(h[0]) * scales[g];
        }
      }
    const int8x16_t x0 = vld1q_s8(x.q + b * kBlock), x1 = vld1q_s8(x.q + b * kBlock + 16);
    const float xd = x.d[b], xs = x.sums[b];
    for (int r = 0; r < R; ++r) {
      const uint8_t* sb = w + r * rb + b / 8 * bytes;
      if (j == 0) __builtin_prefetch(sb + 2 * R * rb);
      if constexpr (T == TensorType::q4_k) {
        const uint8_t* q = sb + kQ4kValues + 32 * (j / 2);
        const int8x16_t right = vdupq_n_s8(static_cast<int8_t>(-4 * (j % 2)));  // >> 0 or 4
        const int8x16_t w0 =
            vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vld1q_u8(q), right), vdupq_n_u8(15)));
        const int8x16_t w1 =
            vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vld1q_u8(q + 16), right), vdupq_n_u8(15)));
        const int32x4_t dots = vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, x0), w1, x1);
        acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(dots), d[r][j] * xd);
        offsets[r] += m[r][j] * xs;
      } else {
        const Q6kSubBlock s = q6_k_sub_block(sb, j);
        const int8x16_t low_right = vdupq_n_s8(static_cast<int8_t>(-s.nibble_shift));
        const int8x16_t high_right = vdupq_n_s8(static_cast<int8_t>(-s.high_shift));
        const auto value = [&](int at) {  // 16 values − 32
          const uint8x16_t low = vandq_u8(vshlq_u8(vld1q_u8(s.ql + at), low_right), vdupq_n_u8(15));
          const uint8x16_t high =
              vandq_u8(vshlq_u8(vld1q_u8(s.qh + at), high_right), vdupq_n_u8(3));
          return vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low, vshlq_n_u8(high, 4))), vdupq_n_s8(32));
        };
        const int g = 8 * (j / 4) + 2 * (j % 4);  // the first half's scale
        const int32x4_t dot0 = vdotq_s32(vdupq_n_s32(0), value(0), x0);
        const int32x4_t dot1 = vdotq_s32(vdupq_n_s32(0), value(16), x1);
        acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(dot0), d[r][g] * xd);
        acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(dot1), d[r][g + 1] * xd);
      }
    }
  }
  for (int r = 0; r < R; ++r) y[r] = vaddvq_f32(acc[r]) + offsets[r];
}
#endif
#endif

#if HWY_TARGET == HWY_AVX3_DL
// ---- AVX-512 DL: two blocks per vpdpbusd ----------------------------------------------------
// A pair of weight blocks fills a 512-bit vector, its bytes unsigned (Q8_0's offset by 128,
// Q4's nibbles as they are) against the row's values in the matching order (Row::q, Row::q4);
// the two blocks' (d, m) halves load as one vector, are converted at once, multiplied by
// Row::scales for the products' scale and by Row::terms for what the unsigned sums leave out.
// (Per pair: 15 instructions, against 17 per block one block at a time.)
template <TensorType T>
struct Pair {
  static constexpr int64_t kBytes = kBlockBytes<T>;  // a block's
  static constexpr int kTerms = T == TensorType::q8_0   ? kTermsQ8_0
                                : T == TensorType::q4_0 ? kTermsQ4_0
                                                        : kTermsQ4_1;
  // The products' lanes: Q8_0 block b in 0–7, b + 1 in 8–15; Q4 (b, b + 1, b, b + 1) by 4s;
  // as the lanes of (d, m, d', m') that scale them.
  static __m512i lanes() {
    return T == TensorType::q8_0 ? _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0)
                                 : _mm512_set_epi32(2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0);
  }
  // The activations of pair p in this type's order.
  static __m512i values(const Row& x, int64_t p) {
    return _mm512_loadu_si512(T == TensorType::q8_0 ? x.q + 64 * p : x.q4 + 64 * p);
  }
  // (d, m, d', m') of the pair at b0 (m = 0 for Q8_0 and Q4_0, whose second half is data).
  static __m128 scales(const uint8_t* b0) {
    int32_t h0, h1;
    std::memcpy(&h0, b0, 4);
    std::memcpy(&h1, b0 + kBytes, 4);
    __m128i halves = _mm_insert_epi32(_mm_cvtsi32_si128(h0), h1, 1);
    if constexpr (T != TensorType::q4_1) halves = _mm_and_si128(halves, _mm_set1_epi32(0xFFFF));
    return _mm_cvtph_ps(halves);
  }
  // The pair's 64 weights as unsigned bytes.
  static __m512i weights(const uint8_t* b0) {
    if constexpr (T == TensorType::q8_0) {
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + kBytes + 2));
      return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
                              _mm512_set1_epi8(static_cast<char>(0x80)));
    } else {
      constexpr int64_t at = T == TensorType::q4_1 ? 4 : 2;
      const __m256i both = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + at))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + kBytes + at)), 1);
      return _mm512_and_si512(
          _mm512_inserti64x4(_mm512_castsi256_si512(both), _mm256_srli_epi16(both, 4), 1),
          _mm512_set1_epi8(15));
    }
  }
};

template <TensorType T, int R>
HWY_INLINE void dot_rows_paired(const uint8_t* w, int64_t rb, int64_t pairs, const Row& x,
                                float* y) {
  using P = Pair<T>;
  const __m512i lanes = P::lanes();
  __m512 acc[R];
  __m128 rest[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps(), rest[r] = _mm_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512i xv = P::values(x, p);
    const __m128 scales = _mm_loadu_ps(x.scales + 4 * p);
    const __m128 terms = _mm_loadu_ps(x.terms + 12 * p + P::kTerms);
    for (int r = 0; r < R; ++r) {
      const uint8_t* b0 = w + r * rb + 2 * p * P::kBytes;
      hwy::Prefetch(b0 + 2 * R * rb);
      const __m128 dm = P::scales(b0);
      rest[r] = _mm_fmadd_ps(dm, terms, rest[r]);
      const __m512 scale =
          _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(_mm_mul_ps(dm, scales)));
      const __m512i dots = _mm512_dpbusd_epi32(_mm512_setzero_si512(), P::weights(b0), xv);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), scale, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m128 t = _mm_add_ps(rest[r], _mm_movehl_ps(rest[r], rest[r]));
    y[r] = _mm512_reduce_add_ps(acc[r]) + _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  }
}

// Several rows of activations (a prompt): XR of them against R ≤ 4 weight rows, each weight
// pair decoded once for all XR (dot_rows_paired decodes it once per activation row). The
// weights' (d, m) converted once too: the products are scaled by the activation row's and the
// weight row's block scales, each spread to the lanes of its block; the four weight rows'
// (d, m, d', m') side by side in one vector for the terms. y[i][r] for activation row i.
template <TensorType T, int R, int XR>
HWY_INLINE void dot_tile_paired(const uint8_t* w, int64_t rb, int64_t pairs, const Row* x,
                                float* const* y) {
  using P = Pair<T>;
  const __m512i lanes = P::lanes();
  __m512 acc[XR][R], rest[XR];
  for (int i = 0; i < XR; ++i) {
    rest[i] = _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) acc[i][r] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    __m512i wv[R];
    __m512 wscale[R];
    __m512 dm4 = _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      const uint8_t* b0 = w + r * rb + 2 * p * P::kBytes;
      hwy::Prefetch(b0 + R * rb);
      const __m128 dm = P::scales(b0);
      dm4 = _mm512_mask_broadcast_f32x4(dm4, static_cast<__mmask16>(0xF << (4 * r)), dm);
      wscale[r] = _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(dm));
      wv[r] = P::weights(b0);
    }
    for (int i = 0; i < XR; ++i) {
      const __m512i xv = P::values(x[i], p);
      const __m512 xscale =
          _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(_mm_loadu_ps(x[i].scales + 4 * p)));
      const __m512 terms = _mm512_broadcast_f32x4(_mm_loadu_ps(x[i].terms + 12 * p + P::kTerms));
      rest[i] = _mm512_fmadd_ps(dm4, terms, rest[i]);
      for (int r = 0; r < R; ++r) {
        const __m512i dots = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[r], xv);
        acc[i][r] =
            _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dots), xscale), wscale[r], acc[i][r]);
      }
    }
  }
  for (int i = 0; i < XR; ++i) {
    alignas(64) float part[16];
    _mm512_store_ps(part, rest[i]);
    for (int r = 0; r < R; ++r)
      y[i][r] = _mm512_reduce_add_ps(acc[i][r]) +
                ((part[4 * r] + part[4 * r + 1]) + (part[4 * r + 2] + part[4 * r + 3]));
  }
}

// Q4_K's sub-blocks j and j + 1 share 32 bytes (low nibbles, high nibbles): both in one
// 512-bit vpdpbusd against the activations' blocks b, b + 1 as they lie, lanes 0–7 scaled by
// d · scale_j, 8–15 by d · scale_j+1; −dmin · min by the blocks' d · Σ q apart. XR activation
// rows against R weight rows, each pair decoded once.
template <int R, int XR>
HWY_INLINE void dot_tile_q4_k(const uint8_t* w, int64_t rb, int64_t blocks, const Row* x,
                              float* const* y) {
  constexpr int64_t bytes = kBlockBytes<TensorType::q4_k>;
  __m512 acc[XR][R];
  float offsets[XR][R];
  for (int i = 0; i < XR; ++i)
    for (int r = 0; r < R; ++r) acc[i][r] = _mm512_setzero_ps(), offsets[i][r] = 0;
  SuperScales k[R];
  for (int64_t b = 0; b < blocks; b += 2) {
    const int j = static_cast<int>(b % 8);
    if (j == 0)
      for (int r = 0; r < R; ++r) unpack_scales<TensorType::q4_k>(w + r * rb + b / 8 * bytes, k[r]);
    __m512i u[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* q = w + r * rb + b / 8 * bytes + kQ4kValues + 32 * (j / 2);
      hwy::Prefetch(q + 2 * R * rb);
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
      u[r] = _mm512_and_si512(
          _mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1),
          _mm512_set1_epi8(15));
    }
    for (int i = 0; i < XR; ++i) {
      const __m512i xv = _mm512_loadu_si512(x[i].q + b * kBlock);
      const float xd0 = x[i].d[b], xd1 = x[i].d[b + 1], xs0 = x[i].sums[b], xs1 = x[i].sums[b + 1];
      for (int r = 0; r < R; ++r) {
        const __m512 scale = _mm512_insertf32x8(_mm512_set1_ps(k[r].d[j] * xd0),
                                                _mm256_set1_ps(k[r].d[j + 1] * xd1), 1);
        const __m512i dots = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[r], xv);
        acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), scale, acc[i][r]);
        offsets[i][r] += k[r].m[j] * xs0 + k[r].m[j + 1] * xs1;
      }
    }
  }
  for (int i = 0; i < XR; ++i)
    for (int r = 0; r < R; ++r) y[i][r] = _mm512_reduce_add_ps(acc[i][r]) + offsets[i][r];
}
#endif

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
#if HWY_TARGET == HWY_AVX3_DL
constexpr int kXRows = 3;  // activation rows a tile: × 4 weight rows, 12 zmm accumulators
#else
constexpr int kXRows = 2;  // × 4 weight rows: 8 accumulators (16 halves on SSE4)
#endif

// y[i][r] = weight row r · activation row i, for XR activation rows and R weight rows: pairs of
// blocks on AVX-512 DL (the K-quants and an odd last block one at a time), one block at a time
// elsewhere, by AVX-VNNI where the AVX2 target has it.
template <TensorType T, int R, int XR>
HWY_INLINE void tile_rows(const uint8_t* w, int64_t rb, int64_t blocks, const Row* x,
                          float* const* y) {
#if HWY_TARGET == HWY_AVX3_DL
  if constexpr (T == TensorType::q4_k) return dot_tile_q4_k<R, XR>(w, rb, blocks, x, y);
  if constexpr (!kKQuant<T>) {
    if constexpr (XR == 1) dot_rows_paired<T, R>(w, rb, blocks / 2, x[0], y[0]);
    else dot_tile_paired<T, R, XR>(w, rb, blocks / 2, x, y);
    if (blocks % 2 == 0) return;
    const int64_t b = blocks - 1;
    for (int i = 0; i < XR; ++i) {
      Row last = x[i];  // the activations' block b as a row of one
      last.q += b * kBlock, last.d += b, last.sums += b;
      float part[R], *out = part;
      dot_tile<T, R, 1>(w + b * kBlockBytes<T>, rb, 1, &last, &out);
      for (int r = 0; r < R; ++r) y[i][r] += part[r];
    }
    return;
  }
#endif
#if HWY_TARGET == HWY_AVX2
  if (int8_kernel<T>() == ProductKernel::int8_avx_vnni)
    return dot_tile<T, R, XR, true>(w, rb, blocks, x, y);
#endif
  dot_tile<T, R, XR>(w, rb, blocks, x, y);
}
#else
constexpr int kXRows = 1;  // (no tiles)
#endif

// y[r] = row r · x for R rows.
template <TensorType T, int R>
HWY_INLINE void dot_row_block(const uint8_t* w, int64_t rb, int64_t blocks, const Row& x,
                              float* y) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
  tile_rows<T, R, 1>(w, rb, blocks, &x, &y);
#else
  if constexpr (kKQuant<T>) {
#if HWY_ARCH_ARM_A64
    if (int8_kernel<T>() == ProductKernel::int8_sdot)
      return dot_rows_k_sdot<T, R>(w, rb, blocks, x, y);
#endif
    dot_rows_k<T, R>(w, rb, blocks, x, y);
  } else {
#if HWY_ARCH_ARM_A64
    if (int8_kernel<T>() == ProductKernel::int8_sdot)
      return dot_rows_sdot<T, R>(w, rb, blocks, x.q, x.d, x.sums, y);
#endif
    dot_rows<T, R>(w, rb, blocks, x, y);
  }
#endif
}

// y[begin, end) (rows of the matrix at w, rb bytes a row) = its rows · x.
template <TensorType T>
HWY_NOINLINE void dot_range(const uint8_t* w, int64_t rb, int64_t blocks, int64_t begin,
                            int64_t end, const Row& x, float* y) {
  constexpr int kRows = 4;  // weight rows side by side
  int64_t r = begin;
  for (; r + kRows <= end; r += kRows) dot_row_block<T, kRows>(w + r * rb, rb, blocks, x, y + r);
  for (; r < end; ++r) dot_row_block<T, 1>(w + r * rb, rb, blocks, x, y + r);
}

// y[i · ldy + begin, end) = rows [begin, end) of the matrix · activation row i, for the M rows
// quantized at `rows` (floats_per_row(K) floats apart). On x86, kXRows activation rows at a
// time share each decoded weight block (tile_rows).
template <TensorType T>
HWY_NOINLINE void dot_range_rows(const uint8_t* w, int64_t rb, int64_t K, int64_t begin,
                                 int64_t end, const float* rows, int64_t M, float* y, int64_t ldy) {
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
        tile_rows<T, kRows, kXRows>(w + r * rb, rb, blocks, x, out);
      }
      if (tiled_end < end)
        for (int i = 0; i < kXRows; ++i)
          dot_range<T>(w, rb, blocks, tiled_end, end, x[i], y + (i0 + i) * ldy);
    }
  }
  for (int64_t i = untiled; i < M; ++i)
    dot_range<T>(w, rb, blocks, begin, end, row_at(rows + i * stride, K), y + i * ldy);
}

}  // namespace int8
}  // namespace HWY_NAMESPACE
}  // namespace qkv::quant
#if HWY_TARGET == HWY_AVX3_DL
#if defined(__clang__)
HWY_POP_ATTRIBUTES
HWY_PUSH_ATTRIBUTES(HWY_TARGET_STR)
#else
#pragma GCC pop_options
#endif
#endif
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
