// The fast attention kernels behind qkv::attention, for arguments already validated.
#pragma once

#include <atomic>
#include <cstdint>

#include "attention/kv_rows.h"
#include "qkv/attention.h"

namespace qkv::detail {

struct Plan;  // what runs for one call (plan.h)

// The kernel variants an attention call can reach: a call sets its variant's bit in
// kernels_reached() once, when it chooses it, so that a test can assert the variant a
// combination of format, shape and unit reaches.
enum class Variant : uint32_t {
  forward_tiles = 1u << 0,
  forward_tiles_bf16_dot = 1u << 1,
  decode_rows = 1u << 2,
  decode_rows_bf16_dot = 1u << 3,
  decode_tiled = 1u << 4,
  decode_tiled_bf16_dot = 1u << 5,
  decode_keys_in_lanes = 1u << 6,
  forward_tiles_amx = 1u << 7,
  decode_tiled_amx = 1u << 8,
  backward_tiles_amx = 1u << 9,
  decode_rows_int8 = 1u << 10,
  decode_values_int8 = 1u << 11,  // (with decode_rows_int8: P rounded to int8)
  backward_tiles = 1u << 12,
  backward_tiles_bf16_dot = 1u << 13,
};
std::atomic<uint32_t>& kernels_reached();
inline void reached(Variant v) {
  kernels_reached().fetch_or(static_cast<uint32_t>(v), std::memory_order_relaxed);
}

// qkv::validate without the check that outputs and inputs do not share memory (for callers
// whose k and v are not views: attention over a cache checks its storage itself).
void validate_shapes(const AttentionArgs& a, const char* where);
// The element types (part of validate_shapes): k and v share one; out is q's type or fp32;
// the bias is fp32.
void validate_types(const AttentionArgs& a, const char* where);
// That a block_mask was made by create_block_mask, for this batch (or 1) and these heads (or 1).
void validate_block_mask_batch(const BlockMask& m, int64_t B, int64_t Hq, const char* where);

// qkv::attention after its checks: the kernel that suits the shape (packed sequences one by
// one), K and V read from a.k and a.v.
void forward_validated(const AttentionArgs& a);
// The same over row sources K and V (a.k and a.v unused; Hkv, Tk and Dv from K and V): for
// callers that have validated the arguments themselves (attention over a cache; a ring is
// read in place, its rows in position order, run by run). The kernel is the one plan_forward
// names.
void forward_validated(const AttentionArgs& a, const KvRows& K, const KvRows& V);

// The drivers: each runs the kernel its plan names (plan.h), choosing nothing.
// Tiled FlashAttention-2 forward (flash_forward.cpp): any Tq; rows read run by run.
void flash_forward(const AttentionArgs& a, const KvRows& K, const KvRows& V, const Plan& plan);

// Split-KV decoding (decode.cpp): a few queries against a long cache. The rows sharing a
// key/value head (Hq / Hkv · Tq) are computed together, so K and V are read once per
// key/value head (the tiled forward reads them once per query head, in tiles of 64 queries).
// K and V may differ in type (a cache with its own key and value formats): the values are then
// widened a block of rows at a time.
void decode_forward(const AttentionArgs& a, const KvRows& K, const KvRows& V, const Plan& plan);
// Whether decoding with int8 scores over a block cache of `format` multiplies P·V in integers
// too (P rounded to 8 bits per value block and 64 keys) for value dim Dv and R query rows per
// key/value head, on the target in use.
bool int8_values_on_bytes(TensorType format, int64_t Dv, int64_t R);

// Whether qkv::attention decodes rather than tiling the queries: up to 4 queries always;
// from 5 on, up to 15 queries (32 when a key/value head serves several query heads) against
// a cache long enough that reading K and V once per key/value head pays for the per-call
// costs (copying the queries, merging the chunks) and, under a causal mask, the scores of
// the diagonal that the tiled forward skips. Measured against the tiled forward (dim 64 and
// 128, 2 threads): 5–8 queries 1.15–2.2× faster from 16 keys per query, 9–15 queries of plain
// multi-head attention 1.1–1.4× from 64 keys per query (slower below), 16–32 queries with 4
// query heads per key/value head 1.0–3.5× from 16 keys per query.
inline bool decodes(int64_t queries, int64_t keys, int64_t query_heads_per_kv_head) {
  if (queries <= 4) return true;
  if (queries > 32 || (queries >= 16 && query_heads_per_kv_head == 1)) return false;
  const int64_t keys_per_query = queries <= 8 || query_heads_per_kv_head > 1 ? 16 : 64;
  return keys >= keys_per_query * queries;
}

// ∂L/∂sinks [Hq] from the forward's out and lse and dout (sinks.cpp): the same bits for any
// thread count.
void sink_gradients(const AttentionArgs& a, const View& dout, float* dsinks);

// Tiled FlashAttention-2 backward (flash_backward.cpp).
void flash_backward(const AttentionArgs& a, const View& dout, const View& dq, const View& dk,
                    const View& dv, const Plan& plan);

}  // namespace qkv::detail
