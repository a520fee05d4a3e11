// The nodes of a mask or score expression (include/qkv/mask_function.h,
// include/qkv/score_function.h): a DAG of integer, boolean and float operations over b, h,
// q_idx, kv_idx, the score, constants and lookups into captured tensors.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "qkv/mask_function.h"

namespace qkv::detail {

// The range of a mask's integers (constants and every operation's result): 32 bits.
inline constexpr int64_t kMost = std::numeric_limits<int32_t>::max();
inline constexpr int64_t kLeast = std::numeric_limits<int32_t>::min();

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
  // where(boolean, x, y): x and y of one kind
  where,
  // floats (score functions): the score, an integer made a float, and functions of floats.
  // + - * / (true division) unary - min max abs, the comparisons and where take floats too.
  score,
  to_float,
  exp,
  log,
  tanh,
  sigmoid,
  sqrt,
  // a value of the relative table `value` at (h, q_idx − kv_idx) (score programs only)
  table,
};

// The name an operation has in the text form: "+", "<=", "&&", "where", "q_idx", ...
const char* op_name(MaskOp op);

struct MaskTensorData {
  std::string name;
  std::vector<int64_t> shape;   // at least one dim, each >= 1
  std::vector<int64_t> stride;  // row-major
  int64_t numel = 0;
  std::vector<int32_t> values;   // an integer tensor (MaskTensor: a copy)
  int32_t min = 0, max = 0;      // over all values
  const float* reals = nullptr;  // a float tensor (ScoreTensor: borrowed)
  float* grad = nullptr;         // where the backward writes ∂L/∂reals, or null
  bool real() const { return reals != nullptr; }
};

struct MaskNode {
  MaskOp op = MaskOp::constant;
  bool boolean = false;                               // a boolean (0 or 1) rather than an integer
  bool real = false;                                  // a float (score functions)
  int32_t value = 0;                                  // constant; table: its number
  float real_value = 0;                               // a float constant
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

// A captured tensor's name, shape and strides, checked (`what`: MaskTensor or ScoreTensor).
std::shared_ptr<MaskTensorData> tensor_data(const char* what, std::string name,
                                            std::vector<int64_t> shape);
// t[indices...]: a float when t is.
std::shared_ptr<const MaskNode> lookup_node(const std::shared_ptr<const MaskTensorData>& t,
                                            const std::vector<MaskExpr>& indices);

// Whether any node of the DAG is a float, or reads the score.
bool has_reals(const MaskNode& node);

// A score expression's value at one point with its derivatives, in double (the reference's
// backward): with respect to the score, and to each element of a float tensor it reads.
struct Derivative {
  const MaskTensorData* tensor;  // null: the score
  int64_t index;                 // flat element index
  double value;
};
struct ScoreGradient {
  double value = 0;
  std::vector<Derivative> derivatives;  // (an element may appear more than once: add them)
};
ScoreGradient differentiate(const MaskNode& node, double score, int64_t b, int64_t h, int64_t q_idx,
                            int64_t kv_idx);

// A float value of a score expression at one point (the score given), in double.
double eval_real(const MaskNode& node, double score, int64_t b, int64_t h, int64_t q_idx,
                 int64_t kv_idx);

}  // namespace qkv::detail
