// The tiled backward's products on one unit (flash_backward.cpp), beside the forward's
// (tile_units-inl.h): how a query tile and its dO are packed once (PackedTile), how a key
// step's P and dS meet them (reduce: dV += Pᵀ dO, dK += dSᵀ Q) and how a key tile's part of
// dQ is delivered (dq: Kᵀ dS). One interface, a unit per instruction family, as the
// forward's: fp32 FMAs, bf16 pairs (the units' pass), AMX-BF16 tiles. Per target, like
// src/simd/simd-inl.h.
#if defined(QKV_ATTENTION_BACKWARD_UNITS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_BACKWARD_UNITS_INL_H_
#undef QKV_ATTENTION_BACKWARD_UNITS_INL_H_
#else
#define QKV_ATTENTION_BACKWARD_UNITS_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include <hwy/highway.h>

#include "attention/tile_units-inl.h"
#include "attention/tiles-inl.h"
#include "qkv/tensor.h"
#include "simd/convert-inl.h"
#include "simd/transpose-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace tiles {

inline int64_t padded(int64_t n) {
  const int64_t N = static_cast<int64_t>(simd::lanes());
  return (n + N - 1) / N * N;
}

// A query tile packed once, read by all its key steps: Qt [D][Mq], Qr [Mq][D_pad],
// dOt [Dv][Mq], dOr [Mq][Dv_pad], lse and Di [Mq]. (On the bf16 units, Q and dO as bf16
// pairs: hi + lo where q_split, dout_split.)
struct PackedTile {
  float *Qt, *Qr, *dOt, *dOr, *lse, *Di;
  float *dout_row, *out_row;  // [Dv_pad] each: rows of dO and O widened for Di (row_f32)
  bool q_split = false, dout_split = false;
};

// How a key step delivers its part of dQ, Kᵀ dS: alone (the caller sums the parts in key
// order), as the first of the sum (dQt ← part) or added to the sum so far (dQt ← dQt + part).
// Each gives the same bits as the others followed by the caller's sum.
enum class DqPart { kAlone, kFirst, kAdd };

// dQt ← dQt + part, over n floats.
inline void add_part(float* dQt, const float* part, int64_t n) {
  for (int64_t i = 0; i < n; i += static_cast<int64_t>(simd::lanes()))
    hn::Store(hn::Add(hn::Load(df, dQt + i), hn::Load(df, part + i)), df, dQt + i);
}

// to[0, E) ← row (b, h, i) of x, widened to fp32 (`to` padded to whole vectors).
inline void widen_row(const View& x, int64_t b, int64_t h, int64_t i, int64_t E, float* to) {
  if (x.stride[3] != 1) {
    for (int64_t e = 0; e < E; ++e) to[e] = x.get(b, h, i, e);
    return;
  }
  const int64_t N = static_cast<int64_t>(simd::lanes());
  with_typed(x, b, h, i, 0, [&](auto* row) {
    for (int64_t e = 0; e < E; e += N)
      hn::Store(simd::load_first_widened(row + e, static_cast<size_t>(std::min(N, E - e))), df,
                to + e);
  });
}

// Row (b, h, i) of x as fp32: where it lies when it is fp32 and contiguous, else widened into
// `buffer` (padded to whole vectors).
inline const float* row_f32(const View& x, int64_t b, int64_t h, int64_t i, int64_t E,
                            float* buffer) {
  if (x.type == TensorType::f32 && x.stride[3] == 1) return &x(b, h, i, 0);
  widen_row(x, b, h, i, E, buffer);
  return buffer;
}

// Rows [i0, i0 + rows) of x(b, h): t ← scale · xᵀ [E][Mq] (lanes past `rows` zero), and
// r ← x [Mq][E_pad] row-major (zero past `rows` and past E).
inline void pack_rows(const View& x, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t E,
                      float scale, float* t, int64_t Mq, float* r, int64_t E_pad) {
  std::fill(r, r + Mq * E_pad, 0.0f);
  if (x.stride[3] == 1) {
    with_typed(x, b, h, i0, 0,
               [&](auto* x0) { simd::pack_transposed(x0, x.stride[2], rows, E, scale, t, Mq); });
    for (int64_t i = 0; i < rows; ++i) widen_row(x, b, h, i0 + i, E, r + i * E_pad);
    return;
  }
  for (int64_t i = 0; i < Mq; ++i)
    for (int64_t e = 0; e < E; ++e) {
      const float v = i < rows ? x.get(b, h, i0 + i, e) : 0;
      t[e * Mq + i] = scale * v;
      r[i * E_pad + e] = v;
    }
}

// The backward's products on one unit, beside the tile unit's scores (tile_units-inl.h):
//   pack      the query tile: Qt, Qr, dOt, dOr (PackedTile)
//   reduce    C rows += Pᵀ R over a run of queries (dV = Pᵀ dO, dK = dSᵀ Q)
//   dq        the key tile's part of dQ, Kᵀ dS, delivered as DqPart says
// BackwardUnit<false> widens every element to fp32 (products-inl.h). BackwardUnit<true>, in
// the units' pass, multiplies bf16 pairs (bf16_products-inl.h; packing in
// bf16_packing-inl.h): Qt and dOt pairs along the head dims, Qr and dOr pairs of query rows;
// P and dS are rounded to bf16 for the products that take them, as in the forward's P·V, and
// every sum is fp32.
template <bool kBf16Dot>
struct BackwardUnit;

template <>
struct BackwardUnit<false> {
  using Tile = TileUnit<false>;
  static void begin() {}
  static void end() {}
  static void pack(const AttentionArgs& a, const View& dout, int64_t b, int64_t h, int64_t i0,
                   int64_t rows, const Shape& n, float scale, PackedTile& p) {
    pack_rows(a.q, b, h, i0, rows, n.D, scale, p.Qt, n.Mq, p.Qr, padded(n.D));
    pack_rows(dout, b, h, i0, rows, n.Dv, 1.0f, p.dOt, n.Mq, p.dOr, padded(n.Dv));
  }
  // dO's row r of the tile, fp32 (as packed in dOr).
  static const float* dout_row(const View&, const PackedTile& p, int64_t, int64_t, int64_t,
                               int64_t r, const Shape& n) {
    return p.dOr + r * padded(n.Dv);
  }
  // P as the reductions read it: in place.
  template <int NQV>
  static const float* reduction_rows(const float* P, int64_t, int64_t, uint16_t*) {
    return P;
  }
  // C [keys][E_pad] += Pᵀ R over `queries` queries from q0: P [keys][Mq] from its query q0,
  // R [Mq][E_pad] the tile's rows.
  static void reduce(const float* P, int64_t keys, int64_t Mq, int64_t q0, int64_t queries,
                     const float* R, bool /*split*/, int64_t E_pad, float* C) {
    products::accumulate_transposed_tile(P, keys, Mq, queries, R + q0 * E_pad, E_pad, E_pad, C,
                                         E_pad);
  }
  // dQt's part Kᵀ dS over the tile (unmasked: one product from zero, stored or added at its
  // end), or over the visible blocks into a part of its own, then added: the same sum.
  template <int NQV, class T, class Chunks>
  static void dq(bool masked, Chunks&& chunks, const float* dS, int64_t nk, int64_t Mq, const T* k,
                 int64_t ks, int64_t D, float* scratch, float* dQt, DqPart dq) {
    using products::Into;
    if (!masked) {
      if (dq == DqPart::kAdd)
        products::accumulate_tile_rows<NQV, Into::kAdd>(dS, nk, Mq, k, ks, D, dQt);
      else products::accumulate_tile_rows<NQV, Into::kStore>(dS, nk, Mq, k, ks, D, dQt);
      return;
    }
    const int64_t N = static_cast<int64_t>(simd::lanes());
    float* part = dq == DqPart::kAdd ? scratch : dQt;
    std::fill(part, part + D * Mq, 0.0f);
    chunks([&](int64_t jj, int64_t keys, int64_t v, int64_t count) {
      simd::with_count<NQV>(static_cast<int>(count), [&](auto c) {
        products::accumulate_tile_rows<decltype(c)::value, Into::kAdd>(
            dS + jj * Mq + v * N, keys, Mq, k + jj * ks, ks, D, part + v * N);
      });
    });
    if (dq == DqPart::kAdd) add_part(dQt, part, D * Mq);
  }
};

#if defined(QKV_BF16_UNITS) && QKV_KERNEL_PASS
template <>
struct BackwardUnit<true> {
  using Tile = TileUnit<true>;
  static void begin() {}
  static void end() {}
  static void pack(const AttentionArgs& a, const View& dout, int64_t b, int64_t h, int64_t i0,
                   int64_t rows, const Shape& n, float /*scale*/, PackedTile& p) {
    p.q_split = packs_two(a.q), p.dout_split = packs_two(dout);
    pack_pairs_transposed(a.q, b, h, i0, rows, n.D, n.Mq, words(p.Qt), p.q_split);
    pack_row_pairs(a.q, b, h, i0, rows, n.D, padded(n.D), n.Mq, words(p.Qr));
    pack_pairs_transposed(dout, b, h, i0, rows, n.Dv, n.Mq, words(p.dOt), p.dout_split);
    pack_row_pairs(dout, b, h, i0, rows, n.Dv, padded(n.Dv), n.Mq, words(p.dOr));
  }
  // dOr holds pairs: the row read again.
  static const float* dout_row(const View& dout, const PackedTile& p, int64_t b, int64_t h,
                               int64_t i0, int64_t r, const Shape& n) {
    return row_f32(dout, b, h, i0 + r, n.Dv, p.dout_row);
  }
  // P rounded to bf16 rows [nk][Mq].
  template <int NQV>
  static const uint16_t* reduction_rows(const float* P, int64_t nk, int64_t Mq, uint16_t* rows16) {
    products::bf16_rows<NQV>(P, nk, Mq, rows16);
    return rows16;
  }
  // R holds pairs of query rows (hi, then lo after Mq/2 · E_pad words when split); q0 is even.
  static void reduce(const uint16_t* P, int64_t keys, int64_t Mq, int64_t q0, int64_t queries,
                     const float* R, bool split, int64_t E_pad, float* C) {
    const uint32_t* r2 = reinterpret_cast<const uint32_t*>(R) + q0 / 2 * E_pad;
    products::rows_times_pairs_wide<products::Into::kAdd>(
        P, Mq, 2, keys, r2, split ? r2 + Mq / 2 * E_pad : nullptr, (queries + 1) / 2, E_pad, E_pad,
        C, E_pad);
  }
  // dS rounded into pairs of keys in place, K's rows interleaved in pairs (into scratch:
  // row d's pair jp is word jp · D + d), then dQt ← K2ᵀ dS̃2 or dQt ← dQt + K2ᵀ dS̃2 (this
  // product adds to what it finds, in order), over the tile or chunk by chunk.
  template <int NQV, class T, class Chunks>
  static void dq(bool masked, Chunks&& chunks, float* dS, int64_t nk, int64_t Mq, const T* k,
                 int64_t ks, int64_t D, float* scratch, float* dQt, DqPart dq) {
    using products::Into;
    products::interleave_row_pairs(reinterpret_cast<const uint16_t*>(k), ks, nk, D, words(scratch),
                                   D);
    const auto* k2 = reinterpret_cast<const uint16_t*>(scratch);
    if (!masked) {
      products::pairs_of_rows<NQV>(dS, nk, Mq);
      if (dq == DqPart::kAdd)
        products::rows_times_pairs_tile<NQV, Into::kAdd>(
            k2, 2, 2 * D, D, words(dS), nullptr, (nk + 1) / 2, Mq, dQt, Mq, 1.0f, nullptr, nullptr);
      else
        products::rows_times_pairs_tile<NQV, Into::kStore>(
            k2, 2, 2 * D, D, words(dS), nullptr, (nk + 1) / 2, Mq, dQt, Mq, 1.0f, nullptr, nullptr);
      return;
    }
    const int64_t N = static_cast<int64_t>(simd::lanes());
    if (dq != DqPart::kAdd) std::fill(dQt, dQt + D * Mq, 0.0f);
    chunks([&](int64_t jj, int64_t keys, int64_t v, int64_t count) {
      simd::with_count<NQV>(static_cast<int>(count), [&](auto c) {
        constexpr int C = decltype(c)::value;
        float* ds = dS + jj * Mq + v * N;
        products::pairs_of_rows<C>(ds, keys, Mq);
        products::rows_times_pairs_tile<C, Into::kAdd>(k2 + jj * D, 2, 2 * D, D, words(ds), nullptr,
                                                       (keys + 1) / 2, Mq, dQt + v * N, Mq, 1.0f,
                                                       nullptr, nullptr);
      });
    });
  }
  static uint32_t* words(float* x) { return reinterpret_cast<uint32_t*>(x); }
  static const uint32_t* words(const float* x) { return reinterpret_cast<const uint32_t*>(x); }
};
#endif  // QKV_BF16_UNITS

#if QKV_AMX_UNIT
// The backward's products on AMX-BF16 tiles (AmxUnit, amx_unit-inl.h), where forced:
// packed and rounded as BackwardUnit<true> does (Qt and dOt pairs along the head dims, Qr and
// dOr pairs of query rows; P and dS rounded to bf16), each product on tiles:
//   S = K Qt, dP = V dOt      the forward's scores (AmxUnit::scores)
//   dV += Pᵀ dO, dK += dSᵀ Q  C [16 keys][16 dims] (dK's or dV's rows) += A [16 keys][32
//                             queries] (P's bf16 rows) · B [16 query pairs][16 dims] (Qr, dOr)
//   dQt (+)= Kᵀ dS            as the forward's P V: K transposed per step, dS paired in place
// Tiles are configured per key step: with the key steps shared out, a step runs on any thread.
template <class Tiles>
struct AmxBackwardUnit {
  using Tile = AmxUnit<Tiles>;
  static constexpr int64_t kBlock = Tile::kBlock, kDepth = Tile::kDepth;
  static void begin() { Tile::begin(); }
  static void end() { Tile::end(); }
  static void pack(const AttentionArgs& a, const View& dout, int64_t b, int64_t h, int64_t i0,
                   int64_t rows, const Shape& n, float /*scale*/, PackedTile& p) {
    p.q_split = packs_two(a.q), p.dout_split = packs_two(dout);
    pack_pairs_transposed(a.q, b, h, i0, rows, n.D, n.Mq, words(p.Qt), p.q_split);
    pack_pairs_transposed(dout, b, h, i0, rows, n.Dv, n.Mq, words(p.dOt), p.dout_split);
    pack_pair_rows(a.q, b, h, i0, rows, n.D, n.Mq, p.q_split, p.Qr);
    pack_pair_rows(dout, b, h, i0, rows, n.Dv, n.Mq, p.dout_split, p.dOr);
  }
  static const float* dout_row(const View& dout, const PackedTile& p, int64_t b, int64_t h,
                               int64_t i0, int64_t r, const Shape& n) {
    return row_f32(dout, b, h, i0 + r, n.Dv, p.dout_row);
  }
  // P rounded to bf16 rows [nk][Mq].
  template <int NQV>
  static const uint16_t* reduction_rows(const float* P, int64_t nk, int64_t Mq, uint16_t* rows16) {
    const hn::RebindToSigned<simd::Df> di;
    const hn::Rebind<uint16_t, decltype(di)> du16;
    const int64_t N = static_cast<int64_t>(simd::lanes());
    for (int64_t jj = 0; jj < nk; ++jj)
      for (int v = 0; v < NQV; ++v)
        hn::Store(hn::DemoteTo(du16, hn::BitCast(di, bf16_bits(hn::Load(df, P + jj * Mq + v * N)))),
                  du16, rows16 + jj * Mq + v * N);
    return rows16;
  }
  // C [keys][E_pad] += Pᵀ R over `queries` queries from q0 (R: pairs of query rows, hi then
  // lo after Mq/2 · E_pad words when split). A last step of fewer than 32 queries, and a last
  // block of fewer than 16 keys, go through zero-padded copies: a tile reads whole rows, and
  // the rows past them belong to other steps.
  static void reduce(const uint16_t* P, int64_t keys, int64_t Mq, int64_t q0, int64_t queries,
                     const float* R, bool split, int64_t E_pad, float* C) {
    const auto* r2 = words(R);
    // An accumulator tile is 16 keys × N dims (the tiles' columns are the target's lanes).
    const int64_t N = static_cast<int64_t>(simd::lanes());
    alignas(64) uint16_t a_staged[kBlock * kDepth];
    alignas(64) float c_staged[kBlock * 2 * kBlock];  // N ≤ 16
    for (int64_t kb = 0; kb < keys; kb += kBlock) {
      const int64_t kr = std::min(kBlock, keys - kb);
      for (int64_t e = 0; e < E_pad; e += 2 * N) {
        const bool dims2 = e + N < E_pad;
        const int64_t width = dims2 ? 2 * N : N;
        float* c = kr == kBlock ? C + kb * E_pad + e : c_staged;
        const int64_t c_stride = kr == kBlock ? E_pad : 2 * N;
        if (kr < kBlock)
          for (int64_t r = 0; r < kr; ++r)
            std::copy_n(C + (kb + r) * E_pad + e, width, c_staged + r * 2 * N);
        Tile::with_blocks(false, dims2, [&](auto, auto columns2) {
          constexpr bool kColumns2 = decltype(columns2)::value;
          Tile::template load_accumulators<false, kColumns2>(c, nullptr, N, 4 * c_stride);
          for (int64_t s = 0; s < queries; s += kDepth) {
            const uint16_t* a = P + kb * Mq + s;  // (P starts at query q0)
            int64_t a_stride = 2 * Mq;
            if (queries - s < kDepth) {  // the last queries, zero past them
              std::fill_n(a_staged, kBlock * kDepth, uint16_t{0});
              for (int64_t r = 0; r < kr; ++r)
                std::copy_n(a + r * Mq, queries - s, a_staged + r * kDepth);
              a = a_staged, a_stride = 2 * kDepth;
            }
            for (int part = 0; part < (split ? 2 : 1); ++part) {
              const uint32_t* b = r2 + part * Mq / 2 * E_pad + (q0 + s) / 2 * E_pad + e;
              Tile::template multiply<false, kColumns2>(a, a_stride, nullptr, 0, b, b + N,
                                                        4 * E_pad);
            }
          }
          Tile::template store_accumulators<false, kColumns2>(c, nullptr, N, 4 * c_stride);
        });
        if (kr < kBlock)
          for (int64_t r = 0; r < kr; ++r)
            std::copy_n(c_staged + r * 2 * N, width, C + (kb + r) * E_pad + e);
      }
    }
  }
  // dQt's part Kᵀ dS: K transposed into scratch (after the part's D × Mq floats), dS paired in
  // place; the part summed from zero over the tile (or chunk by chunk over a masked one's
  // visible blocks) and then stored or added, as BackwardUnit<false> does: the same bits
  // whichever way the caller takes the parts.
  template <int NQV, class T, class Chunks>
  static void dq(bool masked, Chunks&& chunks, float* dS, int64_t nk, int64_t Mq, const T* k,
                 int64_t ks, int64_t D, float* scratch, float* dQt, DqPart dq) {
    float* part = dq == DqPart::kAdd ? scratch : dQt;
    Tile::pack_values(k, ks, nk, D, scratch + D * Mq);
    const auto* kt = reinterpret_cast<const uint16_t*>(scratch + D * Mq);
    if (!masked) {
      Tile::template pairs_in_place<NQV>(dS, nk, Mq);
      Tile::template columns_product<NQV>(kt, words(dS), nk, Mq, D, part, false);
    } else {
      const int64_t N = static_cast<int64_t>(simd::lanes());
      std::fill(part, part + D * Mq, 0.0f);
      chunks([&](int64_t jj, int64_t keys, int64_t v, int64_t count) {
        simd::with_count<NQV>(static_cast<int>(count), [&](auto c) {
          constexpr int C = decltype(c)::value;
          float* ds = dS + jj * Mq + v * N;
          Tile::template pairs_in_place<C>(ds, keys, Mq);
          Tile::template columns_product<C>(kt + jj, words(ds), keys, Mq, D, part + v * N, true);
        });
      });
    }
    if (dq == DqPart::kAdd) add_part(dQt, part, D * Mq);
  }
  // X2 of x (pairs of query rows, hi then lo when split), and zeros for the 16 pair rows past
  // them, which a reduction's last step of queries may read (its A is zero there).
  static void pack_pair_rows(const View& x, int64_t b, int64_t h, int64_t i0, int64_t rows,
                             int64_t E, int64_t Mq, bool split, float* to) {
    const int64_t E_pad = padded(E), packed = (split ? 2 : 1) * Mq / 2 * E_pad;
    pack_row_pairs(x, b, h, i0, rows, E, E_pad, Mq, words(to));
    std::fill(to + packed, to + packed + kBlock * E_pad, 0.0f);
  }
  static uint32_t* words(float* x) { return reinterpret_cast<uint32_t*>(x); }
  static const uint32_t* words(const float* x) { return reinterpret_cast<const uint32_t*>(x); }
};
#endif  // QKV_AMX_UNIT

}  // namespace tiles
}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
