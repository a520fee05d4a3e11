// A score function (include/qkv/score_function.h) as one attention call uses it: its relative
// tables filled for the call's heads and lengths, its checks done, and what the kernels found.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "mask/score_program.h"
#include "qkv/attention.h"
#include "qkv/score_function.h"

namespace qkv::detail {

struct ScoreCall {
  const ScoreProgram* program = nullptr;  // null: the call has no score function
  int64_t B = 0, Hq = 0, Tq = 0, Tk = 0;
  // The indices the function reads: q_idx = i + q_origin, kv_idx = j + kv_origin for query i
  // and key j of the call (0 over views; a cache's positions, attention/kv_rows.h).
  int64_t q_origin = 0, kv_origin = 0;
  int64_t width = 0;  // entries per table row: d = q_idx − kv_idx from first_difference() on
  std::vector<std::vector<float>> tables;  // per table: [Hq or 1][width]
  bool may_miss = false;  // some index may leave its tensor: the kernels look (else they clamp)

  explicit operator bool() const { return program != nullptr; }
  // The smallest q_idx − kv_idx of the call (a table row's entry 0), and the entry of d = 0.
  int64_t first_difference() const { return q_origin - kv_origin - (Tk - 1); }
  int64_t table_zero() const { return -first_difference(); }
  // Table t's row for head h.
  const float* table_row(size_t t, int64_t h) const {
    return tables[t].data() + (program->tables[t].reads_h ? h * width : 0);
  }

  // An index a kernel found outside its tensor at (b, h, q_idx, kv_idx), thrown by check_miss:
  // of those reported, the first in that order (whichever thread found it).
  void report_miss(std::array<int64_t, 4> at, const std::string& what) const {
    std::lock_guard<std::mutex> lock(miss_lock_);
    if (miss_.empty() || at < miss_at_) miss_ = what, miss_at_ = at;
  }
  void check_miss() const;  // throws qkv::Error when a kernel reported a miss

 private:
  mutable std::mutex miss_lock_;
  mutable std::string miss_;
  mutable std::array<int64_t, 4> miss_at_{};
};

// Checks the call's score function against the rest of its arguments (it does not mix with the
// fixed softcap, bias and ALiBi: they are score functions themselves) and finds whether an
// index may leave a tensor, or an integer leave 32 bits (an error naming the subexpression).
// The tables are filled by the kernel (fill_score_tables, per SIMD target: tiles.cpp).
// q_origin and kv_origin: as ScoreCall's.
void prepare_score_call(const AttentionArgs& a, int64_t Tk, ScoreCall& call, const char* where,
                        int64_t q_origin = 0, int64_t kv_origin = 0);

}  // namespace qkv::detail
