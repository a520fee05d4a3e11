// Thread count for qkv's kernels (OpenMP underneath).
// Default: the QKV_NUM_THREADS environment variable if set, else every core.
#pragma once

namespace qkv {

void set_num_threads(int n);  // n >= 1
int num_threads();

}  // namespace qkv
