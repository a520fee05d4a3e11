// Preparing a score function for one attention call (attention/score_call.h).
#include "attention/score_call.h"

#include "mask/program.h"
#include "qkv/error.h"

namespace qkv::detail {

void ScoreCall::check_miss() const {
  std::lock_guard<std::mutex> lock(miss_lock_);
  if (!miss_.empty()) fail(miss_);
}

namespace {

// An integer that may leave 32 bits over the box: an error naming its subexpression.
void check_bounds(const MaskProgram& p, const IndexBox& box, const char* where,
                  bool& lookup_outside) {
  std::vector<int64_t> lo(p.registers + 1), hi(p.registers + 1);
  MaskIntervals report;
  intervals(p, nullptr, box, lo.data(), hi.data(), report);
  if (report.wide >= 0)
    fail(where, ": the score function's ", node_text(*p.code[report.wide].node), " may reach ",
         report.wide_lo, " … ", report.wide_hi, " for this call's sizes, outside 32 bits");
  lookup_outside |= report.lookup_outside;
}

}  // namespace

void prepare_score_call(const AttentionArgs& a, int64_t Tk, ScoreCall& call, const char* where,
                        int64_t q_origin, int64_t kv_origin) {
  call.program = nullptr;
  if (!a.score_mod) return;
  const ScoreProgram& p = a.score_mod->program();
  call.program = &p;
  call.B = a.q.shape[0], call.Hq = a.q.shape[1], call.Tq = a.q.shape[2], call.Tk = Tk;
  call.q_origin = q_origin, call.kv_origin = kv_origin;
  call.width = call.Tq + Tk - 1;
  bool outside = false;
  check_bounds(p.main,
               {0, call.B - 1, 0, call.Hq - 1, q_origin, q_origin + call.Tq - 1, kv_origin,
                kv_origin + Tk - 1},
               where, outside);
  call.may_miss = outside;
  // (A table's own lookups are all evaluated when it is filled: a miss there is an error then.)
  for (const ScoreTable& t : p.tables) {
    bool ignored = false;
    const int64_t d0 = call.first_difference();
    check_bounds(t.program, {0, 0, 0, call.Hq - 1, d0, d0 + call.width - 1, 0, 0}, where, ignored);
  }
  call.tables.resize(p.tables.size());
  for (size_t t = 0; t < p.tables.size(); ++t)
    call.tables[t].assign((p.tables[t].reads_h ? call.Hq : 1) * call.width, 0.0f);
}

}  // namespace qkv::detail
