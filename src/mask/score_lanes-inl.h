// A compiled score function (mask/score_program.h) evaluated over lanes, as a mask is
// (mask/lanes-inl.h, whose integer steps it shares): each float instruction one loop over a
// register of lanes, exp, log and tanh a vector at a time. With derivatives (the backward),
// each float register also carries its derivative with respect to the score and to each
// learnable value the program reads, forward mode: only those derivative_bits says can be
// nonzero are computed.
#if defined(QKV_MASK_SCORE_LANES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_MASK_SCORE_LANES_INL_H_
#undef QKV_MASK_SCORE_LANES_INL_H_
#else
#define QKV_MASK_SCORE_LANES_INL_H_
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "mask/lanes-inl.h"
#include "mask/score_program.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace score_lanes {

namespace hn = hwy::HWY_NAMESPACE;
using mask_lanes::Lanes;

// What a program reads besides its registers.
struct ScoreInputs {
  const float* score = nullptr;          // the score at each lane (none for a table's program)
  const float* const* tables = nullptr;  // per table: the row of the lanes' head
  int64_t zero = 0;                      // entry zero + d holds q_idx − kv_idx = d
};

// Float registers are `lane_stride` floats apart: lanes rounded up to whole vectors of the
// widest target (loops run whole vectors).
inline int64_t lane_stride(int64_t lanes) { return (lanes + 63) / 64 * 64; }

// Floats a program needs over `lanes` lanes: its float registers, each with `slots`
// derivatives (0: values only).
inline int64_t register_floats(const MaskProgram& p, int64_t lanes, int64_t slots) {
  return std::max<int64_t>(p.real_registers, 1) * (1 + slots) * lane_stride(lanes);
}

// Where register r's value (slot 0) or derivative k (slot 1 + k) lies.
struct FloatRegisters {
  float* base;
  int64_t stride, slots;
  float* value(int32_t r) const { return base + r * (1 + slots) * stride; }
  float* derivative(int32_t r, int64_t k) const { return value(r) + (1 + k) * stride; }
};

// Highway's exp and log hold only on their ranges (exp: below 88.7 and above −104; log: on
// (0, FLT_MAX]): IEEE's answers outside them, NaN in NaN out, as std:: and PyTorch give.
template <class D, class V>
V ieee_exp(D d, V x) {
  const V high = hn::Set(d, 88.72f), low = hn::Set(d, -104.0f);
  V y = hn::Exp(d, hn::Min(hn::Max(x, low), high));
  y = hn::IfThenElse(hn::Gt(x, high), hn::Set(d, HUGE_VALF), y);
  y = hn::IfThenZeroElse(hn::Lt(x, low), y);
  return hn::IfThenElse(hn::IsNaN(x), x, y);
}
template <class D, class V>
V ieee_log(D d, V x) {
  V y = hn::Log(d, hn::Max(x, hn::Set(d, 1e-38f)));
  y = hn::IfThenElse(hn::Eq(x, hn::Zero(d)), hn::Set(d, -HUGE_VALF), y);
  y = hn::IfThenElse(hn::Eq(x, hn::Set(d, HUGE_VALF)), x, y);
  y = hn::IfThenElse(hn::Lt(x, hn::Zero(d)), hn::Set(d, NAN), y);
  return hn::IfThenElse(hn::IsNaN(x), x, y);
}

template <class F>
void each_vector(int64_t n, F&& f) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t e = 0; e < n; e += N) f(d, e);
}

// The values of one float instruction over n lanes (its operands' values read from r).
inline void real_step(const MaskProgram& p, const MaskInstr& in, const Lanes& at, int64_t rows,
                      const ScoreInputs& inputs, int32_t* regs, const FloatRegisters& r,
                      MaskMiss* miss) {
  const int64_t n = rows * at.width;
  float* d = r.value(in.dst);
  const float* x = in.a >= 0 && (in.real_operands & 1) ? r.value(in.a) : nullptr;
  const float* y = in.b >= 0 && (in.real_operands & 2) ? r.value(in.b) : nullptr;
  const float* z = in.c >= 0 && (in.real_operands & 4) ? r.value(in.c) : nullptr;
  const int32_t* ix = in.a >= 0 && !(in.real_operands & 1) ? regs + in.a * n : nullptr;
  switch (in.op) {
    case MaskOp::constant:
      std::fill(d, d + n, in.real_value);
      break;
    case MaskOp::score:
      std::copy(inputs.score, inputs.score + n, d);
      break;
    case MaskOp::to_float:
      for (int64_t e = 0; e < n; ++e) d[e] = static_cast<float>(ix[e]);
      break;
    case MaskOp::lookup: {
      const int32_t* flat = mask_lanes::flat_indices(p, in, n, regs, miss);
      const float* values = p.tensors[in.tensor]->reals;
      for (int64_t e = 0; e < n; ++e) d[e] = values[flat[e]];
      break;
    }
    case MaskOp::table: {
      const float* row = inputs.tables[in.value] + inputs.zero;  // entry d = q − kv
      for (int64_t o = 0; o < rows; ++o) {
        float* to = d + o * at.width;
        if (!at.q_inner) {  // (a row of keys: the entries run backwards)
          const int64_t q = std::min(at.q0 + o, at.q_last);
          for (int64_t i = 0; i < at.width; ++i) to[i] = row[q - std::min(at.kv0 + i, at.kv_last)];
          continue;
        }
        // A row of queries: one contiguous run of the table, then the last query's entry
        // repeated over the padding lanes.
        const int64_t kv = std::min(at.kv0 + o, at.kv_last);
        const int64_t real = std::clamp<int64_t>(at.q_last - at.q0 + 1, 0, at.width);
        std::copy_n(row + at.q0 - kv, real, to);
        std::fill(to + real, to + at.width, row[at.q_last - kv]);
      }
      break;
    }
    case MaskOp::add:
      for (int64_t e = 0; e < n; ++e) d[e] = x[e] + y[e];
      break;
    case MaskOp::sub:
      for (int64_t e = 0; e < n; ++e) d[e] = x[e] - y[e];
      break;
    case MaskOp::mul:
      for (int64_t e = 0; e < n; ++e) d[e] = x[e] * y[e];
      break;
    case MaskOp::div:
      for (int64_t e = 0; e < n; ++e) d[e] = x[e] / y[e];
      break;
    case MaskOp::neg:
      for (int64_t e = 0; e < n; ++e) d[e] = -x[e];
      break;
    case MaskOp::min:  // NaN wins, as torch.minimum
      for (int64_t e = 0; e < n; ++e)
        d[e] = x[e] != x[e] || y[e] != y[e] ? x[e] + y[e] : std::min(x[e], y[e]);
      break;
    case MaskOp::max:
      for (int64_t e = 0; e < n; ++e)
        d[e] = x[e] != x[e] || y[e] != y[e] ? x[e] + y[e] : std::max(x[e], y[e]);
      break;
    case MaskOp::abs:
      for (int64_t e = 0; e < n; ++e) d[e] = std::abs(x[e]);
      break;
    case MaskOp::exp:
      each_vector(n, [&](auto df, int64_t e) {
        hn::StoreU(ieee_exp(df, hn::LoadU(df, x + e)), df, d + e);
      });
      break;
    case MaskOp::log:
      each_vector(n, [&](auto df, int64_t e) {
        hn::StoreU(ieee_log(df, hn::LoadU(df, x + e)), df, d + e);
      });
      break;
    case MaskOp::tanh:  // (±1 beyond ±9: Highway's tanh holds there; NaN stays NaN)
      each_vector(n, [&](auto df, int64_t e) {
        const auto v = hn::LoadU(df, x + e);
        const auto t = hn::Tanh(df, hn::Min(hn::Max(v, hn::Set(df, -9.0f)), hn::Set(df, 9.0f)));
        hn::StoreU(hn::IfThenElse(hn::IsNaN(v), v, t), df, d + e);
      });
      break;
    case MaskOp::sigmoid:  // 1 / (1 + e^−x)
      each_vector(n, [&](auto df, int64_t e) {
        const auto one = hn::Set(df, 1.0f);
        hn::StoreU(hn::Div(one, hn::Add(one, ieee_exp(df, hn::Neg(hn::LoadU(df, x + e))))), df,
                   d + e);
      });
      break;
    case MaskOp::sqrt:
      for (int64_t e = 0; e < n; ++e) d[e] = std::sqrt(x[e]);
      break;
    case MaskOp::where: {
      const int32_t* c = regs + in.a * n;
      for (int64_t e = 0; e < n; ++e) d[e] = c[e] ? y[e] : z[e];
      break;
    }
    default:
      break;
  }
}

// A comparison of two floats into an integer register.
inline void compare_step(const MaskInstr& in, int64_t n, int32_t* regs, const FloatRegisters& r) {
  int32_t* d = regs + in.dst * n;
  const float* x = r.value(in.a);
  const float* y = r.value(in.b);
  mask_lanes::compare_lanes(in.op, x, y, n, d);
}

// The derivatives of one float instruction's value (the slots `bits` names; `held` says which
// slots each register's derivatives hold), after its value is computed.
inline void derivative_step(const MaskInstr& in, uint32_t bits, const uint32_t* held, int64_t n,
                            const int32_t* regs, const FloatRegisters& r) {
  const float* x = in.a >= 0 && (in.real_operands & 1) ? r.value(in.a) : nullptr;
  const float* y = in.b >= 0 && (in.real_operands & 2) ? r.value(in.b) : nullptr;
  const float* out = r.value(in.dst);
  for (int64_t k = 0; k < r.slots; ++k) {
    if (!(bits >> k & 1)) continue;
    float* t = r.derivative(in.dst, k);
    // An operand's derivative k, or null when it is zero.
    auto of = [&](int which) -> const float* {
      const int32_t reg = which == 0 ? in.a : which == 1 ? in.b : in.c;
      if (reg < 0 || !(in.real_operands >> which & 1) || !(held[reg] >> k & 1)) return nullptr;
      return r.derivative(reg, k);
    };
    const float *ta = of(0), *tb = of(1);
    auto fill = [&](auto&& f) {
      for (int64_t e = 0; e < n; ++e) t[e] = f(e);
    };
    auto at = [](const float* p, int64_t e) { return p ? p[e] : 0.0f; };
    switch (in.op) {
      case MaskOp::score:
      case MaskOp::lookup:
      case MaskOp::table:
        std::fill(t, t + n, 1.0f);  // (its own slot: the only bit it has)
        break;
      case MaskOp::add:
        fill([&](int64_t e) { return at(ta, e) + at(tb, e); });
        break;
      case MaskOp::sub:
        fill([&](int64_t e) { return at(ta, e) - at(tb, e); });
        break;
      case MaskOp::mul:
        fill([&](int64_t e) { return at(ta, e) * y[e] + x[e] * at(tb, e); });
        break;
      case MaskOp::div:
        fill([&](int64_t e) { return (at(ta, e) - out[e] * at(tb, e)) / y[e]; });
        break;
      case MaskOp::neg:
        fill([&](int64_t e) { return -at(ta, e); });
        break;
      case MaskOp::min:  // to the operand taken (x on a tie)
        fill([&](int64_t e) { return x[e] <= y[e] ? at(ta, e) : at(tb, e); });
        break;
      case MaskOp::max:
        fill([&](int64_t e) { return x[e] >= y[e] ? at(ta, e) : at(tb, e); });
        break;
      case MaskOp::abs:  // sign(x), 0 at 0 (as torch)
        fill([&](int64_t e) { return x[e] > 0 ? at(ta, e) : x[e] < 0 ? -at(ta, e) : 0.0f; });
        break;
      case MaskOp::exp:
        fill([&](int64_t e) { return out[e] * at(ta, e); });
        break;
      case MaskOp::log:
        fill([&](int64_t e) { return at(ta, e) / x[e]; });
        break;
      case MaskOp::tanh:
        fill([&](int64_t e) { return (1 - out[e] * out[e]) * at(ta, e); });
        break;
      case MaskOp::sigmoid:
        fill([&](int64_t e) { return out[e] * (1 - out[e]) * at(ta, e); });
        break;
      case MaskOp::sqrt:
        fill([&](int64_t e) { return 0.5f * at(ta, e) / out[e]; });
        break;
      case MaskOp::where: {
        const int32_t* c = regs + in.a * n;
        const float* tz = of(2);
        fill([&](int64_t e) { return c[e] ? at(tb, e) : at(tz, e); });
        break;
      }
      default:  // constants and float(int): no derivative (never in bits)
        std::fill(t, t + n, 0.0f);
    }
  }
}

// Evaluates the program p over rows × at.width lanes: integer registers in regs
// (mask_lanes::register_ints of them), float ones in `reals` (register_floats with `slots`).
// With slots > 0 (bits: derivative_bits of p, `held`: one word per float register), each float
// register also gets the derivatives bits names, and the flat index each lane of a learnable
// lookup (source k, slot 1 + k) read goes to source_index[k] when that is not null. Returns the
// result's register (its derivatives: those held[result] names; the others are zero).
inline int32_t evaluate(const MaskProgram& p, const Lanes& at, int64_t rows,
                        const ScoreInputs& inputs, int32_t* regs, const FloatRegisters& r,
                        const uint32_t* bits, uint32_t* held, int32_t* const* source_index,
                        MaskMiss* miss) {
  const int64_t n = rows * at.width;
  for (size_t i = 0; i < p.code.size(); ++i) {
    const MaskInstr& in = p.code[i];
    if (mask_lanes::integer_step(p, in, at, rows, regs, miss)) continue;
    if (!in.real) {  // a comparison of floats
      compare_step(in, n, regs, r);
      continue;
    }
    real_step(p, in, at, rows, inputs, regs, r, miss);
    if (r.slots > 0) {
      derivative_step(in, bits[i], held, n, regs, r);
      held[in.dst] = bits[i];
      if (in.op == MaskOp::lookup && bits[i] > 1 && source_index) {
        const int k = std::countr_zero(bits[i]) - 1;  // (a source's bits: its own alone)
        if (source_index[k]) std::copy_n(regs + p.registers * n, n, source_index[k]);
      }
    }
  }
  return p.result;
}

}  // namespace score_lanes
}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
