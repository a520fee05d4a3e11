// The tile products of the tiled kernels on the bf16 units (AVX512-BF16), for the
// translation units that compile a kernel file with QKV_BF16_UNITS (src/simd/units-inl.h).
//
// vdpbf16ps adds to each fp32 lane the two products of a pair of bf16 lanes. The tiled
// kernels' products reduce over d (S = K Qᵀ) and over keys (Oᵀ += Vᵀ P); their packed operand
// therefore holds pairs along the reduced dimension — Qt2[d/2][q] = (q[2i], q[2i + 1]) and
// P2[j/2][q] = (p[2j], p[2j + 1]), one 32-bit lane per query — and the other operand's pair is
// a 32-bit broadcast from where it lies (a K row; a row of Vt, V transposed in bf16). One
// instruction does the work of two FMAs and no element is widened.
#if defined(QKV_ATTENTION_BF16_PRODUCTS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_BF16_PRODUCTS_INL_H_
#undef QKV_ATTENTION_BF16_PRODUCTS_INL_H_
#else
#define QKV_ATTENTION_BF16_PRODUCTS_INL_H_
#endif

#include <cstdint>
#include <cstring>

#include <hwy/highway.h>

#include "simd/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::simd {
namespace HWY_NAMESPACE {

// (The intrinsics come with Highway's x86 headers; only the bf16 units' AVX3 pass compiles
// this, not their other passes.)
#if defined(QKV_BF16_UNITS) && QKV_KERNEL_PASS
HWY_INLINE __m512bh as_pairs(__m512i x) { return (__m512bh)x; }
HWY_INLINE __m512bh load_pairs(const void* p) { return as_pairs(_mm512_loadu_si512(p)); }
// Every lane = the 32 bits at p (a pair of bf16).
HWY_INLINE __m512bh broadcast_pair_bits(const void* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  return as_pairs(_mm512_set1_epi32(static_cast<int>(bits)));
}

// C[j][q] ← scale · Σ_p A2[j][p] · B2[p][q] for NK rows j of A (bf16; row j's pair p at
// a + j · a_stride + p · pair_stride) and NQV vectors of 16 queries of B2 (pairs, `Mq` lanes a
// row), over `pairs` pairs; with `b2_lo`, a second B2 added (an fp32 operand as hi + lo). With
// kRescaleAdd, C ← C · alpha[q] + Σ instead (no scale).
template <int NQV, int NK, bool kRescaleAdd>
HWY_INLINE void rows_times_pairs(const uint16_t* a, int64_t a_stride, int64_t pair_stride,
                                 const uint32_t* b2,
                                 const uint32_t* b2_lo, int64_t pairs, int64_t Mq, float* c,
                                 float scale, const float* alpha) {
  __m512 acc[NK][NQV];
  for (int j = 0; j < NK; ++j)
    for (int v = 0; v < NQV; ++v)
      acc[j][v] = kRescaleAdd ? _mm512_mul_ps(_mm512_loadu_ps(c + j * Mq + v * 16),
                                              _mm512_loadu_ps(alpha + v * 16))
                              : _mm512_setzero_ps();
  for (int pass = 0; pass < (b2_lo ? 2 : 1); ++pass) {
    const uint32_t* b = pass == 0 ? b2 : b2_lo;
    for (int64_t p = 0; p < pairs; ++p) {
      __m512bh x[NQV];
      for (int v = 0; v < NQV; ++v) x[v] = load_pairs(b + p * Mq + v * 16);
      for (int j = 0; j < NK; ++j) {
        const __m512bh y = broadcast_pair_bits(a + j * a_stride + p * pair_stride);
        for (int v = 0; v < NQV; ++v) acc[j][v] = _mm512_dpbf16_ps(acc[j][v], x[v], y);
      }
    }
  }
  const __m512 s = _mm512_set1_ps(scale);
  for (int j = 0; j < NK; ++j)
    for (int v = 0; v < NQV; ++v)
      _mm512_storeu_ps(c + j * Mq + v * 16, kRescaleAdd ? acc[j][v] : _mm512_mul_ps(acc[j][v], s));
}

// rows_times_pairs over `rows` rows in blocks of kProductRows (24 accumulators, NQV loads and a
// broadcast: 29 of 32 registers), the remainder by a smaller instantiation.
template <int NQV, bool kRescaleAdd>
void rows_times_pairs_tile(const uint16_t* a, int64_t a_stride, int64_t pair_stride, int64_t rows,
                           const uint32_t* b2,
                           const uint32_t* b2_lo, int64_t pairs, int64_t Mq, float* c, float scale,
                           const float* alpha, PrefetchQueue* prefetch) {
  constexpr int NK = kProductRows<NQV>;
  int64_t j = 0;
  for (; j + NK <= rows; j += NK) {
    rows_times_pairs<NQV, NK, kRescaleAdd>(a + j * a_stride, a_stride, pair_stride, b2, b2_lo,
                                           pairs, Mq, c + j * Mq, scale, alpha);
    if (prefetch) prefetch->issue_per_call();
  }
  if (j < rows)
    with_count<NK - 1>(static_cast<int>(rows - j), [&](auto nk) {
      rows_times_pairs<NQV, decltype(nk)::value, kRescaleAdd>(a + j * a_stride, a_stride,
                                                              pair_stride, b2, b2_lo, pairs, Mq,
                                                              c + j * Mq, scale, alpha);
    });
}

// P2[jj/2][q] ← (bf16 P[jj][q], bf16 P[jj + 1][q]) for the pairs of the `keys` rows of P (fp32,
// Mq a row), rounded to nearest even; a last odd row pairs with 0. Writes over P itself (row
// jj/2 ≤ jj is written after rows jj and jj + 1 are read).
template <int NQV>
HWY_INLINE void pairs_of_rows(float* p, int64_t keys, int64_t Mq) {
  for (int64_t jj = 0; jj < keys; jj += 2) {
    for (int v = 0; v < NQV; ++v) {
      const __m512 x0 = _mm512_loadu_ps(p + jj * Mq + v * 16);
      const __m512 x1 = jj + 1 < keys ? _mm512_loadu_ps(p + (jj + 1) * Mq + v * 16)
                                      : _mm512_setzero_ps();
      const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x0));
      const __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x1));
      _mm512_storeu_si512(p + jj / 2 * Mq + v * 16, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}
// V2[jj/2][e] ← (V[jj][e], V[jj + 1][e]) for the `keys` rows of V (bf16, vs apart, Dv a
// multiple of 32), a last odd row paired with 0: each pair of value rows interleaved, one
// 32-bit word per column, the columns in order — what P·V broadcasts (the pair of column e of
// key pair jp is word jp · Dv + e).
HWY_INLINE void interleave_row_pairs(const uint16_t* v, int64_t vs, int64_t keys, int64_t Dv,
                                     uint32_t* v2) {
  // The unpacks interleave within 128-bit blocks: the low one holds columns 0–3 of each 8, the
  // high one 4–7; these indices put the words back in column order.
  alignas(64) static constexpr int32_t kFirst[16] = {0, 1, 2, 3, 16, 17, 18, 19,
                                                      4, 5, 6, 7, 20, 21, 22, 23};
  alignas(64) static constexpr int32_t kSecond[16] = {8,  9,  10, 11, 24, 25, 26, 27,
                                                       12, 13, 14, 15, 28, 29, 30, 31};
  const __m512i first = _mm512_load_si512(kFirst), second = _mm512_load_si512(kSecond);
  for (int64_t jj = 0; jj < keys; jj += 2)
    for (int64_t e = 0; e < Dv; e += 32) {
      const __m512i a = _mm512_loadu_si512(v + jj * vs + e);
      const __m512i b = jj + 1 < keys ? _mm512_loadu_si512(v + (jj + 1) * vs + e)
                                      : _mm512_setzero_si512();
      const __m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);
      uint32_t* to = v2 + jj / 2 * Dv + e;
      _mm512_storeu_si512(to, _mm512_permutex2var_epi32(lo, first, hi));
      _mm512_storeu_si512(to + 16, _mm512_permutex2var_epi32(lo, second, hi));
    }
}
#endif  // QKV_BF16_UNITS

}  // namespace HWY_NAMESPACE
}  // namespace qkv::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
