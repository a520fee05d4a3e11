// The fast attention kernels behind qkv::attention, for arguments already validated.
#pragma once

#include <cstdint>

#include "qkv/attention.h"

namespace qkv::detail {

// Tiled FlashAttention-2 forward (flash_forward.cpp): any Tq.
void flash_forward(const AttentionArgs& a);

// Split-KV decoding (decode.cpp): a few queries against a long cache. The rows sharing a
// key/value head (Hq / Hkv · Tq) are computed together, so K and V are read once per
// key/value head (the tiled forward reads them once per query head, in tiles of 64 queries).
void decode_forward(const AttentionArgs& a);

// Whether qkv::attention decodes rather than tiling the queries: up to 15 queries, or up to
// 32 when a key/value head serves several query heads. Against the tiled forward (dim 64 and
// 128, caches of 512 to 32k, 2 threads, causal or not): 5 to 12 queries 1.3–2.2× faster;
// 16 queries with 2 or 4 query heads per key/value head 1.2–1.8×, 24 and 32 with 4 1.0–1.7×;
// 16 queries of plain multi-head attention 0.85–0.9× at caches up to 4k, hence the limit.
inline bool decodes(int64_t queries, int64_t query_heads_per_kv_head) {
  return queries < 16 || (queries <= 32 && query_heads_per_kv_head > 1);
}

// The same over bf16 keys and values [B, Hkv, Tk, D] and [B, Hkv, Tk, Dv] (a KVCache's bf16
// storage, rows contiguous, strides in elements), converted to fp32 as they are read: half the
// bytes of an fp32 cache. `a` gives q, out, lse, scale, softcap and the mask (no bias); its k
// and v are not read.
struct Bf16Rows {
  const uint16_t* data;
  int64_t batch_stride, head_stride, row_stride;
};
void decode_forward_bf16(const AttentionArgs& a, const Bf16Rows& k, const Bf16Rows& v,
                         int64_t Hkv, int64_t Tk, int64_t Dv);

// Tiled FlashAttention-2 backward (flash_backward.cpp).
void flash_backward(const AttentionArgs& a, const View& dout, const View& dq, const View& dk,
                    const View& dv);

// The score transforms after q·k, in the order of include/qkv/attention.h.
inline bool has_score_transforms(const AttentionArgs& a) {
  return a.softcap > 0 || !a.mask.bias.empty() || a.mask.alibi != nullptr;
}

}  // namespace qkv::detail
