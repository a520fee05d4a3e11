// The product units of a query tile, for the tiled forward (flash_forward.cpp) and for
// decoding's tiles of rows (decode_unit_tiled in decode.cpp): how the queries of a tile are
// packed, how key rows meet them (S = K Qt) and how P meets the value rows
// (Oᵀ ← alpha Oᵀ + Vᵀ P), over a whole key tile or over a masked one's visible blocks
// (tile_scores, tile_accumulate). One interface, a unit per instruction family:
//   TileUnit<false>  every element widened to fp32, fused multiply-adds (products-inl.h);
//   TileUnit<true>   bf16 pairs on the bf16 dot unit (vdpbf16ps, bfdot; bf16_products-inl.h),
//                    in the units' pass only: queries as bf16 pairs along the head dim (hi + lo
//                    unless they are bf16), V's rows interleaved in pairs, P rounded to bf16.
//   AmxUnit<Tiles>   AMX-BF16 tiles (amx_unit-inl.h), chosen by the plan (plan.h) for bf16 K
//                    and V, on the instructions or on their stand-in.
// A unit's begin() and end() bracket a unit of work on one thread (AMX: the tiles'
// configuration). Per target, like src/simd/simd-inl.h.
#if defined(QKV_ATTENTION_TILE_UNITS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_TILE_UNITS_INL_H_
#undef QKV_ATTENTION_TILE_UNITS_INL_H_
#else
#define QKV_ATTENTION_TILE_UNITS_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include <hwy/highway.h>

#include "attention/amx_unit-inl.h"
#include "attention/bf16_packing-inl.h"
#include "attention/bf16_products-inl.h"
#include "attention/products-inl.h"
#include "attention/tiles-inl.h"
#include "qkv/tensor.h"
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
  static void begin() {}
  static void end() {}
  // Qt [D][Mq] ← scale · rows [i0, i0 + rows) of q(b, h)ᵀ, zero in the lanes past them.
  static void pack_queries(const View& q, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t D,
                           int64_t Mq, float scale, bool /*two*/, float* Qt) {
    if (q.stride[3] == 1)
      return with_typed(q, b, h, i0, 0, [&](auto* q0) {
        simd::pack_transposed(q0, q.stride[2], rows, D, scale, Qt, Mq);
      });
    for (int64_t d = 0; d < D; ++d)
      for (int64_t r = 0; r < Mq; ++r)
        Qt[d * Mq + r] = r < rows ? scale * q.get(b, h, i0 + r, d) : 0;
  }
  // Vt [Dv][kKeyTile] ← nk value rows (vs apart).
  template <class T>
  static void pack_values(const T* v, int64_t vs, int64_t nk, int64_t Dv, float* Vt) {
    simd::pack_transposed(v, vs, nk, Dv, 1.0f, Vt, kKeyTile);
  }
  // The packed values from key row jj of the tile on.
  static const float* values_from(const float* Vt, int64_t jj, int64_t /*Dv*/) { return Vt + jj; }
  // S [nk][Mq] ← K Qt for nk key rows (ks apart).
  template <int NQV, class T>
  static void scores(const T* k, int64_t ks, int64_t nk, const float* Qt, int64_t D, int64_t Mq,
                     bool /*two*/, float /*scale*/, float* S, products::PrefetchQueue* prefetch) {
    products::scores_tile<NQV>(k, ks, nk, Qt, D, Mq, S, prefetch);
  }
  // Ot [Dv][Mq] ← alpha Ot + Vtᵀ P for the nk rows of P = S.
  template <int NQV>
  static void accumulate(float* S, int64_t nk, int64_t Mq, const float* Vt, int64_t Dv,
                         const float* alpha, float* Ot, products::PrefetchQueue* prefetch) {
    products::accumulate_tile<NQV>(S, nk, Mq, Vt, kKeyTile, Dv, alpha, Ot, prefetch);
  }
};

#if defined(QKV_BF16_UNITS) && QKV_KERNEL_PASS
template <>
struct TileUnit<true> {
  static constexpr bool kBf16Dot = true;
  static constexpr bool kScalesScores = true;  // queries packed unscaled, scores scaled after
  static void begin() {}
  static void end() {}
  // Qt2 [D/2][Mq] words of bf16 pairs of q, unscaled (hi; with `two`, lo after it).
  static void pack_queries(const View& q, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t D,
                           int64_t Mq, float /*scale*/, bool two, float* Qt) {
    pack_pairs_transposed(q, b, h, i0, rows, D, Mq, reinterpret_cast<uint32_t*>(Qt), two);
  }
  // V2 [nk/2][Dv] words: pairs of value rows interleaved.
  template <class T>
  static void pack_values(const T* v, int64_t vs, int64_t nk, int64_t Dv, float* Vt) {
    products::interleave_row_pairs(reinterpret_cast<const uint16_t*>(v), vs, nk, Dv,
                                   reinterpret_cast<uint32_t*>(Vt), Dv);
  }
  // From key row jj (even) on: pair jj / 2.
  static const float* values_from(const float* Vt, int64_t jj, int64_t Dv) {
    return Vt + jj / 2 * Dv;
  }
  template <int NQV, class T>
  static void scores(const T* k, int64_t ks, int64_t nk, const float* Qt, int64_t D, int64_t Mq,
                     bool two, float scale, float* S, products::PrefetchQueue* prefetch) {
    const auto* q2 = reinterpret_cast<const uint32_t*>(Qt);
    products::rows_times_pairs_tile<NQV, products::Into::kStore>(
        reinterpret_cast<const uint16_t*>(k), ks, 2, nk, q2, two ? q2 + D / 2 * Mq : nullptr, D / 2,
        Mq, S, Mq, scale, nullptr, prefetch);
  }
  // P rounded into bf16 pairs in place, then Oᵀ ← alpha Oᵀ + V2ᵀ P2.
  template <int NQV>
  static void accumulate(float* S, int64_t nk, int64_t Mq, const float* Vt, int64_t Dv,
                         const float* alpha, float* Ot, products::PrefetchQueue* prefetch) {
    products::pairs_of_rows<NQV>(S, nk, Mq);
    products::rows_times_pairs_tile<NQV, products::Into::kRescaleAdd>(
        reinterpret_cast<const uint16_t*>(Vt), 2, 2 * Dv, Dv, reinterpret_cast<const uint32_t*>(S),
        nullptr, (nk + 1) / 2, Mq, Ot, Mq, 1.0f, alpha, prefetch);
  }
};
#endif  // QKV_BF16_UNITS

// S ← K Qt over a key tile of nk rows: whole, or for a masked tile block by block over its
// visible blocks only (hidden blocks are left unwritten, and never read).
template <int NQV, class Unit, class T>
void tile_scores(bool masked, const VisibleBlocks& blocks, const T* k, int64_t ks, int64_t nk,
                 const float* Qt, int64_t D, int64_t Mq, bool two, float scale, float* S,
                 products::PrefetchQueue* prefetch) {
  if (!masked) return Unit::template scores<NQV>(k, ks, nk, Qt, D, Mq, two, scale, S, prefetch);
  const int64_t N = static_cast<int64_t>(simd::lanes());
  for (int c = 0; c < blocks.chunks; ++c) {
    if (blocks.first[c] == blocks.last[c]) continue;
    const int64_t jj = c * kKeyChunk, v0 = blocks.first[c];
    simd::with_count<NQV>(blocks.last[c] - blocks.first[c], [&](auto count) {
      // A packed query lane is 4 bytes on every unit: lane v0 · N is Qt + v0 · N.
      Unit::template scores<decltype(count)::value>(k + jj * ks, ks, blocks.keys_in(c, nk),
                                                    Qt + v0 * N, D, Mq, two, scale,
                                                    S + jj * Mq + v0 * N, prefetch);
    });
  }
}

// Ot ← alpha Ot + Vᵀ P over a key tile of nk rows: whole, or for a masked tile over its visible
// blocks only (a hidden one would add 0 · V), the query vectors that see the same chunks
// together over all of those chunks' keys at once. (Chunk by chunk, each call ran 16 keys deep
// and loading and storing its accumulators cost about as much as its products: with a window
// of 512 the forward is 1.6–1.8% faster this way.) A query vector that sees no key of the tile
// keeps its running max: its alpha is exactly 1, its Ot stays.
template <int NQV, class Unit>
void tile_accumulate(bool masked, const VisibleBlocks& blocks, float* S, int64_t nk, int64_t Mq,
                     const float* Vt, int64_t Dv, const float* alpha, float* Ot,
                     products::PrefetchQueue* prefetch) {
  if (!masked) return Unit::template accumulate<NQV>(S, nk, Mq, Vt, Dv, alpha, Ot, prefetch);
  const int64_t N = static_cast<int64_t>(simd::lanes());
  for (int v = 0; v < NQV;) {
    int first, last;
    blocks.chunks_seen_by(v, first, last);
    int w = v + 1;
    for (int w_first, w_last; w < NQV; ++w) {
      blocks.chunks_seen_by(w, w_first, w_last);
      if (w_first != first || w_last != last) break;
    }
    if (first < last) {
      const int64_t jf = first * kKeyChunk, jl = std::min<int64_t>(last * kKeyChunk, nk);
      simd::with_count<NQV>(w - v, [&](auto count) {
        Unit::template accumulate<decltype(count)::value>(S + jf * Mq + v * N, jl - jf, Mq,
                                                          Unit::values_from(Vt, jf, Dv), Dv,
                                                          alpha + v * N, Ot + v * N, prefetch);
      });
    }
    v = w;
  }
}

}  // namespace tiles
}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
