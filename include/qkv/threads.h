// Thread count for qkv's kernels (OpenMP underneath).
// Default: the QKV_NUM_THREADS environment variable if set, else every core.
#pragma once

namespace qkv {

void set_num_threads(int n);  // n >= 1
int num_threads();

namespace detail {
// Threads for a loop over `work` elements: one below ~32k, where starting the team costs more
// than the loop (a small model's decoding step runs dozens of such loops per token).
inline int threads_for(long long work) { return work < (1 << 15) ? 1 : num_threads(); }

// How often qkv's threads have synchronised since the program started: parallel regions opened
// (each a fork and a join) and barriers waited at (the regions' joins among them).
struct SyncCount {
  long long regions = 0, barriers = 0;
};
SyncCount sync_count();
}  // namespace detail

}  // namespace qkv
