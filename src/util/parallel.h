// parallel_for: a loop split statically over threads, with no OpenMP region at all when it
// runs on one thread. libgomp builds and wakes a team for every parallel region, even a
// one-thread one (a memalign and a futex wake each): a small model's decoding step, ~50
// regions per token, spent a third of its time there.
#pragma once

#include <cstdint>

namespace qkv::detail {

// body(i) for i in [0, n) on `threads` threads (OpenMP, schedule(static)).
template <class Body>
inline void parallel_for(int64_t n, int threads, Body&& body) {
  if (threads <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace qkv::detail
