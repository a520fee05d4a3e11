// A score function compiled for the kernels (include/qkv/score_function.h): its relative
// tables cut out and compiled apart, the rest compiled as a mask is (mask/program.h) with
// float registers beside the integer ones, and what the backward differentiates.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mask/program.h"

namespace qkv::detail {

// A subexpression of (h, q_idx − kv_idx), evaluated once per call into a table over
// d = q_idx − kv_idx in [−(Tk − 1), Tq − 1] (its program reads q_idx as d and kv_idx as 0),
// one row per head when it reads h.
struct ScoreTable {
  MaskProgram program;
  bool reads_h = false;
  bool learnable() const { return !sources.empty(); }  // it reads a ScoreTensor with a grad
  std::vector<int32_t> sources;                        // its lookups of ScoreTensors with a grad
  std::vector<uint32_t> depends;  // derivative_bits of program over those sources
};

// Relative tables a score function may have.
inline constexpr size_t kMostScoreTables = 16;

// The instructions of `main` whose values the backward follows the derivative of, besides the
// score: the lookups of ScoreTensors with a grad, and the learnable tables.
struct ScoreProgram {
  std::vector<std::shared_ptr<const MaskNode>> nodes;  // the DAGs the instructions name
  MaskProgram main;  // the function, tables read by MaskOp::table instructions
  std::vector<ScoreTable> tables;
  std::vector<int32_t> sources;  // instruction indices into main.code
  // Per instruction of main: which derivatives its value can have — bit 0 with respect to the
  // score, bit 1 + k with respect to source k (the others are zero and never computed).
  std::vector<uint32_t> depends;
  bool reads_b = false, reads_h = false;
  bool learnable() const { return !sources.empty(); }
  // Whether the function is score + (something without the score): its derivative with
  // respect to the score is 1 (the backward then skips multiplying dS by it).
  bool additive = false;
};

// Throws qkv::Error for a boolean expression, or one that reads more than 31 learnable values.
ScoreProgram compile_score(const MaskExpr& f);

// Per instruction of p, the derivatives its value can have (bit 0: the score, bit 1 + k: the
// instruction sources[k]).
std::vector<uint32_t> derivative_bits(const MaskProgram& p, const std::vector<int32_t>& sources);

}  // namespace qkv::detail
