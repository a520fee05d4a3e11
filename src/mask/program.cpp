// Compiling a mask expression to instructions, and its interval arithmetic (mask/program.h).
#include "mask/program.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <map>
#include <tuple>

#include "qkv/error.h"

namespace qkv::detail {
namespace {

// One instruction per distinct operation: nodes equal in op, value, tensor and operands share it.
class Compiler {
 public:
  explicit Compiler(MaskProgram& p) : p_(p) {}

  int32_t emit(const MaskNode& n) {
    if (auto it = by_node_.find(&n); it != by_node_.end()) return it->second;
    std::vector<int32_t> args;
    for (const auto& a : n.args) args.push_back(emit(*a));
    int32_t tensor = -1;
    if (n.tensor) {
      auto found = std::find(p_.tensors.begin(), p_.tensors.end(), n.tensor);
      tensor = static_cast<int32_t>(found - p_.tensors.begin());
      if (found == p_.tensors.end()) p_.tensors.push_back(n.tensor);
    }
    const auto key =
        std::make_tuple(n.op, n.value, std::bit_cast<uint32_t>(n.real_value), n.real, tensor, args);
    if (auto it = by_key_.find(key); it != by_key_.end()) return by_node_[&n] = it->second;
    MaskInstr in{n.op};
    in.node = &n;
    in.value = n.value;
    in.real_value = n.real_value;
    in.real = n.real;
    for (size_t k = 0; k < n.args.size() && k < 3; ++k)
      if (n.args[k]->real) in.real_operands |= static_cast<uint8_t>(1u << k);
    in.tensor = tensor;
    if (n.op == MaskOp::lookup) {
      in.first_index = static_cast<int32_t>(p_.operands.size());
      in.dims = static_cast<int32_t>(args.size());
      p_.operands.insert(p_.operands.end(), args.begin(), args.end());
    } else {
      if (args.size() > 0) in.a = args[0];
      if (args.size() > 1) in.b = args[1];
      if (args.size() > 2) in.c = args[2];
    }
    in.dst = static_cast<int32_t>(p_.code.size());  // a value number for now: registers below
    p_.code.push_back(in);
    return by_key_[key] = by_node_[&n] = in.dst;
  }

 private:
  MaskProgram& p_;
  std::map<const MaskNode*, int32_t> by_node_;
  std::map<std::tuple<MaskOp, int32_t, uint32_t, bool, int32_t, std::vector<int32_t>>, int32_t>
      by_key_;
};

// Value numbers → registers: a register is free again after its value's last read. Integers
// and booleans take the integer registers, floats the float ones. An instruction reads its
// operands at a lane before it writes that lane, so dst may be one of them.
void allocate_registers(MaskProgram& p, int32_t result) {
  const int32_t n = static_cast<int32_t>(p.code.size());
  std::vector<int32_t> last_read(n, -1);
  auto reads = [&](const MaskInstr& in, auto&& f) {
    for (int32_t r : {in.a, in.b, in.c})
      if (r >= 0) f(r);
    for (int32_t k = 0; k < in.dims; ++k) f(p.operands[in.first_index + k]);
  };
  for (int32_t i = 0; i < n; ++i) reads(p.code[i], [&](int32_t v) { last_read[v] = i; });
  last_read[result] = n;  // read after the program
  std::vector<int32_t> reg(n, -1), free[2];
  int32_t count[2] = {0, 0};
  auto pool = [&](int32_t v) { return p.code[v].real ? 1 : 0; };
  for (int32_t i = 0; i < n; ++i) {
    MaskInstr& in = p.code[i];
    std::vector<int32_t>& mine = free[pool(i)];
    // A float's derivatives read its operands after its value is written (score_lanes-inl.h):
    // its register is taken before theirs are freed, so that it is none of them.
    int32_t r = -1;
    auto take = [&] {
      r = mine.empty() ? count[pool(i)]++ : mine.back();
      if (!mine.empty()) mine.pop_back();
    };
    if (in.real) take();
    reads(in, [&](int32_t v) {
      if (last_read[v] == i && reg[v] >= 0) {
        free[pool(v)].push_back(reg[v]);
        reg[v] = -reg[v] - 2;  // freed; keep the number for the rewrite below
      }
    });
    if (!in.real) take();
    auto to_reg = [&](int32_t v) { return reg[v] >= 0 ? reg[v] : -reg[v] - 2; };
    for (int32_t* o : {&in.a, &in.b, &in.c})
      if (*o >= 0) *o = to_reg(*o);
    for (int32_t k = 0; k < in.dims; ++k)
      p.operands[in.first_index + k] = to_reg(p.operands[in.first_index + k]);
    reg[i] = r;
    in.dst = r;
    // (A value never read is free at once.)
    if (last_read[i] < 0) mine.push_back(r), reg[i] = -r - 2;
  }
  p.registers = std::max(count[0], 1);
  p.real_registers = count[1];
  p.result = reg[result] >= 0 ? reg[result] : -reg[result] - 2;
  p.result_real = p.code[result].real;
}

}  // namespace

MaskProgram compile(const MaskExpr& mask) {
  check(!has_reals(mask.node()),
        "mask: a mask function takes integers and booleans; floats and the score are for score "
        "functions (include/qkv/score_function.h)");
  check(mask.is_bool(),
        "mask: the expression is an integer, not a boolean (compare it: ", to_string(mask),
        " != 0)");
  return compile_any(mask);
}

MaskProgram compile_any(const MaskExpr& expr) {
  MaskProgram p;
  Compiler c(p);
  const int32_t result = c.emit(expr.node());
  for (const MaskInstr& in : p.code) {
    p.reads_b |= in.op == MaskOp::batch;
    p.reads_h |= in.op == MaskOp::head;
  }
  allocate_registers(p, result);
  return p;
}

TensorRanges::TensorRanges(const MaskTensorData& t) : n_(static_cast<int64_t>(t.values.size())) {
  min_.push_back(t.values);
  max_.push_back(t.values);
  for (int64_t len = 2; len <= n_; len *= 2) {
    const auto& pmin = min_.back();
    const auto& pmax = max_.back();
    std::vector<int32_t> lo(n_ - len + 1), hi(n_ - len + 1);
    for (int64_t i = 0; i + len <= n_; ++i) {
      lo[i] = std::min(pmin[i], pmin[i + len / 2]);
      hi[i] = std::max(pmax[i], pmax[i + len / 2]);
    }
    min_.push_back(std::move(lo));
    max_.push_back(std::move(hi));
  }
}

void TensorRanges::range(int64_t first, int64_t last, int64_t& lo, int64_t& hi) const {
  int k = 0;
  while ((int64_t{2} << k) <= last - first + 1) ++k;
  const int64_t second = last - (int64_t{1} << k) + 1;
  lo = std::min(min_[k][first], min_[k][second]);
  hi = std::max(max_[k][first], max_[k][second]);
}

namespace {

constexpr int64_t kHuge = int64_t{1} << 62;  // beyond any product of two 32-bit ranges

// x + y, clamped to ±2^62 (summed in 128 bits: no overflow).
int64_t wide_sum(int64_t x, int64_t y) {
  return static_cast<int64_t>(std::clamp<__int128>(static_cast<__int128>(x) + y, -kHuge, kHuge));
}

// Floor division over x in [xl, xh] by d in [dl, dh] with d of one sign (no zero): monotone in
// each argument, so the corners bound it.
void divide_signed(int64_t xl, int64_t xh, int64_t dl, int64_t dh, int64_t& lo, int64_t& hi) {
  const int64_t c[4] = {floor_div(xl, dl), floor_div(xl, dh), floor_div(xh, dl), floor_div(xh, dh)};
  lo = *std::min_element(c, c + 4);
  hi = *std::max_element(c, c + 4);
}

void join(int64_t& lo, int64_t& hi, int64_t l, int64_t h, bool& any) {
  if (!any) lo = l, hi = h, any = true;
  else lo = std::min(lo, l), hi = std::max(hi, h);
}

void divide(int64_t xl, int64_t xh, int64_t dl, int64_t dh, int64_t& lo, int64_t& hi) {
  bool any = false;
  int64_t l, h;
  if (dl <= -1) divide_signed(xl, xh, dl, std::min<int64_t>(dh, -1), l, h), join(lo, hi, l, h, any);
  if (dl <= 0 && dh >= 0) join(lo, hi, 0, 0, any);  // x / 0 = 0
  if (dh >= 1) divide_signed(xl, xh, std::max<int64_t>(dl, 1), dh, l, h), join(lo, hi, l, h, any);
}

void remainder(int64_t xl, int64_t xh, int64_t dl, int64_t dh, int64_t& lo, int64_t& hi) {
  bool any = false;
  if (dl == dh && dl != 0 && floor_div(xl, dl) == floor_div(xh, dl)) {
    // One period of a constant divisor: x % d = x − k d for one k.
    const int64_t k = floor_div(xl, dl);
    lo = std::min(xl - k * dl, xh - k * dl), hi = std::max(xl - k * dl, xh - k * dl);
    return;
  }
  if (dl <= -1) join(lo, hi, std::max(dl, -kHuge) + 1, 0, any);  // (d, 0]
  if (dl <= 0 && dh >= 0) join(lo, hi, xl, xh, any);             // x % 0 = x
  if (dh >= 1) join(lo, hi, 0, std::min(dh, kHuge) - 1, any);    // [0, d)
}

}  // namespace

void intervals(const MaskProgram& p, const std::vector<TensorRanges>& ranges, const IndexBox& box,
               MaskIntervals& out) {
  out.lo.resize(p.registers);
  out.hi.resize(p.registers);
  intervals(p, ranges.data(), box, out.lo.data(), out.hi.data(), out);
}

BlockState box_state(const MaskProgram& p, const IndexBox& box) {
  int64_t lo[64], hi[64];
  if (p.registers > 64) return BlockState::partial;
  MaskIntervals report;
  intervals(p, nullptr, box, lo, hi, report);
  if (report.lookup_outside || lo[p.result] != hi[p.result]) return BlockState::partial;
  return lo[p.result] ? BlockState::full : BlockState::empty;
}

void intervals(const MaskProgram& p, const TensorRanges* ranges, const IndexBox& box, int64_t* lo,
               int64_t* hi, MaskIntervals& out) {
  out.lookup_outside = false;
  out.wide = -1;
  for (const MaskInstr& in : p.code) {
    // Floats have no ranges here; a comparison of floats may give either boolean.
    if (in.real && in.op != MaskOp::lookup) continue;
    if (in.real_operands) {
      lo[in.dst] = 0, hi[in.dst] = 1;
      continue;
    }
    const int64_t al = in.a >= 0 ? lo[in.a] : 0, ah = in.a >= 0 ? hi[in.a] : 0;
    const int64_t bl = in.b >= 0 ? lo[in.b] : 0, bh = in.b >= 0 ? hi[in.b] : 0;
    int64_t l = 0, h = 0;
    switch (in.op) {
      case MaskOp::constant:
        l = h = in.value;
        break;
      case MaskOp::batch:
        l = box.b0, h = box.b1;
        break;
      case MaskOp::head:
        l = box.h0, h = box.h1;
        break;
      case MaskOp::q_idx:
        l = box.q0, h = box.q1;
        break;
      case MaskOp::kv_idx:
        l = box.k0, h = box.k1;
        break;
      case MaskOp::lookup: {
        const MaskTensorData& t = *p.tensors[in.tensor];
        bool inside = true, one_run = true;
        int64_t first = 0, last = 0;
        for (int32_t d = 0; d < in.dims; ++d) {
          const int32_t r = p.operands[in.first_index + d];
          if (lo[r] < 0 || hi[r] >= t.shape[d]) inside = false;
          // The elements form one run when every dim but the last is a single index.
          if (d + 1 < in.dims && lo[r] != hi[r]) one_run = false;
          first += std::max<int64_t>(lo[r], 0) * t.stride[d];
          last += std::min<int64_t>(hi[r], t.shape[d] - 1) * t.stride[d];
        }
        if (!inside) out.lookup_outside = true;
        if (t.real()) continue;  // (a float: its index checked, no range)
        if (inside && one_run && ranges) {
          ranges[in.tensor].range(first, last, l, h);
        } else if (inside && one_run && last - first < 256) {
          l = h = t.values[first];
          for (int64_t e = first + 1; e <= last; ++e)
            l = std::min<int64_t>(l, t.values[e]), h = std::max<int64_t>(h, t.values[e]);
        } else {
          l = t.min, h = t.max;
        }
        break;
      }
      case MaskOp::add:
        l = wide_sum(al, bl), h = wide_sum(ah, bh);
        break;
      case MaskOp::sub:
        l = wide_sum(al, -bh), h = wide_sum(ah, -bl);
        break;
      case MaskOp::mul: {
        // (Operands stay within ±2^62 only when clamped: products of clamped values are bounded
        // by their saturation.)
        auto times = [](int64_t x, int64_t y) {
          __int128 z = static_cast<__int128>(x) * y;
          return static_cast<int64_t>(std::clamp<__int128>(z, -kHuge, kHuge));
        };
        const int64_t c[4] = {times(al, bl), times(al, bh), times(ah, bl), times(ah, bh)};
        l = *std::min_element(c, c + 4), h = *std::max_element(c, c + 4);
        break;
      }
      case MaskOp::div:
        divide(al, ah, bl, bh, l, h);
        break;
      case MaskOp::mod:
        remainder(al, ah, bl, bh, l, h);
        break;
      case MaskOp::neg:
        l = -ah, h = -al;
        break;
      case MaskOp::min:
        l = std::min(al, bl), h = std::min(ah, bh);
        break;
      case MaskOp::max:
        l = std::max(al, bl), h = std::max(ah, bh);
        break;
      case MaskOp::abs:
        if (al >= 0) l = al, h = ah;
        else if (ah <= 0) l = -ah, h = -al;
        else l = 0, h = std::max(-al, ah);
        break;
      // Comparisons: decided when the ranges are apart (or one point each, for equality).
      case MaskOp::eq:
        l = al == ah && bl == bh && al == bl;
        h = !(ah < bl || bh < al);
        break;
      case MaskOp::ne:
        l = ah < bl || bh < al;
        h = !(al == ah && bl == bh && al == bl);
        break;
      case MaskOp::lt:
        l = ah < bl, h = al < bh;
        break;
      case MaskOp::le:
        l = ah <= bl, h = al <= bh;
        break;
      case MaskOp::gt:
        l = al > bh, h = ah > bl;
        break;
      case MaskOp::ge:
        l = al >= bh, h = ah >= bl;
        break;
      case MaskOp::logical_and:
        l = std::min(al, bl), h = std::min(ah, bh);
        break;
      case MaskOp::logical_or:
        l = std::max(al, bl), h = std::max(ah, bh);
        break;
      case MaskOp::logical_not:
        l = 1 - ah, h = 1 - al;
        break;
      case MaskOp::where: {
        const int64_t cl = lo[in.c], ch = hi[in.c];
        if (al == 1) l = bl, h = bh;       // always x
        else if (ah == 0) l = cl, h = ch;  // always y
        else l = std::min(bl, cl), h = std::max(bh, ch);
        break;
      }
      default:  // (the float operations, skipped above)
        break;
    }
    lo[in.dst] = l;
    hi[in.dst] = h;
    if (out.wide < 0 &&
        (l < std::numeric_limits<int32_t>::min() || h > std::numeric_limits<int32_t>::max())) {
      out.wide = static_cast<int32_t>(&in - p.code.data());
      out.wide_lo = l, out.wide_hi = h;
    }
  }
}

}  // namespace qkv::detail
