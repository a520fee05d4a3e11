#include "qkv/threads.h"

#include <omp.h>

#include <cstdlib>

#include "qkv/error.h"
#include "util/parallel.h"

namespace qkv {
namespace {

int initial_threads() {
  if (const char* env = std::getenv("QKV_NUM_THREADS")) {
    char* end = nullptr;
    long n = std::strtol(env, &end, 10);
    check(end != env && *end == '\0' && n >= 1 && n <= 4096,
          "QKV_NUM_THREADS must be a whole number >= 1, got \"", env, "\"");
    return static_cast<int>(n);
  }
  return omp_get_num_procs();
}

int& thread_count() {
  static int n = initial_threads();
  return n;
}

}  // namespace

void set_num_threads(int n) {
  check(n >= 1, "set_num_threads: n must be >= 1, got ", n);
  thread_count() = n;
}

int num_threads() { return thread_count(); }

detail::SyncCount detail::sync_count() {
  return {detail::sync_counts.regions.load(std::memory_order_relaxed),
          detail::sync_counts.barriers.load(std::memory_order_relaxed)};
}

}  // namespace qkv
