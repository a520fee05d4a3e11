// Split-KV decoding: a few query rows against a long key/value cache.
//
// With one query per head there is too little work per (batch, head) to split by queries,
// and the cost is reading K and V once: the kernel is memory-bound. So the keys are cut into
// chunks (of a size set by the cache length alone), every (batch, kv head, chunk) is a unit
// of work, and the partial results (running max m, sum l, unnormalised output o) are merged
// with their log-sum-exp afterwards (as FlashDecoding and ggml's split-KV path do):
//   m = max_c m_c,  l = Σ_c l_c e^(m_c − m),  out = Σ_c o_c e^(m_c − m) / l.
// The chunk size does not depend on the thread count and the merge runs in chunk order, so
// the result is the same bits for any number of threads.
//
// All query rows that share a key/value head (the heads of a GQA group × Tq) are processed
// together, so each key and value row is read from memory once per unit: up to 7 rows by dot
// products along the head dim, 8 and more in vector lanes with the tiled kernels' pieces.
#include <algorithm>
#include <type_traits>
#include <cmath>
#include <vector>

#include "attention/kernels.h"
#include "attention/masks.h"
#include "attention/simd.h"
#include "attention/tiles.h"
#include "attention/transpose.h"
#include "qkv/threads.h"
#include "qkv/error.h"
#include "util/scratch.h"

namespace qkv::detail {
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
float transformed(const AttentionArgs& a, const View& bias, const Shape& n, int64_t b,
                  int64_t h, int64_t i, int64_t j, float x) {
  if (a.softcap > 0) x = a.softcap * std::tanh(x / a.softcap);
  if (!bias.empty()) x += bias(b, h, i, j);
  if (a.mask.alibi) x += alibi_bias(a.mask, h, i, j, n.Tq, n.Tk);
  return x;
}

// Partial results of one unit: per row m, l, then o[Dv].
float* partial(float* base, const Shape& n, int64_t unit, int64_t r) {
  return base + (unit * n.R + r) * (n.Dv + 2);
}

// Rows this far ahead are asked for early: with the hardware prefetcher alone the kernel read
// K and V at ~72% of a plain read loop; 1–4 rows ahead gave ~87%, 8 or more ~72% again
// (measured: 8 heads, D = 128, cache 32k, 2 threads).
constexpr int64_t kPrefetchRows = 3;

// Key or value rows being decoded: fp32 (a View) or bf16 (a KV cache's storage). Elements of
// a row are contiguous.
template <typename T>
struct Rows {
  const T* data;
  int64_t batch_stride, head_stride, row_stride;
  const T* row(int64_t b, int64_t h, int64_t j) const {
    return data + b * batch_stride + h * head_stride + j * row_stride;
  }
};

using Bf16 = hwy::bfloat16_t;
HWY_INLINE Vf load(const float* p) { return hn::LoadU(df, p); }
HWY_INLINE Vf load(const Bf16* p) {
  const hn::Rebind<Bf16, simd::Df> db;
  return hn::PromoteTo(df, hn::LoadU(db, p));
}
HWY_INLINE float scalar(float x) { return x; }
HWY_INLINE float scalar(Bf16 x) { return hwy::F32FromBF16(x); }

template <typename T>
float dot(const float* a, const T* b, int64_t n) {
  const size_t N = simd::lanes();
  Vf acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  int64_t d = 0;
  for (; d + 2 * static_cast<int64_t>(N) <= n; d += 2 * N) {
    acc0 = hn::MulAdd(hn::LoadU(df, a + d), load(b + d), acc0);
    acc1 = hn::MulAdd(hn::LoadU(df, a + d + N), load(b + d + N), acc1);
  }
  float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
  for (; d < n; ++d) sum += a[d] * scalar(b[d]);
  return sum;
}

// out[0:n] += p · x[0:n]
template <typename T>
void axpy(float p, const T* x, float* out, int64_t n) {
  const size_t N = simd::lanes();
  const Vf pv = hn::Set(df, p);
  int64_t e = 0;
  for (; e + static_cast<int64_t>(N) <= n; e += N)
    hn::StoreU(hn::MulAdd(pv, load(x + e), hn::LoadU(df, out + e)), df, out + e);
  for (; e < n; ++e) out[e] += p * scalar(x[e]);
}

template <typename T>
void prefetch_row(const T* row, int64_t n) {
  for (int64_t i = 0; i < n; i += 64 / static_cast<int64_t>(sizeof(T))) __builtin_prefetch(row + i);
}

// Head dims below a vector (stories260K's are 8) waste most lanes when a vector runs along d:
// then the lanes run along 16 keys instead, and K and V columns are gathered.
bool keys_in_lanes(const Shape& n) {
  const auto N = static_cast<int64_t>(simd::lanes());
  return n.D < N && n.Dv < N && n.R <= kMaxRowsInLanes;
}

// s[r][j − c0] ← q_r · k_j for the keys [c0, c1) visible to row r (others stay −inf).
void scores_keys_in_lanes(const Rows<float>& K, const Shape& n, int64_t b, int64_t hkv,
                          int64_t c0, int64_t c1, const float* q, const KeyRange* ranges,
                          float* s) {
  const hn::RebindToSigned<simd::Df> di;
  const auto N = static_cast<int64_t>(simd::lanes());
  const int64_t ks = K.row_stride;
  const auto lane = hn::Iota(di, 0);
  for (int64_t j = c0; j < c1; j += N) {
    // Keys past c1 read the last key again (in bounds) and are masked below.
    const auto idx = hn::Mul(hn::Min(lane, hn::Set(di, static_cast<int32_t>(c1 - 1 - j))),
                             hn::Set(di, static_cast<int32_t>(ks)));
    Vf acc[kMaxRowsInLanes];
    for (int64_t r = 0; r < n.R; ++r) acc[r] = hn::Zero(df);
    const float* k = K.row(b, hkv, j);
    for (int64_t d = 0; d < n.D; ++d) {
      const Vf kd = hn::GatherIndex(df, k + d, idx);
      for (int64_t r = 0; r < n.R; ++r)
        acc[r] = hn::MulAdd(hn::Set(df, q[r * n.D + d]), kd, acc[r]);
    }
    const auto key = hn::Add(lane, hn::Set(di, static_cast<int32_t>(j)));
    for (int64_t r = 0; r < n.R; ++r) {
      const auto seen = hn::And(
          hn::Not(hn::Lt(key, hn::Set(di, static_cast<int32_t>(ranges[r].begin)))),
          hn::Lt(key, hn::Set(di, static_cast<int32_t>(ranges[r].end))));
      const Vf v = hn::IfThenElse(hn::RebindMask(df, seen), acc[r], hn::Set(df, simd::kMinusInf));
      hn::StoreU(v, df, s + r * n.chunk + j - c0);
    }
  }
}

// o_r += Σ_j p_r[j] v_j over the keys [c0, c1), p = s (0 where masked).
void values_keys_in_lanes(const Rows<float>& V, const Shape& n, int64_t b, int64_t hkv,
                          int64_t c0, int64_t c1, const float* s, float* parts, int64_t unit) {
  const hn::RebindToSigned<simd::Df> di;
  const auto N = static_cast<int64_t>(simd::lanes());
  const int64_t vs = V.row_stride;
  const auto lane = hn::Iota(di, 0);
  for (int64_t e = 0; e < n.Dv; ++e) {
    Vf acc[kMaxRowsInLanes];
    for (int64_t r = 0; r < n.R; ++r) acc[r] = hn::Zero(df);
    for (int64_t j = c0; j < c1; j += N) {
      const auto idx = hn::Mul(hn::Min(lane, hn::Set(di, static_cast<int32_t>(c1 - 1 - j))),
                               hn::Set(di, static_cast<int32_t>(vs)));
      const Vf ve = hn::GatherIndex(df, V.row(b, hkv, j) + e, idx);
      // Past c1 the probabilities are e^(−inf) = 0, so the repeated last row adds nothing.
      for (int64_t r = 0; r < n.R; ++r)
        acc[r] = hn::MulAdd(hn::LoadU(df, s + r * n.chunk + j - c0), ve, acc[r]);
    }
    for (int64_t r = 0; r < n.R; ++r)
      partial(parts, n, unit, r)[2 + e] += hn::GetLane(hn::SumOfLanes(df, acc[r]));
  }
}

template <typename T>
void decode_unit(const AttentionArgs& a, const Rows<T>& K, const Rows<T>& V, const View& bias,
                 float scale, const Shape& n, int64_t b, int64_t hkv, int64_t c, float* parts) {
  const int64_t c0 = c * n.chunk, c1 = std::min(c0 + n.chunk, n.Tk);
  const int64_t unit = (b * n.Hkv + hkv) * n.chunks + c;
  float* s = thread_scratch(4, n.R * n.chunk);
  float* q = thread_scratch(5, n.R * n.D);
  thread_local std::vector<KeyRange> ranges;
  ranges.resize(n.R);
  for (int64_t r = 0; r < n.R; ++r) {
    const int64_t h = n.head(hkv, r), i = n.query(r);
    ranges[r] = visible_keys(a.mask, b, i, n.Tq, n.Tk);
    ranges[r].begin = std::max(ranges[r].begin, c0);
    ranges[r].end = std::min(ranges[r].end, c1);
    for (int64_t d = 0; d < n.D; ++d) q[r * n.D + d] = scale * a.q(b, h, i, d);
  }
  // s ← scale · q kᵀ, each key row read once for all rows of the group.
  std::fill(s, s + n.R * n.chunk, simd::kMinusInf);
  // (bf16 rows cannot be gathered: they take the per-key loop)
  constexpr bool fp32 = std::is_same_v<T, float>;
  const bool lanes_on_keys = fp32 && keys_in_lanes(n);
  // Keys past every row's range (past a kv_len) are never read: they may hold anything.
  int64_t seen_end = c0;
  for (int64_t r = 0; r < n.R; ++r)
    if (ranges[r].begin < ranges[r].end) seen_end = std::max(seen_end, ranges[r].end);
  if constexpr (fp32)
    if (lanes_on_keys) scores_keys_in_lanes(K, n, b, hkv, c0, seen_end, q, ranges.data(), s);
  for (int64_t j = c0; j < c1 && !lanes_on_keys; ++j) {
    const T* k = K.row(b, hkv, j);
    prefetch_row(K.row(b, hkv, std::min(j + kPrefetchRows, n.Tk - 1)), n.D);
    for (int64_t r = 0; r < n.R; ++r)
      if (j >= ranges[r].begin && j < ranges[r].end)
        s[r * n.chunk + j - c0] = dot(q + r * n.D, k, n.D);
  }
  if (has_score_transforms(a))
    for (int64_t r = 0; r < n.R; ++r)
      for (int64_t j = ranges[r].begin; j < ranges[r].end; ++j) {
        float& x = s[r * n.chunk + j - c0];
        x = transformed(a, bias, n, b, n.head(hkv, r), n.query(r), j, x);
      }
  // Softmax pieces per row: m, p = e^(s − m), l = Σ p.
  for (int64_t r = 0; r < n.R; ++r) {
    float* row = s + r * n.chunk;
    float* out = partial(parts, n, unit, r);
    float m = simd::kMinusInf;
    for (int64_t j = 0; j < c1 - c0; ++j) m = std::max(m, row[j]);
    const Vf shift = hn::Set(df, m == simd::kMinusInf ? 0 : m);
    const size_t N = simd::lanes();
    Vf sum = hn::Zero(df);
    // Whole vectors up to c1 (a short cache needs few): -inf beyond c1 gives p = 0 there.
    for (int64_t j = 0; j < c1 - c0; j += N) {
      const Vf p = simd::exp_nonpositive(hn::Sub(hn::LoadU(df, row + j), shift));
      hn::StoreU(p, df, row + j);
      sum = hn::Add(sum, p);
    }
    out[0] = m;
    out[1] = hn::GetLane(hn::SumOfLanes(df, sum));
    std::fill(out + 2, out + 2 + n.Dv, 0.0f);
  }
  // o ← Σ p v, each value row read once.
  if constexpr (fp32)
    if (lanes_on_keys) return values_keys_in_lanes(V, n, b, hkv, c0, seen_end, s, parts, unit);
  for (int64_t j = c0; j < c1; ++j) {
    const T* v = V.row(b, hkv, j);
    prefetch_row(V.row(b, hkv, std::min(j + kPrefetchRows, n.Tk - 1)), n.Dv);
    for (int64_t r = 0; r < n.R; ++r) {
      const float p = s[r * n.chunk + j - c0];
      if (p != 0) axpy(p, v, partial(parts, n, unit, r) + 2, n.Dv);
    }
  }
}


// Many rows per key/value head (a large GQA group, several queries each): the per-row dot
// products above cost R dots and R horizontal sums per key. Here the rows go in vector lanes
// instead, up to 64 per block, and the chunk is walked in tiles of 64 keys with the tiled
// forward's micro-kernels and online softmax: S = K Qt, P = e^(S − m), Ot = alpha Ot + Vᵀ P,
// each key and value row still read from memory once per unit. From 8 rows on this is the
// faster way (cache 32k, dim 128, 2 threads; 8 kv heads, 256 MiB from memory: 8 rows 17.6 ms
// either way, 10 rows 21.3 → 17.6, 16 rows 31.4 → 18; 1 kv head, 32 MiB from L3: 8 rows
// 2.2 → 1.6, 16 rows 3.8 → 1.6); below, a vector of 16 lanes holds too few rows to pay.
constexpr int64_t kTiledDecodeMinRows = 8;

template <typename T>
void decode_unit_tiled(const AttentionArgs& a, const Rows<T>& K, const Rows<T>& V,
                       const View& bias, float scale, const Shape& n, int64_t b, int64_t hkv,
                       int64_t c, float* parts) {
  using tiles::kKeyTile;
  const int64_t N = static_cast<int64_t>(simd::lanes());
  const int64_t c0 = c * n.chunk, c1 = std::min(c0 + n.chunk, n.Tk);
  const int64_t unit = (b * n.Hkv + hkv) * n.chunks + c;
  const int64_t Mq = std::min<int64_t>(tiles::kQueryVectors * N, (n.R + N - 1) / N * N);
  const int64_t blocks = (n.R + Mq - 1) / Mq;
  float* Qt = thread_scratch(0, blocks * n.D * Mq);
  float* S = thread_scratch(1, kKeyTile * Mq);
  float* Ot = thread_scratch(2, blocks * n.Dv * Mq);
  float* state = thread_scratch(3, blocks * 3 * Mq);  // m, l, alpha of each block
  float* Vt = thread_scratch(4, n.Dv * kKeyTile);
  thread_local std::vector<tiles::TileMask> masks;  // each row's keys in this chunk
  masks.resize(blocks);
  int64_t lo = c1, hi = c0;  // the keys some row sees: rows past them are never read
  for (int64_t blk = 0; blk < blocks; ++blk) {
    tiles::TileMask& tm = masks[blk];
    tm.begin.assign(Mq, 0);
    tm.end.assign(Mq, 0);
    float* qt = Qt + blk * n.D * Mq;
    for (int64_t lane = 0; lane < Mq; ++lane) {
      const int64_t r = blk * Mq + lane;
      const int64_t h = n.head(hkv, r), i = n.query(r);
      if (r < n.R) {
        const KeyRange k = visible_keys(a.mask, b, i, n.Tq, n.Tk);
        const int64_t first = std::max(k.begin, c0), end = std::max(std::min(k.end, c1), first);
        tm.begin[lane] = static_cast<int32_t>(first);
        tm.end[lane] = static_cast<int32_t>(end);
        if (first < end) lo = std::min(lo, first), hi = std::max(hi, end);
      }
      for (int64_t d = 0; d < n.D; ++d)
        qt[d * Mq + lane] = r < n.R ? scale * a.q(b, h, i, d) : 0;
    }
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
  const auto floats = [](int64_t elements) { return elements * int64_t{sizeof(T)} / 4; };
  const auto as_f32 = [](const T* p) { return reinterpret_cast<const float*>(p); };
  const int64_t NK = simd::product_rows(static_cast<int>(Mq / N));
  const int64_t calls = blocks * ((kKeyTile + NK - 1) / NK + (n.Dv + NK - 1) / NK);
  const int64_t lines_per_row = (floats(n.D) + 15) / 16 + (floats(n.Dv) + 15) / 16;
  for (int64_t j0 = lo; j0 < hi; j0 += kKeyTile) {
    const int64_t nk = std::min(kKeyTile, hi - j0);
    const int64_t next = j0 + nk, next_rows = std::min(kKeyTile, hi - next);
    const int64_t per_call = std::max<int64_t>(8, (next_rows * lines_per_row + calls - 1) / calls);
    prefetch.issue_all();
    prefetch.reset(as_f32(K.row(b, hkv, next)), floats(K.row_stride), floats(n.D),
                   as_f32(V.row(b, hkv, next)), floats(V.row_stride), floats(n.Dv), next_rows,
                   static_cast<int>(per_call));
    // The tile's K and V rows as fp32 rows: in place, or converted from bf16.
    const float *k_rows, *v_rows;
    int64_t ks, vs;
    if constexpr (std::is_same_v<T, float>) {
      k_rows = K.row(b, hkv, j0), ks = K.row_stride;
      v_rows = V.row(b, hkv, j0), vs = V.row_stride;
    } else {
      float* rows_f32 = thread_scratch(5, kKeyTile * (n.D + n.Dv));
      for (int64_t jj = 0; jj < nk; ++jj) {
        const T *k = K.row(b, hkv, j0 + jj), *v = V.row(b, hkv, j0 + jj);
        for (int64_t d = 0; d < n.D; ++d) rows_f32[jj * n.D + d] = scalar(k[d]);
        for (int64_t e = 0; e < n.Dv; ++e) rows_f32[kKeyTile * n.D + jj * n.Dv + e] = scalar(v[e]);
      }
      k_rows = rows_f32, ks = n.D;
      v_rows = rows_f32 + kKeyTile * n.D, vs = n.Dv;
    }
    simd::pack_transposed(v_rows, vs, nk, n.Dv, 1.0f, Vt, kKeyTile);
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const tiles::TileMask& tm = masks[blk];
      const int64_t rows = std::min(Mq, n.R - blk * Mq);
      float* m = state + blk * 3 * Mq;
      float *l = m + Mq, *alpha = l + Mq;
      simd::with_count<tiles::kQueryVectors>(static_cast<int>((rows + N - 1) / N), [&](auto c) {
        constexpr int NQV = decltype(c)::value;
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
        simd::accumulate_tile<NQV>(S, nk, Mq, Vt, kKeyTile, n.Dv, alpha, Ot + blk * n.Dv * Mq,
                                   &prefetch);
      });
    }
  }
  for (int64_t r = 0; r < n.R; ++r) {
    const int64_t blk = r / Mq, lane = r % Mq;
    const float* m = state + blk * 3 * Mq;
    float* out = partial(parts, n, unit, r);
    out[0] = m[lane];
    out[1] = m[Mq + lane];
    for (int64_t e = 0; e < n.Dv; ++e) out[2 + e] = Ot[(blk * n.Dv + e) * Mq + lane];
  }
}

// The split-KV driver for either element type; Tk, Hkv and Dv come from the rows' caller.
template <typename T>
void decode(const AttentionArgs& a, const Rows<T>& K, const Rows<T>& V, int64_t Hkv, int64_t Tk,
            int64_t Dv) {
  Shape n{a.q.shape[0], a.q.shape[1], Hkv, a.q.shape[2], Tk, a.q.shape[3], Dv, 0, 0, 0, 0};
  n.G = n.Hq / n.Hkv;
  n.R = n.G * n.Tq;
  n.chunk = chunk_for(n.Tk);
  n.chunks = (n.Tk + n.chunk - 1) / n.chunk;
  const View bias = full_bias(a, "attention");
  const float scale = effective_scale(a);
  const int64_t units = n.B * n.Hkv * n.chunks;
  float* parts = thread_scratch(6, units * n.R * (n.Dv + 2));
  const int threads = detail::threads_for(units * n.chunk * (n.D + n.Dv) * n.R);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t c = u % n.chunks, hkv = (u / n.chunks) % n.Hkv, b = u / (n.chunks * n.Hkv);
    if (n.R >= kTiledDecodeMinRows && !keys_in_lanes(n))
      decode_unit_tiled(a, K, V, bias, scale, n, b, hkv, c, parts);
    else
      decode_unit(a, K, V, bias, scale, n, b, hkv, c, parts);
  }
  // Merge the chunks of each row in chunk order.
  const int64_t rows = n.B * n.Hkv * n.R;
#pragma omp parallel for schedule(static) num_threads(detail::threads_for(rows * n.chunks * n.Dv))
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t r = row % n.R, hkv = (row / n.R) % n.Hkv, b = row / (n.R * n.Hkv);
    const int64_t h = n.head(hkv, r), i = n.query(r);
    const int64_t first = (b * n.Hkv + hkv) * n.chunks;
    float m = simd::kMinusInf;
    for (int64_t c = 0; c < n.chunks; ++c) m = std::max(m, partial(parts, n, first + c, r)[0]);
    float* out = &a.out(b, h, i, 0);
    const int64_t os = a.out.stride[3];
    for (int64_t e = 0; e < n.Dv; ++e) out[e * os] = 0;
    float l = 0;
    if (m != simd::kMinusInf) {
      for (int64_t c = 0; c < n.chunks; ++c) {
        const float* p = partial(parts, n, first + c, r);
        if (p[0] == simd::kMinusInf) continue;
        const float w = std::exp(p[0] - m);
        l += w * p[1];
        for (int64_t e = 0; e < n.Dv; ++e) out[e * os] += w * p[2 + e];
      }
      for (int64_t e = 0; e < n.Dv; ++e) out[e * os] /= l;
    }
    if (a.lse) a.lse[(b * n.Hq + h) * n.Tq + i] = l > 0 ? m + std::log(l) : simd::kMinusInf;
  }
}

}  // namespace

void decode_forward(const AttentionArgs& a) {
  // K and V rows are read as vectors; a (rare) strided head dim goes through flash_forward.
  if (a.k.stride[3] != 1 || a.v.stride[3] != 1) return flash_forward(a);
  const Rows<float> K{a.k.data, a.k.stride[0], a.k.stride[1], a.k.stride[2]};
  const Rows<float> V{a.v.data, a.v.stride[0], a.v.stride[1], a.v.stride[2]};
  decode(a, K, V, a.k.shape[1], a.k.shape[2], a.v.shape[3]);
}

void decode_forward_bf16(const AttentionArgs& a, const Bf16Rows& k, const Bf16Rows& v,
                         int64_t Hkv, int64_t Tk, int64_t Dv) {
  check(a.mask.bias.empty(), "decode_forward_bf16: no additive bias over a bf16 cache");
  auto rows = [](const Bf16Rows& r) {
    return Rows<Bf16>{reinterpret_cast<const Bf16*>(r.data), r.batch_stride, r.head_stride,
                      r.row_stride};
  };
  decode(a, rows(k), rows(v), Hkv, Tk, Dv);
}

}  // namespace qkv::detail
