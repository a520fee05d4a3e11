// The fast attention kernels behind qkv::attention, for arguments already validated.
#pragma once

#include "qkv/attention.h"

namespace qkv::detail {

// Tiled FlashAttention-2 forward (flash_forward.cpp): any Tq.
void flash_forward(const AttentionArgs& a);

// Split-KV decoding (decode.cpp): a few queries against a long cache. qkv::attention picks
// it when Tq <= kDecodeMaxQueries and (Hq / Hkv) · Tq <= kDecodeMaxRows: beyond that the
// rows sharing a key fill the vector lanes of the tiled kernel better.
inline constexpr int64_t kDecodeMaxQueries = 4;
inline constexpr int64_t kDecodeMaxRows = 16;
void decode_forward(const AttentionArgs& a);

// Tiled FlashAttention-2 backward (flash_backward.cpp).
void flash_backward(const AttentionArgs& a, const View& dout, const View& dq, const View& dk,
                    const View& dv);

// The score transforms after q·k, in the order of include/qkv/attention.h.
inline bool has_score_transforms(const AttentionArgs& a) {
  return a.softcap > 0 || !a.mask.bias.empty() || a.mask.alibi != nullptr;
}

}  // namespace qkv::detail
