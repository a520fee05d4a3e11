// Mask logic shared by every attention kernel, so all of them agree on what a query sees.
// The semantics are written out in include/qkv/attention.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "qkv/attention.h"

namespace qkv::detail {

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
inline View full_bias(const AttentionArgs& a, const char* where) {
  if (a.mask.bias.empty()) return View{};
  return broadcast_bias(a.mask.bias, a.q.shape[0], a.q.shape[1], a.q.shape[2], a.k.shape[2], where);
}

// The score scale: args.scale, or 1/sqrt(D) when it is 0.
inline float effective_scale(const AttentionArgs& a) {
  return a.scale != 0 ? a.scale : 1.0f / std::sqrt(static_cast<float>(a.q.shape[3]));
}

}  // namespace qkv::detail
