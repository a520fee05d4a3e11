// Split-KV decoding: a few query rows against a long key/value cache.
//
// With one query per head there is too little work per (batch, head) to split by queries,
// and the cost is reading K and V once: the kernel is memory-bound. So the keys are cut into
// chunks (of a size set by the cache length alone), every (batch, kv head, chunk) is a unit
// of work, and the partial results (running max m, sum l, unnormalised output o) are merged
// with their log-sum-exp afterwards (merge.h; as FlashDecoding and ggml's split-KV path do):
//   m = max_c m_c,  l = Σ_c l_c e^(m_c − m),  out = Σ_c o_c e^(m_c − m) / l.
// The chunk size does not depend on the thread count and the merge runs in chunk order, so
// the result is the same bits for any number of threads.
//
// All query rows that share a key/value head (the heads of a GQA group × Tq) are processed
// together, so each key and value row is read from memory once per unit: up to 15 rows with
// their partial sums in registers (decode_unit_rows), 16 and more in vector lanes with the
// tiled kernels' pieces (decode_unit_tiled), and head dims below a vector with the keys in
// the lanes (decode_unit_keys_in_lanes).
// Compiled once per SIMD target; the entry points below dispatch (see src/simd/dispatch.h).
// Compiled once more for the bf16 units (decode_bf16.cpp, src/simd/units.h), where bf16 rows
// are multiplied as pairs (vdpbf16ps, bfdot) instead of widened: the tiled unit on both, the
// rows in registers on x86 (on Arm those still widen).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/decode.cpp"
#include <hwy/foreach_target.h>
#include <hwy/highway.h>
#include "simd/units-inl.h"

#include <algorithm>
#include <type_traits>
#include <cmath>
#include <vector>

#include "util/parallel.h"
#include "attention/kernels.h"
#include "attention/masks.h"
#include "attention/merge.h"
#include "simd/simd-inl.h"
#include "simd/convert-inl.h"
#include "attention/tiles-inl.h"
#include "simd/transpose-inl.h"
#include "qkv/threads.h"
#include "qkv/error.h"
#include "util/scratch.h"
#include "simd/dispatch.h"
#include "simd/units.h"
#include "attention/bf16_products-inl.h"
#include "attention/bf16_packing-inl.h"
#include "attention/block_rows-inl.h"

#if QKV_KERNEL_PASS
HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace simd = ::qkv::simd::HWY_NAMESPACE;
namespace {

namespace hn = simd::hn;
using simd::df;
using simd::Vf;

// Keys per unit: about a sixteenth of the cache, a power of two from 256 to 2048, so that
// even one (batch, kv head) makes 16 units while caches of 4k and more are long enough.
// Each unit reads its K rows, then its V rows: longer chunks switch between the two streams
// less often. Against 256 keys everywhere, 2048 read a 32k cache 8% faster (64k: 8.5%, 16k
// with 1024: 3%; measured in-process, 8 heads, dim 128, 2 threads). It depends on Tk only, not
// on the thread count, so the bits do not either.
int64_t chunk_for(int64_t Tk) {
  int64_t chunk = 256;
  while (chunk < 2048 && 2 * chunk * 16 <= Tk) chunk *= 2;
  return chunk;
}
constexpr int64_t kMaxRowsInLanes = 16;  // rows (GQA group × queries) of the keys-in-lanes path

struct Shape {
  int64_t B, Hq, Hkv, Tq, Tk, D, Dv, G, R, chunk, chunks;  // G = Hq / Hkv, R = G · Tq rows
  // Row r of key/value head hkv's group is query query(r) of query head head(hkv, r).
  int64_t head(int64_t hkv, int64_t r) const { return hkv * G + r / Tq; }
  int64_t query(int64_t r) const { return r % Tq; }
};

// The score transforms after q·k (softcap, bias, ALiBi) on one score: query i of head h,
// key j (scalar: a unit has few scores next to the bytes it reads).
float transformed(const AttentionArgs& a, const View& bias, const Shape& n, int64_t b, int64_t h,
                  int64_t i, int64_t j, float x) {
  if (a.softcap > 0) x = a.softcap * std::tanh(x / a.softcap);
  if (!bias.empty()) x += bias(b, h, i, j);
  if (a.mask.alibi) x += alibi_bias(a.mask, h, i, j, n.Tq, n.Tk);
  return x;
}

// Partial results of one unit: per row m, l, then o[Dv].
float* partial(float* base, const Shape& n, int64_t unit, int64_t r) {
  return base + (unit * n.R + r) * (n.Dv + 2);
}

// Key or value rows being decoded: fp32, bf16 or fp16 (a View, or a KV cache's storage),
// widened in registers as they are read. Elements of a row are contiguous.
template <typename T>
struct Rows {
  const T* data;
  int64_t batch_stride, head_stride, row_stride;
  const T* row(int64_t b, int64_t h, int64_t j) const {
    return data + b * batch_stride + h * head_stride + j * row_stride;
  }
};

using simd::Bf16;
using simd::F16;
using simd::widen_one;

// bf16 rows are widened 2N elements at a time into an even and an odd vector
// (simd::load_pair_widened: half the widening work of load_widened), so the kernels that sum
// over the elements keep their other operand in that order: the first paired_span(D) elements
// of the scaled queries, and of the partial outputs while a unit runs, are stored as blocks of
// 2N, even elements first. (Rows of 4 query rows per key/value head, dim 128, bf16 cache on
// Zen 4: the widening took as many instructions as the FMAs it fed.)
template <typename T>
constexpr bool kPaired = std::is_same_v<T, Bf16>;
template <typename T>
int64_t paired_span(int64_t D) {
  const auto N2 = 2 * static_cast<int64_t>(simd::lanes());
  return kPaired<T> ? D / N2 * N2 : 0;
}
// x[0, span) from natural order into blocks of 2N, evens first; `back` undoes it.
void pair_order(float* x, int64_t span, bool back) {
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

// Rows this far ahead are asked for early, one row per row processed: with the hardware
// prefetcher alone the kernels read K and V at ~72% of a plain read loop; 1–4 rows ahead gave
// ~87–98%, 8 or more less again, and 16 or 64 rows ahead into L2 only no better (8 heads and
// 8 or 32 query heads, D = 128, cache 32k, 2 threads, Sapphire Rapids). On a Zen 5 host the
// rows kFarRows further on are asked for into L2 as well: with the memory in its slow phase
// (a read loop at ~55 GB/s) the AVX-512 code read at 80% of the read loop without them and
// 89–90% with them (32 or 64 rows; AVX2 code 85–88% either way), and in its fast phase (~100
// GB/s) at 70–75% either way.
constexpr int64_t kPrefetchRows = 4, kFarRows = 32;

// The row kPrefetchRows ahead of the first row of [j, j + count) of head (b, hkv), and in
// ahead_rows how many rows from it to ask for (clipped to hi); null when none.
template <typename T>
const T* rows_ahead(const Rows<T>& rows, int64_t b, int64_t hkv, int64_t j, int64_t count,
                    int64_t hi, int64_t& ahead_rows) {
  ahead_rows = std::clamp<int64_t>(hi - (j + kPrefetchRows), 0, count);
  return ahead_rows > 0 ? rows.row(b, hkv, j + kPrefetchRows) : nullptr;
}

// Asks for `row` (n elements) into L1 and the row kFarRows rows of `stride` past it into L2
// (a prefetch past the end of the cache is harmless: prefetches never fault).
template <typename T>
void prefetch_row(const T* row, int64_t stride, int64_t n) {
  const T* far = row + kFarRows * stride;
  for (int64_t i = 0; i < n; i += 64 / static_cast<int64_t>(sizeof(T))) {
    __builtin_prefetch(row + i);
    __builtin_prefetch(far + i, 0, 1);
  }
}

// m ← the max of row[0, count), row ← p = e^(row − m), l ← Σ p, in whole vectors: the row
// holds -inf from count to the next whole vector (p = 0 there). A row that sees no key keeps
// m = -inf and gets p = 0 (not e^(-inf + inf) = NaN), l = 0.
void softmax_row(float* row, int64_t count, float& m, float& l) {
  const size_t N = simd::lanes();
  Vf mx = hn::Set(df, simd::kMinusInf);
  for (int64_t j = 0; j < count; j += N) mx = hn::Max(mx, hn::LoadU(df, row + j));
  m = hn::GetLane(hn::MaxOfLanes(df, mx));
  const Vf shift = hn::Set(df, m == simd::kMinusInf ? 0.0f : m);
  Vf sum = hn::Zero(df);
  for (int64_t j = 0; j < count; j += N) {
    const Vf p = simd::exp_nonpositive(hn::Sub(hn::LoadU(df, row + j), shift));
    hn::StoreU(p, df, row + j);
    sum = hn::Add(sum, p);
  }
  l = hn::GetLane(hn::SumOfLanes(df, sum));
}

// Head dims below a vector (stories260K's are 8) waste most lanes when a vector runs along d:
// then the lanes run along 16 keys instead, and K and V columns are gathered.
bool keys_in_lanes(const Shape& n) {
  const auto N = static_cast<int64_t>(simd::lanes());
  return n.D < N && n.Dv < N && n.R <= kMaxRowsInLanes;
}

// N elements of column `e` of rows row0, row0 + stride, … (the rows past `last` repeat it):
// a gather for fp32; 16-bit elements one by one (head dims this small are rare).
template <typename T>
HWY_INLINE Vf column(const T* row0, int64_t stride, int64_t last, int64_t e) {
  const hn::RebindToSigned<simd::Df> di;
  const auto lane = hn::Iota(di, 0);
  if constexpr (std::is_same_v<T, float>) {
    const auto idx = hn::Mul(hn::Min(lane, hn::Set(di, static_cast<int32_t>(last))),
                             hn::Set(di, static_cast<int32_t>(stride)));
    return hn::GatherIndex(df, row0 + e, idx);
  } else {
    alignas(64) float x[hn::MaxLanes(df)];
    for (int64_t l = 0; l < static_cast<int64_t>(simd::lanes()); ++l)
      x[l] = widen_one(row0[std::min(l, last) * stride + e]);
    return hn::Load(df, x);
  }
}

// s[r][j − c0] ← q_r · k_j for the keys [c0, c1) visible to row r (others stay −inf).
template <typename T>
void scores_keys_in_lanes(const Rows<T>& K, const Shape& n, int64_t b, int64_t hkv, int64_t c0,
                          int64_t c1, const float* q, const KeyRange* ranges, float* s) {
  const hn::RebindToSigned<simd::Df> di;
  const auto N = static_cast<int64_t>(simd::lanes());
  const int64_t ks = K.row_stride;
  const auto lane = hn::Iota(di, 0);
  for (int64_t j = c0; j < c1; j += N) {
    // Keys past c1 read the last key again (in bounds) and are masked below.
    simd::VfSlot acc[kMaxRowsInLanes];
    for (int64_t r = 0; r < n.R; ++r) acc[r] = hn::Zero(df);
    const T* k = K.row(b, hkv, j);
    for (int64_t d = 0; d < n.D; ++d) {
      const Vf kd = column(k, ks, c1 - 1 - j, d);
      for (int64_t r = 0; r < n.R; ++r)
        acc[r] = hn::MulAdd(hn::Set(df, q[r * n.D + d]), kd, acc[r]);
    }
    const auto key = hn::Add(lane, hn::Set(di, static_cast<int32_t>(j)));
    for (int64_t r = 0; r < n.R; ++r) {
      const auto seen =
          hn::And(hn::Not(hn::Lt(key, hn::Set(di, static_cast<int32_t>(ranges[r].begin)))),
                  hn::Lt(key, hn::Set(di, static_cast<int32_t>(ranges[r].end))));
      const Vf v = hn::IfThenElse(hn::RebindMask(df, seen), acc[r], hn::Set(df, simd::kMinusInf));
      hn::StoreU(v, df, s + r * n.chunk + j - c0);
    }
  }
}

// o_r += Σ_j p_r[j] v_j over the keys [c0, c1), p = s (0 where masked).
template <typename T>
void values_keys_in_lanes(const Rows<T>& V, const Shape& n, int64_t b, int64_t hkv, int64_t c0,
                          int64_t c1, const float* s, float* parts, int64_t unit) {
  const auto N = static_cast<int64_t>(simd::lanes());
  const int64_t vs = V.row_stride;
  for (int64_t e = 0; e < n.Dv; ++e) {
    simd::VfSlot acc[kMaxRowsInLanes];
    for (int64_t r = 0; r < n.R; ++r) acc[r] = hn::Zero(df);
    for (int64_t j = c0; j < c1; j += N) {
      const Vf ve = column(V.row(b, hkv, j), vs, c1 - 1 - j, e);
      // Past c1 the probabilities are e^(−inf) = 0, so the repeated last row adds nothing.
      for (int64_t r = 0; r < n.R; ++r)
        acc[r] = hn::MulAdd(hn::LoadU(df, s + r * n.chunk + j - c0), ve, acc[r]);
    }
    for (int64_t r = 0; r < n.R; ++r)
      partial(parts, n, unit, r)[2 + e] += hn::GetLane(hn::SumOfLanes(df, Vf(acc[r])));
  }
}

// Unit (b, hkv, c): its chunk of keys [c0, c1), its rows' visible keys within it (empty:
// begin = end), and their union [lo, hi): key and value rows outside it are never read (past
// a kv_len they may hold anything). q holds each row's scaled query at q[r · D].
struct UnitRows {
  int64_t c0, c1, unit, lo, hi;
  std::vector<KeyRange> ranges;
  float* q;
};
// The calling thread's UnitRows for unit (b, hkv, c), with each row's partial result started
// as "no key seen" and the first `paired` elements of each query in pair order.
const UnitRows& start_unit(const AttentionArgs& a, float scale, const Shape& n, int64_t b,
                           int64_t hkv, int64_t c, float* parts, int64_t paired = 0) {
  thread_local UnitRows u;
  u.c0 = c * n.chunk, u.c1 = std::min(u.c0 + n.chunk, n.Tk);
  u.unit = (b * n.Hkv + hkv) * n.chunks + c;
  u.lo = u.c1, u.hi = u.c0;
  u.ranges.resize(n.R);
  u.q = thread_scratch(ForwardSlot::queries, n.R * n.D);
  for (int64_t r = 0; r < n.R; ++r) {
    const int64_t h = n.head(hkv, r), i = n.query(r);
    const KeyRange k = visible_keys(a.mask, b, i, n.Tq, n.Tk);
    KeyRange& range = u.ranges[r];
    range.begin = std::max(k.begin, u.c0);
    range.end = std::max(std::min(k.end, u.c1), range.begin);
    if (range.begin < range.end)
      u.lo = std::min(u.lo, range.begin), u.hi = std::max(u.hi, range.end);
    tiles::with_element_type(a.q.type, [&](auto element) {
      using Q = decltype(element);
      const Q* row = static_cast<const Q*>(a.q.address()) + b * a.q.stride[0] +
                     h * a.q.stride[1] + i * a.q.stride[2];
      for (int64_t d = 0; d < n.D; ++d) u.q[r * n.D + d] = scale * widen_one(row[d * a.q.stride[3]]);
    });
    pair_order(u.q + r * n.D, paired, false);
    float* out = partial(parts, n, u.unit, r);
    out[0] = simd::kMinusInf, out[1] = 0;
    std::fill(out + 2, out + 2 + n.Dv, 0.0f);
  }
  return u;
}

// A row's scores s[j − lo] for keys j in [lo, hi), of which it sees `range`: the score
// transforms on the keys it sees, -inf on the rest up to the next whole vector past hi, then
// softmax_row into the row's partial result.
void finish_scores(const AttentionArgs& a, const View& bias, const Shape& n, int64_t b, int64_t hkv,
                   int64_t r, KeyRange range, int64_t lo, int64_t hi, float* s, float* out) {
  const int64_t N = static_cast<int64_t>(simd::lanes());
  if (has_score_transforms(a))
    for (int64_t j = range.begin; j < range.end; ++j)
      s[j - lo] = transformed(a, bias, n, b, n.head(hkv, r), n.query(r), j, s[j - lo]);
  const int64_t begin = std::clamp(range.begin, lo, hi), end = std::clamp(range.end, begin, hi);
  std::fill(s, s + (begin - lo), simd::kMinusInf);
  std::fill(s + (end - lo), s + (hi - lo + N - 1) / N * N, simd::kMinusInf);
  softmax_row(s, hi - lo, out[0], out[1]);
}

// One unit with the keys in the lanes (see keys_in_lanes).
template <typename T>
void decode_unit_keys_in_lanes(const AttentionArgs& a, const Rows<T>& K, const Rows<T>& V,
                               const View& bias, float scale, const Shape& n, int64_t b,
                               int64_t hkv, int64_t c, float* parts) {
  const UnitRows& u = start_unit(a, scale, n, b, hkv, c, parts);
  if (u.lo >= u.hi) return;
  float* s = thread_scratch(ForwardSlot::scores, n.R * n.chunk);
  // Scores of the keys [c0, hi), -inf where a row may not look.
  scores_keys_in_lanes(K, n, b, hkv, u.c0, u.hi, u.q, u.ranges.data(), s);
  for (int64_t r = 0; r < n.R; ++r)
    finish_scores(a, bias, n, b, hkv, r, u.ranges[r], u.c0, u.hi, s + r * n.chunk,
                  partial(parts, n, u.unit, r));
  values_keys_in_lanes(V, n, b, hkv, u.c0, u.hi, s, parts, u.unit);
}

// ---- A few rows per key/value head, their sums in registers --------------------------------

// Below this many rows (GQA group × queries) per key/value head, decode_unit_rows; from it on,
// decode_unit_tiled. Cache 32k, dim 128, 2 threads, against the tiled path: 8 rows 1.3–1.7×
// faster, 12 rows 1.3×, 16 rows the same.
constexpr int64_t kTiledDecodeMinRows = 16;
constexpr int kGroupRows = 4;  // rows per register block

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

using PartialDots =
    simd::VfSlot[hn::MaxLanes(df)];  // one row's vectors of partial products, N keys

// part[r][jj + j] ← q_r ⊙ k_j summed over the head dim's whole vectors, for RG rows of q (D
// apart) and KG key rows k_j (ks apart): each q vector loaded once for KG keys. (Pairs of keys
// read K at 8 rows per kv head 5–7% faster than one key with two chains per row; four keys
// at a time were slower from memory.)
// The first `paired` elements of q are in pair order.
template <int RG, int KG, typename T>
HWY_INLINE void key_dots(const float* q, int64_t D, const T* k, int64_t ks, int64_t paired,
                         int64_t whole, PartialDots* part, int64_t jj) {
  constexpr int64_t N = hn::MaxLanes(df);
  simd::VfSlot acc[RG][KG];
  for (int r = 0; r < RG; ++r)
    for (int j = 0; j < KG; ++j) acc[r][j] = hn::Zero(df);
  int64_t d = 0;
  if constexpr (kPaired<T>)
    for (; d < paired; d += 2 * N) {
      simd::VfSlot even[KG], odd[KG];
      for (int j = 0; j < KG; ++j) {
        Vf e, o;
        simd::load_pair_widened(k + j * ks + d, e, o);
        even[j] = e, odd[j] = o;
      }
      for (int r = 0; r < RG; ++r) {
        const Vf qe = hn::LoadU(df, q + r * D + d), qo = hn::LoadU(df, q + r * D + d + N);
        for (int j = 0; j < KG; ++j)
          acc[r][j] = hn::MulAdd(qo, odd[j], hn::MulAdd(qe, even[j], acc[r][j]));
      }
    }
  for (; d < whole; d += N) {
    simd::VfSlot kv[KG];
    for (int j = 0; j < KG; ++j) kv[j] = simd::load_widened(k + j * ks + d);
    for (int r = 0; r < RG; ++r) {
      const Vf qv = hn::LoadU(df, q + r * D + d);
      for (int j = 0; j < KG; ++j) acc[r][j] = hn::MulAdd(qv, kv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < RG; ++r)
    for (int j = 0; j < KG; ++j) part[r][jj + j] = acc[r][j];
}

// s[r · s_stride + jj] ← q_r · k_jj for the R rows and nk ≤ N keys from k (lanes past nk get
// 0): key rows are read in order, each once for all rows, and lane_sums turns each row's N
// vectors of partial products into its N scores. (With a horizontal sum per score and the
// output updated in memory per key, 4 to 8 rows read K and V at 33–54% of a read loop from
// L3; this way 65–88%.)
template <typename T>
void block_scores(const float* q, int64_t R, int64_t D, const T* k, int64_t ks, int64_t nk,
                  const T* ahead, int64_t ahead_rows, float* s, int64_t s_stride) {
  constexpr int64_t N = hn::MaxLanes(df);
  const int64_t whole = D / N * N, paired = paired_span<T>(D);
  PartialDots part[kTiledDecodeMinRows];
  // All rows for KG keys from jj on.
  const auto keys_from = [&](int64_t jj, auto keys) {
    constexpr int KG = decltype(keys)::value;
    for (int j = 0; j < KG; ++j)
      if (jj + j < ahead_rows) prefetch_row(ahead + (jj + j) * ks, ks, D);
    for (int64_t r = 0; r < R; r += kGroupRows)
      simd::with_count<kGroupRows>(
          static_cast<int>(std::min<int64_t>(kGroupRows, R - r)), [&](auto rows) {
            key_dots<decltype(rows)::value, KG>(q + r * D, D, k + jj * ks, ks, paired, whole,
                                                part + r, jj);
          });
  };
  int64_t jj = 0;
  for (; jj + 2 <= nk; jj += 2) keys_from(jj, std::integral_constant<int, 2>{});
  if (jj < nk) keys_from(jj, std::integral_constant<int, 1>{});
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t lane = nk; lane < N; ++lane) part[r][lane] = hn::Zero(df);
    hn::StoreU(lane_sums(part[r]), df, s + r * s_stride);
  }
  for (int64_t d = whole; d < D; ++d)  // a head dim that is not whole vectors
    for (int64_t key = 0; key < nk; ++key)
      for (int64_t r = 0; r < R; ++r)
        s[r * s_stride + key] += q[r * D + d] * widen_one(k[key * ks + d]);  // past `paired`
}

// Value vectors per pass of block_values: RG × W accumulators, W value vectors and a
// broadcast live (one row's value vectors are folded into its FMAs): at most 25 of 32
// registers, 13 of 16.
template <int RG>
inline constexpr int kValueVectors = simd::kVectorRegisters >= 32 ? (RG <= 2 ? 8 : 4)
                                     : RG == 1                    ? 8
                                     : RG == 2                    ? 4
                                     : RG == 3                    ? 3
                                                                  : 2;

// o_r[e0, e0 + W N) += Σ_jj p_r[jj] v_jj[e0, e0 + W N) over nk value rows v, for RG rows
// (p_r = p + r · p_stride), the sums in registers across the rows; asks for ahead_rows rows of
// `ahead` (Dv wide), one per value row. Paired: those columns of o are in pair order (W even).
template <int RG, int W, bool Paired, typename T>
void block_values(const float* p, int64_t p_stride, const T* v, int64_t vs, int64_t nk, int64_t e0,
                  float* const* o, const T* ahead, int64_t ahead_rows, int64_t Dv) {
  constexpr int64_t N = hn::MaxLanes(df);
  simd::VfSlot acc[RG][W];
  for (int r = 0; r < RG; ++r)
    for (int w = 0; w < W; ++w) acc[r][w] = hn::LoadU(df, o[r] + e0 + w * N);
  for (int64_t jj = 0; jj < nk; ++jj) {
    if (jj < ahead_rows) prefetch_row(ahead + jj * vs, vs, Dv);
    simd::VfSlot x[W];
    if constexpr (Paired) {
      static_assert(W % 2 == 0, "pairs of vectors");
      for (int w = 0; w < W; w += 2) {
        Vf even, odd;
        simd::load_pair_widened(v + jj * vs + e0 + w * N, even, odd);
        x[w] = even, x[w + 1] = odd;
      }
    } else {
      for (int w = 0; w < W; ++w) x[w] = simd::load_widened(v + jj * vs + e0 + w * N);
    }
    for (int r = 0; r < RG; ++r) {
      const Vf pr = hn::Set(df, p[r * p_stride + jj]);
      for (int w = 0; w < W; ++w) acc[r][w] = hn::MulAdd(pr, x[w], acc[r][w]);
    }
  }
  for (int r = 0; r < RG; ++r)
    for (int w = 0; w < W; ++w) hn::StoreU(acc[r][w], df, o[r] + e0 + w * N);
}

// Value rows per block: the passes over a block's columns find its rows in L1.
constexpr int64_t kValueBlock = 64;

// o_r += Σ_jj p_r[jj] v_jj over the nk value rows v (vs apart) of one value block, for the
// n.R rows (p_r = s + r · stride + j), in groups of up to 4 rows and passes of kValueVectors
// columns; the first pass asks for ahead_rows rows of `next`.
template <typename T>
void value_block(const float* s, int64_t stride, int64_t j, int64_t nk, const T* v, int64_t vs,
                 const T* next, int64_t ahead_rows, const Shape& n, float* const* o) {
  const int64_t N = static_cast<int64_t>(simd::lanes());
  const int64_t whole = n.Dv / N * N, paired = paired_span<T>(n.Dv);
  for (int64_t r = 0; r < n.R; r += kGroupRows) {
    const float* p = s + r * stride + j;
      simd::with_count<kGroupRows>(
          static_cast<int>(std::min<int64_t>(kGroupRows, n.R - r)), [&](auto rows) {
            constexpr int RG = decltype(rows)::value, W = kValueVectors<RG>;
            int64_t e = 0;
            if constexpr (kPaired<T>) {
              constexpr int WP = W < 2 ? 2 : W / 2 * 2;  // pairs of vectors
              for (; e + WP * N <= paired; e += WP * N, next = nullptr, ahead_rows = 0)
                block_values<RG, WP, true>(p, stride, v, vs, nk, e, o + r, next, ahead_rows, n.Dv);
              if (e < paired)
                simd::with_count<WP / 2>(static_cast<int>((paired - e) / (2 * N)), [&](auto w) {
                  block_values<RG, 2 * decltype(w)::value, true>(p, stride, v, vs, nk, e, o + r,
                                                                 next, ahead_rows, n.Dv);
                });
              if (e < paired) e = paired, next = nullptr, ahead_rows = 0;
            }
            for (; e + W * N <= whole; e += W * N, next = nullptr, ahead_rows = 0)
              block_values<RG, W, false>(p, stride, v, vs, nk, e, o + r, next, ahead_rows, n.Dv);
            if (e < whole)
              simd::with_count<W>(static_cast<int>((whole - e) / N), [&](auto w) {
                block_values<RG, decltype(w)::value, false>(p, stride, v, vs, nk, e, o + r, next,
                                                            ahead_rows, n.Dv);
              });
            next = nullptr, ahead_rows = 0;
          });
  }
  for (int64_t e = whole; e < n.Dv; ++e)  // a value dim that is not whole vectors
    for (int64_t jj = 0; jj < nk; ++jj)
      for (int64_t r = 0; r < n.R; ++r)
        o[r][e] += s[r * stride + j + jj] * widen_one(v[jj * vs + e]);
}

// One unit of R < kTiledDecodeMinRows rows: the scores of the keys N at a time, each row's
// softmax, then P·V over blocks of value rows, in groups of up to 4 rows and passes of
// kValueVectors columns. Each key and value row is read from memory once.
template <typename T>
void decode_unit_rows(const AttentionArgs& a, const Rows<T>& K, const Rows<T>& V, const View& bias,
                      float scale, const Shape& n, int64_t b, int64_t hkv, int64_t c,
                      float* parts) {
  const int64_t N = static_cast<int64_t>(simd::lanes());
  const UnitRows& u = start_unit(a, scale, n, b, hkv, c, parts, paired_span<T>(n.D));
  const int64_t lo = u.lo, hi = u.hi;
  if (lo >= hi) return;
  const int64_t stride = n.chunk + N;  // a row of scores, and room for a whole vector past it
  float* s = thread_scratch(ForwardSlot::scores, n.R * stride);
  const auto ahead = [&](const Rows<T>& rows, int64_t j, int64_t count, int64_t& ahead_rows) {
    return rows_ahead(rows, b, hkv, j, count, hi, ahead_rows);
  };
  for (int64_t j = lo; j < hi; j += N) {
    const int64_t nk = std::min(N, hi - j);
    int64_t ahead_rows;
    const T* next = ahead(K, j, nk, ahead_rows);
    block_scores(u.q, n.R, n.D, K.row(b, hkv, j), K.row_stride, nk, next, ahead_rows, s + (j - lo),
                 stride);
  }
  float* o[kTiledDecodeMinRows];
  for (int64_t r = 0; r < n.R; ++r) {
    float* out = partial(parts, n, u.unit, r);
    finish_scores(a, bias, n, b, hkv, r, u.ranges[r], lo, hi, s + r * stride, out);
    o[r] = out + 2;
  }
  // (o starts at zero: already in pair order.)
  for (int64_t j = lo; j < hi; j += kValueBlock) {
    const int64_t nk = std::min(kValueBlock, hi - j);
    int64_t ahead_rows;
    const T* next = ahead(V, j, nk, ahead_rows);  // asked for by the first pass only
    value_block(s, stride, j - lo, nk, V.row(b, hkv, j), V.row_stride, next, ahead_rows, n, o);
  }
  for (int64_t r = 0; r < n.R; ++r) pair_order(o[r], paired_span<T>(n.Dv), true);
}

// decode_unit_rows over keys and values in 32-value blocks (a Q8_0, Q4_0 or Q4_1 cache): the same
// walk, each block's values widened in registers as they are read and its scale applied once,
// so the rows' bytes are read once and no fp32 copy of them is made. (Fewer operations per
// stored byte than the fp32 rows: still more than 85% of the read loop allows from 4 rows per
// kv head on; docs/tuning.md has the arithmetic.)

// The row 8 rows past `row` (itself kPrefetchRows ahead of the one being read) into L1. A row
// of blocks is read faster than an fp32 one, so it is asked for further ahead; a second,
// farther request into L2 (as the fp32 rows have) measured slower here: 37-56% of the read
// loop against 62-72% (Zen 4, 8/8 heads, 32k q8_0 cache; no prefetch at all 55-78%).
HWY_INLINE void prefetch_blocks(const uint8_t* row, int64_t stride, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(row + 8 * stride + i);
}

// key_dots over rows of blocks: part[r][jj + j] ← q_r ⊙ k_j for RG rows and KG keys (ks bytes
// apart), D a multiple of 32.
// Block by block: one row sums q · (the block's integers) and scales that by d once (one
// FMA per block, not a multiply per vector); several rows share each key vector, scaled once.
template <TensorType kType, int RG, int KG>
HWY_INLINE void key_dots_blocks(const float* q, int64_t D, const uint8_t* k, int64_t ks,
                                PartialDots* part, int64_t jj) {
  constexpr int64_t N = hn::MaxLanes(df), kBytes = kBlockBytes<kType>;
  simd::VfSlot acc[RG][KG];
  for (int r = 0; r < RG; ++r)
    for (int j = 0; j < KG; ++j) acc[r][j] = hn::Zero(df);
  for (int64_t d0 = 0, at = 0; d0 < D; d0 += kBlockValues, at += kBytes) {
    if constexpr (RG == 1) {
      // With an offset m: q · x = d (q · ints) + m Σ q, Σ q kept in lanes beside the dots.
      simd::VfSlot dot[KG];
      [[maybe_unused]] Vf qsum = hn::Zero(df);
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

// block_scores over rows of blocks: s[r · s_stride + jj] ← q_r · k_jj for nk ≤ N keys.
template <TensorType kType>
void block_scores_blocks(const float* q, int64_t R, int64_t D, const BlockRows& K, const uint8_t* k,
                         int64_t nk, int64_t ahead_rows, float* s, int64_t s_stride) {
  constexpr int64_t N = hn::MaxLanes(df);
  const int64_t ks = K.stride_bytes(), bytes = K.row_bytes();
  PartialDots part[kTiledDecodeMinRows];
  const auto keys_from = [&](int64_t jj, auto keys) {
    constexpr int KG = decltype(keys)::value;
    for (int j = 0; j < KG; ++j)
      if (jj + j < ahead_rows) prefetch_blocks(k + (jj + j + kPrefetchRows) * ks, ks, bytes);
    for (int64_t r = 0; r < R; r += kGroupRows)
      simd::with_count<kGroupRows>(
          static_cast<int>(std::min<int64_t>(kGroupRows, R - r)), [&](auto rows) {
            key_dots_blocks<kType, decltype(rows)::value, KG>(q + r * D, D, k + jj * ks, ks,
                                                              part + r, jj);
          });
  };
  int64_t jj = 0;
  if (R <= 2)  // four chains of FMAs rather than two: more in flight
    for (; jj + 4 <= nk; jj += 4) keys_from(jj, std::integral_constant<int, 4>{});
  for (; jj + 2 <= nk; jj += 2) keys_from(jj, std::integral_constant<int, 2>{});
  if (jj < nk) keys_from(jj, std::integral_constant<int, 1>{});
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t lane = nk; lane < N; ++lane) part[r][lane] = hn::Zero(df);
    hn::StoreU(lane_sums(part[r]), df, s + r * s_stride);
  }
}

// block_values over rows of blocks: o_r[e0, e0 + W N) += Σ_jj p_r[jj] v_jj for nk value rows
// (vs bytes apart); the first ahead_rows rows kPrefetchRows further on are asked for.
// kAligned: e0 is a multiple of 32 (so vector w begins a block where w · N is one).
template <TensorType kType, int RG, int W, bool kAligned>
void block_values_blocks(const float* p, int64_t p_stride, const uint8_t* v, int64_t vs,
                         int64_t bytes, int64_t nk, int64_t e0, float* const* o,
                         int64_t ahead_rows) {
  constexpr int64_t N = hn::MaxLanes(df);
  simd::VfSlot acc[RG][W];
  for (int r = 0; r < RG; ++r)
    for (int w = 0; w < W; ++w) acc[r][w] = hn::LoadU(df, o[r] + e0 + w * N);
  for (int64_t jj = 0; jj < nk; ++jj) {
    if (jj < ahead_rows) prefetch_blocks(v + (jj + kPrefetchRows) * vs, vs, bytes);
    const uint8_t* row = v + jj * vs;
    if constexpr (kAligned && RG <= 2) {
      // p · d once per block and row, the block's integers widened into the FMAs.
      // (and p · m, with an offset)
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
      for (int r = 0; r < RG; ++r) {
        const Vf pr = hn::Set(df, p[r * p_stride + jj]);
        for (int w = 0; w < W; ++w) acc[r][w] = hn::MulAdd(pr, x[w], acc[r][w]);
      }
    }
  }
  for (int r = 0; r < RG; ++r)
    for (int w = 0; w < W; ++w) hn::StoreU(acc[r][w], df, o[r] + e0 + w * N);
}

template <TensorType kType>
void decode_unit_rows_blocks(const AttentionArgs& a, const BlockRows& K, const BlockRows& V,
                             const View& bias, float scale, const Shape& n, int64_t b,
                             int64_t hkv, int64_t c, float* parts) {
  const int64_t N = static_cast<int64_t>(simd::lanes());
  const UnitRows& u = start_unit(a, scale, n, b, hkv, c, parts);
  const int64_t lo = u.lo, hi = u.hi;
  if (lo >= hi) return;
  const int64_t stride = n.chunk + N;
  float* s = thread_scratch(ForwardSlot::scores, n.R * stride);
  // Rows kPrefetchRows ahead, up to hi, are asked for as each row is read.
  const auto ahead = [&](int64_t j, int64_t count) {
    return std::clamp<int64_t>(hi - (j + kPrefetchRows), 0, count);
  };
  for (int64_t j = lo; j < hi; j += N) {
    const int64_t nk = std::min(N, hi - j);
    block_scores_blocks<kType>(u.q, n.R, n.D, K, K.row(b, hkv, j), nk, ahead(j, nk), s + (j - lo),
                               stride);
  }
  float* o[kTiledDecodeMinRows];
  for (int64_t r = 0; r < n.R; ++r) {
    float* out = partial(parts, n, u.unit, r);
    finish_scores(a, bias, n, b, hkv, r, u.ranges[r], lo, hi, s + r * stride, out);
    o[r] = out + 2;
  }
  const int64_t vs = V.stride_bytes(), bytes = V.row_bytes();
  for (int64_t j = lo; j < hi; j += kValueBlock) {
    const int64_t nk = std::min(kValueBlock, hi - j);
    const uint8_t* v = V.row(b, hkv, j);
    int64_t ahead_rows = ahead(j, nk);  // asked for by the first pass only
    for (int64_t r = 0; r < n.R; r += kGroupRows) {
      const float* p = s + r * stride + (j - lo);
      simd::with_count<kGroupRows>(
          static_cast<int>(std::min<int64_t>(kGroupRows, n.R - r)), [&](auto rows) {
            constexpr int RG = decltype(rows)::value, W = kValueVectors<RG>;
            constexpr bool kAligned = W * hn::MaxLanes(df) % kBlockValues == 0;
            int64_t e = 0;
            for (; e + W * N <= n.Dv; e += W * N, ahead_rows = 0)
              block_values_blocks<kType, RG, W, kAligned>(p, stride, v, vs, bytes, nk, e, o + r,
                                                          ahead_rows);
            if (e < n.Dv)
              simd::with_count<W>(static_cast<int>((n.Dv - e) / N), [&](auto w) {
                block_values_blocks<kType, RG, decltype(w)::value, kAligned>(
                    p, stride, v, vs, bytes, nk, e, o + r, ahead_rows);
              });
            ahead_rows = 0;
          });
    }
  }
}

// Many rows per key/value head (a large GQA group, several queries each): up to 64 rows per
// block in vector lanes, the chunk walked in tiles of 64 keys with the tiled forward's
// micro-kernels and online softmax: S = K Qt, P = e^(S − m), Ot = alpha Ot + Vᵀ P, each key
// and value row still read from memory once per unit. (MQA with 32 heads, cache 32k, dim 128,
// 2 threads: 51.7 ms through the tiled forward, which reads K and V once per query head,
// 2.45 ms this way.)
// With KB and VB (T float): keys and values in 32-value blocks, each tile widened first.
template <typename T>
void decode_unit_tiled(const AttentionArgs& a, const Rows<T>& K, const Rows<T>& V, const View& bias,
                       float scale, const Shape& n, int64_t b, int64_t hkv, int64_t c,
                       float* parts, const BlockRows* KB = nullptr, const BlockRows* VB = nullptr) {
  using tiles::kKeyTile;
  const int64_t N = static_cast<int64_t>(simd::lanes());
  // On the bf16 units (tiles::kOnUnits): Qt holds the queries unscaled as bf16 pairs along
  // the head dim (hi + lo unless q is bf16), V's rows are interleaved in pairs, and both
  // products run as bf16 dot products (as in the tiled forward's key_step_units).
  constexpr bool kUnits = tiles::kOnUnits<T>;
  const UnitRows& u = start_unit(a, kUnits ? 1.0f : scale, n, b, hkv, c, parts);
  [[maybe_unused]] const bool two = a.q.type != TensorType::bf16;  // q as hi + lo
  const int64_t lo = u.lo, hi = u.hi;
  if (lo >= hi) return;
  const int64_t Mq = std::min<int64_t>(tiles::kQueryVectors * N, (n.R + N - 1) / N * N);
  const int64_t blocks = (n.R + Mq - 1) / Mq;
  float* Qt = thread_scratch(ForwardSlot::q_tiles, blocks * n.D * Mq);
  float* S = thread_scratch(ForwardSlot::scores, kKeyTile * Mq);
  float* Ot = thread_scratch(ForwardSlot::out_tiles, blocks * n.Dv * Mq);
  float* state = thread_scratch(ForwardSlot::softmax_state, blocks * 3 * Mq);  // m, l, alpha
  float* Vt = thread_scratch(ForwardSlot::v_tiles, n.Dv * kKeyTile);
  thread_local std::vector<tiles::TileMask> masks;  // each row's keys in this chunk
  masks.resize(blocks);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t rows = std::min(Mq, n.R - blk * Mq);
    tiles::TileMask& tm = masks[blk];
    tm.begin.assign(Mq, 0);
    tm.end.assign(Mq, 0);
    for (int64_t lane = 0; lane < rows; ++lane) {
      tm.begin[lane] = static_cast<int32_t>(u.ranges[blk * Mq + lane].begin);
      tm.end[lane] = static_cast<int32_t>(u.ranges[blk * Mq + lane].end);
    }
#if defined(QKV_BF16_UNITS)
    if constexpr (kUnits)
      tiles::pack_pairs_transposed(View(u.q, {1, 1, n.R, n.D}), 0, 0, blk * Mq, rows, n.D, Mq,
                                   reinterpret_cast<uint32_t*>(Qt + blk * n.D * Mq), two);
    else
#endif
    simd::pack_transposed(u.q + blk * Mq * n.D, n.D, rows, n.D, 1.0f, Qt + blk * n.D * Mq, Mq);
    std::fill(Ot + blk * n.Dv * Mq, Ot + (blk + 1) * n.Dv * Mq, 0.0f);
    float* m = state + blk * 3 * Mq;
    std::fill(m, m + Mq, simd::kMinusInf);
    std::fill(m + Mq, m + 2 * Mq, 0.0f);
  }
  // The next key tile's rows are asked for while this one computes, spread over the tile's
  // micro-kernel calls (with 16 rows per block there are few, and the tiled forward's 8 lines
  // per call left most for one burst at the next tile, which stalls on the line-fill buffers).
  // Against none: 21% faster from a cache in memory (256 MiB), 3% slower from one in L3.
  simd::PrefetchQueue prefetch;
  const int64_t NK = simd::product_rows(static_cast<int>(Mq / N));
  const int64_t calls = blocks * ((kKeyTile + NK - 1) / NK + (n.Dv + NK - 1) / NK);
  const int64_t lines_per_row =
      KB ? (KB->row_bytes() + 63) / 64 + (VB->row_bytes() + 63) / 64
         : (n.D * int64_t{sizeof(T)} + 63) / 64 + (n.Dv * int64_t{sizeof(T)} + 63) / 64;
  float* k_tile = KB ? thread_scratch(BlockSlot::keys, kKeyTile * n.D) : nullptr;
  float* v_tile = KB ? thread_scratch(BlockSlot::values, kKeyTile * n.Dv) : nullptr;
  for (int64_t j0 = lo; j0 < hi; j0 += kKeyTile) {
    const int64_t nk = std::min(kKeyTile, hi - j0);
    const int64_t next = j0 + nk, next_rows = std::min(kKeyTile, hi - next);
    const int64_t per_call = std::max<int64_t>(8, (next_rows * lines_per_row + calls - 1) / calls);
    prefetch.issue_all();
    if (KB)
      prefetch.reset(KB->row(b, hkv, next), KB->stride_bytes(), KB->row_bytes(),
                     VB->row(b, hkv, next), VB->stride_bytes(), VB->row_bytes(), next_rows,
                     static_cast<int>(per_call));
    else
      prefetch.reset(K.row(b, hkv, next), K.row_stride, n.D, V.row(b, hkv, next), V.row_stride,
                     n.Dv, next_rows, static_cast<int>(per_call));
    // K rows read in place (widened as broadcast), V rows widened as they are packed; rows in
    // blocks widened into tiles first.
    const T* k_rows = K.row(b, hkv, j0);
    int64_t ks = K.row_stride;
    if (KB) {
      widen_rows(*KB, b, hkv, j0, nk, k_tile);
      widen_rows(*VB, b, hkv, j0, nk, v_tile);
      k_rows = reinterpret_cast<const T*>(k_tile), ks = n.D;
    }
#if defined(QKV_BF16_UNITS)
    if constexpr (kUnits)
      simd::interleave_row_pairs(reinterpret_cast<const uint16_t*>(V.row(b, hkv, j0)),
                                 V.row_stride, nk, n.Dv, reinterpret_cast<uint32_t*>(Vt), n.Dv);
    else
#endif
    if (KB) simd::pack_transposed(v_tile, n.Dv, nk, n.Dv, 1.0f, Vt, kKeyTile);
    else simd::pack_transposed(V.row(b, hkv, j0), V.row_stride, nk, n.Dv, 1.0f, Vt, kKeyTile);
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const tiles::TileMask& tm = masks[blk];
      const int64_t rows = std::min(Mq, n.R - blk * Mq);
      float* m = state + blk * 3 * Mq;
      float *l = m + Mq, *alpha = l + Mq;
      simd::with_count<tiles::kQueryVectors>(static_cast<int>((rows + N - 1) / N), [&](auto c) {
        constexpr int NQV = decltype(c)::value;
#if defined(QKV_BF16_UNITS)
        if constexpr (kUnits) {
          const auto* q2 = reinterpret_cast<const uint32_t*>(Qt + blk * n.D * Mq);
          simd::rows_times_pairs_tile<NQV, simd::Into::kStore>(
              reinterpret_cast<const uint16_t*>(k_rows), ks, 2, nk, q2,
              two ? q2 + n.D / 2 * Mq : nullptr, n.D / 2, Mq, S, Mq, scale, nullptr, &prefetch);
        } else
#endif
        simd::scores_tile<NQV>(k_rows, ks, nk, Qt + blk * n.D * Mq, n.D, Mq, S, &prefetch);
        if (has_score_transforms(a))
          for (int64_t lane = 0; lane < rows; ++lane) {
            const int64_t r = blk * Mq + lane;
            for (int64_t jj = 0; jj < nk; ++jj) {
              float& x = S[jj * Mq + lane];
              x = transformed(a, bias, n, b, n.head(hkv, r), n.query(r), j0 + jj, x);
            }
          }
        if (!tm.covers(j0, j0 + nk, rows))
          for (int64_t jj = 0; jj < nk; ++jj)
            for (int v = 0; v < NQV; ++v) {
              float* s = S + jj * Mq + v * N;
              hn::Store(tm.hide(v, j0 + jj, hn::Load(df, s)), df, s);
            }
        tiles::online_softmax<NQV>(S, Mq, m, l, alpha, tiles::every_score<NQV>(nk));
#if defined(QKV_BF16_UNITS)
        if constexpr (kUnits) {  // Oᵀ ← alpha Oᵀ + V2ᵀ P2, P rounded into bf16 pairs in place
          simd::pairs_of_rows<NQV>(S, nk, Mq);
          simd::rows_times_pairs_tile<NQV, simd::Into::kRescaleAdd>(
              reinterpret_cast<const uint16_t*>(Vt), 2, 2 * n.Dv, n.Dv,
              reinterpret_cast<const uint32_t*>(S), nullptr, (nk + 1) / 2, Mq,
              Ot + blk * n.Dv * Mq, Mq, 1.0f, alpha, &prefetch);
          return;
        }
#endif
        simd::accumulate_tile<NQV>(S, nk, Mq, Vt, kKeyTile, n.Dv, alpha, Ot + blk * n.Dv * Mq,
                                   &prefetch);
      });
    }
  }
  for (int64_t r = 0; r < n.R; ++r) {
    const int64_t blk = r / Mq, lane = r % Mq;
    const float* m = state + blk * 3 * Mq;
    float* out = partial(parts, n, u.unit, r);
    out[0] = m[lane];
    out[1] = m[Mq + lane];
    for (int64_t e = 0; e < n.Dv; ++e) out[2 + e] = Ot[(blk * n.Dv + e) * Mq + lane];
  }
}

#if defined(QKV_BF16_UNITS) && HWY_ARCH_X86
// ---- bf16 rows on the bf16 units (AVX512-BF16) ---------------------------------------------
//
// vdpbf16ps adds to each fp32 lane the two products of a pair of bf16 lanes: 32 products per
// instruction, where widening a bf16 vector and an fp32 FMA gave 16 for three. The scores take
// the query as bf16 (an fp32 query as a sum of two bf16, hi + lo, which keeps 16 of its 24
// bits) against 32 key elements per instruction, reduced as in block_scores. P·V takes P
// rounded to bf16 (the one rounding this path adds: |P − P̃| ≤ 2^-8 P) against pairs of value
// rows interleaved (vpunpck{l,h}wd), so each lane sums two keys; the interleave orders the
// columns of a 32-column block as lanes_to_column says, undone once per unit. Used where the
// head dims are whole multiples of 32 and up to 15 rows share a kv head.

constexpr int64_t kUnitBlock = 32;  // bf16 elements per vector

using simd::as_pairs;
using simd::load_pairs;

bool fits_units(const Shape& n) {
  return n.D % kUnitBlock == 0 && n.Dv % kUnitBlock == 0 && n.R < kTiledDecodeMinRows;
}

// The column of a 32-column block that storage position p holds while P·V runs: the low
// interleave covers columns 0–3 of each 8 (per 128-bit lane), the high one columns 4–7.
int64_t lanes_to_column(int64_t p) {
  const int64_t half = p / 16, i = p % 16;
  return (i / 4) * 8 + half * 4 + i % 4;
}
void columns_from_lanes(float* o, int64_t Dv) {
  float tmp[kUnitBlock];
  for (int64_t e0 = 0; e0 < Dv; e0 += kUnitBlock) {
    for (int64_t p = 0; p < kUnitBlock; ++p) tmp[lanes_to_column(p)] = o[e0 + p];
    std::copy(tmp, tmp + kUnitBlock, o + e0);
  }
}

// The queries q (fp32, `count` a multiple of 32) as bf16 hi and, with `two`, lo = q − hi
// (exact in fp32), each rounded to nearest even.
void split_queries(const float* q, int64_t count, bool two, uint16_t* hi, uint16_t* lo) {
  for (int64_t i = 0; i < count; i += kUnitBlock) {
    const __m512 x0 = _mm512_loadu_ps(q + i), x1 = _mm512_loadu_ps(q + i + 16);
    const __m512bh h = _mm512_cvtne2ps_pbh(x1, x0);
    _mm512_storeu_si512(hi + i, (__m512i)h);
    if (!two) continue;
    // hi back in fp32: each bf16 in the high half of a 32-bit lane.
    const __m512i bits = (__m512i)h;
    const __m512 h0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(bits)), 16));
    const __m512 h1 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(bits, 1)), 16));
    _mm512_storeu_si512(lo + i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(x1, h1), _mm512_sub_ps(x0, h0)));
  }
}

// part[r][jj + j] ← the partial dot products of RG query rows with KG key rows.
template <int RG, int KG, bool kTwo>
HWY_INLINE void key_dots_units(const uint16_t* qh, const uint16_t* ql, int64_t D, const Bf16* k,
                               int64_t ks, PartialDots* part, int64_t jj) {
  __m512 acc[RG][KG];
  for (int r = 0; r < RG; ++r)
    for (int j = 0; j < KG; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += kUnitBlock) {
    __m512bh kv[KG];
    for (int j = 0; j < KG; ++j) kv[j] = load_pairs(k + j * ks + d);
    for (int r = 0; r < RG; ++r) {
      const __m512bh h = load_pairs(qh + r * D + d);
      for (int j = 0; j < KG; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], h, kv[j]);
      if constexpr (kTwo) {
        const __m512bh l = load_pairs(ql + r * D + d);
        for (int j = 0; j < KG; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], l, kv[j]);
      }
    }
  }
  for (int r = 0; r < RG; ++r)
    for (int j = 0; j < KG; ++j) part[r][jj + j] = Vf{acc[r][j]};
}

// block_scores on the units: s[r · s_stride + jj] ← scale · q_r · k_jj for nk ≤ 16 keys.
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
      simd::with_count<kGroupRows>(
          static_cast<int>(std::min<int64_t>(kGroupRows, R - r)), [&](auto rows) {
            key_dots_units<decltype(rows)::value, KG, kTwo>(qh + r * D, ql + r * D, D,
                                                            k + jj * ks, ks, part + r, jj);
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

// From 3 rows on, the scores of 4 rows at a time with no reduction per key: a vector holds
// 4 rows × 4 pairs of elements (q_r[d + 2i], q_r[d + 2i + 1]) in its 128-bit blocks, and a
// key's 8 elements k[d, d + 8) are broadcast to every block, so one vdpbf16ps adds 4 rows' 8
// products into the lanes of that key's accumulator; at the end each block sums its 4 lanes.
// (Against block_scores_units, which reduces 16 lanes per row and key: 32/8 heads, 4k keys in
// L3, dim 128 on Zen 4, 0.41–0.47 ms against 0.49–0.54; 64/8 0.87–0.95 against 0.88–1.09.)
constexpr int kGroupKeys = 8;  // keys (accumulators) per pass

// The 4 rows of group g of queries q (R × D, bf16) packed as above: D / 8 vectors of 32.
void pack_row_groups(const uint16_t* q, int64_t R, int64_t D, uint16_t* packed) {
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

// o_r[e0, e0 + 32 W) += Σ_jj p̃_r[jj] v_jj over nk value rows, two rows per instruction: pp
// holds each row's P̃ as pairs (bf16 p̃[2t] in the low half of word t, p̃[2t + 1] in the
// high), o the columns in lane order.
template <int RG, int W>
void block_values_units(const uint32_t* pp, int64_t pp_stride, const Bf16* v, int64_t vs,
                        int64_t nk, int64_t e0, float* const* o, const Bf16* ahead,
                        int64_t ahead_rows, int64_t Dv) {
  __m512 lo[RG][W], hi[RG][W];
  for (int r = 0; r < RG; ++r)
    for (int w = 0; w < W; ++w) {
      lo[r][w] = _mm512_loadu_ps(o[r] + e0 + w * kUnitBlock);
      hi[r][w] = _mm512_loadu_ps(o[r] + e0 + w * kUnitBlock + 16);
    }
  for (int64_t jj = 0; jj < nk; jj += 2) {
    const bool second = jj + 1 < nk;  // an odd count: the last row pairs with zeros
    for (int64_t t = jj; t < std::min(jj + 2, ahead_rows); ++t)
      prefetch_row(ahead + t * vs, vs, Dv);
    __m512bh x_lo[W], x_hi[W];
    for (int w = 0; w < W; ++w) {
      const __m512i a = _mm512_loadu_si512(v + jj * vs + e0 + w * kUnitBlock);
      const __m512i b =
          second ? _mm512_loadu_si512(v + (jj + 1) * vs + e0 + w * kUnitBlock) : _mm512_setzero_si512();
      x_lo[w] = as_pairs(_mm512_unpacklo_epi16(a, b));
      x_hi[w] = as_pairs(_mm512_unpackhi_epi16(a, b));
    }
    for (int r = 0; r < RG; ++r) {
      const __m512bh p = as_pairs(_mm512_set1_epi32(static_cast<int>(pp[r * pp_stride + jj / 2])));
      for (int w = 0; w < W; ++w) {
        lo[r][w] = _mm512_dpbf16_ps(lo[r][w], x_lo[w], p);
        hi[r][w] = _mm512_dpbf16_ps(hi[r][w], x_hi[w], p);
      }
    }
  }
  for (int r = 0; r < RG; ++r)
    for (int w = 0; w < W; ++w) {
      _mm512_storeu_ps(o[r] + e0 + w * kUnitBlock, lo[r][w]);
      _mm512_storeu_ps(o[r] + e0 + w * kUnitBlock + 16, hi[r][w]);
    }
}

// decode_unit_rows on the units (fits_units).
void decode_unit_rows_units(const AttentionArgs& a, const Rows<Bf16>& K, const Rows<Bf16>& V,
                            const View& bias, float scale, const Shape& n, int64_t b, int64_t hkv,
                            int64_t c, float* parts) {
  const int64_t N = static_cast<int64_t>(simd::lanes());
  const UnitRows& u = start_unit(a, 1.0f, n, b, hkv, c, parts);  // scaled after the products
  const int64_t lo = u.lo, hi = u.hi;
  if (lo >= hi) return;
  const bool two = a.q.type != TensorType::bf16;  // a bf16 query is exact in one term
  thread_local std::vector<uint16_t> q16;
  q16.resize(2 * n.R * n.D);
  uint16_t *qh = q16.data(), *ql = qh + n.R * n.D;
  split_queries(u.q, n.R * n.D, two, qh, ql);
  const bool groups = n.R >= 3;
  thread_local std::vector<uint16_t> packed;
  if (groups) {
    const int64_t size = (n.R + 3) / 4 * 4 * n.D;
    packed.resize(2 * size);
    pack_row_groups(qh, n.R, n.D, packed.data());
    if (two) pack_row_groups(ql, n.R, n.D, packed.data() + size);
    qh = packed.data(), ql = packed.data() + size;
  }
  const int64_t stride = n.chunk + N;
  float* s = thread_scratch(ForwardSlot::scores, n.R * stride);
  const auto ahead = [&](const Rows<Bf16>& rows, int64_t j, int64_t count, int64_t& ahead_rows) {
    return rows_ahead(rows, b, hkv, j, count, hi, ahead_rows);
  };
  for (int64_t j = lo; j < hi; j += N) {
    const int64_t nk = std::min(N, hi - j);
    int64_t ahead_rows;
    const Bf16* next = ahead(K, j, nk, ahead_rows);
    const auto scores = groups ? (two ? group_scores_units<true> : group_scores_units<false>)
                               : (two ? block_scores_units<true> : block_scores_units<false>);
    scores(qh, ql, n.R, n.D, scale, K.row(b, hkv, j), K.row_stride, nk, next, ahead_rows,
           s + (j - lo), stride);
  }
  // Each row's softmax, then P̃ as bf16 pairs (rounded to nearest even by vcvtne2ps2bf16).
  const int64_t pairs = (hi - lo + 1) / 2, pp_stride = (pairs + 15) / 16 * 16;
  thread_local std::vector<uint32_t> pp_store;
  pp_store.resize(n.R * pp_stride);
  uint32_t* pp = pp_store.data();
  float* o[kTiledDecodeMinRows];
  for (int64_t r = 0; r < n.R; ++r) {
    float* out = partial(parts, n, u.unit, r);
    finish_scores(a, bias, n, b, hkv, r, u.ranges[r], lo, hi, s + r * stride, out);
    o[r] = out + 2;
    const float* p = s + r * stride;  // p, then 0 to the next whole vector past hi
    for (int64_t t = 0; t < pairs; t += 16) {
      const int64_t j = 2 * t;
      const __m512 x0 = _mm512_loadu_ps(p + j);
      const __m512 x1 = j + 16 < hi - lo ? _mm512_loadu_ps(p + j + 16) : _mm512_setzero_ps();
      _mm512_storeu_si512(pp + r * pp_stride + t, (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
    }
  }
  for (int64_t j = lo; j < hi; j += kValueBlock) {
    const int64_t nk = std::min(kValueBlock, hi - j), vs = V.row_stride;
    const Bf16* v = V.row(b, hkv, j);
    int64_t ahead_rows;
    const Bf16* next = ahead(V, j, nk, ahead_rows);
    for (int64_t r = 0; r < n.R; r += kGroupRows) {
      const uint32_t* p = pp + r * pp_stride + (j - lo) / 2;
      simd::with_count<kGroupRows>(
          static_cast<int>(std::min<int64_t>(kGroupRows, n.R - r)), [&](auto rows) {
            constexpr int RG = decltype(rows)::value, W = RG <= 2 ? 4 : 2;
            int64_t e = 0;
            for (; e + W * kUnitBlock <= n.Dv; e += W * kUnitBlock, next = nullptr, ahead_rows = 0)
              block_values_units<RG, W>(p, pp_stride, v, vs, nk, e, o + r, next, ahead_rows, n.Dv);
            for (; e < n.Dv; e += kUnitBlock, next = nullptr, ahead_rows = 0)
              block_values_units<RG, 1>(p, pp_stride, v, vs, nk, e, o + r, next, ahead_rows, n.Dv);
          });
    }
  }
  for (int64_t r = 0; r < n.R; ++r) columns_from_lanes(o[r], n.Dv);
}
#endif  // QKV_BF16_UNITS && HWY_ARCH_X86

// The split-KV driver for any element type; Tk, Hkv and Dv come from the rows' caller. With KB
// and VB (T float, K and V unused): keys and values in 32-value blocks.
template <typename T>
void decode(const AttentionArgs& a, const Rows<T>& K, const Rows<T>& V, int64_t Hkv, int64_t Tk,
            int64_t Dv, const BlockRows* KB = nullptr, const BlockRows* VB = nullptr) {
  Shape n{a.q.shape[0], a.q.shape[1], Hkv, a.q.shape[2], Tk, a.q.shape[3], Dv, 0, 0, 0, 0};
  n.G = n.Hq / n.Hkv;
  n.R = n.G * n.Tq;
  n.chunk = chunk_for(n.Tk);
  n.chunks = (n.Tk + n.chunk - 1) / n.chunk;
  const View bias = full_bias(a, "attention");
  const float scale = effective_scale(a);
  const int64_t units = n.B * n.Hkv * n.chunks;
  float* parts = thread_scratch(ForwardSlot::partials, units * n.R * (n.Dv + 2));
  const int threads = detail::threads_for(units * n.chunk * (n.D + n.Dv) * n.R);
  parallel_for(units, threads, [&](int64_t u) {
    const int64_t c = u % n.chunks, hkv = (u / n.chunks) % n.Hkv, b = u / (n.chunks * n.Hkv);
    if (KB) {
      if (n.R >= kTiledDecodeMinRows)
        return decode_unit_tiled(a, K, V, bias, scale, n, b, hkv, c, parts, KB, VB);
      return with_block_format(KB->type, [&](auto format) {
        decode_unit_rows_blocks<decltype(format)::value>(a, *KB, *VB, bias, scale, n, b, hkv, c,
                                                         parts);
      });
    }
    if (keys_in_lanes(n)) return decode_unit_keys_in_lanes(a, K, V, bias, scale, n, b, hkv, c, parts);
#if defined(QKV_BF16_UNITS) && HWY_ARCH_X86
    if constexpr (std::is_same_v<T, Bf16>)
      if (fits_units(n)) return decode_unit_rows_units(a, K, V, bias, scale, n, b, hkv, c, parts);
#endif
    if (n.R >= kTiledDecodeMinRows) decode_unit_tiled(a, K, V, bias, scale, n, b, hkv, c, parts);
    else decode_unit_rows(a, K, V, bias, scale, n, b, hkv, c, parts);
  });
  // Merge the chunks of each row in chunk order.
  const int64_t rows = n.B * n.Hkv * n.R;
  parallel_for(rows, detail::threads_for(rows * n.chunks * n.Dv), [&](int64_t row) {
    const int64_t r = row % n.R, hkv = (row / n.R) % n.Hkv, b = row / (n.R * n.Hkv);
    const int64_t h = n.head(hkv, r), i = n.query(r);
    const int64_t first = (b * n.Hkv + hkv) * n.chunks;
    const auto chunk = [&](int64_t c) {
      const float* p = partial(parts, n, first + c, r);
      return PartialRow{p[0], p[1], p + 2};
    };
    float* lse = a.lse ? &a.lse[(b * n.Hq + h) * n.Tq + i] : nullptr;
    if (a.out.type == TensorType::f32)
      return merge_partials(n.chunks, chunk, n.Dv, &a.out(b, h, i, 0), a.out.stride[3], lse);
    // A 16-bit output: merged in fp32, then rounded once.
    float* merged = thread_scratch(ForwardSlot::merged_row, n.Dv);
    merge_partials(n.chunks, chunk, n.Dv, merged, 1, lse);
    for (int64_t e = 0; e < n.Dv; ++e) a.out.set(b, h, i, e, merged[e]);
  });
}

// Keys and values in 32-value blocks (Q8_0, Q4_0, Q4_1).
void decode_blocks(const AttentionArgs& a) {
  const BlockRows K = block_rows(a.k), V = block_rows(a.v);
  const Rows<float> none{nullptr, 0, 0, 0};
  decode(a, none, none, a.k.shape[1], a.k.shape[2], a.v.shape[3], &K, &V);
}

}  // namespace

void decode_forward(const AttentionArgs& a) {
  if (is_kv_block_type(a.k.type)) return decode_blocks(a);
  // K and V rows are read as vectors; a (rare) strided head dim goes through flash_forward.
  if (a.k.stride[3] != 1 || a.v.stride[3] != 1) return flash_forward(a);
  auto run = [&](auto element) {
    using T = decltype(element);
    const Rows<T> K{static_cast<const T*>(a.k.address()), a.k.stride[0], a.k.stride[1],
                    a.k.stride[2]};
    const Rows<T> V{static_cast<const T*>(a.v.address()), a.v.stride[0], a.v.stride[1],
                    a.v.stride[2]};
    decode(a, K, V, a.k.shape[1], a.k.shape[2], a.v.shape[3]);
  };
  tiles::with_element_type(a.k.type, run);
}

}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();
#endif  // QKV_KERNEL_PASS

#if HWY_ONCE
namespace qkv::detail {

#if defined(QKV_BF16_UNITS)
void decode_forward_on_bf16_units(const AttentionArgs& a) {
  QKV_UNITS_NAMESPACE::decode_forward(a);
}
#else
void decode_forward_on_bf16_units(const AttentionArgs& a);  // decode_bf16.cpp

HWY_EXPORT(decode_forward);

void decode_forward(const AttentionArgs& a) {
#if QKV_HAVE_BF16_UNITS
  // bf16 K and V on the bf16 units, when the head dim is whole pairs.
  if (a.k.type == TensorType::bf16 && a.q.shape[3] % 2 == 0 && simd::bf16_units())
    return decode_forward_on_bf16_units(a);
#endif
  QKV_DISPATCH(decode_forward)(a);
}
#endif

}  // namespace qkv::detail
#endif  // HWY_ONCE
