// Packed variable-length batches: one attention call per sequence, on views of its rows.
#pragma once

#include <functional>

#include "qkv/attention.h"

namespace qkv::detail {

// Throws unless a.packed describes sequences that tile q's and k's rows (B must be 1, no
// kv_len). Does nothing when packing is off.
void validate_packed(const AttentionArgs& a, const char* where);

// A per-query tensor (out, dout, dq) or a per-key one (k, v, dk, dv) narrowed to sequence s.
View sequence_queries(const AttentionArgs& a, int s, const View& per_query);
View sequence_keys(const AttentionArgs& a, int s, const View& per_key);

// Runs kernel(sequence_args, s) for each packed sequence (one with queries but no keys is
// fully masked: out 0, lse -inf, dq 0), moving lse between the packed layout and a
// contiguous per-sequence buffer around each call.
using ForwardKernel = std::function<void(const AttentionArgs&, int)>;
using BackwardKernel = std::function<void(const AttentionArgs&, const View& dout, const View& dq,
                                          const View& dk, const View& dv)>;
void run_packed_forward(const AttentionArgs& a, const ForwardKernel& kernel);
void run_packed_backward(const AttentionArgs& a, const View& dout, const View& dq, const View& dk,
                         const View& dv, const BackwardKernel& kernel);

}  // namespace qkv::detail
