// Tiled attention backward, FlashAttention-2 style (Dao 2023, algorithm 2), on the CPU.
//
// Legend as in flash_forward.cpp; E_pad is a row width rounded up to whole vectors.
//
// Nothing Tq × Tk is stored: each tile of probabilities is recomputed from the forward's
// log-sum-exp, P = e^(S − lse). Work is split over (batch, key/value head): one thread owns
// the dK and dV of a head (summed over the query heads of its GQA group) and the dQ of those
// query heads, so there are no atomics and the result is the same bits for any thread count
// (as PyTorch's CPU flash backward does). The heads left over after whole rounds of one per
// thread (all of them for MQA, or GQA at batch 1) run in turn, and the threads share out the
// key tiles of each query tile instead: each key tile's rows of dK and dV belong to one step,
// and the steps' parts of dQ are summed in key order, so the bits stay the same. For one unit:
//   dK, dV [Tk][E_pad] ← 0
//   for each query head h of the group, for each query tile:
//     Qt  ← scale · Qᵀ [D][Mq],  Qr ← Q [Mq][D_pad]         packed once per query tile
//     dOt ← dOᵀ [Dv][Mq],        dOr ← dO [Mq][Dv_pad]
//     Di  ← rowsum(dO ∘ O) [Mq]
//     for each key tile [j0, j1) the tile can see (the key steps):
//       S  ← K Qt, transformed and masked as in the forward;  P ← e^(S − lse)
//       dV[j0:j1] += P̃ dOr           (reduced over the queries; P̃ = P ∘ Z with dropout,
//                                       the mask regenerated: dropout-inl.h)
//       dP ← V dOt;  dS ← P ∘ (dP ∘ Z − Di)  (∘ (1 − tanh²) under a softcap)
//       dK[j0:j1] += dS Qr;  dQt ← dQt + (Kᵀ dS)   (the part summed from zero, then added)
//     dq ← scale · dQtᵀ: the parts summed in key order
// (With the key steps spread over threads, each part is written alone and the parts summed
// in key order afterwards: the same bits. Adding each part at the end of its product, rather
// than writing it and summing in a second pass, took the backward 2–4% faster.)
//   dk ← scale · dK,  dv ← dV
// Five tile products per (query tile, key tile), against two in the forward: the backward
// does 2.5× the forward's flops.
// Compiled once per SIMD target; the entry points below dispatch (see src/simd/dispatch.h).
// Compiled once more for the bf16 units (flash_backward_bf16.cpp, src/simd/units.h): there
// the five products of bf16 K and V run as bf16 dot products (BackwardUnit<true>).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/flash_backward.cpp"
#include <hwy/foreach_target.h>
#include <hwy/highway.h>
#include "simd/units-inl.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention/kernels.h"
#include "attention/plan.h"
#include "simd/simd-inl.h"
#include "simd/kernel_namespace.h"
#include "simd/convert-inl.h"
#include "attention/tiles-inl.h"
#include "simd/transpose-inl.h"
#include "qkv/threads.h"
#include "util/scratch.h"
#include "simd/dispatch.h"
#include "simd/units.h"
#include "attention/backward_units-inl.h"
#include "attention/score_gradients-inl.h"
#include "attention/tile_units-inl.h"
#include "attention/dropout-inl.h"

#if QKV_KERNEL_PASS
QKV_KERNEL_BEGIN(qkv::detail)
namespace {

using namespace tiles;  // NOLINT: the tile shapes, the backward's units and score gradients

// A thread's buffers for one key step: S (then P), dP (then dS), tanh, P after dropout, each
// [Kt][Mq], a masked step's part of dQ, [D][Mq] (on the bf16 units: K's rows interleaved in
// pairs, [Kt/2][D] words), and on the bf16 units P, then dS, in bf16 rows [Kt][Mq].
struct StepBuffers {
  float *S, *dP, *tanh, *dropped, *dq_part;
  uint16_t* rows16;
};

StepBuffers step_buffers(const Shape& n) {
  // (The part holds a masked step's part of dQ, [D][Mq], or on the bf16 units K's rows in
  // pairs; on AMX tiles both a part and K transposed, [D][Kt + 32] bf16.)
  const int64_t tile = kKeyTile * n.Mq, part = n.D * (std::max(n.Mq, kKeyTile / 2) + kKeyTile);
  float* w = thread_scratch(BackwardSlot::tile, 4 * tile + part + tile / 2);
  return {w,
          w + tile,
          w + 2 * tile,
          w + 3 * tile,
          w + 4 * tile,
          reinterpret_cast<uint16_t*>(w + 4 * tile + part)};
}

// Σ_e g[e] · o[e], summed in double: Di = rowsum(dO ∘ O), which dP − Di cancels.
double row_dot(const float* g, const float* o, int64_t E) {
  const hn::Repartition<double, simd::Df> dd;
  const hn::Rebind<float, decltype(dd)> dh;  // as many floats as dd has doubles
  const int64_t M = static_cast<int64_t>(hn::Lanes(dd));
  auto acc = hn::Zero(dd);
  int64_t e = 0;
  for (; e + M <= E; e += M)
    acc = hn::MulAdd(hn::PromoteTo(dd, hn::LoadU(dh, g + e)),
                     hn::PromoteTo(dd, hn::LoadU(dh, o + e)), acc);
  double sum = hn::GetLane(hn::SumOfLanes(dd, acc));
  for (; e < E; ++e) sum += double(g[e]) * o[e];
  return sum;
}

// dS ← P ∘ (dP − Di) (∘ (1 − tanh²) under a softcap) for the vector of query vector v at
// `at` in the step's tiles, written over dP. With dropout (P̃ = P ∘ Z the weights V met), the
// gradient reaching P is dP ∘ Z: dS ← P̃ ∘ dP − P ∘ Di.
HWY_INLINE void score_gradient(const AttentionArgs& a, bool dropout, const PackedTile& p,
                               const StepBuffers& w, int64_t at, int64_t v) {
  const int64_t N = static_cast<int64_t>(simd::lanes());
  const Vf P = hn::Load(df, w.S + at), dP = hn::Load(df, w.dP + at),
           Di = hn::Load(df, p.Di + v * N);
  Vf ds = dropout ? hn::MulSub(hn::Load(df, w.dropped + at), dP, hn::Mul(P, Di))
                  : hn::Mul(P, hn::Sub(dP, Di));
  if (a.softcap > 0) {
    const Vf t = hn::Load(df, w.tanh + at);
    ds = hn::Mul(ds, hn::NegMulAdd(t, t, hn::Set(df, 1.0f)));
  }
  hn::Store(ds, df, w.dP + at);
}

// One key tile [j0, ...) of a query tile: adds to the tile's rows of dK and dV, and delivers
// this key tile's part of dQ, Kᵀ dS [D][Mq], into dQt as `dq` says. K and V are T, on the
// unit that multiplies T. A masked tile computes only its visible blocks (as the forward
// does): each product runs over the whole tile, or over the visible chunks of keys and their
// queries.
template <int NQV, class Unit, class T>
void key_step(const AttentionArgs& a, const ScoreRule& rule, const DropoutRule& drop,
              const Shape& n, int64_t b, int64_t h, int64_t i0, int64_t rows, const TileMask& tm,
              const PackedTile& p, int64_t j0, const StepBuffers& w, float* dK, float* dV,
              float* dQt, DqPart dq, int32_t* mask_regs, const ScoreGrads& score) {
  using Tile = typename Unit::Tile;
  Unit::begin();
  const int64_t N = static_cast<int64_t>(simd::lanes());
  const int64_t Mq = n.Mq, hkv = h / (n.Hq / n.Hkv);
  const int64_t Dp = padded(n.D), Dvp = padded(n.Dv);
  const T* k0 = static_cast<const T*>(a.k.address()) + b * a.k.stride[0] + hkv * a.k.stride[1];
  const T* v0 = static_cast<const T*>(a.v.address()) + b * a.v.stride[0] + hkv * a.v.stride[1];
  const int64_t ks = a.k.stride[2], vs = a.v.stride[2];
  const int64_t j1 = std::min(j0 + kKeyTile, tm.hi), nk = j1 - j0;
  // (A mask function's partial tile goes block by block, as a masked one does.)
  const bool masked = mask_regs || !tm.covers(j0, j1, rows);
  VisibleBlocks blocks;
  if (masked) blocks.find(tm, NQV, rows, j0, j1);
  if (mask_regs) blocks.narrow(a.block_mask->program(), b, h, NQV, i0, rows, j0, j1);
  auto chunks = [&](auto&& product) {  // product(first key, keys, first query vector, count)
    if (!masked) return product(0, nk, 0, NQV);
    for (int c = 0; c < blocks.chunks; ++c)
      if (blocks.first[c] < blocks.last[c])
        product(c * tiles::kKeyChunk, blocks.keys_in(c, nk), blocks.first[c],
                blocks.last[c] - blocks.first[c]);
  };
  // Pᵀ R reduced over the real queries of each chunk, into C rows j0 + ...: dV and dK.
  auto reduce_over_queries = [&](const float* P, const float* R, bool split, int64_t E_pad,
                                 float* C) {
    const auto* rows16 = Unit::template reduction_rows<NQV>(P, nk, Mq, w.rows16);
    chunks([&](int64_t jj, int64_t keys, int64_t v, int64_t count) {
      const int64_t q0 = v * N, q1 = std::min<int64_t>((v + count) * N, rows);
      Unit::reduce(rows16 + jj * Mq + q0, keys, Mq, q0, q1 - q0, R, split, E_pad,
                   C + (j0 + jj) * E_pad);
    });
  };

  // S ← K Qt, transformed; P ← e^(S − lse) in place, on the blocks computed.
  tiles::tile_scores<NQV, Tile>(masked, blocks, k0 + j0 * ks, ks, nk, p.Qt, n.D, Mq, p.q_split,
                                effective_scale(a), w.S, nullptr);
  // A score function: its values, ∂/∂score into w.tanh, its learnable values' derivatives.
  const ScoreCall* call = score.call;
  float* d_sources[32] = {};
  int32_t* index_of[32] = {};
  if (call) {
    const ScoreProgram& sp = *call->program;
    const int64_t sources = static_cast<int64_t>(sp.sources.size()), tile = kKeyTile * Mq;
    float* d =
        thread_scratch(BackwardSlot::score_derivatives, std::max<int64_t>(1, 2 * sources * tile));
    for (int64_t k = 0; k < sources; ++k) {
      d_sources[k] = d + 2 * k * tile;
      index_of[k] = reinterpret_cast<int32_t*>(d + (2 * k + 1) * tile);
    }
    tiles::apply_score_function(
        *call, b, h, i0, rows, j0, nk, Mq, w.S,
        reinterpret_cast<int32_t*>(
            thread_scratch(BackwardSlot::score_ints, tiles::score_register_ints(*call, Mq))),
        thread_scratch(BackwardSlot::score_floats,
                       tiles::score_register_floats(*call, Mq, 1 + sources)),
        w.tanh, d_sources, index_of);
  }
  if (rule.transforms())
    tiles::transform_scores(rule, tm, b, h, i0, rows, j0, nk, masked, n, w.S, w.tanh);
  else if (masked) blocks.apply(tm, NQV, j0, nk, Mq, w.S);
  if (mask_regs)
    blocks.apply_function(a.block_mask->program(), b, h, i0, rows, j0, nk, Mq, w.S, mask_regs);
  chunks([&](int64_t jj0, int64_t keys, int64_t v0c, int64_t count) {
    for (int64_t jj = jj0; jj < jj0 + keys; ++jj)
      for (int64_t v = v0c; v < v0c + count; ++v) {
        float* s = w.S + jj * Mq + v * N;
        hn::Store(simd::exp_nonpositive(hn::Sub(hn::Load(df, s), hn::Load(df, p.lse + v * N))), df,
                  s);
      }
  });
  // Dropout: P̃ ← P ∘ Z, the weights the forward multiplied V by (regenerated, not stored).
  if (drop.on)
    chunks([&](int64_t jj0, int64_t keys, int64_t v0c, int64_t count) {
      dropout::drop_weights(drop, b, h, i0, j0, jj0, keys, v0c, count, Mq, w.S, w.dropped);
    });
  // dV[j0:j1] += P̃ dOr
  reduce_over_queries(drop.on ? w.dropped : w.S, p.dOr, p.dout_split, Dvp, dV);
  // dP ← V dOt;  dS ← P ∘ (dP − Di) (∘ (1 − tanh²)), in dP, on the blocks computed.
  tiles::tile_scores<NQV, Tile>(masked, blocks, v0 + j0 * vs, vs, nk, p.dOt, n.Dv, Mq, p.dout_split,
                                1.0f, w.dP, nullptr);
  chunks([&](int64_t jj0, int64_t keys, int64_t v0c, int64_t count) {
    for (int64_t jj = jj0; jj < jj0 + keys; ++jj)
      for (int64_t v = v0c; v < v0c + count; ++v)
        score_gradient(a, drop.on, p, w, jj * Mq + v * N, v);
  });
  // Through a score function: its learnable values take dS · ∂/∂value, q and k dS · ∂/∂score.
  if (call && call->program->learnable())
    add_source_gradients(score, h, i0, rows, j0, Mq, w.S, w.dP, d_sources, index_of, chunks);
  if (call && !call->program->additive)  // (not where P = 0: 0 · inf would be NaN)
    chunks([&](int64_t jj0, int64_t keys, int64_t v0c, int64_t count) {
      for (int64_t jj = jj0; jj < jj0 + keys; ++jj)
        for (int64_t v = v0c; v < v0c + count; ++v) {
          const int64_t at = jj * Mq + v * N;
          const Vf ds = hn::Mul(hn::Load(df, w.dP + at), hn::Load(df, w.tanh + at));
          hn::Store(hn::IfThenZeroElse(hn::Eq(hn::Load(df, w.S + at), hn::Zero(df)), ds), df,
                    w.dP + at);
        }
    });
  // dK[j0:j1] += dS Qr;  dQ's part Kᵀ dS.
  reduce_over_queries(w.dP, p.Qr, p.q_split, Dp, dK);
  Unit::template dq<NQV>(masked, chunks, w.dP, nk, Mq, k0 + j0 * ks, ks, n.D, w.dq_part, dQt, dq);
  Unit::end();
}

// Row (b, h, j) of `to` ← scale · from[0, E), rounded to `to`'s type.
void store_row(const float* from, float scale, int64_t E, const View& to, int64_t b, int64_t h,
               int64_t j) {
  if (to.stride[3] != 1) {
    for (int64_t e = 0; e < E; ++e) to.set(b, h, j, e, scale * from[e]);
    return;
  }
  const int64_t N = static_cast<int64_t>(simd::lanes());
  with_typed(to, b, h, j, 0, [&](auto* row) {
    for (int64_t e = 0; e < E; e += N)  // from is padded to whole vectors
      simd::store_first_rounded(hn::Mul(hn::Load(df, from + e), hn::Set(df, scale)), row + e,
                                static_cast<size_t>(std::min(N, E - e)));
  });
}

// Key tiles whose dQ parts are held at once before they are summed, in key order.
inline constexpr int64_t kKeyTilesPerBatch = 64;

// One query tile: its key steps (spread over the threads when `split_keys`), then
// dq ← scale · (Σ over key tiles, in key order, of their dQt)ᵀ. The sum's order does not
// depend on which thread ran which step, nor on the batching: the same bits either way.
template <int NQV, class Unit, class T>
void query_tile(const AttentionArgs& a, const ScoreRule& rule, float scale, const Shape& n,
                const View& dout, const View& dq, int64_t b, int64_t h, int64_t i0, int64_t rows,
                bool split_keys, PackedTile& p, float* dQt, float* dK, float* dV,
                const ScoreGrads& score) {
  const int64_t Mq = n.Mq;
  TileMask tm;
  tm.init(a.mask, b, i0, rows, n);
  // The key tiles the tile sees, ascending (a mask function's empty blocks left out; its
  // partial ones as −tile − 1).
  const BlockMask* fn = a.block_mask;
  int64_t count = 0;
  int64_t* key_tiles = nullptr;
  if (tm.lo < tm.hi) {
    const int64_t first = tm.lo / kKeyTile, last = (tm.hi - 1) / kKeyTile;
    key_tiles =
        reinterpret_cast<int64_t*>(thread_scratch(BackwardSlot::key_tiles, 2 * (last - first + 1)));
    for (int64_t k = first; k <= last; ++k) {
      const BlockState st = tiles::key_tile_state(fn, b, h, i0, rows, k * kKeyTile, n.Tk);
      if (st != BlockState::empty) key_tiles[count++] = st == BlockState::partial ? -k - 1 : k;
    }
  }
  if (count == 0) {  // the tile sees no key: its gradient is zero
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t d = 0; d < n.D; ++d) dq.set(b, h, i0 + r, d, 0);
    return;
  }

  // Pack the tile: transposed for the score-shaped products, row-major for the reductions.
  Unit::pack(a, dout, b, h, i0, rows, n, scale, p);
  for (int64_t r = 0; r < Mq; ++r) {
    const bool real = r < rows;
    p.Di[r] = real ? row_dot(Unit::dout_row(dout, p, b, h, i0, r, n),
                             row_f32(a.out, b, h, i0 + r, n.Dv, p.out_row), n.Dv)
                   : 0;
    // A row that saw no key has lse = -inf; any finite value works, as all its P are 0.
    const float l = real ? a.lse[(b * n.Hq + h) * n.Tq + i0 + r] : 0;
    p.lse[r] = std::isinf(l) ? 0 : l;
  }

  const DropoutRule drop(a.dropout, n.Hq);
  auto step = [&](int64_t k, float* part, DqPart dq) {
    const bool partial = key_tiles[k] < 0;
    const int64_t tile = partial ? -key_tiles[k] - 1 : key_tiles[k];
    int32_t* mask_regs = nullptr;  // (the running thread's)
    if (partial)
      mask_regs = reinterpret_cast<int32_t*>(thread_scratch(
          BackwardSlot::mask_registers, tiles::function_register_ints(fn->program())));
    key_step<NQV, Unit, T>(a, rule, drop, n, b, h, i0, rows, tm, p, tile * kKeyTile,
                           step_buffers(n), dK, dV, part, dq, mask_regs, score);
  };
  if (!split_keys) {  // each step adds its part to the sum in turn
    for (int64_t k = 0; k < count; ++k) step(k, dQt, k == 0 ? DqPart::kFirst : DqPart::kAdd);
  } else {
    // The threads write the parts of a batch of steps alone; they are then summed in order.
    const int64_t part = n.D * Mq;
    float* parts = thread_scratch(BackwardSlot::partials, kKeyTilesPerBatch * part);
    for (int64_t k0 = 0; k0 < count; k0 += kKeyTilesPerBatch) {
      const int64_t steps = std::min(kKeyTilesPerBatch, count - k0);
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads())
      for (int64_t k = 0; k < steps; ++k) step(k0 + k, parts + k * part, DqPart::kAlone);
      for (int64_t k = 0; k < steps; ++k) {
        if (k0 + k == 0) std::copy_n(parts + k * part, part, dQt);
        else add_part(dQt, parts + k * part, part);
      }
    }
  }
  if (dq.stride[3] == 1) {
    float* row_scale = p.lse;  // lse is done with
    std::fill(row_scale, row_scale + Mq, scale);
    with_typed(dq, b, h, i0, 0, [&](auto* dq0) {
      simd::unpack_transposed(dQt, Mq, rows, n.D, row_scale, dq0, dq.stride[2]);
    });
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t d = 0; d < n.D; ++d) dq.set(b, h, i0 + r, d, scale * dQt[d * Mq + r]);
  }
}

}  // namespace

void flash_backward(const AttentionArgs& args, const View& dout, const View& dq, const View& dk,
                    const View& dv, const Plan& plan) {
  std::vector<char> k_copy, v_copy;
  AttentionArgs a = args;
  a.k = contiguous_rows(args.k, k_copy);
  a.v = contiguous_rows(args.v, v_copy);
  const size_t N = simd::lanes();
  const Shape n{a.q.shape[0], a.q.shape[1], a.k.shape[1], a.q.shape[2],
                a.k.shape[2], a.q.shape[3], a.v.shape[3], static_cast<int64_t>(kQueryVectors * N)};
  const ScoreRule rule = score_rule(a, "attention_backward");
  const float scale = effective_scale(a);
  const int64_t Dp = padded(n.D), Dvp = padded(n.Dv), Mq = n.Mq;
  const int64_t tiles_q = (n.Tq + Mq - 1) / Mq, group = n.Hq / n.Hkv;
  ScoreCall call;  // a score function's tables, filled before the threads start
  prepare_score_call(a, n.Tk, call, "attention_backward");
  if (call) tiles::fill_score_tables(call);
  const bool learnable = call && call.program->learnable();

  // One (batch, key/value head) per thread in whole rounds; the units left over, fewer than
  // the threads (all of them for MQA or GQA at batch 1; the third of 3 on 2 threads), run
  // one after another with the key tiles of each query tile spread over the threads instead,
  // so that no thread idles through a whole unit. Same arithmetic either way. (A score
  // function's learnable values are summed per unit, each unit on one thread: then every unit
  // runs alone.)
  const int64_t units = n.B * n.Hkv;
  const int64_t whole_rounds = learnable ? units : units - units % num_threads();
  std::vector<int64_t> offsets;  // each source's sums in a unit's
  int64_t unit_sums = 0;
  if (learnable)
    for (size_t k = 0; k < call.program->sources.size(); ++k) {
      offsets.push_back(unit_sums);
      unit_sums += source_size(call, static_cast<int64_t>(k), group);
    }
  std::vector<double> sums(units * unit_sums, 0.0);
  auto unit = [&](auto element, auto on, int64_t u, bool split_keys) {
    using T = decltype(element);
    using Unit = decltype(on);
    const int64_t b = u / n.Hkv, hkv = u % n.Hkv;
    PackedTile p;
    p.Qt = thread_scratch(BackwardSlot::q_tiles, n.D * Mq);
    // (Qr and dOr with 16 rows of zeros past them for the AMX unit's last step of queries.)
    p.Qr = thread_scratch(BackwardSlot::q_rows, (Mq + 32) * Dp);
    p.dOt = thread_scratch(BackwardSlot::dout_tiles, n.Dv * Mq);
    p.dOr = thread_scratch(BackwardSlot::dout_rows, (Mq + 32) * Dvp);
    p.lse = thread_scratch(BackwardSlot::lse, 2 * Mq + n.D * Mq + 2 * Dvp);
    p.Di = p.lse + Mq;
    float* dQt = p.Di + Mq;
    p.dout_row = dQt + n.D * Mq;
    p.out_row = p.dout_row + Dvp;
    float* dK = thread_scratch(BackwardSlot::dk_dv, n.Tk * (Dp + Dvp));
    float* dV = dK + n.Tk * Dp;
    std::fill(dK, dK + n.Tk * (Dp + Dvp), 0.0f);
    const ScoreGrads score{call ? &call : nullptr, sums.data() + u * unit_sums, &offsets,
                           hkv * group};
    for (int64_t h = hkv * group; h < (hkv + 1) * group; ++h)
      for (int64_t t = 0; t < tiles_q; ++t) {
        const int64_t i0 = t * Mq, rows = std::min(Mq, n.Tq - i0);
        simd::with_count<kQueryVectors>(static_cast<int>((rows + N - 1) / N), [&](auto c) {
          query_tile<decltype(c)::value, Unit, T>(a, rule, scale, n, dout, dq, b, h, i0, rows,
                                                  split_keys, p, dQt, dK, dV, score);
        });
      }
    for (int64_t j = 0; j < n.Tk; ++j) {
      store_row(dK + j * Dp, scale, n.D, dk, b, hkv, j);
      store_row(dV + j * Dvp, 1.0f, n.Dv, dv, b, hkv, j);
    }
  };
  auto run_on = [&](auto element, auto on) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads())
    for (int64_t u = 0; u < whole_rounds; ++u) unit(element, on, u, false);
    for (int64_t u = whole_rounds; u < units; ++u) unit(element, on, u, true);
  };
  // The plan's unit (plan.cpp chose it).
  tiles::with_element_type(a.k.type, [&](auto element) {
    using T = decltype(element);
    reached(plan.variant);
#if QKV_AMX_UNIT
    if constexpr (std::is_same_v<T, simd::Bf16>)
      if (plan.variant == Variant::backward_tiles_amx &&
          tiles::run_on_amx([&](auto amx) {
            run_on(element, AmxBackwardUnit<typename decltype(amx)::TileSet>{});
          }))
        return;
#endif
    check(plan.variant ==
              (kOnUnits<T> ? Variant::backward_tiles_bf16_dot : Variant::backward_tiles),
          "attention_backward: the plan names ", variant_name(plan.variant),
          ", which this pass does not compile for ", dtype_name(a.k.type), " keys");
    run_on(element, BackwardUnit<kOnUnits<T>>{});
  });
  if (call) call.check_miss();  // an index a kernel found outside its tensor
  if (learnable) write_score_gradients(call, sums, unit_sums, offsets, n.B, n.Hkv, group);
}

QKV_KERNEL_END();  // qkv::detail::HWY_NAMESPACE

#endif  // QKV_KERNEL_PASS

#if HWY_ONCE
namespace qkv::detail {

// The bf16-unit pass (flash_backward_bf16.cpp) where the plan says so.
QKV_ENTRY_WITH_BF16_UNITS(flash_backward,
                          (const AttentionArgs& a, const View& dout, const View& dq, const View& dk,
                           const View& dv, const Plan& plan),
                          (a, dout, dq, dk, dv, plan), plan.bf16_units)

}  // namespace qkv::detail
#endif  // HWY_ONCE
