// A compiled mask (mask/program.h) evaluated over lanes: each instruction one loop over a
// register of lanes, which the compiler turns into the target's vectors (this header is
// compiled once per SIMD target, inside HWY_BEFORE_NAMESPACE's target attributes). Lane e of a
// block of `rows` rows of `width` lanes is the pair at inner index e % width and outer index
// e / width; the kernels' score tiles put the queries along a row (q_inner).
#if defined(QKV_MASK_LANES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_MASK_LANES_INL_H_
#undef QKV_MASK_LANES_INL_H_
#else
#define QKV_MASK_LANES_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <hwy/highway.h>

#include "mask/program.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace mask_lanes {

// Where the lanes lie. Indices past the last real query or key (a tile's padding) are read as
// the last one, so that they never index a tensor where a real pair would not.
struct Lanes {
  int64_t b = 0, h = 0;
  int64_t q0 = 0, q_last = 0;
  int64_t kv0 = 0, kv_last = 0;
  int64_t width = 0;
  bool q_inner = true;
};

// Registers a program needs for `lanes` lanes: p.registers, and one for a lookup's flat index.
inline int64_t register_ints(const MaskProgram& p, int64_t lanes) {
  return (p.registers + 1) * lanes;
}

// Index lanes along rows (inner) or across them (outer), clamped to the real ones.
inline void fill_index(int32_t* d, int64_t rows, int64_t width, int64_t first, int64_t last,
                       bool inner) {
  for (int64_t o = 0; o < rows; ++o) {
    int32_t* row = d + o * width;
    if (inner) {
      for (int64_t i = 0; i < width; ++i) row[i] = static_cast<int32_t>(std::min(first + i, last));
    } else {
      std::fill(row, row + width, static_cast<int32_t>(std::min(first + o, last)));
    }
  }
}

// The flat element index of lookup `in` at each of n lanes, into the spare register
// (register p.registers), clamped into the tensor; with `miss`, the first index outside its
// tensor is reported there.
inline const int32_t* flat_indices(const MaskProgram& p, const MaskInstr& in, int64_t n,
                                   int32_t* regs, MaskMiss* miss) {
  const MaskTensorData& t = *p.tensors[in.tensor];
  int32_t* flat = regs + p.registers * n;
  for (int32_t k = 0; k < in.dims; ++k) {
    const int32_t* index = regs + p.operands[in.first_index + k] * n;
    const int32_t size = static_cast<int32_t>(t.shape[k]);
    const int32_t stride = static_cast<int32_t>(t.stride[k]);
    uint32_t outside = 0;
    for (int64_t e = 0; e < n; ++e) {
      const int32_t i = index[e];
      outside |= static_cast<uint32_t>(i) >= static_cast<uint32_t>(size);
      const int32_t at_k = std::min(std::max(i, 0), size - 1) * stride;
      flat[e] = k == 0 ? at_k : flat[e] + at_k;
    }
    if (outside && miss && !miss->found)
      for (int64_t e = 0; e < n; ++e)
        if (index[e] < 0 || index[e] >= size) {
          *miss = {true, in.tensor, k, index[e], e};
          break;
        }
  }
  return flat;
}

// d ← x op y (1 or 0) over n lanes, for a comparison op: of integers, or of floats (a score
// function's, mask/score_lanes-inl.h).
template <class T>
inline void compare_lanes(MaskOp op, const T* x, const T* y, int64_t n, int32_t* d) {
  switch (op) {
    case MaskOp::eq:
      for (int64_t e = 0; e < n; ++e) d[e] = x[e] == y[e];
      break;
    case MaskOp::ne:
      for (int64_t e = 0; e < n; ++e) d[e] = x[e] != y[e];
      break;
    case MaskOp::lt:
      for (int64_t e = 0; e < n; ++e) d[e] = x[e] < y[e];
      break;
    case MaskOp::le:
      for (int64_t e = 0; e < n; ++e) d[e] = x[e] <= y[e];
      break;
    case MaskOp::gt:
      for (int64_t e = 0; e < n; ++e) d[e] = x[e] > y[e];
      break;
    case MaskOp::ge:
      for (int64_t e = 0; e < n; ++e) d[e] = x[e] >= y[e];
      break;
    default:
      break;
  }
}

// Floor division and Python's remainder of x by y over n lanes (x / 0 = 0, x % 0 = x), into
// `quotient` or `remainder` (either may be null). A vector whose operands are all below 2^24 in
// magnitude divides in floats, which is then exact but for a quotient off by one, set right by
// the remainder's sign; others divide in doubles (exact for 32-bit operands), a lane at a time.
// (Doubles for every lane made a 2-D grid's score function, four divisions per pair, 3× slower.)
inline void floor_divide(const int32_t* x, const int32_t* y, int64_t n, int32_t* quotient,
                         int32_t* remainder) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::ScalableTag<int32_t> di;
  const hn::RebindToFloat<decltype(di)> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(di));
  const auto small = hn::Set(di, 1 << 24), minus_small = hn::Set(di, -(1 << 24));
  const auto zero = hn::Zero(di), one = hn::Set(di, 1);
  int64_t e = 0;
  for (; e + N <= n; e += N) {
    const auto vx = hn::LoadU(di, x + e), vy = hn::LoadU(di, y + e);
    const auto in_range = hn::And(hn::And(hn::Gt(vx, minus_small), hn::Lt(vx, small)),
                                  hn::And(hn::Gt(vy, minus_small), hn::Lt(vy, small)));
    if (!hn::AllTrue(di, in_range)) break;  // (the lanes from here on: in doubles)
    const auto by_zero = hn::Eq(vy, zero);
    const auto ys = hn::IfThenElse(by_zero, one, vy);
    auto q = hn::ConvertTo(di, hn::Floor(hn::Div(hn::ConvertTo(df, vx), hn::ConvertTo(df, ys))));
    const auto r = hn::Sub(vx, hn::Mul(q, ys));
    // The remainder has the divisor's sign and is smaller: y > 0, 0 <= r < y; y < 0, y < r <= 0.
    const auto positive = hn::Gt(ys, zero);
    const auto up = hn::Or(hn::And(positive, hn::Not(hn::Lt(r, ys))),
                           hn::AndNot(positive, hn::Not(hn::Gt(r, ys))));
    const auto down =
        hn::Or(hn::And(positive, hn::Lt(r, zero)), hn::AndNot(positive, hn::Gt(r, zero)));
    q = hn::Sub(hn::Add(q, hn::IfThenElseZero(up, one)), hn::IfThenElseZero(down, one));
    if (quotient) hn::StoreU(hn::IfThenZeroElse(by_zero, q), di, quotient + e);
    if (remainder)
      hn::StoreU(hn::IfThenElse(by_zero, vx, hn::Sub(vx, hn::Mul(q, ys))), di, remainder + e);
  }
  for (; e < n; ++e) {
    const int64_t s = y[e] == 0 ? 1 : y[e];
    const auto q = static_cast<int64_t>(std::floor(static_cast<double>(x[e]) / s));
    if (quotient) quotient[e] = y[e] == 0 ? 0 : static_cast<int32_t>(q);
    if (remainder) remainder[e] = y[e] == 0 ? x[e] : static_cast<int32_t>(x[e] - s * q);
  }
}

// One integer or boolean instruction of p over rows × at.width lanes of regs (operands that
// are integers or booleans too). Returns false, doing nothing, for an instruction that reads or
// writes floats (the score evaluator's: mask/score_lanes-inl.h).
inline bool integer_step(const MaskProgram& p, const MaskInstr& in, const Lanes& at, int64_t rows,
                         int32_t* regs, MaskMiss* miss) {
  if (in.real || in.real_operands) return false;
  const int64_t n = rows * at.width;
  auto reg = [&](int32_t r) { return regs + r * n; };
  // (Sums and products wrap as unsigned, never overflow: create_block_mask has shown that
  // no real pair leaves 32 bits.)
  auto wrap = [](uint32_t x) { return static_cast<int32_t>(x); };
  int32_t* d = reg(in.dst);
  const int32_t* x = in.a >= 0 ? reg(in.a) : nullptr;
  const int32_t* y = in.b >= 0 ? reg(in.b) : nullptr;
  const int32_t* z = in.c >= 0 ? reg(in.c) : nullptr;
  switch (in.op) {
    case MaskOp::constant:
      std::fill(d, d + n, in.value);
      break;
    case MaskOp::batch:
      std::fill(d, d + n, static_cast<int32_t>(at.b));
      break;
    case MaskOp::head:
      std::fill(d, d + n, static_cast<int32_t>(at.h));
      break;
    case MaskOp::q_idx:
      fill_index(d, rows, at.width, at.q0, at.q_last, at.q_inner);
      break;
    case MaskOp::kv_idx:
      fill_index(d, rows, at.width, at.kv0, at.kv_last, !at.q_inner);
      break;
    case MaskOp::lookup: {
      const int32_t* flat = flat_indices(p, in, n, regs, miss);
      const int32_t* values = p.tensors[in.tensor]->values.data();
      for (int64_t e = 0; e < n; ++e) d[e] = values[flat[e]];
      break;
    }
    case MaskOp::add:
      for (int64_t e = 0; e < n; ++e) d[e] = wrap(static_cast<uint32_t>(x[e]) + y[e]);
      break;
    case MaskOp::sub:
      for (int64_t e = 0; e < n; ++e) d[e] = wrap(static_cast<uint32_t>(x[e]) - y[e]);
      break;
    case MaskOp::mul:
      for (int64_t e = 0; e < n; ++e) d[e] = wrap(static_cast<uint32_t>(x[e]) * y[e]);
      break;
    case MaskOp::div:  // floor(x / y); x / 0 = 0
      floor_divide(x, y, n, d, nullptr);
      break;
    case MaskOp::mod:  // x − y · floor(x / y) (-2^31 % -1 too); x % 0 = x
      floor_divide(x, y, n, nullptr, d);
      break;
    case MaskOp::neg:
      for (int64_t e = 0; e < n; ++e) d[e] = wrap(0u - static_cast<uint32_t>(x[e]));
      break;
    case MaskOp::min:
      for (int64_t e = 0; e < n; ++e) d[e] = std::min(x[e], y[e]);
      break;
    case MaskOp::max:
      for (int64_t e = 0; e < n; ++e) d[e] = std::max(x[e], y[e]);
      break;
    case MaskOp::abs:
      for (int64_t e = 0; e < n; ++e)
        d[e] = x[e] < 0 ? wrap(0u - static_cast<uint32_t>(x[e])) : x[e];
      break;
    case MaskOp::eq:
    case MaskOp::ne:
    case MaskOp::lt:
    case MaskOp::le:
    case MaskOp::gt:
    case MaskOp::ge:
      compare_lanes(in.op, x, y, n, d);
      break;
    case MaskOp::logical_and:
      for (int64_t e = 0; e < n; ++e) d[e] = x[e] & y[e];
      break;
    case MaskOp::logical_or:
      for (int64_t e = 0; e < n; ++e) d[e] = x[e] | y[e];
      break;
    case MaskOp::logical_not:
      for (int64_t e = 0; e < n; ++e) d[e] = x[e] ^ 1;
      break;
    case MaskOp::where:
      for (int64_t e = 0; e < n; ++e) d[e] = x[e] ? y[e] : z[e];
      break;
    default:  // (floats: never here, see above)
      return false;
  }
  return true;
}

// Evaluates p over rows × at.width lanes into regs (register_ints of them); returns the register
// holding the mask (0 or 1 per lane). Lookups read clamped indices; with `miss`, the first index
// outside its tensor is reported there.
inline const int32_t* evaluate(const MaskProgram& p, const Lanes& at, int64_t rows, int32_t* regs,
                               MaskMiss* miss) {
  for (const MaskInstr& in : p.code) integer_step(p, in, at, rows, regs, miss);
  return regs + p.result * rows * at.width;
}

}  // namespace mask_lanes
}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
