// The product units of a tile of decoding's rows (decode_unit_tiled in decode.cpp): how the
// queries of a tile are packed, how key rows meet them (S = K Qt) and how P meets the value
// rows (Oᵀ ← alpha Oᵀ + Vᵀ P). One interface, a unit per instruction family:
//   TileUnit<false>  every element widened to fp32, fused multiply-adds (products-inl.h);
//   TileUnit<true>   bf16 pairs on the bf16 dot unit (vdpbf16ps, bfdot; bf16_products-inl.h),
//                    in the units' pass only: queries as bf16 pairs along the head dim (hi + lo
//                    unless they are bf16), V's rows interleaved in pairs, P rounded to bf16.
// A new unit (AMX tiles) is one more specialization. Per target, like src/simd/simd-inl.h.
#if defined(QKV_ATTENTION_TILE_UNITS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_TILE_UNITS_INL_H_
#undef QKV_ATTENTION_TILE_UNITS_INL_H_
#else
#define QKV_ATTENTION_TILE_UNITS_INL_H_
#endif

#include <cstdint>

#include <hwy/highway.h>

#include "attention/bf16_packing-inl.h"
#include "attention/bf16_products-inl.h"
#include "attention/products-inl.h"
#include "attention/tiles-inl.h"
#include "simd/transpose-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace tiles {

template <bool kBf16Dot>
struct TileUnit;

template <>
struct TileUnit<false> {
  static constexpr bool kBf16Dot = false;
  static constexpr bool kScalesScores = false;  // the queries are packed already scaled
  // Qt [D][Mq] ← rows [row0, row0 + rows) of q (R × D, fp32).
  static void pack_queries(const float* q, int64_t R, int64_t row0, int64_t rows, int64_t D,
                           int64_t Mq, bool /*two*/, float* Qt) {
    (void)R;
    simd::pack_transposed(q + row0 * D, D, rows, D, 1.0f, Qt, Mq);
  }
  // Vt [Dv][kKeyTile] ← nk value rows (vs apart).
  template <class T>
  static void pack_values(const T* v, int64_t vs, int64_t nk, int64_t Dv, float* Vt) {
    simd::pack_transposed(v, vs, nk, Dv, 1.0f, Vt, kKeyTile);
  }
  // S [nk][Mq] ← K Qt for nk key rows (ks apart).
  template <int NQV, class T>
  static void scores(const T* k, int64_t ks, int64_t nk, const float* Qt, int64_t D, int64_t Mq,
                     bool /*two*/, float /*scale*/, float* S, simd::PrefetchQueue* prefetch) {
    simd::scores_tile<NQV>(k, ks, nk, Qt, D, Mq, S, prefetch);
  }
  // Ot [Dv][Mq] ← alpha Ot + Vtᵀ P for the nk rows of P = S.
  template <int NQV>
  static void accumulate(float* S, int64_t nk, int64_t Mq, const float* Vt, int64_t Dv,
                         const float* alpha, float* Ot, simd::PrefetchQueue* prefetch) {
    simd::accumulate_tile<NQV>(S, nk, Mq, Vt, kKeyTile, Dv, alpha, Ot, prefetch);
  }
};

#if defined(QKV_BF16_UNITS) && QKV_KERNEL_PASS
template <>
struct TileUnit<true> {
  static constexpr bool kBf16Dot = true;
  static constexpr bool kScalesScores = true;  // queries packed unscaled, scores scaled after
  // Qt2 [D/2][Mq] words of bf16 pairs (hi; with `two`, lo after it).
  static void pack_queries(const float* q, int64_t R, int64_t row0, int64_t rows, int64_t D,
                           int64_t Mq, bool two, float* Qt) {
    pack_pairs_transposed(View(const_cast<float*>(q), {1, 1, R, D}), 0, 0, row0, rows, D, Mq,
                          reinterpret_cast<uint32_t*>(Qt), two);
  }
  // V2 [nk/2][Dv] words: pairs of value rows interleaved.
  template <class T>
  static void pack_values(const T* v, int64_t vs, int64_t nk, int64_t Dv, float* Vt) {
    simd::interleave_row_pairs(reinterpret_cast<const uint16_t*>(v), vs, nk, Dv,
                               reinterpret_cast<uint32_t*>(Vt), Dv);
  }
  template <int NQV, class T>
  static void scores(const T* k, int64_t ks, int64_t nk, const float* Qt, int64_t D, int64_t Mq,
                     bool two, float scale, float* S, simd::PrefetchQueue* prefetch) {
    const auto* q2 = reinterpret_cast<const uint32_t*>(Qt);
    simd::rows_times_pairs_tile<NQV, simd::Into::kStore>(
        reinterpret_cast<const uint16_t*>(k), ks, 2, nk, q2, two ? q2 + D / 2 * Mq : nullptr,
        D / 2, Mq, S, Mq, scale, nullptr, prefetch);
  }
  // P rounded into bf16 pairs in place, then Oᵀ ← alpha Oᵀ + V2ᵀ P2.
  template <int NQV>
  static void accumulate(float* S, int64_t nk, int64_t Mq, const float* Vt, int64_t Dv,
                         const float* alpha, float* Ot, simd::PrefetchQueue* prefetch) {
    simd::pairs_of_rows<NQV>(S, nk, Mq);
    simd::rows_times_pairs_tile<NQV, simd::Into::kRescaleAdd>(
        reinterpret_cast<const uint16_t*>(Vt), 2, 2 * Dv, Dv, reinterpret_cast<const uint32_t*>(S),
        nullptr, (nk + 1) / 2, Mq, Ot, Mq, 1.0f, alpha, prefetch);
  }
};
#endif  // QKV_BF16_UNITS

}  // namespace tiles
}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
