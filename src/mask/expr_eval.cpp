// Evaluating mask and score expressions one point at a time, the reference the compiled
// programs are checked against: integers (checked to stay in 32 bits), floats, and the score
// function's derivatives by forward mode with sparse terms.
#include "mask/expr.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "qkv/error.h"
#include "qkv/score_function.h"

namespace qkv {

using detail::MaskOp;

namespace {

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

double evaluate_score(const MaskExpr& f, double score, int64_t b, int64_t h, int64_t q_idx,
                      int64_t kv_idx) {
  check(!f.is_bool(), "evaluate_score: the expression is a boolean (a mask), not a score");
  return detail::eval_real(f.node(), score, b, h, q_idx, kv_idx);
}

int64_t evaluate(const MaskExpr& mask, int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx) {
  return eval(mask.node(), {b, h, q_idx, kv_idx});
}

}  // namespace qkv
