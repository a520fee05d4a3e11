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

}  // namespace

float* thread_scratch_at(int slot, size_t floats) {
  thread_local std::array<Buffer, kScratchSlots> buffers;
  Buffer& b = buffers[slot];
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
  return b.data;
}

float* team_scratch_at(int slot, size_t floats) {
  if (!in_team()) return thread_scratch_at(slot, floats);
  float* p = nullptr;
  count_team_barrier();
#pragma omp single copyprivate(p)
  p = thread_scratch_at(slot, floats);
  return p;
}

}  // namespace qkv::detail
