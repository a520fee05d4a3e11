// Per-thread scratch memory. Kernels never allocate per call: each thread keeps a few
// 64-byte-aligned buffers that grow to the largest size asked for and are then reused.
// (A fresh 4 KiB page costs ~11 µs to touch here, so reuse matters; large buffers ask for
// transparent huge pages.)
//
// Each kernel family names its slots below. Kernels of one family never run inside one another
// on a thread, so they share the family's slots; a family that calls another while it holds
// buffers (attention over a cache gathers keys and then runs attention; the ring holds its
// blocks across attention calls) has slots of its own.
#pragma once

#include <cstddef>
#include <type_traits>

namespace qkv::detail {

// Each family's slots begin where the previous family's end (`end` closes each list), so a slot
// added to one family moves the later families and two families never share a slot by accident.

// The tiled forward and split-KV decoding (src/attention/flash_forward.cpp, decode.cpp).
enum class ForwardSlot {
  q_tiles,
  scores,
  out_tiles,
  softmax_state,
  v_tiles,
  merged_row,
  partials,
  queries,
  key_ranges,
  tile_masks,
  mask_registers,
  score_ints,
  score_floats,
  end
};
// The tiled backward (src/attention/flash_backward.cpp): the forward's slots, its own uses (the
// two never run inside one another).
enum class BackwardSlot {
  q_tiles,
  q_rows,
  dout_tiles,
  dout_rows,
  tile,
  dk_dv,
  partials,
  lse,
  key_tiles,
  mask_registers,
  score_ints,
  score_floats,
  score_derivatives,
  end
};
inline constexpr int kAttentionSlots = static_cast<int>(ForwardSlot::end) >
                                               static_cast<int>(BackwardSlot::end)
                                           ? static_cast<int>(ForwardSlot::end)
                                           : static_cast<int>(BackwardSlot::end);
// Attention over a cache: the visible keys and values gathered as fp32, the queries and outputs
// of a rotated cache (src/attention/stored.cpp).
enum class StoredSlot { keys = kAttentionSlots, values, rotated_queries, rotated_out, end };
// Products with block-format weights (src/quant/matmul.cpp; the AMX-INT8 unit's tokens and
// weight chunk, src/quant/amx_int8-inl.h).
enum class QuantSlot {
  block_sums = static_cast<int>(StoredSlot::end),
  tile,
  amx_tokens,
  amx_chunk,
  end
};
// Ring attention (src/dist/ring_attention.cpp), kept across the attention calls it makes.
enum class RingSlot {
  block0 = static_cast<int>(QuantSlot::end),
  block1,
  partial,
  incoming,
  outgoing,
  out,
  lse,
  part_out,
  part_lse,
  part_dq,
  part_dk,
  part_dv,
  end
};
// Keys and values in 32-value blocks widened a tile at a time (src/attention/block_rows-inl.h).
enum class BlockSlot { keys = static_cast<int>(RingSlot::end), values, end };
// A key/value cache's new rows, rotated before they are stored (src/generate/kv_cache.cpp).
enum class CacheSlot { keys = static_cast<int>(BlockSlot::end), values, end };
// The operands of a bf16 product, rounded (src/ops/gemm.cpp).
enum class GemmSlot { a = static_cast<int>(CacheSlot::end), b, end };
// A decoded token's rows that each thread of its team keeps for itself (src/model/inference.cpp:
// the residual stream, norms, SwiGLU's output; src/model/multihead.cpp: the rotated queries).
enum class DecodeSlot { rows = static_cast<int>(GemmSlot::end), queries, end };
inline constexpr int kScratchSlots = static_cast<int>(DecodeSlot::end);

// A buffer of at least `floats` floats for the calling thread, in slot `slot`. Contents are
// not preserved when it grows. Throws std::bad_alloc if memory runs out.
float* thread_scratch_at(int slot, size_t floats);
template <typename Slot>
float* thread_scratch(Slot slot, size_t floats) {
  static_assert(static_cast<int>(Slot::end) <= kScratchSlots, "a family past the last slot");
  return thread_scratch_at(static_cast<int>(slot), floats);
}

// A buffer that a loop's threads share (filled by one, read by all): the calling thread's,
// or inside a team (util/parallel.h: every thread of it calls this) a team buffer of the slot,
// its address given to the whole team. Each thread remembers the team's buffers, so only a
// slot's first call in a team, or a call that needs it larger, costs a barrier (where one
// thread allocates); a buffer's contents last until its loops end, as outside a team.
float* team_scratch_at(int slot, size_t floats);
template <typename Slot>
float* team_scratch(Slot slot, size_t floats) {
  static_assert(static_cast<int>(Slot::end) <= kScratchSlots, "a family past the last slot");
  return team_scratch_at(static_cast<int>(slot), floats);
}

// The same as storage for n objects of a plain type T (key ranges, tile masks), left
// uninitialised.
template <class T>
inline constexpr bool kScratchType =
    std::is_trivially_copyable_v<T>&& std::is_trivially_destructible_v<T> && alignof(T) <= 64;
template <class T>
inline size_t floats_for(size_t n) {
  return (n * sizeof(T) + sizeof(float) - 1) / sizeof(float);
}
template <class T, typename Slot>
T* thread_scratch_for(Slot slot, size_t n) {
  static_assert(kScratchType<T>);
  return static_cast<T*>(static_cast<void*>(thread_scratch(slot, floats_for<T>(n))));
}
template <class T, typename Slot>
T* team_scratch_for(Slot slot, size_t n) {
  static_assert(kScratchType<T>);
  return static_cast<T*>(static_cast<void*>(team_scratch(slot, floats_for<T>(n))));
}

}  // namespace qkv::detail
