// The nodes of a mask expression (include/qkv/mask_function.h): a DAG of integer and boolean
// operations over b, h, q_idx, kv_idx, constants and lookups into captured tensors.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qkv/mask_function.h"

namespace qkv::detail {

enum class MaskOp : uint8_t {
  // leaves
  constant,
  batch,
  head,
  q_idx,
  kv_idx,
  // tensor[args...]
  lookup,
  // integers → integer
  add,
  sub,
  mul,
  div,  // floor division, x / 0 = 0
  mod,  // remainder with the divisor's sign, x % 0 = x
  neg,
  min,
  max,
  abs,
  // integers → boolean (eq and ne: two integers or two booleans)
  eq,
  ne,
  lt,
  le,
  gt,
  ge,
  // booleans → boolean
  logical_and,
  logical_or,
  logical_not,
  // where(boolean, x, y): x and y both integers or both booleans
  where,
};

// The name an operation has in the text form: "+", "<=", "&&", "where", "q_idx", ...
const char* op_name(MaskOp op);

struct MaskTensorData {
  std::string name;
  std::vector<int64_t> shape;   // at least one dim, each >= 1
  std::vector<int64_t> stride;  // row-major
  std::vector<int32_t> values;
  int32_t min = 0, max = 0;  // over all values
};

struct MaskNode {
  MaskOp op = MaskOp::constant;
  bool boolean = false;                               // a boolean (0 or 1) rather than an integer
  int32_t value = 0;                                  // constant
  std::shared_ptr<const MaskTensorData> tensor;       // lookup
  std::vector<std::shared_ptr<const MaskNode>> args;  // operands in order
};

// Floor division and Python's remainder on 64-bit integers, with x / 0 = 0 and x % 0 = x.
inline int64_t floor_div(int64_t x, int64_t y) {
  if (y == 0) return 0;
  const int64_t q = x / y;
  return (x % y != 0 && ((x < 0) != (y < 0))) ? q - 1 : q;
}
inline int64_t floor_mod(int64_t x, int64_t y) { return y == 0 ? x : x - floor_div(x, y) * y; }

// The node's expression in the text form.
std::string node_text(const MaskNode& node);

}  // namespace qkv::detail
