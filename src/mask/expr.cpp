// Building, printing and evaluating mask expressions (include/qkv/mask_function.h).
#include "mask/expr.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
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

constexpr int64_t kMost = std::numeric_limits<int32_t>::max();
constexpr int64_t kLeast = std::numeric_limits<int32_t>::min();

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

namespace {

// Binding strength in the text form: a child binds at least as tightly as its place asks.
int precedence(const detail::MaskNode& n) {
  switch (n.op) {
    case MaskOp::logical_or:
      return 1;
    case MaskOp::logical_and:
      return 2;
    case MaskOp::eq:
    case MaskOp::ne:
    case MaskOp::lt:
    case MaskOp::le:
    case MaskOp::gt:
    case MaskOp::ge:
      return 3;
    case MaskOp::add:
    case MaskOp::sub:
      return 4;
    case MaskOp::mul:
    case MaskOp::div:
    case MaskOp::mod:
      return 5;
    case MaskOp::neg:
    case MaskOp::logical_not:
      return 6;
    case MaskOp::constant:  // "-5" reads as a negation
      return (n.real ? std::signbit(n.real_value) && !std::isnan(n.real_value) : n.value < 0) ? 6
                                                                                              : 7;
    default:
      return 7;
  }
}

// A float constant that reads back to the same 32-bit float, and reads as a float: "2.0",
// "0.1", "1e-07", "inf", "nan".
void print_real(float x, std::ostringstream& out) {
  if (std::isnan(x)) {
    out << "nan";
    return;
  }
  if (std::isinf(x)) {
    out << (x < 0 ? "-inf" : "inf");
    return;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", double(x));
  // The shortest of 6 to 9 digits that reads back to x.
  for (int digits = 6; digits < 9; ++digits) {
    char shorter[32];
    std::snprintf(shorter, sizeof shorter, "%.*g", digits, double(x));
    if (std::strtof(shorter, nullptr) == x) {
      std::snprintf(text, sizeof text, "%s", shorter);
      break;
    }
  }
  out << text;
  if (!std::strpbrk(text, ".en")) out << ".0";  // 2 → 2.0: a float, not an integer
}

void print(const detail::MaskNode& n, int at_least, std::ostringstream& out) {
  const int p = precedence(n);
  const bool parens = p < at_least;
  if (parens) out << '(';
  switch (n.op) {
    case MaskOp::constant:
      if (n.boolean) out << (n.value ? "true" : "false");
      else if (n.real) print_real(n.real_value, out);
      else out << n.value;
      break;
    case MaskOp::batch:
    case MaskOp::head:
    case MaskOp::q_idx:
    case MaskOp::kv_idx:
    case MaskOp::score:
      out << detail::op_name(n.op);
      break;
    case MaskOp::table:
      out << "table" << n.value << "[h, q_idx - kv_idx]";
      break;
    case MaskOp::lookup:
      out << n.tensor->name << '[';
      for (size_t a = 0; a < n.args.size(); ++a) {
        if (a) out << ", ";
        print(*n.args[a], 0, out);
      }
      out << ']';
      break;
    case MaskOp::neg:
    case MaskOp::logical_not:
      out << (n.op == MaskOp::neg ? "-" : "!");
      print(*n.args[0], 6, out);
      break;
    case MaskOp::min:
    case MaskOp::max:
    case MaskOp::abs:
    case MaskOp::where:
    case MaskOp::to_float:
    case MaskOp::exp:
    case MaskOp::log:
    case MaskOp::tanh:
    case MaskOp::sigmoid:
    case MaskOp::sqrt:
      out << detail::op_name(n.op) << '(';
      for (size_t a = 0; a < n.args.size(); ++a) {
        if (a) out << ", ";
        print(*n.args[a], 0, out);
      }
      out << ')';
      break;
    default:  // binary, left-associative (comparisons do not chain: both sides bind tighter)
      print(*n.args[0], p == 3 ? 4 : p, out);
      out << ' ' << detail::op_name(n.op) << ' ';
      print(*n.args[1], p + 1, out);
  }
  if (parens) out << ')';
}

struct Point {
  int64_t b, h, q, kv;
};

int64_t checked(int64_t x, const detail::MaskNode& n) {
  check(x >= detail::kLeast && x <= detail::kMost, "mask: ", detail::op_name(n.op), " gives ", x,
        ", which leaves 32 bits");
  return x;
}

double eval_real(const detail::MaskNode& n, const Point& p, double score);

int64_t eval(const detail::MaskNode& n, const Point& p, double score = 0) {
  auto arg = [&](int k) { return eval(*n.args[k], p, score); };
  // Comparisons of floats, in double.
  if (n.boolean && n.args.size() == 2 && n.args[0]->real) {
    const double x = eval_real(*n.args[0], p, score), y = eval_real(*n.args[1], p, score);
    switch (n.op) {
      case MaskOp::eq:
        return x == y;
      case MaskOp::ne:
        return x != y;
      case MaskOp::lt:
        return x < y;
      case MaskOp::le:
        return x <= y;
      case MaskOp::gt:
        return x > y;
      default:
        return x >= y;
    }
  }
  switch (n.op) {
    case MaskOp::constant:
      return n.value;
    case MaskOp::batch:
      return p.b;
    case MaskOp::head:
      return p.h;
    case MaskOp::q_idx:
      return p.q;
    case MaskOp::kv_idx:
      return p.kv;
    case MaskOp::lookup: {
      const auto& t = *n.tensor;
      int64_t at = 0;
      for (size_t d = 0; d < n.args.size(); ++d) {
        const int64_t i = eval(*n.args[d], p);
        if (i < 0 || i >= t.shape[d])
          fail("mask: index ", i, " is outside ", t.name, " (dim ", d, " has ", t.shape[d],
               " elements) at b = ", p.b, ", h = ", p.h, ", q_idx = ", p.q, ", kv_idx = ", p.kv);
        at += i * t.stride[d];
      }
      return t.values[at];
    }
    case MaskOp::add:
      return checked(arg(0) + arg(1), n);
    case MaskOp::sub:
      return checked(arg(0) - arg(1), n);
    case MaskOp::mul:
      return checked(arg(0) * arg(1), n);
    case MaskOp::div:
      return checked(detail::floor_div(arg(0), arg(1)), n);
    case MaskOp::mod:
      return detail::floor_mod(arg(0), arg(1));
    case MaskOp::neg:
      return checked(-arg(0), n);
    case MaskOp::min:
      return std::min(arg(0), arg(1));
    case MaskOp::max:
      return std::max(arg(0), arg(1));
    case MaskOp::abs:
      return checked(std::abs(arg(0)), n);
    case MaskOp::eq:
      return arg(0) == arg(1);
    case MaskOp::ne:
      return arg(0) != arg(1);
    case MaskOp::lt:
      return arg(0) < arg(1);
    case MaskOp::le:
      return arg(0) <= arg(1);
    case MaskOp::gt:
      return arg(0) > arg(1);
    case MaskOp::ge:
      return arg(0) >= arg(1);
    case MaskOp::logical_and: {  // both sides, as the kernels evaluate them
      const int64_t x = arg(0), y = arg(1);
      return x && y;
    }
    case MaskOp::logical_or: {
      const int64_t x = arg(0), y = arg(1);
      return x || y;
    }
    case MaskOp::logical_not:
      return !arg(0);
    case MaskOp::where: {
      const int64_t c = arg(0), x = arg(1), y = arg(2);
      return c ? x : y;
    }
    default:  // a float: not an integer or a boolean
      fail("mask: ", detail::op_name(n.op), " gives a float where an integer or boolean is read");
  }
  return 0;
}

// The index of t[args...] at p, checked against t's shape.
int64_t flat_index(const detail::MaskNode& n, const Point& p, double score) {
  const auto& t = *n.tensor;
  int64_t at = 0;
  for (size_t d = 0; d < n.args.size(); ++d) {
    const int64_t i = eval(*n.args[d], p, score);
    if (i < 0 || i >= t.shape[d])
      fail("mask: index ", i, " is outside ", t.name, " (dim ", d, " has ", t.shape[d],
           " elements) at b = ", p.b, ", h = ", p.h, ", q_idx = ", p.q, ", kv_idx = ", p.kv);
    at += i * t.stride[d];
  }
  return at;
}

double eval_real(const detail::MaskNode& n, const Point& p, double score) {
  auto arg = [&](int k) { return eval_real(*n.args[k], p, score); };
  switch (n.op) {
    case MaskOp::constant:
      return n.real_value;
    case MaskOp::score:
      return score;
    case MaskOp::to_float:
      return static_cast<double>(eval(*n.args[0], p, score));
    case MaskOp::lookup:
      return n.tensor->reals[flat_index(n, p, score)];
    case MaskOp::add:
      return arg(0) + arg(1);
    case MaskOp::sub:
      return arg(0) - arg(1);
    case MaskOp::mul:
      return arg(0) * arg(1);
    case MaskOp::div:
      return arg(0) / arg(1);
    case MaskOp::neg:
      return -arg(0);
    case MaskOp::min:  // (NaN wins, as torch.minimum)
    case MaskOp::max: {
      const double x = arg(0), y = arg(1);
      if (std::isnan(x) || std::isnan(y)) return NAN;
      return n.op == MaskOp::min ? std::min(x, y) : std::max(x, y);
    }
    case MaskOp::abs:
      return std::abs(arg(0));
    case MaskOp::exp:
      return std::exp(arg(0));
    case MaskOp::log:
      return std::log(arg(0));
    case MaskOp::tanh:
      return std::tanh(arg(0));
    case MaskOp::sigmoid:
      return 1 / (1 + std::exp(-arg(0)));
    case MaskOp::sqrt:
      return std::sqrt(arg(0));
    case MaskOp::where: {
      const int64_t c = eval(*n.args[0], p, score);
      const double x = arg(1), y = arg(2);
      return c ? x : y;
    }
    default:
      fail("mask: ", detail::op_name(n.op), " gives an integer or a boolean where a float is read");
  }
}

// Forward mode with sparse derivatives: each value carries its derivative terms.
using detail::Derivative;
using Dual = detail::ScoreGradient;

void add_scaled(std::vector<Derivative>& to, const std::vector<Derivative>& from, double k) {
  for (const Derivative& d : from) to.push_back({d.tensor, d.index, k * d.value});
}

Dual dual(const detail::MaskNode& n, const Point& p, double score) {
  if (!n.real) return {static_cast<double>(eval(n, p, score)), {}};  // an integer: no derivative
  auto arg = [&](int k) { return dual(*n.args[k], p, score); };
  Dual out;
  switch (n.op) {
    case MaskOp::score:
      return {score, {{nullptr, 0, 1.0}}};
    case MaskOp::lookup: {
      const int64_t at = flat_index(n, p, score);
      return {n.tensor->reals[at], {{n.tensor.get(), at, 1.0}}};
    }
    case MaskOp::add:
    case MaskOp::sub: {
      const Dual x = arg(0), y = arg(1);
      const double sign = n.op == MaskOp::add ? 1 : -1;
      out.value = x.value + sign * y.value;
      add_scaled(out.derivatives, x.derivatives, 1);
      add_scaled(out.derivatives, y.derivatives, sign);
      return out;
    }
    case MaskOp::mul: {
      const Dual x = arg(0), y = arg(1);
      out.value = x.value * y.value;
      add_scaled(out.derivatives, x.derivatives, y.value);
      add_scaled(out.derivatives, y.derivatives, x.value);
      return out;
    }
    case MaskOp::div: {
      const Dual x = arg(0), y = arg(1);
      out.value = x.value / y.value;
      add_scaled(out.derivatives, x.derivatives, 1 / y.value);
      add_scaled(out.derivatives, y.derivatives, -out.value / y.value);
      return out;
    }
    case MaskOp::min:
    case MaskOp::max: {
      const Dual x = arg(0), y = arg(1);
      const bool first = n.op == MaskOp::min ? x.value <= y.value : x.value >= y.value;
      out = first ? x : y;
      if (std::isnan(x.value) || std::isnan(y.value)) out.value = NAN;
      return out;
    }
    case MaskOp::where: {
      const int64_t c = eval(*n.args[0], p, score);
      const Dual x = arg(1), y = arg(2);
      return c ? x : y;
    }
    default: {  // functions of one float, and constants
      if (n.args.empty() || n.op == MaskOp::to_float) return {eval_real(n, p, score), {}};
      const Dual x = arg(0);
      double v = 0, slope = 0;
      switch (n.op) {
        case MaskOp::neg:
          v = -x.value, slope = -1;
          break;
        case MaskOp::abs:
          v = std::abs(x.value), slope = x.value > 0 ? 1 : x.value < 0 ? -1 : 0;
          break;
        case MaskOp::exp:
          v = std::exp(x.value), slope = v;
          break;
        case MaskOp::log:
          v = std::log(x.value), slope = 1 / x.value;
          break;
        case MaskOp::tanh:
          v = std::tanh(x.value), slope = 1 - v * v;
          break;
        case MaskOp::sigmoid:
          v = 1 / (1 + std::exp(-x.value)), slope = v * (1 - v);
          break;
        case MaskOp::sqrt:
          v = std::sqrt(x.value), slope = 0.5 / v;
          break;
        default:
          fail("score function: ", detail::op_name(n.op), " is not differentiated");
      }
      out.value = v;
      add_scaled(out.derivatives, x.derivatives, slope);
      return out;
    }
  }
}

}  // namespace

detail::ScoreGradient detail::differentiate(const MaskNode& node, double score, int64_t b,
                                            int64_t h, int64_t q_idx, int64_t kv_idx) {
  return dual(node, {b, h, q_idx, kv_idx}, score);
}

double detail::eval_real(const MaskNode& node, double score, int64_t b, int64_t h, int64_t q_idx,
                         int64_t kv_idx) {
  return node.real ? qkv::eval_real(node, {b, h, q_idx, kv_idx}, score)
                   : static_cast<double>(eval(node, {b, h, q_idx, kv_idx}, score));
}

std::string to_string(const MaskExpr& mask) { return detail::node_text(mask.node()); }

std::string detail::node_text(const MaskNode& node) {
  std::ostringstream out;
  print(node, 0, out);
  return out.str();
}

double evaluate_score(const MaskExpr& f, double score, int64_t b, int64_t h, int64_t q_idx,
                      int64_t kv_idx) {
  check(!f.is_bool(), "evaluate_score: the expression is a boolean (a mask), not a score");
  return detail::eval_real(f.node(), score, b, h, q_idx, kv_idx);
}

int64_t evaluate(const MaskExpr& mask, int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx) {
  return eval(mask.node(), {b, h, q_idx, kv_idx});
}

}  // namespace qkv
