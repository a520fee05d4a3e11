// Building, printing and evaluating mask expressions (include/qkv/mask_function.h).
#include "mask/expr.h"

#include <limits>
#include <sstream>

#include "qkv/error.h"

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
  }
  return "?";
}

namespace {

constexpr int64_t kMost = std::numeric_limits<int32_t>::max();
constexpr int64_t kLeast = std::numeric_limits<int32_t>::min();

MaskExpr make(MaskOp op, bool boolean, std::vector<MaskExpr> args, int32_t value = 0,
              std::shared_ptr<const MaskTensorData> tensor = nullptr) {
  auto node = std::make_shared<MaskNode>();
  node->op = op;
  node->boolean = boolean;
  node->value = value;
  node->tensor = std::move(tensor);
  for (const MaskExpr& a : args) node->args.push_back(a.shared());
  return MaskExpr(std::move(node));
}

const char* kind(const MaskExpr& x) { return x.is_bool() ? "a boolean" : "an integer"; }

MaskExpr integers(MaskOp op, bool result_bool, const MaskExpr& x, const MaskExpr& y) {
  check(!x.is_bool() && !y.is_bool(), "mask: ", op_name(op), " takes integers, got ", kind(x),
        " and ", kind(y));
  return make(op, result_bool, {x, y});
}

// == and != compare two integers or two booleans.
MaskExpr same_kind(MaskOp op, const MaskExpr& x, const MaskExpr& y) {
  check(x.is_bool() == y.is_bool(), "mask: ", op_name(op), " compares values of one kind, got ",
        kind(x), " and ", kind(y));
  return make(op, true, {x, y});
}

MaskExpr booleans(MaskOp op, const MaskExpr& x, const MaskExpr& y) {
  check(x.is_bool() && y.is_bool(), "mask: ", op_name(op), " takes booleans, got ", kind(x),
        " and ", kind(y));
  return make(op, true, {x, y});
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

bool MaskExpr::is_bool() const { return node_->boolean; }

namespace mask_args {
const MaskExpr b = detail::make(MaskOp::batch, false, {});
const MaskExpr h = detail::make(MaskOp::head, false, {});
const MaskExpr q_idx = detail::make(MaskOp::q_idx, false, {});
const MaskExpr kv_idx = detail::make(MaskOp::kv_idx, false, {});
}  // namespace mask_args

MaskExpr operator+(const MaskExpr& x, const MaskExpr& y) {
  return detail::integers(MaskOp::add, false, x, y);
}
MaskExpr operator-(const MaskExpr& x, const MaskExpr& y) {
  return detail::integers(MaskOp::sub, false, x, y);
}
MaskExpr operator*(const MaskExpr& x, const MaskExpr& y) {
  return detail::integers(MaskOp::mul, false, x, y);
}
MaskExpr operator/(const MaskExpr& x, const MaskExpr& y) {
  return detail::integers(MaskOp::div, false, x, y);
}
MaskExpr operator%(const MaskExpr& x, const MaskExpr& y) {
  return detail::integers(MaskOp::mod, false, x, y);
}
MaskExpr operator-(const MaskExpr& x) {
  check(!x.is_bool(), "mask: unary - takes an integer, got a boolean");
  // A negated constant is a constant, as the text form reads "-5".
  if (x.node().op == MaskOp::constant && x.node().value != detail::kLeast)
    return MaskExpr(-static_cast<int64_t>(x.node().value));
  return detail::make(MaskOp::neg, false, {x});
}
MaskExpr operator==(const MaskExpr& x, const MaskExpr& y) {
  return detail::same_kind(MaskOp::eq, x, y);
}
MaskExpr operator!=(const MaskExpr& x, const MaskExpr& y) {
  return detail::same_kind(MaskOp::ne, x, y);
}
MaskExpr operator<(const MaskExpr& x, const MaskExpr& y) {
  return detail::integers(MaskOp::lt, true, x, y);
}
MaskExpr operator<=(const MaskExpr& x, const MaskExpr& y) {
  return detail::integers(MaskOp::le, true, x, y);
}
MaskExpr operator>(const MaskExpr& x, const MaskExpr& y) {
  return detail::integers(MaskOp::gt, true, x, y);
}
MaskExpr operator>=(const MaskExpr& x, const MaskExpr& y) {
  return detail::integers(MaskOp::ge, true, x, y);
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
  check(condition.is_bool(), "mask: where's condition must be a boolean, got an integer");
  check(x.is_bool() == y.is_bool(), "mask: where's two values must be of one kind, got ",
        detail::kind(x), " and ", detail::kind(y));
  return detail::make(MaskOp::where, x.is_bool(), {condition, x, y});
}
MaskExpr min(const MaskExpr& x, const MaskExpr& y) {
  return detail::integers(MaskOp::min, false, x, y);
}
MaskExpr max(const MaskExpr& x, const MaskExpr& y) {
  return detail::integers(MaskOp::max, false, x, y);
}
MaskExpr abs(const MaskExpr& x) {
  check(!x.is_bool(), "mask: abs takes an integer, got a boolean");
  return detail::make(MaskOp::abs, false, {x});
}

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

MaskTensor::MaskTensor(std::string name, std::vector<int64_t> shape, std::vector<int32_t> values) {
  check(!name.empty(), "MaskTensor: the name is empty");
  for (size_t c = 0; c < name.size(); ++c) {
    const char ch = name[c];
    const bool letter = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
    check(letter || (c > 0 && ch >= '0' && ch <= '9'), "MaskTensor: the name \"", name,
          "\" is not an identifier (letters, digits and _, not a digit first)");
  }
  check(!shape.empty(), "MaskTensor ", name, ": the shape has no dims");
  int64_t count = 1;
  for (int64_t n : shape) {
    check(n >= 1, "MaskTensor ", name, ": a dim is ", n, " (each must be at least 1)");
    check(count <= ((int64_t{1} << 31) - 1) / n, "MaskTensor ", name,
          ": more than 2^31 - 1 elements");
    count *= n;
  }
  check(static_cast<int64_t>(values.size()) == count, "MaskTensor ", name, ": ", values.size(),
        " values for a shape of ", count, " elements");
  auto data = std::make_shared<detail::MaskTensorData>();
  data->name = std::move(name);
  data->shape = std::move(shape);
  data->stride.assign(data->shape.size(), 1);
  for (size_t d = data->shape.size() - 1; d > 0; --d)
    data->stride[d - 1] = data->stride[d] * data->shape[d];
  data->values = std::move(values);
  data->min = data->max = data->values[0];
  for (int32_t v : data->values)
    data->min = std::min(data->min, v), data->max = std::max(data->max, v);
  data_ = std::move(data);
}

const std::string& MaskTensor::name() const { return data_->name; }

MaskExpr MaskTensor::operator[](const MaskExpr& index) const { return at({index}); }

MaskExpr MaskTensor::at(const std::vector<MaskExpr>& indices) const {
  check(indices.size() == data_->shape.size(), "mask: ", data_->name, " has ", data_->shape.size(),
        " dims but is read with ", indices.size(), " indices");
  for (const MaskExpr& i : indices)
    check(!i.is_bool(), "mask: an index into ", data_->name, " is a boolean, not an integer");
  return detail::make(MaskOp::lookup, false, indices, 0, data_);
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
    case MaskOp::constant:
      return n.value < 0 ? 6 : 7;  // "-5" reads as a negation
    default:
      return 7;
  }
}

void print(const detail::MaskNode& n, int at_least, std::ostringstream& out) {
  const int p = precedence(n);
  const bool parens = p < at_least;
  if (parens) out << '(';
  switch (n.op) {
    case MaskOp::constant:
      if (n.boolean) out << (n.value ? "true" : "false");
      else out << n.value;
      break;
    case MaskOp::batch:
    case MaskOp::head:
    case MaskOp::q_idx:
    case MaskOp::kv_idx:
      out << detail::op_name(n.op);
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

int64_t eval(const detail::MaskNode& n, const Point& p) {
  auto arg = [&](int k) { return eval(*n.args[k], p); };
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
  }
  return 0;
}

}  // namespace

std::string to_string(const MaskExpr& mask) { return detail::node_text(mask.node()); }

std::string detail::node_text(const MaskNode& node) {
  std::ostringstream out;
  print(node, 0, out);
  return out.str();
}

int64_t evaluate(const MaskExpr& mask, int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx) {
  return eval(mask.node(), {b, h, q_idx, kv_idx});
}

}  // namespace qkv
