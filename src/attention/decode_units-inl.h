// Split-KV decoding's rows kernel on the bf16 dot unit (AVX512-BF16, Arm BF16): RowsOnBf16Dot,
// the unit decode_unit_rows (decode.cpp) runs for bf16 keys and values of head dims that are
// whole blocks (32 on x86-64, 8 on AArch64), fewer than 16 rows per key/value head, in the
// units' pass; written once over the bf16 products' primitives (bf16_products-inl.h). Per
// target, like src/simd/simd-inl.h.
#if defined(QKV_ATTENTION_DECODE_UNITS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_DECODE_UNITS_INL_H_
#undef QKV_ATTENTION_DECODE_UNITS_INL_H_
#else
#define QKV_ATTENTION_DECODE_UNITS_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include <hwy/highway.h>

#include "attention/bf16_products-inl.h"
#include "attention/decode_rows-inl.h"
#include "util/scratch.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace decoding {

#if defined(QKV_BF16_UNITS) && QKV_KERNEL_PASS
inline constexpr bool kRowsOnUnits = true;

// The dot unit (vdpbf16ps, bfdot) adds to each fp32 lane the two products of a pair of bf16
// lanes: two products per instruction, where widening a bf16 vector and an fp32 FMA gave one
// for three instructions. The scores take the query as bf16 (an fp32 query as a sum of two
// bf16, hi + lo, which keeps 16 of its 24 bits) against 2 · kPairLanes key elements per
// instruction, reduced as in key_scores (decode_rows-inl.h). P·V takes P rounded to bf16 (the
// one rounding this path adds: |P − P̃| ≤ 2^-8 P) against pairs of value rows interleaved
// (row_pairs), so each lane sums two keys; the interleave orders a block's columns as
// pair_lane_column says, undone once per unit. Used where the head dims are whole blocks and
// up to 15 rows share a kv head.

using products::Acc;
using products::dot_pairs;
using products::load_pairs;
using products::Pairs;
inline constexpr int64_t kUnitBlock = 2 * products::kPairLanes;  // bf16 elements per Pairs vector
// (The plan runs rows on this unit where both head dims are whole blocks: plan.h's constant.)
static_assert(kUnitBlock == kBf16UnitBlock, "plan.h's kBf16UnitBlock is not this unit's block");

inline void columns_from_lanes(float* o, int64_t Dv) {
  float tmp[kUnitBlock];
  for (int64_t e0 = 0; e0 < Dv; e0 += kUnitBlock) {
    for (int64_t p = 0; p < kUnitBlock; ++p) tmp[products::pair_lane_column(p)] = o[e0 + p];
    std::copy(tmp, tmp + kUnitBlock, o + e0);
  }
}

// The queries q (fp32; `count` whole vectors) as bf16 hi and, with `two`, lo = q − hi (exact
// in fp32), each rounded to nearest even.
// (Every split-KV unit splits its queries again: vector code, not scalar.)
inline void split_queries(const float* q, int64_t count, bool two, uint16_t* hi, uint16_t* lo) {
  for (int64_t i = 0; i < count; i += products::kPairLanes) {
    const Vf x = hn::LoadU(df, q + i);
    products::round_to_bf16(x.raw, hi + i);
    if (two)
      products::round_to_bf16(
          hn::Sub(x, simd::load_widened(reinterpret_cast<const Bf16*>(hi + i))).raw, lo + i);
  }
}

// part[r][jj + j] ← the partial dot products of RG query rows with KG key rows.
template <int RG, int KG, bool kTwo>
HWY_INLINE void key_dots_units(const uint16_t* qh, const uint16_t* ql, int64_t D, const Bf16* k,
                               int64_t ks, PartialDots* part, int64_t jj) {
  Acc acc[RG][KG];
  for (int r = 0; r < RG; ++r)
    for (int j = 0; j < KG; ++j) acc[r][j] = products::acc_zero();
  for (int64_t d = 0; d < D; d += kUnitBlock) {
    Pairs kv[KG];
    for (int j = 0; j < KG; ++j) kv[j] = load_pairs(k + j * ks + d);
    for (int r = 0; r < RG; ++r) {
      const Pairs h = load_pairs(qh + r * D + d);
      for (int j = 0; j < KG; ++j) acc[r][j] = dot_pairs(acc[r][j], h, kv[j]);
      if constexpr (kTwo) {
        const Pairs l = load_pairs(ql + r * D + d);
        for (int j = 0; j < KG; ++j) acc[r][j] = dot_pairs(acc[r][j], l, kv[j]);
      }
    }
  }
  for (int r = 0; r < RG; ++r)
    for (int j = 0; j < KG; ++j) part[r][jj + j] = Vf{acc[r][j]};
}

// key_scores on the units: s[r · s_stride + jj] ← scale · q_r · k_jj for nk ≤ N keys.
template <bool kTwo>
void block_scores_units(const uint16_t* qh, const uint16_t* ql, int64_t R, int64_t D, float scale,
                        const Bf16* k, int64_t ks, int64_t nk, const Bf16* ahead,
                        int64_t ahead_rows, float* s, int64_t s_stride) {
  constexpr int64_t N = hn::MaxLanes(df);
  PartialDots part[kTiledDecodeMinRows];
  const auto keys_from = [&](int64_t jj, auto keys) {
    constexpr int KG = decltype(keys)::value;
    for (int j = 0; j < KG; ++j)
      if (jj + j < ahead_rows) prefetch_row(ahead + (jj + j) * ks, ks, D);
    for (int64_t r = 0; r < R; r += kGroupRows)
      simd::with_count<kGroupRows>(static_cast<int>(std::min<int64_t>(kGroupRows, R - r)),
                                   [&](auto rows) {
                                     key_dots_units<decltype(rows)::value, KG, kTwo>(
                                         qh + r * D, ql + r * D, D, k + jj * ks, ks, part + r, jj);
                                   });
  };
  int64_t jj = 0;
  for (; jj + 2 <= nk; jj += 2) keys_from(jj, std::integral_constant<int, 2>{});
  if (jj < nk) keys_from(jj, std::integral_constant<int, 1>{});
  const Vf vscale = hn::Set(df, scale);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t lane = nk; lane < N; ++lane) part[r][lane] = hn::Zero(df);
    hn::StoreU(hn::Mul(lane_sums(part[r]), vscale), df, s + r * s_stride);
  }
}

#if HWY_ARCH_X86
inline constexpr bool kGroupScores = true;
using products::as_pairs;

// From 3 rows on, the scores of 4 rows at a time with no reduction per key: a vector holds
// 4 rows × 4 pairs of elements (q_r[d + 2i], q_r[d + 2i + 1]) in its 128-bit blocks, and a
// key's 8 elements k[d, d + 8) are broadcast to every block, so one vdpbf16ps adds 4 rows' 8
// products into the lanes of that key's accumulator; at the end each block sums its 4 lanes.
// (Faster than block_scores_units, which reduces 16 lanes per row and key, from 3 rows on.)
inline constexpr int kGroupKeys = 8;  // keys (accumulators) per pass

// The 4 rows of group g of queries q (R × D, bf16) packed as above: D / 8 vectors of 32.
inline void pack_row_groups(const uint16_t* q, int64_t R, int64_t D, uint16_t* packed) {
  const int64_t groups = (R + 3) / 4;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t d = 0; d < D; d += 8)
      for (int64_t r = 0; r < 4; ++r) {
        uint16_t* to = packed + (g * D / 8 + d / 8) * 32 + r * 8;
        if (4 * g + r < R) std::copy(q + (4 * g + r) * D + d, q + (4 * g + r) * D + d + 8, to);
        else std::fill(to, to + 8, uint16_t{0});
      }
}

// acc[j] (j < KG) ← the 4 rows' lane products with key j, over the head dim.
template <int KG, bool kTwo>
HWY_INLINE void group_dots(const uint16_t* qh, const uint16_t* ql, int64_t D, const Bf16* k,
                           int64_t ks, __m512* acc) {
  for (int j = 0; j < KG; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 8) {
    const __m512bh h = load_pairs(qh + d * 4);
    __m512bh l;
    if constexpr (kTwo) l = load_pairs(ql + d * 4);
    for (int j = 0; j < KG; ++j) {
      const __m512bh kb = as_pairs(_mm512_broadcast_i32x4(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(k + j * ks + d))));
      acc[j] = _mm512_dpbf16_ps(acc[j], h, kb);
      if constexpr (kTwo) acc[j] = _mm512_dpbf16_ps(acc[j], l, kb);
    }
  }
}

// Block b of each of acc[0, 4) summed: lane i of block b of the result is Σ of block b of acc[i].
HWY_INLINE __m512 block_sums(const __m512* acc) {
  const auto pair_sums = [](__m512 x, __m512 y) {  // per block: x0+x1, x2+x3, y0+y1, y2+y3
    return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x88), _mm512_shuffle_ps(x, y, 0xdd));
  };
  return pair_sums(pair_sums(acc[0], acc[1]), pair_sums(acc[2], acc[3]));
}

// s[r · s_stride + jj] ← scale · q_r · k_jj for the R ≥ 3 rows and nk ≤ 16 keys, 4 rows at a
// time; packed_h / packed_l: the queries by pack_row_groups.
template <bool kTwo>
void group_scores_units(const uint16_t* packed_h, const uint16_t* packed_l, int64_t R, int64_t D,
                        float scale, const Bf16* k, int64_t ks, int64_t nk, const Bf16* ahead,
                        int64_t ahead_rows, float* s, int64_t s_stride) {
  for (int64_t j = 0; j < nk; ++j)
    if (j < ahead_rows) prefetch_row(ahead + j * ks, ks, D);
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t g = 0; g * 4 < R; ++g) {
    const uint16_t* qh = packed_h + g * D * 4;
    const uint16_t* ql = packed_l + g * D * 4;
    __m512 acc[16];
    for (int64_t j0 = 0; j0 < 16; j0 += kGroupKeys) {
      const int count = static_cast<int>(std::clamp<int64_t>(nk - j0, 0, kGroupKeys));
      if (count == 0) {
        for (int j = 0; j < kGroupKeys; ++j) acc[j0 + j] = _mm512_setzero_ps();
        continue;
      }
      simd::with_count<kGroupKeys>(count, [&](auto keys) {
        constexpr int KG = decltype(keys)::value;
        group_dots<KG, kTwo>(qh, ql, D, k + j0 * ks, ks, acc + j0);
        for (int j = KG; j < kGroupKeys; ++j) acc[j0 + j] = _mm512_setzero_ps();
      });
    }
    // u[t]: block r holds row r's scores of keys 4t … 4t + 3; then rows from blocks.
    __m512 u[4];
    for (int t = 0; t < 4; ++t) u[t] = block_sums(acc + 4 * t);
    const __m512 v0 = _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 v1 = _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 v2 = _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 v3 = _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 rows[4] = {_mm512_shuffle_f32x4(v0, v2, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_f32x4(v0, v2, _MM_SHUFFLE(3, 1, 3, 1)),
                            _mm512_shuffle_f32x4(v1, v3, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_f32x4(v1, v3, _MM_SHUFFLE(3, 1, 3, 1))};
    for (int64_t r = 0; r < 4 && 4 * g + r < R; ++r)
      _mm512_storeu_ps(s + (4 * g + r) * s_stride, _mm512_mul_ps(rows[r], vscale));
  }
}

#else
inline constexpr bool kGroupScores = false;  // the 4-rows-per-vector layout is AVX-512's
inline void pack_row_groups(const uint16_t*, int64_t, int64_t, uint16_t*) {}
template <bool kTwo>
void group_scores_units(const uint16_t*, const uint16_t*, int64_t, int64_t, float, const Bf16*,
                        int64_t, int64_t, const Bf16*, int64_t, float*, int64_t) {}
#endif  // HWY_ARCH_X86

// o_r[e0, e0 + kUnitBlock W) += Σ_jj p̃_r[jj] v_jj over nk value rows, two rows per
// instruction: pp holds each row's P̃ as pairs (bf16 p̃[2t] in the low half of word t,
// p̃[2t + 1] in the high), o the columns in lane order.
template <int RG, int W>
void block_values_units(const uint32_t* pp, int64_t pp_stride, const Bf16* v, int64_t vs,
                        int64_t nk, int64_t e0, float* const* o, const Bf16* ahead,
                        int64_t ahead_rows, int64_t Dv) {
  constexpr int64_t L = products::kPairLanes;
  Acc lo[RG][W], hi[RG][W];
  for (int r = 0; r < RG; ++r)
    for (int w = 0; w < W; ++w) {
      lo[r][w] = products::acc_load(o[r] + e0 + w * kUnitBlock);
      hi[r][w] = products::acc_load(o[r] + e0 + w * kUnitBlock + L);
    }
  const auto* bits = reinterpret_cast<const uint16_t*>(v);
  for (int64_t jj = 0; jj < nk; jj += 2) {
    const bool second = jj + 1 < nk;  // an odd count: the last row pairs with zeros
    for (int64_t t = jj; t < std::min(jj + 2, ahead_rows); ++t)
      prefetch_row(ahead + t * vs, vs, Dv);
    Pairs x_lo[W], x_hi[W];
    for (int w = 0; w < W; ++w) {
      const uint16_t* a = bits + jj * vs + e0 + w * kUnitBlock;
      products::row_pairs(a, second ? a + vs : nullptr, x_lo[w], x_hi[w]);
    }
    for (int r = 0; r < RG; ++r) {
      const Pairs p = products::broadcast_pair_bits(pp + r * pp_stride + jj / 2);
      for (int w = 0; w < W; ++w) {
        lo[r][w] = dot_pairs(lo[r][w], x_lo[w], p);
        hi[r][w] = dot_pairs(hi[r][w], x_hi[w], p);
      }
    }
  }
  for (int r = 0; r < RG; ++r)
    for (int w = 0; w < W; ++w) {
      products::acc_store(o[r] + e0 + w * kUnitBlock, lo[r][w]);
      products::acc_store(o[r] + e0 + w * kUnitBlock + L, hi[r][w]);
    }
}

// The rows kernel's unit for bf16 rows: the queries split into bf16 hi (+ lo) and, from 3 rows
// on, packed 4 rows to a vector; scores scaled after the products; each row's P rounded into
// bf16 pairs; the outputs' columns in lane order until finish() puts them back.
struct RowsOnBf16Dot {
  static constexpr bool kScalesScores = true;
  static int64_t paired(const ElementSource<Bf16>&) { return 0; }  // queries in natural order
  const uint16_t *qh = nullptr, *ql = nullptr;
  uint32_t* pp = nullptr;
  int64_t pp_stride = 0, D = 0;
  bool two = false, groups = false;

  // q: R rows of D (unscaled); count: the keys of the unit, hi − lo.
  void prepare(const ElementSource<Bf16>&, const float* q, int64_t R, int64_t dim, bool two_terms,
               int64_t count) {
    D = dim, two = two_terms, groups = kGroupScores && R >= 3;
    auto* q16 = reinterpret_cast<uint16_t*>(thread_scratch(ForwardSlot::q_tiles, R * D));
    uint16_t *hi = q16, *lo = q16 + R * D;
    split_queries(q, R * D, two, hi, lo);
    qh = hi, ql = lo;
    if (groups) {
      const int64_t size = (R + 3) / 4 * 4 * D;
      auto* packed = reinterpret_cast<uint16_t*>(thread_scratch(ForwardSlot::out_tiles, size));
      pack_row_groups(hi, R, D, packed);
      if (two) pack_row_groups(lo, R, D, packed + size);
      qh = packed, ql = packed + size;
    }
    const int64_t pairs = (count + 1) / 2;
    pp_stride = (pairs + 15) / 16 * 16;
    pp = reinterpret_cast<uint32_t*>(thread_scratch(ForwardSlot::softmax_state, R * pp_stride));
  }

  void scores(const ElementSource<Bf16>& K, const float*, int64_t R, const Bf16* k, int64_t nk,
              int64_t ahead_rows, float scale, float* s, int64_t stride) {
    const Bf16* ahead = k + kPrefetchRows * K.step;
    const auto run = groups ? (two ? group_scores_units<true> : group_scores_units<false>)
                            : (two ? block_scores_units<true> : block_scores_units<false>);
    run(qh, ql, R, D, scale, k, K.step, nk, ahead, ahead_rows, s, stride);
  }

  // Row r's P̃ as bf16 pairs (rounded to nearest even); p holds `count` probabilities, then 0
  // to the next whole vector.
  void probabilities(const float* p, int64_t count, int64_t r) {
    auto* to = reinterpret_cast<uint16_t*>(pp + r * pp_stride);
    for (int64_t j = 0; j < count; j += products::kPairLanes)  // an odd count's last pair: (p̃, 0)
      products::round_to_bf16(products::acc_load(p + j), to + j);
  }

  void values(const ElementSource<Bf16>& V, const float*, int64_t, int64_t j, int64_t nk,
              const Bf16* v, int64_t ahead_rows, int64_t R, float* const* o) {
    const Bf16* next = ahead_rows > 0 ? v + kPrefetchRows * V.step : nullptr;
    const int64_t Dv = V.dim;
    for_row_groups(R, [&](int64_t r, auto rows) {
      constexpr int RG = decltype(rows)::value, W = RG <= 2 ? 4 : 2;
      const uint32_t* p = pp + r * pp_stride + j / 2;
      int64_t e = 0;
      for (; e + W * kUnitBlock <= Dv; e += W * kUnitBlock, next = nullptr, ahead_rows = 0)
        block_values_units<RG, W>(p, pp_stride, v, V.step, nk, e, o + r, next, ahead_rows, Dv);
      for (; e < Dv; e += kUnitBlock, next = nullptr, ahead_rows = 0)
        block_values_units<RG, 1>(p, pp_stride, v, V.step, nk, e, o + r, next, ahead_rows, Dv);
    });
  }

  void finish(const ElementSource<Bf16>& V, float* const* o, int64_t R) {
    for (int64_t r = 0; r < R; ++r) columns_from_lanes(o[r], V.dim);
  }
};
#else
inline constexpr bool kRowsOnUnits = false;
struct RowsOnBf16Dot;  // (the units' pass only)
#endif  // QKV_BF16_UNITS

}  // namespace decoding
}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
