// Printing mask and score expressions as Python-like text (qkv::to_string, and the text a
// compiled program reports).
#include "mask/expr.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "qkv/error.h"

namespace qkv {

using detail::MaskOp;

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

}  // namespace

std::string to_string(const MaskExpr& mask) { return detail::node_text(mask.node()); }

std::string detail::node_text(const MaskNode& node) {
  std::ostringstream out;
  print(node, 0, out);
  return out.str();
}

}  // namespace qkv
