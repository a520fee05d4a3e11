// Compiling a score function (mask/score_program.h): relative tables, then instructions.
#include "mask/score_program.h"

#include <cmath>
#include <map>
#include <memory>

#include "qkv/error.h"
#include "qkv/score_function.h"

namespace qkv::detail {
namespace {

// What a value reads: the batch, the head, q_idx, kv_idx (other than through their
// difference), their difference, the score.
enum Reads : uint8_t { kB = 1, kH = 2, kQ = 4, kKV = 8, kD = 16, kScore = 32 };

bool is_difference(const MaskNode& n) {
  if (n.op != MaskOp::sub) return false;
  const MaskOp x = n.args[0]->op, y = n.args[1]->op;
  return (x == MaskOp::q_idx && y == MaskOp::kv_idx) || (x == MaskOp::kv_idx && y == MaskOp::q_idx);
}

class TableCutter {
 public:
  explicit TableCutter(ScoreProgram& p) : p_(p) {}

  uint8_t reads(const MaskNode& n) {
    if (auto it = reads_.find(&n); it != reads_.end()) return it->second;
    uint8_t r = 0;
    switch (n.op) {
      case MaskOp::batch:
        r = kB;
        break;
      case MaskOp::head:
        r = kH;
        break;
      case MaskOp::q_idx:
        r = kQ;
        break;
      case MaskOp::kv_idx:
        r = kKV;
        break;
      case MaskOp::score:
        r = kScore;
        break;
      default:
        if (is_difference(n)) r = kD;
        else
          for (const auto& a : n.args) r |= reads(*a);
    }
    return reads_[&n] = r;
  }

  // Whether n is a float of (h, q_idx − kv_idx) worth a table: it reads the difference, and
  // nothing else that varies with the pair.
  bool relative(const MaskNode& n) {
    const uint8_t r = reads(n);
    return n.real && n.op != MaskOp::constant && (r & kD) && !(r & (kB | kQ | kKV | kScore));
  }

  // n with its largest relative subexpressions replaced by table reads.
  std::shared_ptr<const MaskNode> cut(const std::shared_ptr<const MaskNode>& n) {
    if (auto it = done_.find(n.get()); it != done_.end()) return it->second;
    std::shared_ptr<const MaskNode> out = n;
    if (relative(*n)) {
      ScoreTable t;
      check(p_.tables.size() < kMostScoreTables, "score function: more than ", kMostScoreTables,
            " subexpressions of (h, q_idx - kv_idx)");
      t.program = compile_any(MaskExpr(n));
      t.reads_h = t.program.reads_h;
      for (size_t i = 0; i < t.program.code.size(); ++i) {
        const MaskInstr& in = t.program.code[i];
        if (in.op == MaskOp::lookup && in.real && t.program.tensors[in.tensor]->grad)
          t.sources.push_back(static_cast<int32_t>(i));
      }
      check(t.sources.size() <= 31, "score function: a subexpression reads ", t.sources.size(),
            " learnable values; at most 31 are differentiated");
      t.depends = derivative_bits(t.program, t.sources);
      auto node = std::make_shared<MaskNode>();
      node->op = MaskOp::table;
      node->real = true;
      node->value = static_cast<int32_t>(p_.tables.size());
      p_.tables.push_back(std::move(t));
      out = node;
    } else if (!n->args.empty()) {
      std::vector<std::shared_ptr<const MaskNode>> args;
      bool changed = false;
      for (const auto& a : n->args) {
        args.push_back(cut(a));
        changed |= args.back() != a;
      }
      if (changed) {
        auto node = std::make_shared<MaskNode>(*n);
        node->args = std::move(args);
        out = node;
      }
    }
    return done_[n.get()] = out;
  }

 private:
  ScoreProgram& p_;
  std::map<const MaskNode*, uint8_t> reads_;
  std::map<const MaskNode*, std::shared_ptr<const MaskNode>> done_;
};

}  // namespace

std::vector<uint32_t> derivative_bits(const MaskProgram& p, const std::vector<int32_t>& sources) {
  // Registers are reused: follow what each one holds, instruction by instruction.
  std::vector<uint32_t> bits(p.code.size(), 0), held(p.real_registers, 0);
  for (size_t i = 0; i < p.code.size(); ++i) {
    const MaskInstr& in = p.code[i];
    if (!in.real) continue;  // integers and booleans carry no derivative
    uint32_t b = 0;
    for (size_t k = 0; k < sources.size(); ++k)
      if (sources[k] == static_cast<int32_t>(i)) b |= 2u << k;
    if (in.op == MaskOp::score) b |= 1;
    // Float operands: a and b (and for where, b and c; a is its condition).
    for (int k = 0; k < 3; ++k) {
      const int32_t r = k == 0 ? in.a : k == 1 ? in.b : in.c;
      if (r >= 0 && (in.real_operands >> k & 1)) b |= held[r];
    }
    if (in.op == MaskOp::lookup || in.op == MaskOp::table) b &= ~1u;  // (indices are integers)
    bits[i] = b;
    held[in.dst] = b;
  }
  return bits;
}

namespace {

// The DAG at n with each x / c, c a float constant whose reciprocal is a normal float, as
// x · (1 / c): one multiply where the division takes a vector divide (the softcap's
// tanh(score / c) · c: the fixed option's arithmetic), within 1.5 ulps of the division.
std::shared_ptr<const MaskNode> multiply_by_reciprocals(
    const std::shared_ptr<const MaskNode>& n,
    std::map<const MaskNode*, std::shared_ptr<const MaskNode>>& done) {
  if (auto it = done.find(n.get()); it != done.end()) return it->second;
  auto copy = std::make_shared<MaskNode>(*n);
  bool changed = false;
  for (auto& a : copy->args) {
    std::shared_ptr<const MaskNode> b = multiply_by_reciprocals(a, done);
    changed |= b != a;
    a = std::move(b);
  }
  if (copy->op == MaskOp::div && copy->real && copy->args.size() == 2) {
    const MaskNode& c = *copy->args[1];
    const bool constant = c.op == MaskOp::constant && c.real && std::isnormal(c.real_value);
    const float r = constant ? static_cast<float>(1.0 / static_cast<double>(c.real_value)) : 0;
    if (constant && std::isnormal(r)) {
      auto reciprocal = std::make_shared<MaskNode>(c);
      reciprocal->real_value = r;
      copy->op = MaskOp::mul, copy->args[1] = std::move(reciprocal), changed = true;
    }
  }
  return done[n.get()] = changed ? std::shared_ptr<const MaskNode>(copy) : n;
}

}  // namespace

ScoreProgram compile_score(const MaskExpr& f) {
  check(!f.is_bool(),
        "score function: the expression is a boolean (a mask: create_block_mask takes it); a "
        "score function gives a number, e.g. where(",
        to_string(f), ", score, -inf)");
  ScoreProgram p;
  TableCutter cutter(p);
  std::shared_ptr<const MaskNode> root = cutter.cut(f.shared());
  std::map<const MaskNode*, std::shared_ptr<const MaskNode>> rewritten;
  MaskExpr body(multiply_by_reciprocals(root, rewritten));
  if (!body.is_real()) body = to_float(body);  // an integer score function: a float
  p.nodes = {f.shared(), body.shared()};
  // score + x or x + score or score − x, x free of the score: the derivative is 1.
  const MaskNode& r = body.node();
  if ((r.op == MaskOp::add || r.op == MaskOp::sub) && r.args.size() == 2) {
    const bool left = r.args[0]->op == MaskOp::score && !(cutter.reads(*r.args[1]) & kScore);
    const bool right = r.op == MaskOp::add && r.args[1]->op == MaskOp::score &&
                       !(cutter.reads(*r.args[0]) & kScore);
    p.additive = left || right;
  }
  p.main = compile_any(body);
  for (size_t i = 0; i < p.main.code.size(); ++i) {
    const MaskInstr& in = p.main.code[i];
    const bool learnable_lookup =
        in.op == MaskOp::lookup && in.real && p.main.tensors[in.tensor]->grad != nullptr;
    const bool learnable_table = in.op == MaskOp::table && p.tables[in.value].learnable();
    if (learnable_lookup || learnable_table) p.sources.push_back(static_cast<int32_t>(i));
  }
  check(p.sources.size() <= 31, "score function: it reads ", p.sources.size(),
        " learnable values; at most 31 are differentiated");
  p.depends = derivative_bits(p.main, p.sources);
  p.reads_b = p.main.reads_b;
  p.reads_h = p.main.reads_h;
  for (const ScoreTable& t : p.tables) p.reads_h |= t.reads_h;
  return p;
}

}  // namespace qkv::detail

namespace qkv {

ScoreFunction::ScoreFunction(const MaskExpr& f)
    : expr_(std::make_shared<const MaskExpr>(f)),
      program_(std::make_shared<const detail::ScoreProgram>(detail::compile_score(f))) {}

bool ScoreFunction::learnable() const { return program_ && program_->learnable(); }

int64_t ScoreFunction::tables() const {
  return program_ ? static_cast<int64_t>(program_->tables.size()) : 0;
}

}  // namespace qkv
