// The tile products of the attention kernels (forward, backward, decoding), per Highway target
// like src/simd/simd-inl.h: register-blocked micro-kernels, their drivers over whole tiles, and
// the prefetch queue that brings the next key tile in while one computes.
//
// Block sizes come from the target's register file (kVectorRegisters): a micro-kernel keeps
// NK × NQV accumulators, NQV loaded vectors and a broadcast live, and NK × NQV must leave
// room for those. With 32 registers (AVX-512) a block spans up to 4 query vectors and 6 rows
// (24 accumulators + 4 + 1 = 29); with 16 (AVX2, SSE4) up to 2 query vectors and 6 rows
// (12 + 2 + 1 = 15), the shape of the classic AVX2 SGEMM kernel. A tile wider than a block
// runs block by block, each re-reading its rows of A from L1.
#if defined(QKV_ATTENTION_PRODUCTS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_PRODUCTS_INL_H_
#undef QKV_ATTENTION_PRODUCTS_INL_H_
#else
#define QKV_ATTENTION_PRODUCTS_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <hwy/highway.h>

#include "simd/convert-inl.h"
#include "simd/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace products {
using namespace ::qkv::simd::HWY_NAMESPACE;  // NOLINT: written in the SIMD layer's words

// ---- Micro-kernels ------------------------------------------------------------------------
// `Mq` is the query-tile width in floats (a multiple of the lane count); NQV vectors of it
// are live. Rows of A, B, V, K are read through a row stride, their elements contiguous.

// What a product does with C: overwrite it; add to it after scaling query column q by
// alpha[q] (the online softmax's rescale of the output); or add its sum, formed from zero,
// to C at the end (C + Σ: the same bits as storing Σ and adding it to C afterwards).
enum class Into { kStore, kRescaleAdd, kAdd };

// C[j][q] ← Σ_d A[j][d] · Bt[d][q] for NK rows j, as `kInto` says. With A = K, V: the scores
// S = K Qᵀ and the backward's dP = V dOᵀ. With A = Vᵀ (packed): the output Oᵀ += Vᵀ P. Each
// step of d broadcasts one element of each of NK rows of A: along a row of A, so the NK rows
// cost NK new cache lines every 16 steps. (Broadcasting along a column instead, as
// packed_times_rows does, costs a new line every step: P V with V read in place ran 4–8%
// slower.)
// A's elements are fp32, bf16 or fp16 (K and V where they lie), widened as they are broadcast;
// a 16-bit A steps two elements of d at a time (one 32-bit load per bf16 pair), in the same
// order of additions as fp32.
template <int NQV, int NK, Into kInto = Into::kStore, class T = float>
HWY_INLINE void rows_times_packed(const T* HWY_RESTRICT a, int64_t a_stride,
                                  const float* HWY_RESTRICT bt, int64_t depth, int64_t Mq,
                                  float* HWY_RESTRICT c, const float* HWY_RESTRICT alpha) {
  static_assert(kInto == Into::kStore || kInto == Into::kRescaleAdd);
  const size_t N = lanes();
  VfSlot acc[NK][NQV];
  for (int j = 0; j < NK; ++j)
    for (int v = 0; v < NQV; ++v) {
      if constexpr (kInto == Into::kStore) acc[j][v] = hn::Zero(df);
      else acc[j][v] = hn::Mul(hn::Load(df, c + j * Mq + v * N), hn::Load(df, alpha + v * N));
    }
  int64_t d = 0;
  if constexpr (kBroadcastFours<T>) {
    for (; d + 4 <= depth; d += 4)
      for (int j = 0; j < NK; ++j) {
        VfSlot x[4];
        broadcast_four(a + j * a_stride + d, x);
        for (int i = 0; i < 4; ++i)
          for (int v = 0; v < NQV; ++v)
            acc[j][v] = hn::MulAdd(x[i], hn::Load(df, bt + (d + i) * Mq + v * N), acc[j][v]);
      }
  }
  if constexpr (!std::is_same_v<T, float>) {
    for (; d + 2 <= depth; d += 2) {
      VfSlot b0[NQV], b1[NQV];
      for (int v = 0; v < NQV; ++v) {
        b0[v] = hn::Load(df, bt + d * Mq + v * N);
        b1[v] = hn::Load(df, bt + (d + 1) * Mq + v * N);
      }
      for (int j = 0; j < NK; ++j) {
        Vf x0, x1;
        broadcast_pair(a + j * a_stride + d, x0, x1);
        for (int v = 0; v < NQV; ++v) acc[j][v] = hn::MulAdd(x0, b0[v], acc[j][v]);
        for (int v = 0; v < NQV; ++v) acc[j][v] = hn::MulAdd(x1, b1[v], acc[j][v]);
      }
    }
  }
  for (; d < depth; ++d) {
    VfSlot b[NQV];
    for (int v = 0; v < NQV; ++v) b[v] = hn::Load(df, bt + d * Mq + v * N);
    for (int j = 0; j < NK; ++j) {
      const Vf x = broadcast_widened(a + j * a_stride + d);
      for (int v = 0; v < NQV; ++v) acc[j][v] = hn::MulAdd(x, b[v], acc[j][v]);
    }
  }
  for (int j = 0; j < NK; ++j)
    for (int v = 0; v < NQV; ++v) hn::Store(acc[j][v], df, c + j * Mq + v * N);
}

// Ct[e][q] ← Σ_j B[j][e] · P[j][q] for NE columns e starting at e0, stored or added to Ct as
// `kInto` says (kStore or kAdd): the backward's dQᵀ part Kᵀ dS with K read in place.
// (Transposing K for rows_times_packed, as the forward does with V, made the backward slower:
// there nothing shares the transposed copy, which is one more 32 KiB stream per key step.)
template <int NQV, int NE, Into kInto, class T>
HWY_INLINE void packed_times_rows(const float* HWY_RESTRICT p, int64_t rows, int64_t Mq,
                                  const T* HWY_RESTRICT b, int64_t b_stride, int64_t e0,
                                  float* HWY_RESTRICT ct) {
  static_assert(kInto == Into::kStore || kInto == Into::kAdd);
  const size_t N = lanes();
  VfSlot acc[NE][NQV];
  for (int e = 0; e < NE; ++e)
    for (int v = 0; v < NQV; ++v) acc[e][v] = hn::Zero(df);
  for (int64_t j = 0; j < rows; ++j) {
    VfSlot x[NQV];
    for (int v = 0; v < NQV; ++v) x[v] = hn::Load(df, p + j * Mq + v * N);
    const T* brow = b + j * b_stride + e0;
    int e = 0;
    if constexpr (kBroadcastFours<T>)
      for (; e + 4 <= NE; e += 4) {
        VfSlot y[4];
        broadcast_four(brow + e, y);
        for (int i = 0; i < 4; ++i)
          for (int v = 0; v < NQV; ++v) acc[e + i][v] = hn::MulAdd(y[i], x[v], acc[e + i][v]);
      }
    for (; e < NE; ++e) {
      const Vf y = broadcast_widened(brow + e);
      for (int v = 0; v < NQV; ++v) acc[e][v] = hn::MulAdd(y, x[v], acc[e][v]);
    }
  }
  for (int e = 0; e < NE; ++e)
    for (int v = 0; v < NQV; ++v) {
      float* c = ct + (e0 + e) * Mq + v * N;
      const Vf sum = acc[e][v];
      hn::Store(kInto == Into::kAdd ? hn::Add(hn::Load(df, c), sum) : sum, df, c);
    }
}

// C[j][e] += Σ_q P[j][q] · R[q][e] for NJ rows j and NEV vectors of columns from e0:
// a tile product reduced over the queries, vectorised along e (backward: dV += Pᵀ dO and
// dK += dSᵀ Q). R rows are padded to whole vectors.
template <int NJ, int NEV>
HWY_INLINE void packed_transposed_times_rows(const float* HWY_RESTRICT p, int64_t Mq,
                                             int64_t queries, const float* HWY_RESTRICT r,
                                             int64_t r_stride, int64_t e0, float* HWY_RESTRICT c,
                                             int64_t c_stride) {
  const size_t N = lanes();
  VfSlot acc[NJ][NEV];
  for (int j = 0; j < NJ; ++j)
    for (int v = 0; v < NEV; ++v) acc[j][v] = hn::Load(df, c + j * c_stride + e0 + v * N);
  for (int64_t q = 0; q < queries; ++q) {
    VfSlot x[NEV];
    for (int v = 0; v < NEV; ++v) x[v] = hn::Load(df, r + q * r_stride + e0 + v * N);
    for (int j = 0; j < NJ; ++j) {
      const Vf y = hn::Set(df, p[j * Mq + q]);
      for (int v = 0; v < NEV; ++v) acc[j][v] = hn::MulAdd(y, x[v], acc[j][v]);
    }
  }
  for (int j = 0; j < NJ; ++j)
    for (int v = 0; v < NEV; ++v) hn::Store(acc[j][v], df, c + j * c_stride + e0 + v * N);
}

// Rows of the next key tile to bring into L2, a few cache lines at a time: the drivers below
// ask for some after each micro-kernel call, so the prefetches overlap the arithmetic. (Issued
// in one loop, ~1,000 prefetches of lines coming from memory stall on the line-fill buffers:
// ~4% of the forward's time at seq 2048, dim 128.)
class PrefetchQueue {
 public:
  // Rows [0, rows) of two row sets (a key tile of K and of V, of any element type): `count`
  // elements wide, `stride` elements apart, `per_call` lines asked for after each micro-kernel
  // call.
  template <class A, class B>
  void reset(const A* a, int64_t a_stride, int64_t a_count, const B* b, int64_t b_stride,
             int64_t b_count, int64_t rows, int per_call = 8) {
    per_call_ = per_call;
    base_[0] = reinterpret_cast<const char*>(a), base_[1] = reinterpret_cast<const char*>(b);
    stride_[0] = a_stride * int64_t{sizeof(A)}, stride_[1] = b_stride * int64_t{sizeof(B)};
    lines_[0] = (a_count * int64_t{sizeof(A)} + 63) / 64;
    lines_[1] = (b_count * int64_t{sizeof(B)} + 63) / 64;
    rows_ = rows;
    set_ = rows > 0 ? 0 : 2, row_ = line_ = 0;
  }
  // Asks for the next `count` cache lines.
  void issue(int count) {
    for (; count > 0 && set_ < 2; --count) {
      __builtin_prefetch(base_[set_] + row_ * stride_[set_] + line_ * 64, 0, 2);
      if (++line_ == lines_[set_]) {
        line_ = 0;
        if (++row_ == rows_) row_ = 0, ++set_;
      }
    }
  }
  void issue_all() { issue(std::numeric_limits<int>::max()); }
  // What a micro-kernel call asks for: `per_call` lines (from reset).
  void issue_per_call() { issue(per_call_); }

 private:
  const char* base_[2] = {};  // strides in bytes
  int64_t stride_[2] = {}, lines_[2] = {}, rows_ = 0;
  int set_ = 2, per_call_ = 8;
  int64_t row_ = 0, line_ = 0;
};

// Full-width drivers over any number of rows / columns, with the remainders dispatched to
// smaller instantiations; each asks `prefetch` (when given) for a few lines per call.

// Query vectors one micro-kernel block spans, and its rows: with 32 registers, 24
// accumulators whatever the width (plus NQV loads and a broadcast: 29 of 32); with 16, 12
// accumulators in blocks of at most 2 vectors (plus 2 loads and a broadcast: 15 of 16).
inline constexpr int kBlockVectors = kVectorRegisters >= 32 ? 4 : 2;
constexpr int product_rows(int nqv) {
  if (kVectorRegisters >= 32) return nqv >= 4 ? 6 : nqv == 3 ? 8 : nqv == 2 ? 12 : 16;
  return nqv >= 2 ? 6 : 12;
}
template <int NQV>
inline constexpr int kProductRows = product_rows(NQV);

// C ← A Bt over `rows` rows of A, as `kInto` says, in blocks of kProductRows rows and up to
// kBlockVectors query vectors (a wider tile runs its query vectors block by block).
template <int NQV, Into kInto, class T>
void rows_times_packed_tile(const T* a, int64_t a_stride, int64_t rows, const float* bt,
                            int64_t depth, int64_t Mq, float* c, const float* alpha,
                            PrefetchQueue* prefetch) {
  if constexpr (NQV > kBlockVectors) {
    const int64_t rest = kBlockVectors * static_cast<int64_t>(lanes());
    rows_times_packed_tile<kBlockVectors, kInto>(a, a_stride, rows, bt, depth, Mq, c, alpha,
                                                 prefetch);
    rows_times_packed_tile<NQV - kBlockVectors, kInto>(a, a_stride, rows, bt + rest, depth, Mq,
                                                       c + rest, alpha ? alpha + rest : nullptr,
                                                       prefetch);
  } else {
    constexpr int NK = kProductRows<NQV>;
    int64_t j = 0;
    for (; j + NK <= rows; j += NK) {
      rows_times_packed<NQV, NK, kInto>(a + j * a_stride, a_stride, bt, depth, Mq, c + j * Mq,
                                        alpha);
      if (prefetch) prefetch->issue_per_call();
    }
    if (j < rows)
      with_count<NK - 1>(static_cast<int>(rows - j), [&](auto nk) {
        rows_times_packed<NQV, decltype(nk)::value, kInto>(a + j * a_stride, a_stride, bt, depth,
                                                           Mq, c + j * Mq, alpha);
      });
  }
}

// C[j][q] = Σ_d A[j][d] · Bt[d][q] over `rows` rows of A (the keys, of any element type):
// S = K Qᵀ, dP = V dOᵀ.
template <int NQV, class T>
void scores_tile(const T* a, int64_t a_stride, int64_t rows, const float* bt, int64_t depth,
                 int64_t Mq, float* c, PrefetchQueue* prefetch = nullptr) {
  rows_times_packed_tile<NQV, Into::kStore>(a, a_stride, rows, bt, depth, Mq, c, nullptr, prefetch);
}

// Ct[e][q] = Ct[e][q] · alpha[q] + Σ_j Bt[e][j] · P[j][q] for the `columns` rows of Bt,
// over `keys` keys: Oᵀ ← alpha Oᵀ + Vᵀ P.
template <int NQV>
void accumulate_tile(const float* p, int64_t keys, int64_t Mq, const float* bt, int64_t bt_stride,
                     int64_t columns, const float* alpha, float* ct,
                     PrefetchQueue* prefetch = nullptr) {
  rows_times_packed_tile<NQV, Into::kRescaleAdd>(bt, bt_stride, columns, p, keys, Mq, ct, alpha,
                                                 prefetch);
}

// Ct[e][q] ← (or +=, as `kInto` says) Σ_j B[j][e] · P[j][q] over `keys` rows of B read in
// place, for `columns` columns e: dQᵀ's part Kᵀ dS.
template <int NQV, Into kInto, class T>
void accumulate_tile_rows(const float* p, int64_t keys, int64_t Mq, const T* b,
                          int64_t b_stride, int64_t columns, float* ct) {
  if constexpr (NQV > kBlockVectors) {
    const int64_t rest = kBlockVectors * static_cast<int64_t>(lanes());
    accumulate_tile_rows<kBlockVectors, kInto>(p, keys, Mq, b, b_stride, columns, ct);
    accumulate_tile_rows<NQV - kBlockVectors, kInto>(p + rest, keys, Mq, b, b_stride, columns,
                                                     ct + rest);
  } else {
    constexpr int NE = kProductRows<NQV>;
    int64_t e = 0;
    for (; e + NE <= columns; e += NE)
      packed_times_rows<NQV, NE, kInto>(p, keys, Mq, b, b_stride, e, ct);
    if (e < columns)
      with_count<NE - 1>(static_cast<int>(columns - e), [&](auto ne) {
        packed_times_rows<NQV, decltype(ne)::value, kInto>(p, keys, Mq, b, b_stride, e, ct);
      });
  }
}

// With 32 registers: column blocks of up to 8 vectors (a row of 128 floats in one block),
// and as many rows per block as keep 24 or fewer accumulators (at most 8). Against 4 × 6
// blocks everywhere, this took the backward 1.6–3% faster at dim 128 and 6% at dim 64 (no
// 2-vector remainder blocks at dim 128, 24 accumulators instead of 16 at dim 64). With 16:
// blocks of 2 vectors × 6 rows or 1 × 12 (12 accumulators, 2 loads, a broadcast).
inline constexpr int kTransposedMaxVectors = kVectorRegisters >= 32 ? 8 : 2;
template <int NEV>
inline constexpr int kTransposedRows = kVectorRegisters >= 32 ? (NEV >= 7   ? 3
                                                                 : NEV >= 5 ? 4
                                                                 : NEV == 4 ? 6
                                                                            : 8)
                                                              : (NEV >= 2 ? 6 : 12);

// C[Kt][E] += Pᵀ R over `queries` queries; E (a multiple of the lane count) is the padded
// row width of R and C.
HWY_INLINE void accumulate_transposed_tile(const float* p, int64_t rows, int64_t Mq,
                                           int64_t queries, const float* r, int64_t r_stride,
                                           int64_t columns, float* c, int64_t c_stride) {
  const int64_t N = static_cast<int64_t>(lanes());
  const int64_t vectors = columns / N;
  for (int64_t v = 0; v < vectors; v += kTransposedMaxVectors) {
    const int nev = static_cast<int>(std::min<int64_t>(kTransposedMaxVectors, vectors - v));
    with_count<kTransposedMaxVectors>(nev, [&](auto nev_c) {
      constexpr int NEV = decltype(nev_c)::value, NJ = kTransposedRows<NEV>;
      int64_t j = 0;
      for (; j + NJ <= rows; j += NJ)
        packed_transposed_times_rows<NJ, NEV>(p + j * Mq, Mq, queries, r, r_stride, v * N,
                                              c + j * c_stride, c_stride);
      if (j < rows)
        with_count<NJ - 1>(static_cast<int>(rows - j), [&](auto nj) {
          packed_transposed_times_rows<decltype(nj)::value, NEV>(
              p + j * Mq, Mq, queries, r, r_stride, v * N, c + j * c_stride, c_stride);
        });
    });
  }
}

}  // namespace products
}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
