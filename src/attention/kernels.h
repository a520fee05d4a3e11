// The fast attention kernels behind qkv::attention, for arguments already validated.
#pragma once

#include "qkv/attention.h"

namespace qkv::detail {

// Tiled FlashAttention-2 forward (flash_forward.cpp): any Tq.
void flash_forward(const AttentionArgs& a);

// Split-KV decoding (decode.cpp): a few queries against a long cache.
void decode_forward(const AttentionArgs& a);

// The score transforms after q·k, in the order of include/qkv/attention.h.
inline bool has_score_transforms(const AttentionArgs& a) {
  return a.softcap > 0 || !a.mask.bias.empty() || a.mask.alibi != nullptr;
}

}  // namespace qkv::detail
