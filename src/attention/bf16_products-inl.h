// The tile products of the tiled kernels on the bf16 units (AVX512-BF16 on x86-64, BF16 on
// AArch64), for the translation units that compile a kernel file with QKV_BF16_UNITS
// (src/simd/units-inl.h).
//
// vdpbf16ps (x86) and bfdot (Arm) add to each fp32 lane the two products of a pair of bf16
// lanes. The tiled kernels' products reduce over d (S = K Qᵀ), over keys (Oᵀ += Vᵀ P) or, in
// the backward, over queries (dV += Pᵀ dO); their packed operand therefore holds pairs along
// the reduced dimension — Qt2[d/2][q] = (q[2i], q[2i + 1]) and P2[j/2][q] = (p[2j], p[2j + 1]),
// one 32-bit lane per query — and the other operand's pair is a 32-bit broadcast from where it
// lies (a K row; a word of V's rows interleaved in pairs). One instruction does the work of two
// FMAs and no element is widened. The few instructions that differ between the two are the
// primitives below; the products are written once over them.
#if defined(QKV_ATTENTION_BF16_PRODUCTS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_BF16_PRODUCTS_INL_H_
#undef QKV_ATTENTION_BF16_PRODUCTS_INL_H_
#else
#define QKV_ATTENTION_BF16_PRODUCTS_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "attention/products-inl.h"
#include "simd/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace products {
using namespace ::qkv::simd::HWY_NAMESPACE;  // NOLINT: written in the SIMD layer's words

// (The intrinsics come with Highway's headers; only the bf16 units' pass compiles this.)
#if defined(QKV_BF16_UNITS) && QKV_KERNEL_PASS
#if HWY_ARCH_X86
using Acc = __m512;      // fp32 sums, a lane per column
using Pairs = __m512bh;  // bf16 pairs, one per 32-bit lane
inline constexpr int kPairLanes = 16;
HWY_INLINE Acc acc_zero() { return _mm512_setzero_ps(); }
HWY_INLINE Acc acc_set(float x) { return _mm512_set1_ps(x); }
HWY_INLINE Acc acc_load(const float* p) { return _mm512_loadu_ps(p); }
HWY_INLINE void acc_store(float* p, Acc x) { _mm512_storeu_ps(p, x); }
HWY_INLINE Acc acc_mul(Acc x, Acc y) { return _mm512_mul_ps(x, y); }
HWY_INLINE Pairs as_pairs(__m512i x) { return (Pairs)x; }
HWY_INLINE Pairs load_pairs(const void* p) { return as_pairs(_mm512_loadu_si512(p)); }
// Every lane = the 32 bits at p (a pair of bf16).
HWY_INLINE Pairs broadcast_pair_bits(const void* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  return as_pairs(_mm512_set1_epi32(static_cast<int>(bits)));
}
// acc + x[2i] y[2i] + x[2i + 1] y[2i + 1] in each lane i.
HWY_INLINE Acc dot_pairs(Acc acc, Pairs x, Pairs y) { return _mm512_dpbf16_ps(acc, x, y); }
// to[i] ← (bf16 x0[i], bf16 x1[i]) for each lane, rounded to nearest even.
HWY_INLINE void round_pair_words(Acc x0, Acc x1, uint32_t* to) {
  const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x0));
  const __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x1));
  _mm512_storeu_si512(to, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
}
// to[i] ← bf16 x[i], rounded to nearest even.
HWY_INLINE void round_to_bf16(Acc x, uint16_t* to) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(to), (__m256i)_mm512_cvtneps_pbh(x));
}
// lo, hi ← the pairs (x[e], y[e]) of the 2 · kPairLanes columns at x and y (y null: 0), in
// registers: vpunpck{l,h}wd interleave within 128-bit blocks, so a lane's column is the one
// pair_lane_column says (a kernel that keeps its sums in that order undoes it once).
HWY_INLINE void row_pairs(const uint16_t* x, const uint16_t* y, Pairs& lo, Pairs& hi) {
  const __m512i a = _mm512_loadu_si512(x);
  const __m512i b = y ? _mm512_loadu_si512(y) : _mm512_setzero_si512();
  lo = as_pairs(_mm512_unpacklo_epi16(a, b));
  hi = as_pairs(_mm512_unpackhi_epi16(a, b));
}
// The column that lane p of (lo, hi) — lo's lanes first — holds: the low interleave covers
// columns 0–3 of each 8 (per 128-bit block), the high one columns 4–7.
inline int64_t pair_lane_column(int64_t p) {
  const int64_t half = p / 16, i = p % 16;
  return (i / 4) * 8 + half * 4 + i % 4;
}
// to[e] ← (x[e], y[e]) for kInterleavedColumns columns (y null: 0).
inline constexpr int kInterleavedColumns = 32;
HWY_INLINE void interleave_columns(const uint16_t* x, const uint16_t* y, uint32_t* to) {
  // The unpacks interleave within 128-bit blocks: the low one holds columns 0–3 of each 8, the
  // high one 4–7; these indices put the words back in column order.
  alignas(64) static constexpr int32_t kFirst[16] = {0, 1, 2, 3, 16, 17, 18, 19,
                                                     4, 5, 6, 7, 20, 21, 22, 23};
  alignas(64) static constexpr int32_t kSecond[16] = {8,  9,  10, 11, 24, 25, 26, 27,
                                                      12, 13, 14, 15, 28, 29, 30, 31};
  const __m512i a = _mm512_loadu_si512(x);
  const __m512i b = y ? _mm512_loadu_si512(y) : _mm512_setzero_si512();
  const __m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);
  _mm512_storeu_si512(to, _mm512_permutex2var_epi32(lo, _mm512_load_si512(kFirst), hi));
  _mm512_storeu_si512(to + 16, _mm512_permutex2var_epi32(lo, _mm512_load_si512(kSecond), hi));
}
#else  // AArch64 with BF16
using Acc = float32x4_t;
using Pairs = bfloat16x8_t;
inline constexpr int kPairLanes = 4;
HWY_INLINE Acc acc_zero() { return vdupq_n_f32(0.0f); }
HWY_INLINE Acc acc_set(float x) { return vdupq_n_f32(x); }
HWY_INLINE Acc acc_load(const float* p) { return vld1q_f32(p); }
HWY_INLINE void acc_store(float* p, Acc x) { vst1q_f32(p, x); }
HWY_INLINE Acc acc_mul(Acc x, Acc y) { return vmulq_f32(x, y); }
HWY_INLINE Pairs load_pairs(const void* p) {
  return vreinterpretq_bf16_u32(vld1q_u32(static_cast<const uint32_t*>(p)));
}
HWY_INLINE Pairs broadcast_pair_bits(const void* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  return vreinterpretq_bf16_u32(vdupq_n_u32(bits));
}
HWY_INLINE Acc dot_pairs(Acc acc, Pairs x, Pairs y) { return vbfdotq_f32(acc, x, y); }
HWY_INLINE void round_pair_words(Acc x0, Acc x1, uint32_t* to) {
  const uint16x4_t lo = vreinterpret_u16_bf16(vcvt_bf16_f32(x0));
  const uint16x4_t hi = vreinterpret_u16_bf16(vcvt_bf16_f32(x1));
  vst1q_u16(reinterpret_cast<uint16_t*>(to), vcombine_u16(vzip1_u16(lo, hi), vzip2_u16(lo, hi)));
}
HWY_INLINE void round_to_bf16(Acc x, uint16_t* to) {
  vst1_u16(to, vreinterpret_u16_bf16(vcvt_bf16_f32(x)));
}
HWY_INLINE void row_pairs(const uint16_t* x, const uint16_t* y, Pairs& lo, Pairs& hi) {
  const uint16x8_t a = vld1q_u16(x), b = y ? vld1q_u16(y) : vdupq_n_u16(0);
  lo = vreinterpretq_bf16_u16(vzip1q_u16(a, b));  // columns 0–3
  hi = vreinterpretq_bf16_u16(vzip2q_u16(a, b));  // columns 4–7
}
inline int64_t pair_lane_column(int64_t p) { return p; }
inline constexpr int kInterleavedColumns = 8;
HWY_INLINE void interleave_columns(const uint16_t* x, const uint16_t* y, uint32_t* to) {
  const uint16x8_t a = vld1q_u16(x), b = y ? vld1q_u16(y) : vdupq_n_u16(0);
  vst1q_u16(reinterpret_cast<uint16_t*>(to), vzip1q_u16(a, b));
  vst1q_u16(reinterpret_cast<uint16_t*>(to + 4), vzip2q_u16(a, b));
}
#endif

// C[j][q] ← scale · Σ_p A2[j][p] · B2[p][q] for NK rows j of A (bf16; row j's pair p at
// a + j · a_stride + p · pair_stride) and NQV vectors of columns q of B2 (pairs, b_stride
// words a row), over `pairs` pairs; with `b2_lo`, a second B2 added (an fp32 operand as
// hi + lo). C's rows are c_stride floats apart. With Into::kRescaleAdd, C ← C · alpha[q] + Σ
// instead; with Into::kAdd, C ← C + Σ (neither scales).
template <int NQV, int NK, Into kInto>
HWY_INLINE void rows_times_pairs(const uint16_t* a, int64_t a_stride, int64_t pair_stride,
                                 const uint32_t* b2, const uint32_t* b2_lo, int64_t pairs,
                                 int64_t b_stride, float* c, int64_t c_stride, float scale,
                                 const float* alpha) {
  constexpr int L = kPairLanes;
  Acc acc[NK][NQV];
  for (int j = 0; j < NK; ++j)
    for (int v = 0; v < NQV; ++v) {
      if constexpr (kInto == Into::kStore) acc[j][v] = acc_zero();
      else if constexpr (kInto == Into::kAdd) acc[j][v] = acc_load(c + j * c_stride + v * L);
      else acc[j][v] = acc_mul(acc_load(c + j * c_stride + v * L), acc_load(alpha + v * L));
    }
  for (int pass = 0; pass < (b2_lo ? 2 : 1); ++pass) {
    const uint32_t* b = pass == 0 ? b2 : b2_lo;
    for (int64_t p = 0; p < pairs; ++p) {
      Pairs x[NQV];
      for (int v = 0; v < NQV; ++v) x[v] = load_pairs(b + p * b_stride + v * L);
      for (int j = 0; j < NK; ++j) {
        const Pairs y = broadcast_pair_bits(a + j * a_stride + p * pair_stride);
        for (int v = 0; v < NQV; ++v) acc[j][v] = dot_pairs(acc[j][v], x[v], y);
      }
    }
  }
  const Acc s = acc_set(scale);
  for (int j = 0; j < NK; ++j)
    for (int v = 0; v < NQV; ++v)
      acc_store(c + j * c_stride + v * L,
                kInto == Into::kStore ? acc_mul(acc[j][v], s) : acc[j][v]);
}

// rows_times_pairs over `rows` rows in blocks of kProductRows (with 4 vectors, 24 accumulators,
// 4 loads and a broadcast: 29 of 32 registers), the remainder by a smaller instantiation.
template <int NQV, Into kInto>
void rows_times_pairs_tile(const uint16_t* a, int64_t a_stride, int64_t pair_stride, int64_t rows,
                           const uint32_t* b2, const uint32_t* b2_lo, int64_t pairs,
                           int64_t b_stride, float* c, int64_t c_stride, float scale,
                           const float* alpha, PrefetchQueue* prefetch) {
  constexpr int NK = kProductRows<NQV>;
  int64_t j = 0;
  for (; j + NK <= rows; j += NK) {
    // A product that adds to C: the next block's rows of C asked for while this one runs (dK
    // and dV outgrow L2; +2.4% of the bf16 peak in the forward + backward at dim 128).
    if constexpr (kInto != Into::kStore) {
      constexpr int kVectorsPerLine = 16 / kPairLanes > 1 ? 16 / kPairLanes : 1;
      if (j + 2 * NK <= rows)
        for (int r = 0; r < NK; ++r)
          for (int v = 0; v < NQV; v += kVectorsPerLine)
            hwy::Prefetch(c + (j + NK + r) * c_stride + v * kPairLanes);
    }
    rows_times_pairs<NQV, NK, kInto>(a + j * a_stride, a_stride, pair_stride, b2, b2_lo, pairs,
                                     b_stride, c + j * c_stride, c_stride, scale, alpha);
    if (prefetch) prefetch->issue_per_call();
  }
  if (j < rows)
    with_count<NK - 1>(static_cast<int>(rows - j), [&](auto nk) {
      rows_times_pairs<NQV, decltype(nk)::value, kInto>(a + j * a_stride, a_stride, pair_stride, b2,
                                                        b2_lo, pairs, b_stride, c + j * c_stride,
                                                        c_stride, scale, alpha);
    });
}

// rows_times_pairs_tile over `columns` columns of B2 and C (whole vectors, zero-padded in B2),
// at most 4 vectors at a time (as the tiles' query vectors): the products whose columns are a
// head dim.
template <Into kInto>
void rows_times_pairs_wide(const uint16_t* a, int64_t a_stride, int64_t pair_stride, int64_t rows,
                           const uint32_t* b2, const uint32_t* b2_lo, int64_t pairs,
                           int64_t b_stride, int64_t columns, float* c, int64_t c_stride) {
  constexpr int kMost = 4, L = kPairLanes;
  for (int64_t e = 0; e < columns; e += kMost * L)
    with_count<kMost>(static_cast<int>(std::min<int64_t>(kMost, (columns - e) / L)), [&](auto n) {
      rows_times_pairs_tile<decltype(n)::value, kInto>(a, a_stride, pair_stride, rows, b2 + e,
                                                       b2_lo ? b2_lo + e : nullptr, pairs, b_stride,
                                                       c + e, c_stride, 1.0f, nullptr, nullptr);
    });
}

// P2[jj/2][q] ← (bf16 P[jj][q], bf16 P[jj + 1][q]) for the pairs of the `keys` rows of P (fp32,
// Mq a row), rounded to nearest even; a last odd row pairs with 0. Writes over P itself (row
// jj/2 ≤ jj is written after rows jj and jj + 1 are read).
template <int NQV>
HWY_INLINE void pairs_of_rows(float* p, int64_t keys, int64_t Mq) {
  constexpr int L = kPairLanes;
  for (int64_t jj = 0; jj < keys; jj += 2)
    for (int v = 0; v < NQV; ++v) {
      const Acc x0 = acc_load(p + jj * Mq + v * L);
      const Acc x1 = jj + 1 < keys ? acc_load(p + (jj + 1) * Mq + v * L) : acc_zero();
      round_pair_words(x0, x1, reinterpret_cast<uint32_t*>(p + jj / 2 * Mq + v * L));
    }
}

// R2[jj/2][e] ← (R[jj][e], R[jj + 1][e]) for the `rows` rows of R (bf16, rs apart) and
// columns e < E, a last odd row paired with 0; R2's rows are r2_stride words apart. Each pair
// of rows interleaved, one 32-bit word per column, the columns in order: what a product that
// reduces over R's rows broadcasts or loads (V's rows for P·V, K's for dQ = dS K).
HWY_INLINE void interleave_row_pairs(const uint16_t* r, int64_t rs, int64_t rows, int64_t E,
                                     uint32_t* r2, int64_t r2_stride) {
  constexpr int64_t C = kInterleavedColumns;
  const int64_t whole = E / C * C;
  for (int64_t jj = 0; jj < rows; jj += 2) {
    const uint16_t* x = r + jj * rs;
    const uint16_t* y = jj + 1 < rows ? x + rs : nullptr;
    uint32_t* to = r2 + jj / 2 * r2_stride;
    for (int64_t e = 0; e < whole; e += C) interleave_columns(x + e, y ? y + e : nullptr, to + e);
    for (int64_t e = whole; e < E; ++e) to[e] = x[e] | (y ? uint32_t{y[e]} << 16 : 0u);
  }
}

// R[j][q] ← bf16 P[j][q] for `rows` rows of Mq floats: rounded to nearest even, in rows of Mq
// bf16 (so that adjacent columns form the pairs of a product that reduces over them).
template <int NQV>
HWY_INLINE void bf16_rows(const float* p, int64_t rows, int64_t Mq, uint16_t* r) {
  constexpr int L = kPairLanes;
  for (int64_t j = 0; j < rows; ++j)
    for (int v = 0; v < NQV; ++v) round_to_bf16(acc_load(p + j * Mq + v * L), r + j * Mq + v * L);
}
#endif  // QKV_BF16_UNITS

}  // namespace products
}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
