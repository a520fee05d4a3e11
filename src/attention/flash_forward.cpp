// Tiled attention forward, FlashAttention-2 style (Dao 2023, algorithm 1), on the CPU.
//
// Legend: B batch, H heads, Tq queries, Tk keys, D head dim, Dv value dim, Mq query-tile
// rows, Kt key-tile rows, N vector lanes (16 on AVX-512).
//
// Work is split over (batch, head, group of query tiles); each unit writes only its own rows
// of out and lse, and a row's arithmetic does not depend on the grouping, so results do not
// depend on the thread count. For one query tile:
//   Qt[D][Mq]  ← scale · Q[tile]ᵀ        packed once; one query per vector lane
//   m, l [Mq]  ← -inf, 0                 running max and sum of each query row
//   Ot[Dv][Mq] ← 0                       the output, transposed
//   for each key tile [j0, j1) that some query of the tile can see:
//     S[Kt][Mq] ← K[j0:j1] Qt            scores: K rows read in place, broadcast
//     Vt[Dv][Kt] ← V[j0:j1]ᵀ             packed once for all the query tiles of a group
//     S ← softcap, + bias, − ALiBi (or a score function, tiles::apply_score_function),
//         -inf where masked (only tiles that need it)
//     m' ← max(m, max_j S);  alpha ← e^(m − m');  P ← e^(S − m')
//     l ← alpha · l + Σ_j P;  P ← P ∘ Z (dropout: Z = 0 or 1/(1 − p), dropout-inl.h)
//     Ot ← alpha · Ot + Vᵀ P;  m ← m'
//   out ← Otᵀ / l,  lse ← m + log l      (l = 0: the row saw no key → 0 and -inf; a sink
//                                         s adds e^(s − m) to l first)
//
// Memory traffic: Qt (D × Mq floats) and Ot (Dv × Mq) stay in L1/L2 for the whole key loop,
// and the two tile products (2 · Mq · Kt · D flops each) dominate. The query tiles of a group
// (up to kTilesPerGroup) walk the key tiles together, each K and V tile serving all of them
// while it is in cache: K and V stream from memory once per group instead of once per tile
// (at seq 2048, dim 128 a head's K and V fill the 2 MiB L2; grouping 4 tiles lifted the
// forward by ~5% of peak). V is transposed per key tile so that P V, like K Qt, broadcasts
// along rows (see rows_times_packed): shared by the group, that lifted the forward by 2–4%,
// and made groups of 8 pay (+1–3% at dim 128 over 4; 16 lost again: Qt and Ot of 16 tiles
// crowd K and V out of L2).
// Compiled once per SIMD target; the entry points below dispatch (see src/simd/dispatch.h).
// Compiled once more for the bf16 units (flash_forward_bf16.cpp, src/simd/units.h): there
// bf16 K and V go through the bf16 tile products (attention/bf16_products-inl.h), with Q and
// P packed as bf16 pairs and V's rows interleaved in pairs.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/flash_forward.cpp"
#include <hwy/foreach_target.h>
#include <hwy/highway.h>
#include "simd/units-inl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "attention/kernels.h"
#include "attention/plan.h"
#include "attention/masks.h"
#include "simd/simd-inl.h"
#include "simd/kernel_namespace.h"
#include "simd/convert-inl.h"
#include "attention/tiles-inl.h"
#include "simd/transpose-inl.h"
#include "qkv/error.h"
#include "qkv/threads.h"
#include "util/parallel.h"
#include "util/scratch.h"
#include "simd/dispatch.h"
#include "simd/units.h"
#include "attention/tile_units-inl.h"
#include "attention/block_rows-inl.h"
#include "attention/dropout-inl.h"

#if QKV_KERNEL_PASS
QKV_KERNEL_BEGIN(qkv::detail)
namespace {

using namespace tiles;

inline constexpr int64_t kTilesPerGroup = 8;

// One query tile of a group: where it lies, what it sees, and its running state.
struct QueryTile {
  int64_t i0, rows;
  int nqv;  // vectors of Mq that hold real rows
  float *Qt, *Ot, *m, *l, *alpha;
  TileMask tm;
  float scale;  // on the bf16 units, applied to the scores (Qt holds q itself)
  bool two;     // on the bf16 units: Qt holds q as hi + lo pairs (q not bf16)
};

template <class Unit>
void start_tile(const AttentionArgs& a, float scale, const Shape& n, int64_t b, int64_t h,
                QueryTile& t) {
  const int64_t Mq = n.Mq;
  t.tm.init(a.mask, b, t.i0, t.rows, n);
  t.scale = scale, t.two = Unit::kBf16Dot && a.q.type != TensorType::bf16;
  Unit::pack_queries(a.q, b, h, t.i0, t.rows, n.D, Mq, scale, t.two, t.Qt);
  std::fill(t.Ot, t.Ot + n.Dv * Mq, 0.0f);
  std::fill(t.m, t.m + Mq, simd::kMinusInf);
  std::fill(t.l, t.l + Mq, 0.0f);
}

// f(jj, v) for every key row jj and query vector v holding scores: the whole tile of nk keys,
// or block by block the visible blocks of a masked one (its hidden blocks are never written or
// read: the softmax over only the visible blocks took a window of 512 1.2% faster).
template <int NQV, class F>
void for_visible_scores(bool masked, const VisibleBlocks& blocks, int64_t nk, F&& f) {
  if (!masked) return every_score<NQV>(nk)(f);
  for (int c = 0; c < blocks.chunks; ++c)
    for (int v = 0; v < NQV; ++v)
      if (v >= blocks.first[c] && v < blocks.last[c])
        for (int64_t jj = c * kKeyChunk; jj < c * kKeyChunk + blocks.keys_in(c, nk); ++jj) f(jj, v);
}

// One key tile [j0, j1) for one query tile: scores, online softmax, P V, on the unit that
// multiplies K's elements T (fp32, bf16 or fp16): key j0 at k_tile, the others ks elements
// apart; Vt as the unit packed it. A masked tile computes only the blocks some query sees.
// A score function's registers (a thread's).
struct ScoreRegisters {
  int32_t* ints = nullptr;
  float* reals = nullptr;
};

template <int NQV, class Unit, class T>
void key_step(const AttentionArgs& a, const ScoreRule& rule, const ScoreCall& call,
              const ScoreRegisters& score_regs, const DropoutRule& drop, const Shape& n, int64_t b,
              int64_t h, const T* k_tile, int64_t ks, const float* Vt, int64_t j0, int64_t j1,
              QueryTile& t, float* S, int32_t* mask_regs, products::PrefetchQueue& prefetch) {
  const int64_t Mq = n.Mq, nk = j1 - j0;
  // (A mask function's partial tile goes block by block, as a masked one does.)
  const bool masked = mask_regs || !t.tm.covers(j0, j1, t.rows);
  VisibleBlocks blocks;
  if (masked) blocks.find(t.tm, NQV, t.rows, j0, j1);
  // (A mask function reads the rule's indices: i + q_origin, j + kv_origin.)
  const int64_t q0 = t.i0 + rule.q_origin, kv0 = j0 + rule.kv_origin;
  if (mask_regs) blocks.narrow(a.block_mask->program(), b, h, NQV, q0, t.rows, kv0, kv0 + nk);
  tile_scores<NQV, Unit>(masked, blocks, k_tile, ks, nk, t.Qt, n.D, Mq, t.two, t.scale, S,
                         &prefetch);
  if (call)  // (over the whole tile: the masks below hide what it must not show)
    apply_score_function(call, b, h, t.i0, t.rows, j0, nk, Mq, S, score_regs.ints,
                         score_regs.reals);
  // (The mask below sets -inf where a row of a partial block may not look.)
  if (rule.transforms())
    transform_scores(rule, t.tm, b, h, t.i0, t.rows, j0, nk, masked, n, S, nullptr);
  else if (masked) blocks.apply(t.tm, NQV, j0, nk, Mq, S);
  if (mask_regs)
    blocks.apply_function(a.block_mask->program(), b, h, q0, t.rows, kv0, nk, Mq, S, mask_regs);
  online_softmax<NQV>(S, Mq, t.m, t.l, t.alpha,
                      [&](auto&& f) { for_visible_scores<NQV>(masked, blocks, nk, f); });
  // Dropout after the sum l has taken P: the weights V is multiplied by, not the softmax's.
  if (drop.on) {
    if (!masked) dropout::drop_weights(drop, b, h, t.i0, j0, 0, nk, 0, NQV, Mq, S, S);
    else
      for (int c = 0; c < blocks.chunks; ++c)
        if (blocks.first[c] < blocks.last[c])
          dropout::drop_weights(drop, b, h, t.i0, j0, c * kKeyChunk, blocks.keys_in(c, nk),
                                blocks.first[c], blocks.last[c] - blocks.first[c], Mq, S, S);
  }
  tile_accumulate<NQV, Unit>(masked, blocks, S, nk, Mq, Vt, n.Dv, t.alpha, t.Ot, &prefetch);
}

// An output this large does not stay in the caches for whoever reads it next: it is
// written with streaming stores, which spare the caches the lines' first fetch and later
// eviction (2–5% of the forward at seq 2048, measured in-process; the most with a window).
inline constexpr double kStreamOutputBytes = 4 << 20;

// out ← Otᵀ / l; lse ← m + log l. A row that saw no key (l = 0) gets 0 and -inf; a NaN in
// the inputs (l NaN) stays NaN, as in the reference. A sink s adds e^(s − m) to l first (with
// m raised to s when s is larger): a row that saw no key then gets 0 and lse = s.
void finish_tile(const AttentionArgs& a, const Shape& n, int64_t b, int64_t h, const QueryTile& t,
                 bool stream) {
  float* inv = t.alpha;  // free now
  const float sink = a.sinks ? a.sinks[h] : simd::kMinusInf;
  for (int64_t r = 0; r < n.Mq; ++r) {
    float shrink = 1;  // Ot's rows are scaled for m, not for the max with the sink
    if (sink != simd::kMinusInf) {
      const float m = t.l[r] == 0 ? sink : std::max(t.m[r], sink);
      shrink = t.l[r] == 0 ? 0 : std::exp(t.m[r] - m);
      t.l[r] = t.l[r] * shrink + std::exp(sink - m);
      t.m[r] = m;
    }
    inv[r] = t.l[r] == 0 ? 0 : shrink / t.l[r];
  }
  if (a.out.stride[3] == 1) {
    with_typed(a.out, b, h, t.i0, 0, [&](auto* out) {
      simd::unpack_transposed(t.Ot, n.Mq, t.rows, n.Dv, inv, out, a.out.stride[2], stream);
    });
  } else {
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t e = 0; e < n.Dv; ++e) a.out.set(b, h, t.i0 + r, e, t.Ot[e * n.Mq + r] * inv[r]);
  }
  if (a.lse)
    for (int64_t r = 0; r < t.rows; ++r)
      a.lse[(b * n.Hq + h) * n.Tq + t.i0 + r] =
          t.l[r] == 0 ? simd::kMinusInf : t.m[r] + std::log(t.l[r]);
}

// Whether K and V are widened to fp32 a tile at a time (blocks, or two formats) rather than
// read in place.
bool widened(const KvRows& K, const KvRows& V) { return K.in_blocks() || K.type != V.type; }

// One unit: query tiles [first, first + count) of (b, h), walking the key tiles together; K
// and V are T (fp32, bf16 or fp16), read in place a run at a time (a key tile that a ring's
// wrap splits is copied together first), multiplied on Unit.
template <class T, class Unit>
void query_tile_group(const AttentionArgs& a, const KvRows& K, const KvRows& V,
                      const ScoreRule& rule, const ScoreCall& call, const DropoutRule& drop,
                      float scale, const Shape& n, int64_t b, int64_t h, int64_t first,
                      int64_t count, bool stream_out) {
  const size_t N = simd::lanes();
  const int64_t Mq = n.Mq;
  float* Qt = thread_scratch(ForwardSlot::q_tiles, count * n.D * Mq);
  float* S = thread_scratch(ForwardSlot::scores, kKeyTile * Mq);
  float* Ot = thread_scratch(ForwardSlot::out_tiles, count * n.Dv * Mq);
  // m, l, alpha of each tile, each [Mq]
  float* state = thread_scratch(ForwardSlot::softmax_state, count * 3 * Mq);
  float* Vt = thread_scratch(ForwardSlot::v_tiles, n.Dv * kKeyTile);
  const BlockMask* fn = a.block_mask;
  int32_t* mask_regs = nullptr;
  if (fn)
    mask_regs = reinterpret_cast<int32_t*>(
        thread_scratch(ForwardSlot::mask_registers, function_register_ints(fn->program())));
  ScoreRegisters score_regs;
  if (call) {
    score_regs.ints = reinterpret_cast<int32_t*>(
        thread_scratch(ForwardSlot::score_ints, score_register_ints(call, n.Mq)));
    score_regs.reals =
        thread_scratch(ForwardSlot::score_floats, score_register_floats(call, n.Mq, 0));
  }
  Unit::begin();
  QueryTile tiles_of_group[kTilesPerGroup];
  const auto group = std::span(tiles_of_group, static_cast<size_t>(count));
  int64_t lo = n.Tk, hi = 0;  // keys some query of the group sees
  for (int64_t g = 0; g < count; ++g) {
    QueryTile& t = group[g];
    t.i0 = (first + g) * Mq;
    t.rows = std::min(Mq, n.Tq - t.i0);
    t.nqv = static_cast<int>((t.rows + N - 1) / N);
    t.Qt = Qt + g * n.D * Mq;
    t.Ot = Ot + g * n.Dv * Mq;
    t.m = state + g * 3 * Mq, t.l = t.m + Mq, t.alpha = t.l + Mq;
    start_tile<Unit>(a, scale, n, b, h, t);
    if (t.tm.lo < t.tm.hi) lo = std::min(lo, t.tm.lo), hi = std::max(hi, t.tm.hi);
  }

  const int64_t hkv = h / (n.Hq / n.Hkv);
  // Keys and values in 32-value blocks (a Q8_0, Q4_0 or Q4_1 cache), or in two different
  // formats (T is float): each key tile's rows widened into tiles first, then read as fp32 rows.
  const bool in_blocks = widened(K, V);
  const bool wraps = K.wrap() < K.rows || V.wrap() < V.rows;
  float *k_tile = nullptr, *v_tile = nullptr;  // (T rows where a tile is copied together)
  if (in_blocks || wraps) {
    k_tile = thread_scratch(BlockSlot::keys, kKeyTile * n.D);
    v_tile = thread_scratch(BlockSlot::values, kKeyTile * n.Dv);
  }
  const auto rows_at = [&](const KvRows& r, int64_t j) {
    return reinterpret_cast<const T*>(r.row(b, hkv, j));
  };
  products::PrefetchQueue prefetch;
  // What the mask function leaves of each tile's key tile (full without one), found once per
  // key tile: the empty ones are never read.
  BlockState seen[kTilesPerGroup];
  for (int64_t j0 = lo / kKeyTile * kKeyTile; j0 < hi; j0 += kKeyTile) {
    bool any = false;
    for (int64_t g = 0; g < count; ++g) {
      seen[g] = key_tile_state(fn, b, h, group[g].i0 + rule.q_origin, group[g].rows,
                               j0 + rule.kv_origin, n.Tk + rule.kv_origin);
      any |= seen[g] != BlockState::empty;
    }
    if (!any) continue;
    // The next key tile's K and V rows, asked for while this one computes.
    prefetch.issue_all();  // what the last tile's products left over
    const int64_t next = j0 + kKeyTile, next_rows = std::min(kKeyTile, hi - next);
    const int64_t rows = std::min(kKeyTile, hi - j0);
    const T* k_rows = nullptr;
    int64_t ks = n.D;  // (K's rows in k_tile)
    if (in_blocks) {
      prefetch.reset(K.row(b, hkv, next), K.stride_bytes(), K.row_bytes(), V.row(b, hkv, next),
                     V.stride_bytes(), V.row_bytes(), std::max<int64_t>(next_rows, 0));
      widen_rows(K, b, hkv, j0, rows, k_tile);
      widen_rows(V, b, hkv, j0, rows, v_tile);
      k_rows = reinterpret_cast<const T*>(k_tile);
      simd::pack_transposed(v_tile, n.Dv, rows, n.Dv, 1.0f, Vt, kKeyTile);
    } else {
      prefetch.reset(rows_at(K, next), K.row_stride, n.D, rows_at(V, next), V.row_stride, n.Dv,
                     std::max<int64_t>(next_rows, 0));
      if (K.one_run(j0, rows) && V.one_run(j0, rows)) {
        k_rows = rows_at(K, j0), ks = K.row_stride;
        Unit::pack_values(rows_at(V, j0), V.row_stride, rows, n.Dv, Vt);
      } else {
        K.copy_rows(b, hkv, j0, rows, k_tile);
        V.copy_rows(b, hkv, j0, rows, v_tile);
        k_rows = reinterpret_cast<const T*>(k_tile);
        Unit::pack_values(reinterpret_cast<const T*>(v_tile), n.Dv, rows, n.Dv, Vt);
      }
    }
    for (int64_t g = 0; g < count; ++g) {
      QueryTile& t = group[g];
      // The same key tiles, clipped the same way, as if the tile were alone.
      const BlockState st = seen[g];
      if (j0 + kKeyTile <= t.tm.lo || j0 >= t.tm.hi || st == BlockState::empty) continue;
      const int64_t j1 = std::min(j0 + kKeyTile, t.tm.hi);
      simd::with_count<kQueryVectors>(t.nqv, [&](auto c) {
        key_step<decltype(c)::value, Unit>(
            a, rule, call, score_regs, drop, n, b, h, k_rows, ks, Vt, j0, j1, t, S,
            st == BlockState::partial ? mask_regs : nullptr, prefetch);
      });
    }
  }
  Unit::end();
  for (const QueryTile& t : group) finish_tile(a, n, b, h, t, stream_out);
  if (stream_out) hwy::FlushStream();
}

// The units (b, h, group) ordered by the number of keys their queries see, most first.
std::vector<int64_t> heaviest_first(const Mask& mask, const BlockMask* fn, int64_t q_origin,
                                    const Shape& n, int64_t per_group, int64_t groups) {
  std::vector<int64_t> keys(n.B * groups, 0);  // the same for every head (head 0's blocks)
  for (int64_t b = 0; b < n.B; ++b)
    for (int64_t i0 = 0; i0 < n.Tq; i0 += n.Mq) {
      // Both ends of a row's visible range are non-decreasing in the row.
      const KeyRange first = visible_keys(mask, b, i0, n.Tq, n.Tk);
      const KeyRange last = visible_keys(mask, b, std::min(i0 + n.Mq, n.Tq) - 1, n.Tq, n.Tk);
      int64_t seen = std::max<int64_t>(last.end - first.begin, 0);
      if (fn) {  // the blocks the mask function leaves
        const int64_t qb = (i0 + q_origin) / fn->block();
        seen = std::min<int64_t>(
            seen, (fn->full_key_blocks(b, 0, qb).size() + fn->partial_key_blocks(b, 0, qb).size()) *
                      fn->block());
      }
      keys[b * groups + i0 / n.Mq / per_group] += seen;
    }
  std::vector<int64_t> order(n.B * n.Hq * groups);
  for (size_t u = 0; u < order.size(); ++u) order[u] = static_cast<int64_t>(u);
  auto cost = [&](int64_t u) { return keys[u / (groups * n.Hq) * groups + u % groups]; };
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return cost(x) > cost(y); });
  return order;
}

}  // namespace

void flash_forward(const AttentionArgs& a, const KvRows& K, const KvRows& V, const Plan& plan) {
  const size_t N = simd::lanes();
  const Shape n{a.q.shape[0], a.q.shape[1], K.heads, a.q.shape[2],
                K.rows,       a.q.shape[3], V.dim,   static_cast<int64_t>(kQueryVectors * N)};
  ScoreRule rule = score_rule(a, n.Tk, "attention");
  rule.q_origin = K.query_origin(n.Tq), rule.kv_origin = K.key_origin();
  ScoreCall call;  // a score function's tables, filled before the threads start
  prepare_score_call(a, n.Tk, call, "attention", rule.q_origin, rule.kv_origin);
  if (call) fill_score_tables(call);
  const float scale = effective_scale(a);
  const DropoutRule drop(a.dropout, n.Hq);
  const int64_t tiles = (n.Tq + n.Mq - 1) / n.Mq;
  // Groups as large as kTilesPerGroup while every thread still gets several units.
  int64_t per_group = kTilesPerGroup;
  while (per_group > 1 && n.B * n.Hq * ((tiles + per_group - 1) / per_group) < 4 * num_threads())
    per_group /= 2;
  const int64_t groups = (tiles + per_group - 1) / per_group;
  const int64_t units = n.B * n.Hq * groups;
  // Dynamic scheduling ends well only if the last units are short: heaviest first. (Under a
  // causal mask the last query tiles see the most keys; taken in index order, the heaviest
  // unit came last and left the other thread idle for ~2% of the forward.)
  const std::vector<int64_t> order =
      heaviest_first(a.mask, a.block_mask, rule.q_origin, n, per_group, groups);
  const bool stream_out =
      a.out.type == TensorType::f32 && 4.0 * n.B * n.Hq * n.Tq * n.Dv >= kStreamOutputBytes;
  const auto on_unit = [&](auto element, auto unit, Variant variant) {
    using T = decltype(element);
    using Unit = decltype(unit);
    reached(variant);
    parallel_for<Schedule::dynamic>(units, num_threads(), [&](int64_t u) {
      const int64_t w = order[u];
      const int64_t g = w % groups, h = (w / groups) % n.Hq, b = w / (groups * n.Hq);
      const int64_t first = g * per_group;
      query_tile_group<T, Unit>(a, K, V, rule, call, drop, scale, n, b, h, first,
                                std::min(per_group, tiles - first), stream_out);
    });
  };
  // The plan's unit (plan.cpp chose it).
  auto group = [&](auto element) {
    using T = decltype(element);
    if constexpr (std::is_same_v<T, simd::Bf16>)
      if (plan.variant == Variant::forward_tiles_amx &&
          run_on_amx([&](auto amx) { on_unit(element, amx, plan.variant); }))
        return;
    check(plan.variant == (kOnUnits<T> ? Variant::forward_tiles_bf16_dot : Variant::forward_tiles),
          "attention: the tiled forward's plan names ", variant_name(plan.variant),
          ", which this pass does not compile for ", dtype_name(K.type), " keys");
    on_unit(element, TileUnit<kOnUnits<T>>{}, plan.variant);
  };
  if (widened(K, V)) group(float{});  // widened to fp32 a tile at a time
  else with_element_type(K.type, group);
  if (call) call.check_miss();  // an index a kernel found outside its tensor
}

QKV_KERNEL_END();  // qkv::detail::HWY_NAMESPACE
#endif  // QKV_KERNEL_PASS

#if HWY_ONCE
namespace qkv::detail {

// The bf16-unit pass (flash_forward_bf16.cpp) where the plan says so.
QKV_ENTRY_WITH_BF16_UNITS(flash_forward,
                          (const AttentionArgs& a, const KvRows& K, const KvRows& V,
                           const Plan& plan),
                          (a, K, V, plan), plan.bf16_units)

}  // namespace qkv::detail
#endif  // HWY_ONCE
