// The one clock of qkv: seconds since an arbitrary start, monotonic (training and ring
// statistics, the tool's and benchmarks' timings).
#pragma once

#include <chrono>

namespace qkv {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace qkv
