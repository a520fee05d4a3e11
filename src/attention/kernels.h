// The fast attention kernels behind qkv::attention, for arguments already validated.
#pragma once

#include <cstdint>

#include "qkv/attention.h"

namespace qkv::detail {

// Tiled FlashAttention-2 forward (flash_forward.cpp): any Tq.
void flash_forward(const AttentionArgs& a);

// Split-KV decoding (decode.cpp): a few queries against a long cache. qkv::attention picks
// it when Tq <= kDecodeMaxQueries, whatever the GQA group: the rows sharing a key/value head
// (Hq / Hkv · Tq) are computed together, so K and V are read once per key/value head.
inline constexpr int64_t kDecodeMaxQueries = 4;
void decode_forward(const AttentionArgs& a);

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
