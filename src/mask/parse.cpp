// The text form of a mask or score expression: a recursive-descent parser over C's precedence
// levels (include/qkv/mask_function.h, include/qkv/score_function.h). Errors name the column, from
// 1, of what could not be read.
#include <cctype>
#include <cstdlib>
#include <limits>
#include <string>

#include "mask/expr.h"
#include "qkv/error.h"
#include "qkv/score_function.h"

namespace qkv {
namespace {

class Parser {
 public:
  // `what`: "mask" or "score function", for messages.
  Parser(std::string_view text, std::vector<std::shared_ptr<const detail::MaskTensorData>> tensors,
         bool scores)
      : text_(text), tensors_(std::move(tensors)), scores_(scores) {}

  MaskExpr parse() {
    check(text_.size() <= 1 << 16, "mask: the text is ", text_.size(),
          " characters long; at most 65536 are read");
    MaskExpr e = logical_or();
    skip_space();
    if (at_ < text_.size()) error("expected an operator or the end");
    return e;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    // (Pieces streamed one by one: concatenated std::strings trip GCC 12's false -Wrestrict.)
    const bool long_text = text_.size() > 80;
    const std::string_view shown = long_text ? text_.substr(0, 77) : text_;
    const char* kind = scores_ ? "score function" : "mask";
    if (at_ < text_.size())
      fail(kind, " \"", shown, long_text ? "..." : "", "\": column ", at_ + 1, ": ", what,
           ", found \"", text_.substr(at_, 12), "\"");
    fail(kind, " \"", shown, long_text ? "..." : "", "\": column ", at_ + 1, ": ", what,
         ", found the end");
  }

  void skip_space() {
    while (at_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[at_]))) ++at_;
  }
  // Takes `token` if the text continues with it (callers try "&&" before "&", "||" before "|").
  bool take(std::string_view token) {
    skip_space();
    if (text_.substr(at_, token.size()) != token) return false;
    at_ += token.size();
    return true;
  }
  void expect(std::string_view token, const char* what) {
    if (!take(token)) error(std::string("expected ") + what);
  }
  // A builder error (an operand of the wrong kind) with the column of its operator.
  template <class F>
  MaskExpr at(size_t column, F&& build) {
    try {
      return build();
    } catch (const Error& e) {
      at_ = column;
      error(std::string(e.what()).substr(6));  // (without "mask: ")
    }
  }

  // Nesting deeper than this is refused rather than run the stack out.
  void enter() {
    if (++depth_ > 200) error("nesting deeper than 200 levels");
  }

  MaskExpr logical_or() {
    MaskExpr x = logical_and();
    for (;;) {
      const size_t op = (skip_space(), at_);
      if (take("||") || take("|")) {
        MaskExpr y = logical_and();
        x = at(op, [&] { return x || y; });
      } else {
        return x;
      }
    }
  }
  MaskExpr logical_and() {
    MaskExpr x = comparison();
    for (;;) {
      const size_t op = (skip_space(), at_);
      if (take("&&") || take("&")) {
        MaskExpr y = comparison();
        x = at(op, [&] { return x && y; });
      } else {
        return x;
      }
    }
  }
  MaskExpr comparison() {
    MaskExpr x = sum();
    const size_t op = (skip_space(), at_);
    static constexpr std::string_view kOps[] = {"==", "!=", "<=", ">=", "<", ">"};
    for (std::string_view o : kOps)
      if (take(o)) {
        MaskExpr y = sum();
        return at(op, [&] {
          if (o == "==") return x == y;
          if (o == "!=") return x != y;
          if (o == "<=") return x <= y;
          if (o == ">=") return x >= y;
          if (o == "<") return x < y;
          return x > y;
        });
      }
    return x;
  }
  MaskExpr sum() {
    MaskExpr x = product();
    for (;;) {
      const size_t op = (skip_space(), at_);
      if (take("+")) {
        MaskExpr y = product();
        x = at(op, [&] { return x + y; });
      } else if (take("-")) {
        MaskExpr y = product();
        x = at(op, [&] { return x - y; });
      } else {
        return x;
      }
    }
  }
  MaskExpr product() {
    MaskExpr x = unary();
    for (;;) {
      const size_t op = (skip_space(), at_);
      if (take("*")) {
        MaskExpr y = unary();
        x = at(op, [&] { return x * y; });
      } else if (take("//") || take("/")) {
        MaskExpr y = unary();
        x = at(op, [&] { return x / y; });
      } else if (take("%")) {
        MaskExpr y = unary();
        x = at(op, [&] { return x % y; });
      } else {
        return x;
      }
    }
  }
  MaskExpr unary() {
    const size_t op = (skip_space(), at_);
    if (take("-")) {
      skip_space();
      if (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_])))
        return number(true);  // a negative constant, -2^31 included
      enter();
      MaskExpr x = unary();
      --depth_;
      return at(op, [&] { return -x; });
    }
    if (take("!") || take("~")) {
      enter();
      MaskExpr x = unary();
      --depth_;
      return at(op, [&] { return !x; });
    }
    return primary();
  }
  MaskExpr primary() {
    skip_space();
    if (at_ >= text_.size()) error("expected an operand");
    const char c = text_[at_];
    if (std::isdigit(static_cast<unsigned char>(c))) return number(false);
    if (take("(")) {
      enter();
      MaskExpr x = logical_or();
      --depth_;
      expect(")", "')'");
      return x;
    }
    if (!(std::isalpha(static_cast<unsigned char>(c)) || c == '_')) error("expected an operand");
    const size_t start = at_;
    while (at_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[at_])) || text_[at_] == '_'))
      ++at_;
    const std::string_view name = text_.substr(start, at_ - start);
    using namespace mask_args;
    if (name == "b") return mask_args::b;
    if (name == "h") return mask_args::h;
    if (name == "q_idx") return q_idx;
    if (name == "kv_idx") return kv_idx;
    if (name == "true") return MaskExpr(true);
    if (name == "false") return MaskExpr(false);
    if (name == "where" || name == "min" || name == "max" || name == "abs")
      return call(name, start);
    for (const auto& t : tensors_)
      if (t->name == name) return lookup(t, start);
    if (scores_) {
      if (name == "score") return score_args::score;
      if (name == "inf") return MaskExpr(std::numeric_limits<double>::infinity());
      if (name == "nan") return MaskExpr(std::numeric_limits<double>::quiet_NaN());
      if (name == "float" || name == "exp" || name == "log" || name == "tanh" ||
          name == "sigmoid" || name == "sqrt")
        return call(name, start);
      at_ = start;
      error(
          "expected score, b, h, q_idx, kv_idx, a function (where, min, max, abs, float, exp, "
          "log, tanh, sigmoid, sqrt), inf, nan or a captured tensor");
    }
    at_ = start;
    error("expected b, h, q_idx, kv_idx, a function (where, min, max, abs) or a captured tensor");
  }
  bool digit_at() const {
    return at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]));
  }
  // A number at the cursor (after a minus sign when `negative`): an integer of 32 bits, or in a
  // score function a float when a '.' or an exponent follows the digits.
  MaskExpr number(bool negative) {
    const size_t start = at_;
    while (digit_at()) ++at_;
    bool real = false;
    if (scores_ && at_ < text_.size() && text_[at_] == '.') {
      real = true;
      ++at_;
      while (digit_at()) ++at_;
    }
    if (scores_ && at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
      const size_t mark = at_++;
      if (at_ < text_.size() && (text_[at_] == '+' || text_[at_] == '-')) ++at_;
      if (digit_at()) {
        real = true;
        while (digit_at()) ++at_;
      } else {
        at_ = mark;
      }
    }
    const std::string digits(text_.substr(start, at_ - start));
    if (real) {
      const double v = std::strtod(digits.c_str(), nullptr);
      return MaskExpr(negative ? -v : v);
    }
    int64_t value = 0;
    for (char ch : digits) {
      value = value * 10 + (ch - '0');
      if (value > (int64_t{1} << 31) || (!negative && value == (int64_t{1} << 31))) {
        at_ = start;
        error("an integer larger than 32 bits");
      }
    }
    return MaskExpr(negative ? -value : value);
  }
  MaskExpr call(std::string_view name, size_t start) {
    const size_t n = name == "where" ? 3 : name == "min" || name == "max" ? 2 : 1;
    expect("(", "'(' after the function's name");
    enter();
    std::vector<MaskExpr> args;
    args.push_back(logical_or());
    while (args.size() < n) {
      expect(",", "',' and the function's next argument");
      args.push_back(logical_or());
    }
    --depth_;
    expect(")", "')' after the function's arguments");
    return at(start, [&] {
      if (name == "where") return where(args[0], args[1], args[2]);
      if (name == "min") return min(args[0], args[1]);
      if (name == "max") return max(args[0], args[1]);
      if (name == "float") return to_float(args[0]);
      if (name == "exp") return exp(args[0]);
      if (name == "log") return log(args[0]);
      if (name == "tanh") return tanh(args[0]);
      if (name == "sigmoid") return sigmoid(args[0]);
      if (name == "sqrt") return sqrt(args[0]);
      return abs(args[0]);
    });
  }
  MaskExpr lookup(const std::shared_ptr<const detail::MaskTensorData>& t, size_t start) {
    expect("[", "'[' after a tensor's name");
    enter();
    std::vector<MaskExpr> indices;
    indices.push_back(logical_or());
    while (take(",")) indices.push_back(logical_or());
    --depth_;
    expect("]", "']' after the indices");
    return at(start, [&] { return MaskExpr(detail::lookup_node(t, indices)); });
  }

  std::string_view text_;
  std::vector<std::shared_ptr<const detail::MaskTensorData>> tensors_;
  bool scores_;
  size_t at_ = 0;
  int depth_ = 0;
};

}  // namespace

MaskExpr parse_mask(std::string_view text, std::span<const MaskTensor> tensors) {
  std::vector<std::shared_ptr<const detail::MaskTensorData>> all;
  for (const MaskTensor& t : tensors) all.push_back(t.data());
  return Parser(text, std::move(all), false).parse();
}

MaskExpr parse_score(std::string_view text, std::span<const ScoreTensor> tensors,
                     std::span<const MaskTensor> integer_tensors) {
  std::vector<std::shared_ptr<const detail::MaskTensorData>> all;
  for (const ScoreTensor& t : tensors) all.push_back(t.data());
  for (const MaskTensor& t : integer_tensors) all.push_back(t.data());
  for (size_t i = 0; i < all.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      check(all[i]->name != all[j]->name, "parse_score: two captured tensors are named ",
            all[i]->name);
  return Parser(text, std::move(all), true).parse();
}

}  // namespace qkv
