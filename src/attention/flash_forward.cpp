// Tiled attention forward, FlashAttention-2 style (Dao 2023, algorithm 1), on the CPU.
//
// Legend: B batch, H heads, Tq queries, Tk keys, D head dim, Dv value dim, Mq query-tile
// rows, Kt key-tile rows, N vector lanes (16 on AVX-512).
//
// Work is split over (batch, head, query tile); each unit writes only its own rows of out
// and lse, so results do not depend on the thread count. For one unit:
//   Qt[D][Mq]  ← scale · Q[tile]ᵀ        packed once; one query per vector lane
//   m, l [Mq]  ← -inf, 0                 running max and sum of each query row
//   Ot[Dv][Mq] ← 0                       the output, transposed
//   for each key tile [j0, j1) that some query of the tile can see:
//     S[Kt][Mq] ← K[j0:j1] Qt            scores: K rows read in place, broadcast
//     S ← softcap, + bias, − ALiBi, -inf where masked (only tiles that need it)
//     m' ← max(m, max_j S);  alpha ← e^(m − m');  P ← e^(S − m')
//     l ← alpha · l + Σ_j P;  Ot ← alpha · Ot + Vᵀ P;  m ← m'
//   out ← Otᵀ / l,  lse ← m + log l      (l = 0: the row saw no key → 0 and -inf)
//
// Memory traffic: Qt (D × Mq floats) and Ot (Dv × Mq) stay in L1/L2 for the whole key loop;
// each key tile of K and V is read once per query tile, so K and V stream Tq / Mq times.
// With Mq = 64 that is one pass over K and V per 64 queries, and the two tile products
// (2 · Mq · Kt · D flops each) dominate: the kernel is compute-bound from Tq ≈ 64 on.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention/kernels.h"
#include "attention/masks.h"
#include "attention/simd.h"
#include "attention/tiles.h"
#include "qkv/threads.h"
#include "util/scratch.h"

namespace qkv::detail {
namespace {

namespace hn = simd::hn;
using simd::df;
using simd::Vf;
using namespace tiles;

// One (batch, head, query tile) unit.
template <int NQV>
void query_tile(const AttentionArgs& a, const View& bias, float scale, const Shape& n,
                int64_t b, int64_t h, int64_t i0, int64_t rows) {
  const size_t N = simd::lanes();
  const int64_t Mq = n.Mq;
  const int64_t hkv = h / (n.Hq / n.Hkv);
  float* Qt = thread_scratch(0, n.D * Mq);
  float* S = thread_scratch(1, kKeyTile * Mq);
  float* Ot = thread_scratch(2, n.Dv * Mq);
  float* m = thread_scratch(3, 4 * Mq);  // m, l, alpha, and the new max, each [Mq]
  float* l = m + Mq;
  float* alpha = l + Mq;
  thread_local TileMask tm;
  tm.init(a.mask, b, i0, rows, n);

  // Qt ← scale · Q[tile]ᵀ, zero in padded lanes.
  for (int64_t d = 0; d < n.D; ++d)
    for (int64_t r = 0; r < Mq; ++r) Qt[d * Mq + r] = r < rows ? scale * a.q(b, h, i0 + r, d) : 0;
  std::fill(Ot, Ot + n.Dv * Mq, 0.0f);
  std::fill(m, m + Mq, simd::kMinusInf);
  std::fill(l, l + Mq, 0.0f);

  const bool transforms = has_score_transforms(a);
  const float* k0 = &a.k(b, hkv, 0, 0);
  const float* v0 = &a.v(b, hkv, 0, 0);
  const int64_t ks = a.k.stride[2], vs = a.v.stride[2];
  for (int64_t j0 = tm.lo / kKeyTile * kKeyTile; j0 < tm.hi; j0 += kKeyTile) {
    const int64_t j1 = std::min(j0 + kKeyTile, tm.hi);
    const int64_t nk = j1 - j0;
    // Ask for the next key tile's K and V rows now, so that they arrive while this tile
    // computes.
    for (int64_t j = j1; j < std::min(j1 + kKeyTile, tm.hi); ++j) {
      for (int64_t d = 0; d < n.D; d += 16) __builtin_prefetch(k0 + j * ks + d, 0, 2);
      for (int64_t e = 0; e < n.Dv; e += 16) __builtin_prefetch(v0 + j * vs + e, 0, 2);
    }
    simd::scores_tile<NQV>(k0 + j0 * ks, ks, nk, Qt, n.D, Mq, S);
    // And this tile's V rows into L1 while the softmax runs: the P V product reads each row
    // in 6-column slices, and from L2 it ran at ~65% of peak against ~80% from L1.
    for (int64_t j = j0; j < j1; ++j)
      for (int64_t e = 0; e < n.Dv; e += 16) __builtin_prefetch(v0 + j * vs + e, 0, 3);
    const bool masked = !tm.covers(j0, j1, rows);
    if (transforms || masked)
      transform_scores(a, bias, tm, b, h, i0, rows, j0, nk, masked, n, S, nullptr);

    // Online softmax, lane by lane (each lane is one query row). The NQV vectors of a key row
    // are independent chains: walking them together keeps max and sum off the add latency.
    Vf mx[NQV], shift[NQV], sum[NQV];
    for (int v = 0; v < NQV; ++v) mx[v] = hn::Load(df, m + v * N);
    for (int64_t jj = 0; jj < nk; ++jj)
      for (int v = 0; v < NQV; ++v) mx[v] = hn::Max(mx[v], hn::Load(df, S + jj * Mq + v * N));
    for (int v = 0; v < NQV; ++v) {
      // A row that has seen no key yet keeps max -inf; subtract 0 instead so that
      // e^(-inf - (-inf)) does not become NaN.
      shift[v] = hn::IfThenZeroElse(hn::Eq(mx[v], hn::Set(df, simd::kMinusInf)), mx[v]);
      sum[v] = hn::Zero(df);
    }
    for (int64_t jj = 0; jj < nk; ++jj)
      for (int v = 0; v < NQV; ++v) {
        float* s = S + jj * Mq + v * N;
        const Vf p = simd::exp_nonpositive(hn::Sub(hn::Load(df, s), shift[v]));
        hn::Store(p, df, s);
        sum[v] = hn::Add(sum[v], p);
      }
    for (int v = 0; v < NQV; ++v) {
      const Vf a_v = simd::exp_nonpositive(hn::Sub(hn::Load(df, m + v * N), shift[v]));
      hn::Store(hn::MulAdd(hn::Load(df, l + v * N), a_v, sum[v]), df, l + v * N);
      hn::Store(a_v, df, alpha + v * N);
      hn::Store(mx[v], df, m + v * N);
    }
    simd::accumulate_tile<NQV>(S, nk, Mq, v0 + j0 * vs, vs, n.Dv, alpha, Ot);
  }

  // out ← Otᵀ / l; lse ← m + log l.
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = l[r] > 0 ? 1 / l[r] : 0;
    for (int64_t e = 0; e < n.Dv; ++e) a.out(b, h, i0 + r, e) = Ot[e * Mq + r] * inv;
    if (a.lse)
      a.lse[(b * n.Hq + h) * n.Tq + i0 + r] =
          l[r] > 0 ? m[r] + std::log(l[r]) : simd::kMinusInf;
  }
}

}  // namespace

void flash_forward(const AttentionArgs& args) {
  std::vector<float> k_copy, v_copy;
  AttentionArgs a = args;
  a.k = contiguous_rows(args.k, k_copy);
  a.v = contiguous_rows(args.v, v_copy);
  const size_t N = simd::lanes();
  const Shape n{a.q.shape[0], a.q.shape[1], a.k.shape[1], a.q.shape[2], a.k.shape[2],
                a.q.shape[3], a.v.shape[3], static_cast<int64_t>(kQueryVectors * N)};
  const View bias = full_bias(a, "attention");
  const float scale = effective_scale(a);
  const int64_t tiles = (n.Tq + n.Mq - 1) / n.Mq;
  const int64_t units = n.B * n.Hq * tiles;

#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads())
  for (int64_t u = 0; u < units; ++u) {
    const int64_t t = u % tiles, h = (u / tiles) % n.Hq, b = u / (tiles * n.Hq);
    const int64_t i0 = t * n.Mq, rows = std::min(n.Mq, n.Tq - i0);
    const int nqv = static_cast<int>((rows + N - 1) / N);
    simd::with_count<kQueryVectors>(nqv, [&](auto c) {
      query_tile<decltype(c)::value>(a, bias, scale, n, b, h, i0, rows);
    });
  }
}

}  // namespace qkv::detail
