// Programmable scores: a score function score_mod(score, b, h, q_idx, kv_idx) → float, applied
// to each scaled score q·k · scale before the softmax (PyTorch's flex_attention score_mod).
// T5's relative-position bias, ALiBi with learned slopes and tanh softcapping are each one:
//
//   using namespace qkv::score_args;                      // score, b, h, q_idx, kv_idx
//   qkv::ScoreTensor slopes("slopes", {H}, slope_values, slope_grads);
//   qkv::ScoreFunction alibi(score - slopes[h] * abs(q_idx - kv_idx));
//   args.score_mod = &alibi;
//
// or as text (qkv::parse_score): "score - slopes[h] * abs(q_idx - kv_idx)".
//
// The expression is the mask functions' (include/qkv/mask_function.h, MaskExpr, here also
// called ScoreExpr) with floats added:
//   score                the scaled score of the pair (a float)
//   float constants      2.5, 1e-3, inf, nan (C++: a double, held as a 32-bit float)
//   float(x)             an integer as a float; arithmetic mixing an integer and a float is
//                        float arithmetic (Python's int + float), so score + 1 is a float
//   + - * / unary -      on floats / is true division (on two integers it stays floor division)
//   min max abs where    on floats too; comparisons of floats give booleans
//   exp log tanh sigmoid sqrt
//   t[i, ...]            a ScoreTensor's element (a float) at integer indices
// The kernels evaluate it in fp32 with SIMD a few key rows of a score tile at a time, forward
// and backward; the reference evaluates it node by node in double (evaluate_score).
//
// What a score can do: a score of −inf hides the key, as a mask would (a row whose scores
// are all −inf gets out = 0, lse = −inf); a NaN score gives NaN, as PyTorch's does.
//
// Gradients. The backward differentiates the expression: ∂score_mod/∂score carries dS back
// to q and k, and a ScoreTensor given a `grad` receives ∂L/∂values (written, not added) from
// attention_backward, summed in a fixed order: the same bits for any thread count.
//
// Relative tables. A float subexpression that reads q_idx and kv_idx only as q_idx − kv_idx
// (or kv_idx − q_idx), and besides only h, constants and captured tensors (T5's bucketed bias
// bias[h, bucket(q_idx − kv_idx)], ALiBi's slopes[h] * abs(q_idx − kv_idx)) is evaluated once
// per call into a table over (h, q_idx − kv_idx), and the kernels read the table: a contiguous
// row per key, as cheap as an additive bias and without its Tq × Tk memory.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "qkv/mask_function.h"

namespace qkv {

namespace detail {
struct ScoreProgram;
}

using ScoreExpr = MaskExpr;

// The five arguments of a score function, for `using namespace qkv::score_args;`.
namespace score_args {
using mask_args::b;
using mask_args::h;
using mask_args::kv_idx;
using mask_args::q_idx;
extern const MaskExpr score;
}  // namespace score_args

// A float tensor a score function reads by index (row-major over `shape`), borrowed: `values`
// must stay alive through every attention call that reads it (it may change between calls: a
// learned parameter). `grad`, when given (as many floats), receives ∂L/∂values from
// attention_backward. The name appears in errors and in the text form.
class ScoreTensor {
 public:
  ScoreTensor(std::string name, std::vector<int64_t> shape, const float* values,
              float* grad = nullptr);
  MaskExpr operator[](const MaskExpr& index) const;         // a 1-D tensor's element
  MaskExpr at(const std::vector<MaskExpr>& indices) const;  // one index per dim
  const std::string& name() const;
  const std::shared_ptr<const detail::MaskTensorData>& data() const { return data_; }

 private:
  std::shared_ptr<const detail::MaskTensorData> data_;
};

// The text form (parse_mask's, with score, float literals, inf, nan, float(), exp, log, tanh,
// sigmoid and sqrt), reading the float tensors `tensors` and the integer ones
// `integer_tensors` by name. A qkv::Error names the column of what it cannot read.
MaskExpr parse_score(std::string_view text, std::span<const ScoreTensor> tensors = {},
                     std::span<const MaskTensor> integer_tensors = {});

// The function's value at one point, evaluated node by node in double (the reference).
// Throws qkv::Error for an index outside a tensor.
double evaluate_score(const MaskExpr& f, double score, int64_t b, int64_t h, int64_t q_idx,
                      int64_t kv_idx);

// A score function compiled for the kernels: its relative tables found, its instructions and
// registers laid out. Cheap to copy (it shares them). Throws qkv::Error when the expression
// is a boolean (a mask: create_block_mask takes it).
class ScoreFunction {
 public:
  ScoreFunction() = default;
  explicit ScoreFunction(const MaskExpr& f);
  bool empty() const { return program_ == nullptr; }
  const MaskExpr& expr() const { return *expr_; }
  // Whether it reads a ScoreTensor that has a grad (the backward then writes it).
  bool learnable() const;
  // The subexpressions evaluated once per call into relative tables.
  int64_t tables() const;
  const detail::ScoreProgram& program() const { return *program_; }

 private:
  std::shared_ptr<const MaskExpr> expr_;
  std::shared_ptr<const detail::ScoreProgram> program_;
};

}  // namespace qkv
