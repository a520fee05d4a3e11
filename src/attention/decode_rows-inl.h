// Row sources of split-KV decoding (src/attention/decode.cpp): where row j of (batch, kv head)
// lives, and how its elements meet the queries. One policy per way rows are stored, each read
// in place and widened in registers:
//   ElementSource<T>    fp32, bf16 or fp16 elements (T: float, simd::Bf16, simd::F16)
//   BlockSource<kType>  32-value blocks (q8_0, q4_0, q4_1; the formats of block_rows-inl.h)
// The drivers in decode.cpp are written once over them. A source gives
//   row(b, h, j), step (rows apart, in Ptr units), width (a row, in Ptr units);
//   ask(row):  the prefetch for a row kPrefetchRows ahead of the one being read;
//   dots<RG, KG>(q, k, part, jj):  RG query rows' partial products with KG key rows;
//   value_rows(...):  o_r += Σ p_r[j] v_j over a block of value rows;
//   tile(...):  a tile of rows for the tiled unit, in place or widened into scratch.
// Per target, like src/simd/simd-inl.h.
#if defined(QKV_ATTENTION_DECODE_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_DECODE_ROWS_INL_H_
#undef QKV_ATTENTION_DECODE_ROWS_INL_H_
#else
#define QKV_ATTENTION_DECODE_ROWS_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <hwy/highway.h>

#include "attention/block_rows-inl.h"
#include "attention/kv_rows.h"
#include "attention/plan.h"
#include "simd/convert-inl.h"
#include "simd/simd-inl.h"
#include "util/scratch.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace decoding {

namespace simd = ::qkv::simd::HWY_NAMESPACE;
namespace hn = simd::hn;
using simd::Bf16;
using simd::df;
using simd::Vf;
using simd::widen_one;

inline constexpr int kGroupRows = 4;  // rows per register block
// Value rows per block: the passes over a block's columns find its rows in L1.
inline constexpr int64_t kValueBlock = 64;

// Rows this far ahead are asked for early, one row per row processed: the hardware prefetcher
// alone leaves the kernels well short of a plain read loop's rate, 1–4 rows ahead comes close
// to it, 8 or more falls off again. The rows kFarRows further on are asked for into L2 as
// well, which helps the AVX-512 code when memory is slow and costs nothing otherwise.
inline constexpr int64_t kPrefetchRows = 4, kFarRows = 32;

// Asks for `row` (n elements) into L1 and the row kFarRows rows of `stride` past it into L2
// (a prefetch past the end of the cache is harmless: prefetches never fault).
template <typename T>
HWY_INLINE void prefetch_row(const T* row, int64_t stride, int64_t n) {
  const T* far = row + kFarRows * stride;
  for (int64_t i = 0; i < n; i += 64 / static_cast<int64_t>(sizeof(T))) {
    __builtin_prefetch(row + i);
    __builtin_prefetch(far + i, 0, 1);
  }
}

// The row 8 rows past `row` into L1. A row of blocks is read faster than an fp32 one, so it
// is asked for further ahead; a second, farther request into L2 (as the fp32 rows have) makes
// the block rows slower.
HWY_INLINE void prefetch_blocks(const uint8_t* row, int64_t stride, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(row + 8 * stride + i);
}

// bf16 rows are widened 2N elements at a time into an even and an odd vector
// (simd::load_pair_widened: half the widening work of load_widened), so the kernels that sum
// over the elements keep their other operand in that order: the first paired_span(D) elements
// of the scaled queries, and of the partial outputs while a unit runs, are stored as blocks of
// 2N, even elements first. (Widened one vector at a time, the widening takes as many
// instructions as the FMAs it feeds at a few query rows per key/value head.)
template <typename T>
inline constexpr bool kPaired = std::is_same_v<T, Bf16>;
template <typename T>
int64_t paired_span(int64_t D) {
  const auto N2 = 2 * static_cast<int64_t>(simd::lanes());
  return kPaired<T> ? D / N2 * N2 : 0;
}
// x[0, span) from natural order into blocks of 2N, evens first; `back` undoes it.
inline void pair_order(float* x, int64_t span, bool back) {
  const auto N = static_cast<int64_t>(simd::lanes());
  float tmp[2 * hn::MaxLanes(df)];
  for (int64_t blk = 0; blk < span; blk += 2 * N) {
    for (int64_t i = 0; i < N; ++i)
      for (int64_t odd = 0; odd < 2; ++odd) {
        float& natural = x[blk + 2 * i + odd];
        float& paired = x[blk + odd * N + i];
        if (back) tmp[2 * i + odd] = paired;
        else tmp[odd * N + i] = natural;
      }
    std::copy(tmp, tmp + 2 * N, x + blk);
  }
}

using PartialDots =
    simd::VfSlot[hn::MaxLanes(df)];  // one row's vectors of partial products, N keys

// Value vectors per pass of a value block: RG × W accumulators, W value vectors and a
// broadcast live (one row's value vectors are folded into its FMAs): at most 25 of 32
// registers, 13 of 16.
template <int RG>
inline constexpr int kValueVectors = simd::kVectorRegisters >= 32 ? (RG <= 2 ? 8 : 4)
                                     : RG == 1                    ? 8
                                     : RG == 2                    ? 4
                                     : RG == 3                    ? 3
                                                                  : 2;

// f(std::integral_constant<int, c>) for c = min(kGroupRows, R − r) over the groups of rows
// r = 0, kGroupRows, … of R rows.
template <typename F>
HWY_INLINE void for_row_groups(int64_t R, F&& f) {
  for (int64_t r = 0; r < R; r += kGroupRows)
    simd::with_count<kGroupRows>(static_cast<int>(std::min<int64_t>(kGroupRows, R - r)),
                                 [&](auto rows) { f(r, rows); });
}

// A value pass's accumulators: columns [e0, e0 + W N) of RG rows' outputs, loaded and stored.
template <int RG, int W>
HWY_INLINE void load_outputs(float* const* o, int64_t e0, simd::VfSlot (&acc)[RG][W]) {
  constexpr int64_t N = hn::MaxLanes(df);
  for (int r = 0; r < RG; ++r)
    for (int w = 0; w < W; ++w) acc[r][w] = hn::LoadU(df, o[r] + e0 + w * N);
}
template <int RG, int W>
HWY_INLINE void store_outputs(const simd::VfSlot (&acc)[RG][W], float* const* o, int64_t e0) {
  constexpr int64_t N = hn::MaxLanes(df);
  for (int r = 0; r < RG; ++r)
    for (int w = 0; w < W; ++w) hn::StoreU(acc[r][w], df, o[r] + e0 + w * N);
}
// acc[r][w] += p_r[jj] · x[w] for RG rows (p_r = p + r · p_stride) and W value vectors.
template <int RG, int W>
HWY_INLINE void add_products(const float* p, int64_t p_stride, int64_t jj, const simd::VfSlot* x,
                             simd::VfSlot (&acc)[RG][W]) {
  for (int r = 0; r < RG; ++r) {
    const Vf pr = hn::Set(df, p[r * p_stride + jj]);
    for (int w = 0; w < W; ++w) acc[r][w] = hn::MulAdd(pr, x[w], acc[r][w]);
  }
}

// ---- fp32, bf16 and fp16 elements ------------------------------------------------------------

template <typename T>
struct ElementSource {
  using Ptr = const T*;
  using TileElement = T;  // what tile() hands the tiled unit
  const T* data;
  int64_t batch_stride, head_stride, step;  // in elements
  int64_t dim;                              // elements per row
  int64_t whole, paired_end;                // the head dim's whole vectors; its paired span
  int64_t first, slots;                     // a ring's (KvRows::slot)
  static constexpr bool kFourKeys = false;  // (four keys at a time were slower from memory)

  explicit ElementSource(const KvRows& r)
      : data(static_cast<const T*>(r.data)),
        batch_stride(r.batch_stride),
        head_stride(r.head_stride),
        step(r.row_stride),
        dim(r.dim),
        whole(r.dim / static_cast<int64_t>(simd::lanes()) * static_cast<int64_t>(simd::lanes())),
        paired_end(paired_span<T>(r.dim)),
        first(r.first),
        slots(r.slots) {}

  // Row j of head (b, h); rows j, j + 1, … lie step apart up to a ring's wrap.
  Ptr row(int64_t b, int64_t h, int64_t j) const {
    return data + b * batch_stride + h * head_stride + (slots > 0 ? (first + j) % slots : j) * step;
  }
  int64_t width() const { return dim; }
  int64_t paired() const { return paired_end; }
  // (Static, with the caller's copies of step and width: a member read after a vector store
  // is read again, since vector types may alias anything.)
  static void ask(Ptr r, int64_t row_step, int64_t row_width) {
    prefetch_row(r, row_step, row_width);
  }

  // part[r][jj + j] ← q_r ⊙ k_j summed over the head dim's whole vectors, for RG rows of q
  // (dim apart) and KG key rows k_j: each q vector loaded once for KG keys. (Pairs of keys
  // read K at 8 rows per kv head 5–7% faster than one key with two chains per row.) The first
  // paired() elements of q are in pair order.
  template <int RG, int KG>
  HWY_INLINE void dots(const float* q, Ptr k, PartialDots* part, int64_t jj) const {
    constexpr int64_t N = hn::MaxLanes(df);
    const int64_t D = dim, st = step, pairs_end = paired_end, whole_end = whole;
    simd::VfSlot acc[RG][KG];
    for (int r = 0; r < RG; ++r)
      for (int j = 0; j < KG; ++j) acc[r][j] = hn::Zero(df);
    int64_t d = 0;
    if constexpr (kPaired<T>)
      for (; d < pairs_end; d += 2 * N) {
        simd::VfSlot even[KG], odd[KG];
        for (int j = 0; j < KG; ++j) {
          Vf e, o;
          simd::load_pair_widened(k + j * st + d, e, o);
          even[j] = e, odd[j] = o;
        }
        for (int r = 0; r < RG; ++r) {
          const Vf qe = hn::LoadU(df, q + r * D + d), qo = hn::LoadU(df, q + r * D + d + N);
          for (int j = 0; j < KG; ++j)
            acc[r][j] = hn::MulAdd(qo, odd[j], hn::MulAdd(qe, even[j], acc[r][j]));
        }
      }
    for (; d < whole_end; d += N) {
      simd::VfSlot kv[KG];
      for (int j = 0; j < KG; ++j) kv[j] = simd::load_widened(k + j * st + d);
      for (int r = 0; r < RG; ++r) {
        const Vf qv = hn::LoadU(df, q + r * D + d);
        for (int j = 0; j < KG; ++j) acc[r][j] = hn::MulAdd(qv, kv[j], acc[r][j]);
      }
    }
    for (int r = 0; r < RG; ++r)
      for (int j = 0; j < KG; ++j) part[r][jj + j] = acc[r][j];
  }

  // s[r · s_stride + key] += the products of a head dim past its whole vectors.
  void dots_tail(const float* q, int64_t R, Ptr k, int64_t nk, float* s, int64_t s_stride) const {
    for (int64_t d = whole; d < dim; ++d)
      for (int64_t key = 0; key < nk; ++key)
        for (int64_t r = 0; r < R; ++r)
          s[r * s_stride + key] += q[r * dim + d] * widen_one(k[key * step + d]);
  }

  // o_r[e0, e0 + W N) += Σ_jj p_r[jj] v_jj[e0, e0 + W N) over nk value rows v, for RG rows
  // (p_r = p + r · p_stride), the sums in registers across the rows; asks for ahead_rows rows
  // kPrefetchRows on, one per value row. Paired: those columns of o are in pair order.
  template <int RG, int W, bool Paired>
  void values_pass(const float* p, int64_t p_stride, Ptr v, int64_t nk, int64_t e0, float* const* o,
                   int64_t ahead_rows) const {
    constexpr int64_t N = hn::MaxLanes(df);
    const int64_t st = step, width = dim;
    simd::VfSlot acc[RG][W];
    load_outputs<RG, W>(o, e0, acc);
    for (int64_t jj = 0; jj < nk; ++jj) {
      if (jj < ahead_rows) ask(v + (jj + kPrefetchRows) * st, st, width);
      simd::VfSlot x[W];
      if constexpr (Paired) {
        static_assert(W % 2 == 0, "pairs of vectors");
        for (int w = 0; w < W; w += 2) {
          Vf even, odd;
          simd::load_pair_widened(v + jj * st + e0 + w * N, even, odd);
          x[w] = even, x[w + 1] = odd;
        }
      } else {
        for (int w = 0; w < W; ++w) x[w] = simd::load_widened(v + jj * st + e0 + w * N);
      }
      add_products<RG, W>(p, p_stride, jj, x, acc);
    }
    store_outputs<RG, W>(acc, o, e0);
  }

  // o_r += Σ_jj p_r[jj] v_jj over the nk value rows from v of one value block, for R rows
  // (p_r = s + r · stride + j), in groups of up to 4 rows and passes of kValueVectors columns;
  // the first pass asks for ahead_rows rows.
  HWY_INLINE void value_rows(const float* s, int64_t stride, int64_t j, int64_t nk, Ptr v,
                             int64_t ahead_rows, int64_t R, float* const* o) const {
    const int64_t N = static_cast<int64_t>(simd::lanes());
    const int64_t whole_end = whole, pairs_end = paired_end, width = dim, st = step;
    for_row_groups(R, [&](int64_t r, auto rows) {
      constexpr int RG = decltype(rows)::value, W = kValueVectors<RG>;
      const float* p = s + r * stride + j;
      int64_t e = 0;
      if constexpr (kPaired<T>) {
        constexpr int WP = W < 2 ? 2 : W / 2 * 2;  // pairs of vectors
        for (; e + WP * N <= pairs_end; e += WP * N, ahead_rows = 0)
          values_pass<RG, WP, true>(p, stride, v, nk, e, o + r, ahead_rows);
        if (e < pairs_end)
          simd::with_count<WP / 2>(static_cast<int>((pairs_end - e) / (2 * N)), [&](auto w) {
            values_pass<RG, 2 * decltype(w)::value, true>(p, stride, v, nk, e, o + r, ahead_rows);
          });
        if (e < pairs_end) e = pairs_end, ahead_rows = 0;
      }
      for (; e + W * N <= whole_end; e += W * N, ahead_rows = 0)
        values_pass<RG, W, false>(p, stride, v, nk, e, o + r, ahead_rows);
      if (e < whole_end)
        simd::with_count<W>(static_cast<int>((whole_end - e) / N), [&](auto w) {
          values_pass<RG, decltype(w)::value, false>(p, stride, v, nk, e, o + r, ahead_rows);
        });
      ahead_rows = 0;
    });
    for (int64_t e = whole_end; e < width; ++e)  // a value dim that is not whole vectors
      for (int64_t jj = 0; jj < nk; ++jj)
        for (int64_t r = 0; r < R; ++r)
          o[r][e] += s[r * stride + j + jj] * widen_one(v[jj * st + e]);
  }

  // Rows [j0, j0 + nk) for the tiled unit: in place.
  const T* tile(int64_t b, int64_t h, int64_t j0, int64_t, float*, int64_t& stride) const {
    stride = step;
    return row(b, h, j0);
  }
};

// ---- 32-value blocks (q8_0, q4_0, q4_1) --------------------------------------------------------
//
// The element rows' walk, each block's values widened in registers as they are read and its
// scale (and offset) applied once, so the rows' bytes are read once and no fp32 copy of them is
// made. (The work per stored byte is the block's widening and one scale per block, fewer
// operations than the fp32 rows take per byte.)

// Rows addressed in bytes (blocks, or values of their own format): where row j is, how far
// apart rows lie and how wide one is, and its prefetch; widened to fp32 for the tiled unit.
struct ByteRows {
  using Ptr = const uint8_t*;
  using TileElement = float;  // widened into the thread's scratch for tiles
  KvRows rows;
  int64_t step;   // bytes
  int64_t dim;    // values per row
  int64_t bytes;  // per row

  explicit ByteRows(const KvRows& r)
      : rows(r), step(r.stride_bytes()), dim(r.dim), bytes(r.row_bytes()) {}
  Ptr row(int64_t b, int64_t h, int64_t j) const { return rows.row(b, h, j); }
  int64_t width() const { return bytes; }
  int64_t paired() const { return 0; }
  static void ask(Ptr r, int64_t row_step, int64_t row_bytes) {
    prefetch_blocks(r, row_step, row_bytes);
  }
};

template <TensorType kType>
struct BlockSource : ByteRows {
  static constexpr TensorType kFormat = kType;
  static constexpr bool kFourKeys = true;  // with 1 or 2 rows: four chains of FMAs in flight
  using ByteRows::ByteRows;

  // dots over rows of blocks (dim a multiple of 32), block by block: one row sums q · (the
  // block's integers) and scales that by d once (one FMA per block, not a multiply per
  // vector); several rows share each key vector, scaled once. With an offset m:
  // q · x = d (q · ints) + m Σ q.
  template <int RG, int KG>
  HWY_INLINE void dots(const float* q, Ptr k, PartialDots* part, int64_t jj) const {
    constexpr int64_t N = hn::MaxLanes(df), kBytes = kBlockBytes<kType>;
    const int64_t D = dim, ks = step;
    simd::VfSlot acc[RG][KG];
    for (int r = 0; r < RG; ++r)
      for (int j = 0; j < KG; ++j) acc[r][j] = hn::Zero(df);
    for (int64_t d0 = 0, at = 0; d0 < D; d0 += kBlockValues, at += kBytes) {
      if constexpr (RG == 1) {
        simd::VfSlot dot[KG];
        [[maybe_unused]] Vf qsum = hn::Zero(df);  // Σ q, in lanes beside the dots
        for (int64_t i = 0; i < kBlockValues; i += N) {
          const Vf qv = hn::LoadU(df, q + d0 + i);
          if constexpr (kHasMin<kType>) qsum = hn::Add(qsum, qv);
          for (int j = 0; j < KG; ++j) {
            const Vf x = block_ints<kType>(k + j * ks + at, i);
            dot[j] = i == 0 ? hn::Mul(qv, x) : hn::MulAdd(qv, x, dot[j]);
          }
        }
        for (int j = 0; j < KG; ++j) {
          acc[0][j] = hn::MulAdd(hn::Set(df, block_scale(k + j * ks + at)), dot[j], acc[0][j]);
          if constexpr (kHasMin<kType>)
            acc[0][j] = hn::MulAdd(hn::Set(df, block_min<kType>(k + j * ks + at)), qsum, acc[0][j]);
        }
      } else {
        simd::VfSlot scale[KG];
        [[maybe_unused]] simd::VfSlot min[KG];
        for (int j = 0; j < KG; ++j) {
          scale[j] = hn::Set(df, block_scale(k + j * ks + at));
          if constexpr (kHasMin<kType>) min[j] = hn::Set(df, block_min<kType>(k + j * ks + at));
        }
        for (int64_t i = 0; i < kBlockValues; i += N) {
          simd::VfSlot kv[KG];
          for (int j = 0; j < KG; ++j) {
            const Vf x = block_ints<kType>(k + j * ks + at, i);
            if constexpr (kHasMin<kType>) kv[j] = hn::MulAdd(scale[j], x, min[j]);
            else kv[j] = hn::Mul(scale[j], x);
          }
          for (int r = 0; r < RG; ++r) {
            const Vf qv = hn::LoadU(df, q + r * D + d0 + i);
            for (int j = 0; j < KG; ++j) acc[r][j] = hn::MulAdd(qv, kv[j], acc[r][j]);
          }
        }
      }
    }
    for (int r = 0; r < RG; ++r)
      for (int j = 0; j < KG; ++j) part[r][jj + j] = acc[r][j];
  }

  void dots_tail(const float*, int64_t, Ptr, int64_t, float*, int64_t) const {}  // whole blocks

  // o_r[e0, e0 + W N) += Σ_jj p_r[jj] v_jj for nk value rows; the first ahead_rows rows
  // kPrefetchRows further on are asked for. kAligned: e0 is a multiple of 32 (so vector w
  // begins a block where w · N is one).
  template <int RG, int W, bool kAligned>
  void values_pass(const float* p, int64_t p_stride, Ptr v, int64_t nk, int64_t e0, float* const* o,
                   int64_t ahead_rows) const {
    constexpr int64_t N = hn::MaxLanes(df);
    simd::VfSlot acc[RG][W];
    load_outputs<RG, W>(o, e0, acc);
    const int64_t st = step, row_bytes = bytes;
    for (int64_t jj = 0; jj < nk; ++jj) {
      if (jj < ahead_rows) ask(v + (jj + kPrefetchRows) * st, st, row_bytes);
      const uint8_t* row = v + jj * st;
      if constexpr (kAligned && RG <= 2) {
        // p · d (and p · m) once per block and row, the block's integers widened into the FMAs.
        simd::VfSlot pr[RG], pd[RG];
        [[maybe_unused]] simd::VfSlot pm[RG];
        for (int r = 0; r < RG; ++r) pr[r] = hn::Set(df, p[r * p_stride + jj]);
        for (int w = 0; w < W; ++w) {
          const uint8_t* blk = row + (e0 + w * N) / kBlockValues * kBlockBytes<kType>;
          if ((w * N) % kBlockValues == 0) {
            const Vf d = hn::Set(df, block_scale(blk));
            for (int r = 0; r < RG; ++r) pd[r] = hn::Mul(pr[r], d);
            if constexpr (kHasMin<kType>) {
              const Vf m = hn::Set(df, block_min<kType>(blk));
              for (int r = 0; r < RG; ++r) pm[r] = hn::Mul(pr[r], m);
            }
          }
          const Vf x = block_ints<kType>(blk, (w * N) % kBlockValues);
          for (int r = 0; r < RG; ++r) {
            acc[r][w] = hn::MulAdd(pd[r], x, acc[r][w]);
            if constexpr (kHasMin<kType>) acc[r][w] = hn::Add(acc[r][w], pm[r]);
          }
        }
      } else {
        simd::VfSlot x[W];
        for (int w = 0; w < W; ++w) x[w] = widen_vector<kType>(row, e0 + w * N);
        add_products<RG, W>(p, p_stride, jj, x, acc);
      }
    }
    store_outputs<RG, W>(acc, o, e0);
  }

  // As ElementSource::value_rows, over rows of blocks.
  void value_rows(const float* s, int64_t stride, int64_t j, int64_t nk, Ptr v, int64_t ahead_rows,
                  int64_t R, float* const* o) const {
    const int64_t N = static_cast<int64_t>(simd::lanes()), Dv = dim;
    for_row_groups(R, [&](int64_t r, auto group) {
      constexpr int RG = decltype(group)::value, W = kValueVectors<RG>;
      constexpr bool kAligned = W * hn::MaxLanes(df) % kBlockValues == 0;
      const float* p = s + r * stride + j;
      int64_t e = 0;
      for (; e + W * N <= Dv; e += W * N, ahead_rows = 0)
        values_pass<RG, W, kAligned>(p, stride, v, nk, e, o + r, ahead_rows);
      if (e < Dv)
        simd::with_count<W>(static_cast<int>((Dv - e) / N), [&](auto w) {
          values_pass<RG, decltype(w)::value, kAligned>(p, stride, v, nk, e, o + r, ahead_rows);
        });
      ahead_rows = 0;
    });
  }

  // Rows [j0, j0 + nk) for the tiled unit: widened to fp32 into `scratch` (nk × dim).
  const float* tile(int64_t b, int64_t h, int64_t j0, int64_t nk, float* scratch,
                    int64_t& stride) const {
    widen_rows_of<kType>(rows, b, h, j0, nk, scratch);
    stride = dim;
    return scratch;
  }
};

// ---- Values in a format of their own ---------------------------------------------------------
//
// A cache whose values are stored in another format than its keys (q8_0 keys with q4_0
// values, say): the keys are read by their own source, and each block of value rows is widened
// to fp32 into the thread's scratch (widen_rows_at: any row type) and multiplied there as fp32
// rows. Each value row is still read from memory once; the widened block stays in L1.
struct WidenedValues : ByteRows {
  using ByteRows::ByteRows;

  // As ElementSource::value_rows: nk ≤ kValueBlock rows from v widened, then summed as fp32.
  void value_rows(const float* s, int64_t stride, int64_t j, int64_t nk, Ptr v, int64_t,
                  int64_t R, float* const* o) const {
    float* w = thread_scratch(BlockSlot::values, kValueBlock * dim);
    widen_rows_at(rows.type, v, step, nk, dim, w);
    const ElementSource<float> widened(kv_rows(TensorType::f32, w, 0, 0, dim, 1, nk, dim));
    widened.value_rows(s, stride, j, nk, w, 0, R, o);
  }

  // Rows [j0, j0 + nk) for the tiled unit: widened to fp32 into `scratch` (nk × dim).
  const float* tile(int64_t b, int64_t h, int64_t j0, int64_t nk, float* scratch,
                    int64_t& stride) const {
    widen_rows(rows, b, h, j0, nk, scratch);
    stride = dim;
    return scratch;
  }
};

// ---- Scores and values of a few rows, their sums in registers: the FMA unit -------------------

// Lane j of the result is the sum of x[j]'s lanes, for the N = lanes vectors x (clobbered):
// log2 N rounds, each adding the even lanes of a pair of vectors to their odd lanes and
// halving the vectors (ConcatEven / ConcatOdd, one shuffle each on AVX-512): 2N − 2 shuffles
// for N sums, where N separate horizontal sums take N log2 N.
HWY_INLINE Vf lane_sums(simd::VfSlot* x) {
  for (size_t count = hn::MaxLanes(df); count > 1; count /= 2)
    for (size_t i = 0; i < count / 2; ++i)
      x[i] = hn::Add(hn::ConcatEven(df, x[2 * i + 1], x[2 * i]),
                     hn::ConcatOdd(df, x[2 * i + 1], x[2 * i]));
  return x[0];
}

// s[r · s_stride + jj] ← q_r · k_jj for the R rows and nk ≤ N key rows from k (lanes past nk
// get 0): key rows are read in order, each once for all rows, and lane_sums turns each row's
// N vectors of partial products into its N scores; the first ahead_rows rows kPrefetchRows on
// are asked for. (A horizontal sum per score, with the output updated in memory per key, reads
// K and V well below this way's rate at 4 to 8 rows.)
template <class Src>
void key_scores(const Src& src, const float* q, int64_t R, typename Src::Ptr k, int64_t nk,
                int64_t ahead_rows, float* s, int64_t s_stride) {
  constexpr int64_t N = hn::MaxLanes(df);
  PartialDots part[kTiledDecodeMinRows];
  const int64_t st = src.step, D = src.dim, width = src.width();
  const typename Src::Ptr ahead = k + kPrefetchRows * st;
  // All rows for KG keys from jj on.
  const auto keys_from = [&](int64_t jj, auto keys) {
    constexpr int KG = decltype(keys)::value;
    for (int j = 0; j < KG; ++j)
      if (jj + j < ahead_rows) Src::ask(ahead + (jj + j) * st, st, width);
    for_row_groups(R, [&](int64_t r, auto rows) {
      src.template dots<decltype(rows)::value, KG>(q + r * D, k + jj * st, part + r, jj);
    });
  };
  int64_t jj = 0;
  if (Src::kFourKeys && R <= 2)
    for (; jj + 4 <= nk; jj += 4) keys_from(jj, std::integral_constant<int, 4>{});
  for (; jj + 2 <= nk; jj += 2) keys_from(jj, std::integral_constant<int, 2>{});
  if (jj < nk) keys_from(jj, std::integral_constant<int, 1>{});
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t lane = nk; lane < N; ++lane) part[r][lane] = hn::Zero(df);
    hn::StoreU(lane_sums(part[r]), df, s + r * s_stride);
  }
  src.dots_tail(q, R, k, nk, s, s_stride);
}

// The rows kernel's unit when every element is widened to fp32: the queries arrive scaled,
// the first paired() of them in pair order, and so do the outputs while the unit runs.
struct RowsOnFma {
  static constexpr bool kScalesScores = false;
  template <class Src>
  static int64_t paired(const Src& K) {
    return K.paired();
  }  // queries in pair order
  template <class Src>
  void prepare(const Src&, float*, int64_t, int64_t, bool, int64_t) {}
  template <class Src>
  void scores(const Src& K, const float* q, int64_t R, typename Src::Ptr k, int64_t nk,
              int64_t ahead_rows, float /*scale*/, float* s, int64_t stride) {
    key_scores(K, q, R, k, nk, ahead_rows, s, stride);
  }
  void probabilities(const float*, int64_t, int64_t) {}
  template <class Src>
  void values(const Src& V, const float* s, int64_t stride, int64_t j, int64_t nk,
              typename Src::Ptr v, int64_t ahead_rows, int64_t R, float* const* o) {
    V.value_rows(s, stride, j, nk, v, ahead_rows, R, o);
  }
  template <class Src>
  void finish(const Src& V, float* const* o, int64_t R) {
    for (int64_t r = 0; r < R; ++r) pair_order(o[r], V.paired(), true);
  }
};

}  // namespace decoding
}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
