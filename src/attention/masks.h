// Mask logic shared by every attention kernel, so all of them agree on what a query sees.
// The semantics are written out in include/qkv/attention.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "qkv/attention.h"
#include "qkv/mask_function.h"
#include "qkv/score_function.h"

namespace qkv::detail {

struct ScoreCall;  // attention/score_call.h

// Causal, sliding-window and padding masks each hide keys outside an interval, so together
// they leave one contiguous range of visible keys per query row: [begin, end).
struct KeyRange {
  int64_t begin;
  int64_t end;  // begin >= end: the row sees no key
};

inline KeyRange visible_keys(const Mask& mask, int64_t b, int64_t i, int64_t Tq, int64_t Tk) {
  const int64_t pos = i + (Tk - Tq);  // the query's place on the key axis (bottom-right)
  int64_t begin = 0;
  int64_t end = Tk;
  if (mask.kv_len) end = std::min<int64_t>(end, mask.kv_len[b]);
  if (mask.causal) end = std::min(end, pos + 1);
  if (mask.window_right >= 0) end = std::min(end, pos + mask.window_right + 1);
  if (mask.window_left >= 0) begin = std::max<int64_t>(begin, pos - mask.window_left);
  return {begin, end};
}

// ALiBi's distance penalty, as FlashAttention-2 defines it: -slope · |pos - j|.
inline float alibi_bias(const Mask& mask, int64_t h, int64_t i, int64_t j, int64_t Tq, int64_t Tk) {
  const int64_t distance = i + (Tk - Tq) - j;
  return -mask.alibi[h] * static_cast<float>(distance < 0 ? -distance : distance);
}

// The bias seen as [B, Hq, Tq, Tk] with stride 0 along broadcast dims.
// Throws unless the bias has 2 to 4 dims, each (aligned right) 1 or equal to the full size.
View broadcast_bias(const View& bias, int64_t B, int64_t Hq, int64_t Tq, int64_t Tk,
                    const char* where);

// args.mask.bias broadcast to [B, Hq, Tq, Tk], or an empty view when there is none.
inline View full_bias(const AttentionArgs& a, int64_t Tk, const char* where) {
  if (a.mask.bias.empty()) return View{};
  return broadcast_bias(a.mask.bias, a.q.shape[0], a.q.shape[1], a.q.shape[2], Tk, where);
}

// The score rule, one for every kernel and the reference: after the scaled q·k of query i
// (batch b, head h) and key j come, in this order, the softcap c · tanh(s / c), the bias,
// ALiBi's −slope · |pos − j|, then the mask (visible_keys above: −inf outside the query's
// range). The tiled kernels apply the same steps a vector at a time (transform_scores in
// tiles.cpp). A mask function (block_mask) hides pairs as the mask does; a score function
// (score_mod) replaces the softcap, bias and ALiBi steps.
struct ScoreRule {
  float softcap = 0;             // 0: off
  View bias;                     // [B, Hq, Tq, Tk], strides 0 where broadcast; or empty
  const float* alibi = nullptr;  // [Hq] slopes, or null
  Mask mask;
  int64_t Tq = 0, Tk = 0;
  const BlockMask* block_mask = nullptr;     // a mask function, or null
  const ScoreFunction* score_mod = nullptr;  // a score function (then none of the three)
  // The indices the functions read: q_idx = i + q_origin, kv_idx = j + kv_origin (0 over
  // views; a cache's positions, KvRows::positions). Kernels that evaluate the score function
  // over lanes hold its tables in `call` (set by the kernel).
  int64_t q_origin = 0, kv_origin = 0;
  const ScoreCall* call = nullptr;

  // Whether any step of the three fixed ones runs between q·k and the mask.
  bool transforms() const { return softcap > 0 || !bias.empty() || alibi != nullptr; }
  // Score s of (b, h, i, j) after the steps before the mask (a score function evaluated node
  // by node, in double).
  float transform(int64_t b, int64_t h, int64_t i, int64_t j, float s) const {
    if (score_mod) return static_cast<float>(evaluate_score(score_mod->expr(), s, b, h, i, j));
    if (softcap > 0) s = softcap * std::tanh(s / softcap);
    if (!bias.empty()) s += bias(b, h, i, j);
    if (alibi) s += alibi_bias(mask, h, i, j, Tq, Tk);
    return s;
  }
  // The keys query i of batch b sees.
  KeyRange visible(int64_t b, int64_t i) const { return visible_keys(mask, b, i, Tq, Tk); }
  // Whether the mask function hides key j from query i of (b, h), evaluated node by node.
  bool function_hides(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return block_mask && !evaluate(block_mask->mask(), b, h, i, j);
  }
};

// The rule of a call over Tk keys (a.k's when it has them).
inline ScoreRule score_rule(const AttentionArgs& a, int64_t Tk, const char* where) {
  return {a.softcap,  full_bias(a, Tk, where), a.mask.alibi, a.mask, a.q.shape[2], Tk, a.block_mask,
          a.score_mod};
}
inline ScoreRule score_rule(const AttentionArgs& a, const char* where) {
  return score_rule(a, a.k.shape[2], where);
}

// What the mask function does to query rows [i0, i1) against keys [j0, j1) of (b, h): hides
// them all (every block they touch is empty), shows them all (every one full), or must be
// evaluated pair by pair. Full when there is no mask function.
inline BlockState tile_state(const BlockMask* m, int64_t b, int64_t h, int64_t i0, int64_t i1,
                             int64_t j0, int64_t j1) {
  if (!m) return BlockState::full;
  const int64_t s = m->block();
  bool any_shown = false, all_full = true;
  for (int64_t qb = i0 / s; qb <= (i1 - 1) / s; ++qb)
    for (int64_t kb = j0 / s; kb <= (j1 - 1) / s; ++kb) {
      const BlockState st = m->state(b, h, qb, kb);
      any_shown |= st != BlockState::empty;
      all_full &= st == BlockState::full;
    }
  return !any_shown ? BlockState::empty : all_full ? BlockState::full : BlockState::partial;
}

// The score scale: args.scale, or 1/sqrt(D) when it is 0.
inline float effective_scale(const AttentionArgs& a) {
  return a.scale != 0 ? a.scale : 1.0f / std::sqrt(static_cast<float>(a.q.shape[3]));
}

}  // namespace qkv::detail
