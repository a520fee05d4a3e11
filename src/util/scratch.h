// Per-thread scratch memory. Kernels never allocate per call: each thread keeps a few
// 64-byte-aligned buffers that grow to the largest size asked for and are then reused.
// (A fresh 4 KiB page costs ~11 µs to touch here, so reuse matters; large buffers ask for
// transparent huge pages.)
#pragma once

#include <cstddef>

namespace qkv::detail {

inline constexpr int kScratchSlots = 8;

// A buffer of at least `floats` floats for the calling thread; `slot` < kScratchSlots picks
// one of its buffers, so a kernel can hold several at once. Contents are not preserved when
// it grows. Throws std::bad_alloc if memory runs out.
float* thread_scratch(int slot, size_t floats);

}  // namespace qkv::detail
