#include "util/scratch.h"

#include "util/parallel.h"

#include <sys/mman.h>

#include <array>
#include <cstdlib>
#include <new>

namespace qkv::detail {
namespace {

struct Buffer {
  float* data = nullptr;
  size_t floats = 0;
  ~Buffer() { std::free(data); }
};

// b at least `floats` long (its contents lost when it grows).
void grow(Buffer& b, size_t floats) {
  if (b.floats < floats) {
    std::free(b.data);
    b.data = nullptr;
    b.floats = 0;
    const size_t bytes = (floats * sizeof(float) + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, bytes);
    if (!p) throw std::bad_alloc();
    if (bytes >= (2u << 20)) madvise(p, bytes, MADV_HUGEPAGE);
    b.data = static_cast<float*>(p);
    b.floats = bytes / sizeof(float);
  }
}

}  // namespace

float* thread_scratch_at(int slot, size_t floats) {
  thread_local std::array<Buffer, kScratchSlots> buffers;
  Buffer& b = buffers[slot];
  grow(b, floats);
  return b.data;
}

namespace {

// Buffers of a slot that a thread allocated for its teams: kept apart from its own slots, which
// a team's loop bodies may grow (and so free) while the team still uses the shared one.
Buffer& team_owned(int slot) {
  thread_local std::array<Buffer, kScratchSlots> buffers;
  return buffers[slot];
}

// What this thread knows of its team's buffers. Every thread of a team makes the same calls in
// the same order and is given the same addresses, so all make the same choice from it.
struct TeamBuffers {
  uint64_t team = 0;
  std::array<float*, kScratchSlots> data{};
  std::array<size_t, kScratchSlots> floats{};
};

}  // namespace

float* team_scratch_at(int slot, size_t floats) {
  if (!in_team()) return thread_scratch_at(slot, floats);
  thread_local TeamBuffers known;
  if (known.team != tl_team) known = TeamBuffers{.team = tl_team};
  if (known.floats[slot] >= floats) return known.data[slot];
  float* p = nullptr;
  size_t have = 0;
  count_team_barrier();
#pragma omp single copyprivate(p, have)
  {
    Buffer& b = team_owned(slot);
    grow(b, floats);
    p = b.data, have = b.floats;
  }
  known.data[slot] = p, known.floats[slot] = have;
  return p;
}

}  // namespace qkv::detail
