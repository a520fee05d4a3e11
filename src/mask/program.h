// A mask expression compiled for the kernels: its DAG as a list of instructions (common
// subexpressions once), each writing a register of lanes, registers reused once read for the
// last time. Evaluated over lanes by src/mask/lanes-inl.h (SIMD, per target) and over index
// ranges by interval arithmetic here (what a whole block of pairs can give).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mask/expr.h"

namespace qkv::detail {

struct MaskInstr {
  MaskOp op;
  int32_t dst = 0;                    // register written
  int32_t a = -1, b = -1, c = -1;     // operand registers
  bool real = false;                  // dst is a float register (else an integer one)
  uint8_t real_operands = 0;          // bit k: operand k (a, b, c) is a float register
  int32_t value = 0;                  // constant; table: its number
  float real_value = 0;               // a float constant
  int32_t tensor = -1;                // lookup: index into MaskProgram::tensors
  int32_t first_index = 0, dims = 0;  // lookup: its index registers, operands[first, first + dims)
  const MaskNode* node = nullptr;     // what it computes, for messages (the mask owns it)
};

struct MaskProgram {
  std::vector<MaskInstr> code;
  std::vector<int32_t> operands;  // lookups' index registers
  std::vector<std::shared_ptr<const MaskTensorData>> tensors;
  int32_t registers = 0;       // integer (and boolean) registers
  int32_t real_registers = 0;  // float registers (score functions)
  int32_t result = 0;          // the register holding the mask (or the score)
  bool result_real = false;    // result is a float register
  bool reads_b = false, reads_h = false;
};

// A mask: a boolean expression without floats (else a qkv::Error).
MaskProgram compile(const MaskExpr& mask);
// Any expression (a score function's, or a part of it).
MaskProgram compile_any(const MaskExpr& expr);

// The first index found outside its tensor by an evaluation over lanes (mask/lanes-inl.h).
struct MaskMiss {
  bool found = false;
  int32_t tensor = 0, dim = 0;
  int64_t index = 0, lane = 0;
};

// A box of points: b in [b0, b1], h in [h0, h1], q_idx in [q0, q1], kv_idx in [k0, k1]
// (inclusive).
struct IndexBox {
  int64_t b0, b1, h0, h1, q0, q1, k0, k1;
};

// Per tensor, O(1) range minimum and maximum over runs of its flat elements (sparse tables).
class TensorRanges {
 public:
  explicit TensorRanges(const MaskTensorData& t);
  // min and max over flat elements [first, last]
  void range(int64_t first, int64_t last, int64_t& lo, int64_t& hi) const;

 private:
  int64_t n_ = 0;
  std::vector<std::vector<int32_t>> min_, max_;  // level k: over runs of 2^k
};

// Interval arithmetic over a box: each register's range of values; a boolean's [0, 1] when
// the box holds both. `lookup_outside` tells whether some lookup's index range leaves its
// tensor (the box must then be evaluated point by point, which finds the index or shows the
// lookup is never out of it at a point). lo and hi hold one entry per register, as lanes do;
// the mask's range is at register p.result.
// `wide`: the first instruction whose integer range leaves 32 bits (-1 if none), and its range.
struct MaskIntervals {
  std::vector<int64_t> lo, hi;
  bool lookup_outside = false;
  int32_t wide = -1;
  int64_t wide_lo = 0, wide_hi = 0;
};
void intervals(const MaskProgram& p, const std::vector<TensorRanges>& ranges, const IndexBox& box,
               MaskIntervals& out);
// The same into lo[p.registers] and hi[p.registers] (no allocation, for the kernels); without
// range tables a lookup's range is found by reading the elements (up to 256 of them, else the
// tensor's whole range). The report's lo and hi stay empty.
void intervals(const MaskProgram& p, const TensorRanges* ranges, const IndexBox& box, int64_t* lo,
               int64_t* hi, MaskIntervals& report);

// What a mask function does to the pairs of a box: hides them all, shows them all, or
// neither (or the interval arithmetic cannot tell). Kernels refine a partial block's tiles by
// it; programs of more than 64 registers are not refined.
BlockState box_state(const MaskProgram& p, const IndexBox& box);

}  // namespace qkv::detail
