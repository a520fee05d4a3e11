// The attention options Python passes (qkv._qkv._AttentionOptions) and the AttentionArgs
// made of them over the caller's arrays: shared by qkv.attention and qkv.dist.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "arrays.h"
#include "qkv/attention.h"
#include "qkv/mask_function.h"
#include "qkv/score_function.h"

namespace qkv::python {

using Opt = std::optional<InArray>;

struct Options {
  bool causal = false;
  int window_left = -1, window_right = -1;
  Opt kv_len, bias, alibi, cu_seqlens_q, cu_seqlens_k, sinks;
  float softcap = 0, scale = 0;
  std::string layout = "bhtd";
  const BlockMask* block_mask = nullptr;     // (the Python side keeps its object alive)
  const ScoreFunction* score_mod = nullptr;  // (the same)
  float dropout_p = 0;
  uint64_t dropout_seed = 0;
  uint32_t dropout_offset = 0;
};

// A q/k/v/out-like array as [B, H, T, D]: "bhtd" as it is, "bthd" (FlashAttention's) with T
// and H swapped in the view; a 3-dim array (a packed batch) gets a batch of one in front.
View as_bhtd(View v, const Options& o, const char* what);

// `out` is written by the forward and read by the backward, hence taken as a View.
AttentionArgs make_args(const InArray& q, const InArray& k, const InArray& v, const View& out,
                        const std::optional<OutArray>& lse, const Options& o);

}  // namespace qkv::python
