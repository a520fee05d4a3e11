// Building mask and score expressions (include/qkv/mask_function.h): the nodes, their kinds
// (integer, boolean, float) checked as each operation is made. Printed by expr_text.cpp,
// evaluated point by point by expr_eval.cpp.
#include "mask/expr.h"

#include <cmath>
#include <unordered_set>

#include "qkv/error.h"
#include "qkv/score_function.h"

namespace qkv {
namespace detail {

const char* op_name(MaskOp op) {
  switch (op) {
    case MaskOp::constant:
      return "constant";
    case MaskOp::batch:
      return "b";
    case MaskOp::head:
      return "h";
    case MaskOp::q_idx:
      return "q_idx";
    case MaskOp::kv_idx:
      return "kv_idx";
    case MaskOp::lookup:
      return "[]";
    case MaskOp::add:
      return "+";
    case MaskOp::sub:
      return "-";
    case MaskOp::mul:
      return "*";
    case MaskOp::div:
      return "/";
    case MaskOp::mod:
      return "%";
    case MaskOp::neg:
      return "unary -";
    case MaskOp::min:
      return "min";
    case MaskOp::max:
      return "max";
    case MaskOp::abs:
      return "abs";
    case MaskOp::eq:
      return "==";
    case MaskOp::ne:
      return "!=";
    case MaskOp::lt:
      return "<";
    case MaskOp::le:
      return "<=";
    case MaskOp::gt:
      return ">";
    case MaskOp::ge:
      return ">=";
    case MaskOp::logical_and:
      return "&&";
    case MaskOp::logical_or:
      return "||";
    case MaskOp::logical_not:
      return "!";
    case MaskOp::where:
      return "where";
    case MaskOp::score:
      return "score";
    case MaskOp::to_float:
      return "float";
    case MaskOp::exp:
      return "exp";
    case MaskOp::log:
      return "log";
    case MaskOp::tanh:
      return "tanh";
    case MaskOp::sigmoid:
      return "sigmoid";
    case MaskOp::sqrt:
      return "sqrt";
    case MaskOp::table:
      return "table";
  }
  return "?";
}

bool has_reals(const MaskNode& node) {
  std::vector<const MaskNode*> todo = {&node};
  std::unordered_set<const MaskNode*> seen;  // (a DAG: each node once)
  while (!todo.empty()) {
    const MaskNode* n = todo.back();
    todo.pop_back();
    if (n->real || n->op == MaskOp::score) return true;
    for (const auto& a : n->args)
      if (seen.insert(a.get()).second) todo.push_back(a.get());
  }
  return false;
}

namespace {

MaskExpr make(MaskOp op, bool boolean, std::vector<MaskExpr> args, int32_t value = 0,
              std::shared_ptr<const MaskTensorData> tensor = nullptr, bool real = false) {
  auto node = std::make_shared<MaskNode>();
  node->op = op;
  node->boolean = boolean;
  node->real = real;
  node->value = value;
  node->tensor = std::move(tensor);
  for (const MaskExpr& a : args) node->args.push_back(a.shared());
  return MaskExpr(std::move(node));
}

const char* kind(const MaskExpr& x) {
  return x.is_bool() ? "a boolean" : x.is_real() ? "a float" : "an integer";
}

// An integer operand of float arithmetic, made a float (a constant stays a constant).
MaskExpr as_real(const MaskExpr& x) {
  if (x.is_real()) return x;
  if (x.node().op == MaskOp::constant) return MaskExpr(static_cast<double>(x.node().value));
  return make(MaskOp::to_float, false, {x}, 0, nullptr, true);
}

// Arithmetic and comparisons: two integers, or numbers of which one is a float (then both are
// floats, as Python's int + float is). `integers_only`: the operator takes no floats.
MaskExpr numbers(MaskOp op, bool result_bool, const MaskExpr& x, const MaskExpr& y,
                 bool integers_only = false) {
  const bool reals = x.is_real() || y.is_real();
  check(!x.is_bool() && !y.is_bool(), "mask: ", op_name(op),
        reals && !integers_only ? " takes numbers, got " : " takes integers, got ", kind(x),
        " and ", kind(y));
  if (!reals) return make(op, result_bool, {x, y});
  check(!integers_only, "mask: ", op_name(op), " takes integers, got ", kind(x), " and ", kind(y));
  return make(op, result_bool, {as_real(x), as_real(y)}, 0, nullptr, !result_bool);
}

// == and != compare two booleans, or two numbers.
MaskExpr same_kind(MaskOp op, const MaskExpr& x, const MaskExpr& y) {
  check(x.is_bool() == y.is_bool(), "mask: ", op_name(op), " compares values of one kind, got ",
        kind(x), " and ", kind(y));
  if (x.is_bool()) return make(op, true, {x, y});
  return numbers(op, true, x, y);
}

MaskExpr booleans(MaskOp op, const MaskExpr& x, const MaskExpr& y) {
  check(x.is_bool() && y.is_bool(), "mask: ", op_name(op), " takes booleans, got ", kind(x),
        " and ", kind(y));
  return make(op, true, {x, y});
}

// A function of one float (an integer argument made a float).
MaskExpr real_function(MaskOp op, const MaskExpr& x) {
  check(!x.is_bool(), "mask: ", op_name(op), " takes a number, got a boolean");
  return make(op, false, {as_real(x)}, 0, nullptr, true);
}

}  // namespace
}  // namespace detail

using detail::MaskOp;

MaskExpr::MaskExpr(int64_t constant) {
  check(constant >= detail::kLeast && constant <= detail::kMost, "mask: the constant ", constant,
        " does not fit 32 bits");
  *this = detail::make(MaskOp::constant, false, {}, static_cast<int32_t>(constant));
}

MaskExpr::MaskExpr(bool constant) {
  *this = detail::make(MaskOp::constant, true, {}, constant ? 1 : 0);
}

MaskExpr::MaskExpr(double constant) {
  auto node = std::make_shared<detail::MaskNode>();
  node->op = MaskOp::constant;
  node->real = true;
  node->real_value = static_cast<float>(constant);
  node_ = std::move(node);
}

bool MaskExpr::is_bool() const { return node_->boolean; }
bool MaskExpr::is_real() const { return node_->real; }

namespace mask_args {
const MaskExpr b = detail::make(MaskOp::batch, false, {});
const MaskExpr h = detail::make(MaskOp::head, false, {});
const MaskExpr q_idx = detail::make(MaskOp::q_idx, false, {});
const MaskExpr kv_idx = detail::make(MaskOp::kv_idx, false, {});
}  // namespace mask_args

namespace score_args {
const MaskExpr score = detail::make(MaskOp::score, false, {}, 0, nullptr, true);
}  // namespace score_args

MaskExpr operator+(const MaskExpr& x, const MaskExpr& y) {
  return detail::numbers(MaskOp::add, false, x, y);
}
MaskExpr operator-(const MaskExpr& x, const MaskExpr& y) {
  return detail::numbers(MaskOp::sub, false, x, y);
}
MaskExpr operator*(const MaskExpr& x, const MaskExpr& y) {
  return detail::numbers(MaskOp::mul, false, x, y);
}
MaskExpr operator/(const MaskExpr& x, const MaskExpr& y) {
  return detail::numbers(MaskOp::div, false, x, y);  // floor division of integers
}
MaskExpr operator%(const MaskExpr& x, const MaskExpr& y) {
  return detail::numbers(MaskOp::mod, false, x, y, /*integers_only=*/true);
}
MaskExpr operator-(const MaskExpr& x) {
  check(!x.is_bool(), "mask: unary - takes a number, got a boolean");
  // A negated constant is a constant, as the text form reads "-5".
  if (x.node().op == MaskOp::constant && x.is_real()) return MaskExpr(-double(x.node().real_value));
  if (x.node().op == MaskOp::constant && x.node().value != detail::kLeast)
    return MaskExpr(-static_cast<int64_t>(x.node().value));
  return detail::make(MaskOp::neg, false, {x}, 0, nullptr, x.is_real());
}
MaskExpr operator==(const MaskExpr& x, const MaskExpr& y) {
  return detail::same_kind(MaskOp::eq, x, y);
}
MaskExpr operator!=(const MaskExpr& x, const MaskExpr& y) {
  return detail::same_kind(MaskOp::ne, x, y);
}
MaskExpr operator<(const MaskExpr& x, const MaskExpr& y) {
  return detail::numbers(MaskOp::lt, true, x, y);
}
MaskExpr operator<=(const MaskExpr& x, const MaskExpr& y) {
  return detail::numbers(MaskOp::le, true, x, y);
}
MaskExpr operator>(const MaskExpr& x, const MaskExpr& y) {
  return detail::numbers(MaskOp::gt, true, x, y);
}
MaskExpr operator>=(const MaskExpr& x, const MaskExpr& y) {
  return detail::numbers(MaskOp::ge, true, x, y);
}
MaskExpr operator&&(const MaskExpr& x, const MaskExpr& y) {
  return detail::booleans(MaskOp::logical_and, x, y);
}
MaskExpr operator||(const MaskExpr& x, const MaskExpr& y) {
  return detail::booleans(MaskOp::logical_or, x, y);
}
MaskExpr operator!(const MaskExpr& x) {
  check(x.is_bool(), "mask: ! takes a boolean, got an integer");
  return detail::make(MaskOp::logical_not, true, {x});
}
MaskExpr where(const MaskExpr& condition, const MaskExpr& x, const MaskExpr& y) {
  check(condition.is_bool(), "mask: where's condition must be a boolean, got ",
        detail::kind(condition));
  check(x.is_bool() == y.is_bool(), "mask: where's two values must be of one kind, got ",
        detail::kind(x), " and ", detail::kind(y));
  if (x.is_real() || y.is_real())  // an integer beside a float is made a float
    return detail::make(MaskOp::where, false, {condition, detail::as_real(x), detail::as_real(y)},
                        0, nullptr, true);
  return detail::make(MaskOp::where, x.is_bool(), {condition, x, y});
}
MaskExpr min(const MaskExpr& x, const MaskExpr& y) {
  return detail::numbers(MaskOp::min, false, x, y);
}
MaskExpr max(const MaskExpr& x, const MaskExpr& y) {
  return detail::numbers(MaskOp::max, false, x, y);
}
MaskExpr abs(const MaskExpr& x) {
  check(!x.is_bool(), "mask: abs takes a number, got a boolean");
  return detail::make(MaskOp::abs, false, {x}, 0, nullptr, x.is_real());
}
MaskExpr to_float(const MaskExpr& x) {
  check(!x.is_bool(), "mask: float takes a number, got a boolean");
  return detail::as_real(x);
}
MaskExpr exp(const MaskExpr& x) { return detail::real_function(MaskOp::exp, x); }
MaskExpr log(const MaskExpr& x) { return detail::real_function(MaskOp::log, x); }
MaskExpr tanh(const MaskExpr& x) { return detail::real_function(MaskOp::tanh, x); }
MaskExpr sigmoid(const MaskExpr& x) { return detail::real_function(MaskOp::sigmoid, x); }
MaskExpr sqrt(const MaskExpr& x) { return detail::real_function(MaskOp::sqrt, x); }

MaskExpr and_masks(std::initializer_list<MaskExpr> masks) {
  MaskExpr all(true);
  bool first = true;
  for (const MaskExpr& m : masks) {
    check(m.is_bool(), "and_masks: a mask is an integer expression, not a boolean");
    all = first ? m : all && m;
    first = false;
  }
  return all;
}

MaskExpr or_masks(std::initializer_list<MaskExpr> masks) {
  MaskExpr any(false);
  bool first = true;
  for (const MaskExpr& m : masks) {
    check(m.is_bool(), "or_masks: a mask is an integer expression, not a boolean");
    any = first ? m : any || m;
    first = false;
  }
  return any;
}

std::shared_ptr<detail::MaskTensorData> detail::tensor_data(const char* what, std::string name,
                                                            std::vector<int64_t> shape) {
  check(!name.empty(), what, ": the name is empty");
  for (size_t c = 0; c < name.size(); ++c) {
    const char ch = name[c];
    const bool letter = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
    check(letter || (c > 0 && ch >= '0' && ch <= '9'), what, ": the name \"", name,
          "\" is not an identifier (letters, digits and _, not a digit first)");
  }
  check(!shape.empty(), what, " ", name, ": the shape has no dims");
  int64_t count = 1;
  for (int64_t n : shape) {
    check(n >= 1, what, " ", name, ": a dim is ", n, " (each must be at least 1)");
    check(count <= ((int64_t{1} << 31) - 1) / n, what, " ", name, ": more than 2^31 - 1 elements");
    count *= n;
  }
  auto data = std::make_shared<MaskTensorData>();
  data->name = std::move(name);
  data->shape = std::move(shape);
  data->stride.assign(data->shape.size(), 1);
  for (size_t d = data->shape.size() - 1; d > 0; --d)
    data->stride[d - 1] = data->stride[d] * data->shape[d];
  data->numel = count;
  return data;
}

MaskTensor::MaskTensor(std::string name, std::vector<int64_t> shape, std::vector<int32_t> values) {
  auto data = detail::tensor_data("MaskTensor", std::move(name), std::move(shape));
  check(static_cast<int64_t>(values.size()) == data->numel, "MaskTensor ", data->name, ": ",
        values.size(), " values for a shape of ", data->numel, " elements");
  data->values = std::move(values);
  data->min = data->max = data->values[0];
  for (int32_t v : data->values)
    data->min = std::min(data->min, v), data->max = std::max(data->max, v);
  data_ = std::move(data);
}

const std::string& MaskTensor::name() const { return data_->name; }

ScoreTensor::ScoreTensor(std::string name, std::vector<int64_t> shape, const float* values,
                         float* grad) {
  auto data = detail::tensor_data("ScoreTensor", std::move(name), std::move(shape));
  check(values != nullptr, "ScoreTensor ", data->name, ": values is null");
  data->reals = values;
  data->grad = grad;
  data_ = std::move(data);
}

const std::string& ScoreTensor::name() const { return data_->name; }
MaskExpr ScoreTensor::operator[](const MaskExpr& index) const { return at({index}); }
MaskExpr ScoreTensor::at(const std::vector<MaskExpr>& indices) const {
  return MaskExpr(detail::lookup_node(data_, indices));
}

MaskExpr MaskTensor::operator[](const MaskExpr& index) const { return at({index}); }

MaskExpr MaskTensor::at(const std::vector<MaskExpr>& indices) const {
  return MaskExpr(detail::lookup_node(data_, indices));
}

std::shared_ptr<const detail::MaskNode> detail::lookup_node(
    const std::shared_ptr<const MaskTensorData>& t, const std::vector<MaskExpr>& indices) {
  check(indices.size() == t->shape.size(), "mask: ", t->name, " has ", t->shape.size(),
        " dims but is read with ", indices.size(), " indices");
  for (const MaskExpr& i : indices)
    check(!i.is_bool() && !i.is_real(), "mask: an index into ", t->name, " is ", kind(i),
          ", not an integer");
  return make(MaskOp::lookup, false, indices, 0, t, t->real()).shared();
}

}  // namespace qkv
