// bf16 and fp16 attention: each combination of element types the API takes, forward and
// backward, on a grid of options, against float64 math over the same rounded inputs.
//
// The bound comes from the rounding. The inputs are rounded to the 16-bit type first and the
// float64 answer is computed from the rounded values, so input rounding is not error. What is
// left: the fp32 arithmetic (the fp32 kernels' own tolerance, attention_problem.h) and, for a
// 16-bit output, its rounding to nearest even, at most half an ulp: |x| · 2^-8 in bf16,
// |x| · 2^-11 in fp16. In the backward, a 16-bit out also enters Di = rowsum(dO ∘ O) rounded;
// its effect is bounded from the data below. The widening kernels round nothing else; the
// kernels on the bf16 units (avx512_bf16, neon_bf16; bf16 keys and values) round P to bf16 for
// P·V (and in the backward dS for its products) and take an fp32 q or dout as two bf16 terms:
// units_rounding() and units_backward() add those.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention_problem.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/targets.h"
#include "qkv/threads.h"

namespace qkv {
namespace {

using testing::BiasKind;
using testing::Case;
using testing::Problem;

// Half an ulp, relative, of a type's rounding.
double unit_roundoff(TensorType t) {
  return t == TensorType::bf16 ? 0x1p-8 : t == TensorType::f16 ? 0x1p-11 : 0;
}

uint16_t round_to(TensorType t, float x) {
  return t == TensorType::bf16 ? float_to_bf16(x) : float_to_half(x);
}
float widen(TensorType t, uint16_t bits) {
  return t == TensorType::bf16 ? bf16_to_float(bits) : half_to_float(bits);
}

// 16-bit storage beside an fp32 tensor: the same layout (the view's strides), each element the
// tensor's rounded; with `round_source`, the tensor then holds the rounded values too, so
// float64 math over it is math over what the kernel reads.
struct Storage16 {
  std::vector<uint16_t> bits;
  View view;
  Storage16(TensorType type, Tensor& t, const View& like, bool round_source) {
    bits.resize(t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) {
      bits[i] = round_to(type, t.data()[i]);
      if (round_source) t.data()[i] = widen(type, bits[i]);
    }
    view = like;
    view.type = type;
    view.data = nullptr;
    view.elements = bits.data() + (like.data - t.data());
  }
};

struct Types {
  TensorType q, kv, out;
  std::string name() const {
    return std::string("q_") + dtype_name(q) + "_kv_" + dtype_name(kv) + "_out_" + dtype_name(out);
  }
};

// One problem in the given types: `p` holds the rounded inputs in fp32 (the oracle's), `args`
// the typed views the kernel reads.
struct TypedProblem {
  Problem p;
  std::vector<std::unique_ptr<Storage16>> storage;
  AttentionArgs args;
  TypedProblem(const Case& c, const Types& t, uint32_t seed = 5) : p(c, seed) {
    args = p.args;
    auto retype = [&](TensorType type, Tensor& tensor, View& view) {
      if (type == TensorType::f32) return;
      storage.push_back(std::make_unique<Storage16>(type, tensor, view, true));
      view = storage.back()->view;
    };
    retype(t.q, p.q, args.q);
    retype(t.kv, p.k, args.k);
    retype(t.kv, p.v, args.v);
    if (t.out != TensorType::f32) {
      storage.push_back(std::make_unique<Storage16>(t.out, p.out, args.out, false));
      // NaN in every output element: the kernel must write each one.
      std::fill(storage.back()->bits.begin(), storage.back()->bits.end(),
                t.out == TensorType::bf16 ? 0x7fc0 : 0x7e00);
      args.out = storage.back()->view;
    }
  }
};

// Largest |actual − expected| − bound(expected) over a [B, H, T, X] view of any type; > 0
// fails. NaN counts as infinitely wrong.
double excess(const View& actual, const std::vector<double>& expected, double tol, double u) {
  double worst = -1;
  int64_t n = 0;
  for (int64_t a = 0; a < actual.shape[0]; ++a)
    for (int64_t b = 0; b < actual.shape[1]; ++b)
      for (int64_t c = 0; c < actual.shape[2]; ++c)
        for (int64_t d = 0; d < actual.shape[3]; ++d, ++n) {
          const double x = actual.get(a, b, c, d);
          if (std::isnan(x)) return INFINITY;
          const double e = expected[n];
          worst = std::max(worst, std::abs(x - e) - (tol + u * std::abs(e) * (1 + tol)));
        }
  return worst;
}

// What the bf16-unit kernels add to the error of a score and of an output: an fp32
// query as hi + lo bf16 is off by at most 2^-16 |q| per element, so a score by 2^-16 · scale ·
// Σ_d |q_d k_d| ≤ 2^-16 · scale · D · m² (inputs within ±m); scores off by at most δ move an
// output by at most (e^(2δ) − 1) · max|v| ≈ 2δ m; and P rounded to bf16 (|P̃ − P| ≤ 2^-8 P)
// moves it by 2^-8 · Σ P |v| / Σ P ≤ 2^-8 m.
struct UnitsRounding {
  double score = 0, out = 0;
};
UnitsRounding units_rounding(const Case& c, const Types& t) {
  // (The units run the tiled forward and tiled decoding for even head dims, and on x86
  // decoding under 16 rows per kv head for dims of whole 32s; the bound is taken for every
  // even dim on that target: the avx512_dl run holds the widening kernels to theirs.)
  const bool on_units = testing::on_bf16_units_target() && t.kv == TensorType::bf16 && c.D % 2 == 0;
  if (!on_units) return {};
  const double scale = c.scale != 0 ? c.scale : 1 / std::sqrt(double(c.D)), m = c.magnitude;
  UnitsRounding u;
  u.score = t.q == TensorType::bf16 ? 0 : 0x1p-16 * scale * c.D * m * m;
  u.out = 2.01 * u.score * m + 0x1p-8 * m;
  return u;
}

void expect_forward_within_bound(const Case& c, const Types& t) {
  TypedProblem tp(c, t);
  const testing::Expected e = testing::naive_attention(tp.p);
  // The fp32 kernel's tolerance (as the fast-kernel tests allow it against float64, doubled),
  // then the output's rounding.
  const double tol = 2 * testing::attention_tolerance(c, e.max_abs_score);
  const UnitsRounding units = units_rounding(c, t);
  attention(tp.args);
  EXPECT_LE(excess(tp.args.out, e.out, tol + units.out, unit_roundoff(t.out)), 0)
      << c.name() << " " << t.name();
  EXPECT_LE(testing::max_lse_error(tp.p.lse.data(), e.lse), tol + units.score)
      << c.name() << " " << t.name();
  // The reference kernel reads every type too: the same bound.
  TypedProblem ref(c, t);
  reference::attention(ref.args);
  EXPECT_LE(excess(ref.args.out, e.out, tol, unit_roundoff(t.out)), 0)
      << "reference " << c.name() << " " << t.name();
}

const Types kForwardTypes[] = {
    {TensorType::bf16, TensorType::bf16, TensorType::bf16},
    {TensorType::bf16, TensorType::bf16, TensorType::f32},
    {TensorType::f16, TensorType::f16, TensorType::f16},
    {TensorType::f16, TensorType::f16, TensorType::f32},
    {TensorType::f32, TensorType::bf16, TensorType::f32},  // an fp32 query against a bf16 cache
    {TensorType::f32, TensorType::f16, TensorType::f32},
    {TensorType::bf16, TensorType::f16, TensorType::bf16},
};

// Every option, with shapes that reach every kernel: the tiled forward, split-KV decoding with
// its three unit kernels (rows in registers, rows in lanes, keys in lanes) and odd dims.
std::vector<Case> option_grid() {
  return testing::variations(
      Case{.B = 2, .Hq = 4, .Hkv = 2, .Tq = 67, .Tk = 80, .D = 32, .Dv = 24},
      {
          [](Case&) {},
          [](Case& c) { c.causal = true; },
          [](Case& c) { c.window_left = 9, c.window_right = 20; },
          [](Case& c) { c.padding = true, c.causal = true; },
          [](Case& c) { c.bias = BiasKind::full; },
          [](Case& c) { c.alibi = true, c.causal = true; },
          [](Case& c) { c.softcap = 5, c.magnitude = 3; },
          [](Case& c) { c.seq_major = true; },
          [](Case& c) { c.dim_strided = true; },
          [](Case& c) { c.D = 19, c.Dv = 7, c.scale = 0.5f; },
          [](Case& c) { c.Tq = 1, c.Tk = 600; },  // decode, rows in registers
          // … with dims of whole pairs of vectors, then a vector, then single elements
          [](Case& c) { c.Tq = 1, c.Tk = 600, c.D = 56, c.Dv = 40; },
          // the forward with value dims of whole 32s (the bf16 units interleave V's rows), an
          // odd number of keys
          [](Case& c) { c.Tk = 81, c.D = 64, c.Dv = 32, c.causal = true; },
          // … with dims the bf16 units take, an odd number of keys in a window, 6 rows
          [](Case& c) { c.Tq = 3, c.Tk = 601, c.D = 64, c.Dv = 32, c.window_left = 200; },
          [](Case& c) { c.Tq = 2, c.Tk = 600, c.D = 32, c.Dv = 64, c.bias = BiasKind::full; },
          [](Case& c) { c.Hq = 16, c.Hkv = 1, c.Tq = 2, c.Tk = 600; },  // decode, rows in lanes
          [](Case& c) { c.Tq = 1, c.Tk = 600, c.D = 8, c.Dv = 8; },     // decode, keys in lanes
          [](Case& c) { c.Tq = 3, c.Tk = 600, c.causal = true, c.bias = BiasKind::batch_key; },
          [](Case& c) { c.causal = true, c.sinks = true; },  // sinks: tiled, then decoding
          [](Case& c) { c.Tq = 3, c.Tk = 600, c.D = 64, c.Dv = 32, c.sinks = true; },
          [](Case& c) { c.Tk = 81, c.D = 64, c.Dv = 32, c.causal = true, c.dropout = 0.2f; },
      });
}

class DtypeForward : public ::testing::TestWithParam<Case> {};

TEST_P(DtypeForward, WithinTheRoundingBound) {
  for (const Types& t : kForwardTypes) expect_forward_within_bound(GetParam(), t);
}

INSTANTIATE_TEST_SUITE_P(Grid, DtypeForward, ::testing::ValuesIn(option_grid()),
                         [](const auto& info) { return info.param.name(); });

// ---- Backward -------------------------------------------------------------------------------

// dout, dq, dk, dv: fp32 tensors (the oracle's, dout rounded like the typed one) and views of
// the requested type.
struct TypedGrads {
  Tensor dout, dq, dk, dv;
  std::vector<std::unique_ptr<Storage16>> storage;
  View dout_view, dq_view, dk_view, dv_view;
  TypedGrads(const Case& c, TensorType dout_type, TensorType grad_type) {
    dout_view = (dout = Tensor({c.B, c.Hq, c.Tq, c.Dv})).view();
    dq_view = (dq = Tensor({c.B, c.Hq, c.Tq, c.D})).view();
    dk_view = (dk = Tensor({c.B, c.Hkv, c.Tk, c.D})).view();
    dv_view = (dv = Tensor({c.B, c.Hkv, c.Tk, c.Dv})).view();
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> uniform(-1, 1);
    for (int64_t i = 0; i < dout.numel(); ++i) dout.data()[i] = uniform(rng);
    auto retype = [&](TensorType type, Tensor& t, View& v, bool source) {
      if (type == TensorType::f32) return;
      storage.push_back(std::make_unique<Storage16>(type, t, v, source));
      v = storage.back()->view;
    };
    retype(dout_type, dout, dout_view, true);
    retype(grad_type, dq, dq_view, false);
    retype(grad_type, dk, dk_view, false);
    retype(grad_type, dv, dv_view, false);
  }
};

// What the backward on the bf16 units adds to the error of dq, dk, dv (the largest of each),
// and of Di (into dDi, per query row). With P̃ and dS̃ rounded to bf16 (relative 2^-8), an
// operand that is not bf16 taken as hi + lo (2^-16), the forward's P relatively off by ρ
// where its scores were (q not bf16; units_rounding) and its out off by units.out:
//   dv_j  += (2^-8 + ρ + 2^-16 [dO split]) · Σ_i P_ij max_e |dO_ie|
//   dS_ij is off by ε_ij = (2^-8 + ρ + 2^-16 [q split]) |dS_ij| + P_ij 2^-16 Σ_e |dO_ie v_je|
//         [dO split], with |dS_ij| ≤ P_ij |dP_ij − Di_i| (a softcap's factor is at most 1);
//   dq_i  += scale · max|k| · Σ_j ε_ij;   dk_j += scale · max|q| · Σ_i ε_ij;
//   Di_i  += units.out · Σ_e |dO_ie| (its effect on dq and dk is bounded with the other dDi).
struct UnitsBackward {
  double dq = 0, dk = 0, dv = 0;
};
UnitsBackward units_backward(const Case& c, const Types& t, const TypedProblem& tp,
                             const TypedGrads& g, const testing::Expected& e,
                             std::vector<double>& dDi) {
  const bool on_units =
      testing::on_bf16_units_target() && t.kv == TensorType::bf16 && c.D % 2 == 0 && c.Dv % 2 == 0;
  if (!on_units) return {};
  const UnitsRounding forward = units_rounding(c, t);
  const double scale = c.scale != 0 ? c.scale : 1 / std::sqrt(double(c.D));
  const double rho = 2.01 * forward.score;
  const double dout_lo = t.out == TensorType::bf16 ? 0 : 0x1p-16;
  const double q_lo = t.q == TensorType::bf16 ? 0 : 0x1p-16;
  const View& v = tp.p.args.v;
  const float* dout = g.dout.data();  // [B][Hq][Tq][Dv]
  UnitsBackward u;
  std::vector<double> dk_sum(c.B * c.Hkv * c.Tk, 0), dv_sum(c.B * c.Hkv * c.Tk, 0);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Tq; ++i) {
        const int64_t row = (b * c.Hq + h) * c.Tq + i, hkv = h / (c.Hq / c.Hkv);
        const float* go = dout + row * c.Dv;
        double di = 0, sum_abs = 0, max_abs = 0;
        for (int64_t x = 0; x < c.Dv; ++x) {
          di += double(go[x]) * e.out[row * c.Dv + x];
          sum_abs += std::abs(go[x]);
          max_abs = std::max(max_abs, double(std::abs(go[x])));
        }
        dDi[row] += forward.out * sum_abs;
        double dq_sum = 0;
        for (int64_t j = 0; j < c.Tk; ++j) {
          const double p = e.weights[row * c.Tk + j];
          if (p == 0) continue;
          double dp = 0, dp_abs = 0;
          for (int64_t x = 0; x < c.Dv; ++x) {
            dp += double(go[x]) * v.get(b, hkv, j, x);
            dp_abs += std::abs(double(go[x]) * v.get(b, hkv, j, x));
          }
          const double eps = (0x1p-8 + rho + q_lo) * p * std::abs(dp - di) + p * dout_lo * dp_abs;
          dq_sum += eps;
          const int64_t key = (b * c.Hkv + hkv) * c.Tk + j;
          dk_sum[key] += eps;
          dv_sum[key] += (0x1p-8 + rho + dout_lo) * p * max_abs;
        }
        u.dq = std::max(u.dq, scale * c.magnitude * dq_sum);
      }
  for (double x : dk_sum) u.dk = std::max(u.dk, scale * c.magnitude * x);
  for (double x : dv_sum) u.dv = std::max(u.dv, x);
  return u;
}

void expect_backward_within_bound(const Case& c, const Types& t, TensorType grad_type) {
  TypedProblem tp(c, t);
  attention(tp.args);
  TypedGrads g(c, t.out, grad_type);
  attention_backward(tp.args, g.dout_view, g.dq_view, g.dk_view, g.dv_view);
  // The oracle: the reference backward on the rounded fp32 inputs (its sums in double).
  Tensor dq({c.B, c.Hq, c.Tq, c.D}), dk({c.B, c.Hkv, c.Tk, c.D}), dv({c.B, c.Hkv, c.Tk, c.Dv});
  reference::attention_backward(tp.p.args, g.dout, dq, dk, dv);
  // The fp32 tiled backward's tolerance against the reference (attention_backward_test).
  const double tol = 64 * FLT_EPSILON * std::sqrt(double(std::max(c.Tq, c.Tk)) * c.D) *
                     c.magnitude * (1 + std::abs(c.softcap));
  // A 16-bit out moves Di_i by at most u Σ_e |dO_ie O_ie|, and so dq_i by scale · max|k| ·
  // that, dk_j by scale · max|q| · Σ_i P_ij · that (P from the float64 forward).
  const double u_out = unit_roundoff(t.out);
  const testing::Expected e = testing::naive_attention(tp.p);
  const double scale = c.scale != 0 ? c.scale : 1 / std::sqrt(double(c.D));
  std::vector<double> dDi(c.B * c.Hq * c.Tq, 0);
  for (int64_t r = 0; r < static_cast<int64_t>(dDi.size()); ++r)
    for (int64_t x = 0; x < c.Dv; ++x)
      dDi[r] += u_out * std::abs(g.dout.data()[r * c.Dv + x] * e.out[r * c.Dv + x]);
  const UnitsBackward units = units_backward(c, t, tp, g, e, dDi);
  const double max_q = c.magnitude, max_k = c.magnitude;
  double worst_dq = 0, worst_dk = 0;
  for (double d : dDi) worst_dq = std::max(worst_dq, scale * max_k * d);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t hkv = 0; hkv < c.Hkv; ++hkv)
      for (int64_t j = 0; j < c.Tk; ++j) {
        double sum = 0;
        for (int64_t h = hkv * (c.Hq / c.Hkv); h < (hkv + 1) * (c.Hq / c.Hkv); ++h)
          for (int64_t i = 0; i < c.Tq; ++i) {
            const int64_t row = (b * c.Hq + h) * c.Tq + i;
            sum += e.weights[row * c.Tk + j] * dDi[row];
          }
        worst_dk = std::max(worst_dk, scale * max_q * sum);
      }
  const double u = unit_roundoff(grad_type);
  auto compare = [&](const View& actual, const Tensor& expected, double extra, const char* name) {
    std::vector<double> x(expected.data(), expected.data() + expected.numel());
    // Relative to 1 + |g|, as the fp32 test measures it.
    double worst = -1;
    for (int64_t i = 0, n = 0; i < actual.shape[0]; ++i)
      for (int64_t h = 0; h < actual.shape[1]; ++h)
        for (int64_t r = 0; r < actual.shape[2]; ++r)
          for (int64_t d = 0; d < actual.shape[3]; ++d, ++n) {
            const double a = actual.get(i, h, r, d);
            ASSERT_FALSE(std::isnan(a)) << name;
            const double bound = tol * (1 + std::abs(x[n])) + extra + u * std::abs(x[n]) * 1.01;
            worst = std::max(worst, std::abs(a - x[n]) - bound);
          }
    EXPECT_LE(worst, 0) << name << " " << c.name() << " " << t.name() << " grads "
                        << dtype_name(grad_type);
  };
  compare(g.dq_view, dq, (worst_dq + units.dq) * 1.01, "dq");
  compare(g.dk_view, dk, (worst_dk + units.dk) * 1.01, "dk");
  compare(g.dv_view, dv, units.dv * 1.01, "dv");
}

std::vector<Case> backward_grid() {
  return testing::variations(
      Case{.B = 2, .Hq = 4, .Hkv = 2, .Tq = 67, .Tk = 80, .D = 32, .Dv = 24},
      {
          [](Case&) {},
          [](Case& c) { c.causal = true, c.window_left = 20; },
          [](Case& c) { c.padding = true; },
          [](Case& c) { c.bias = BiasKind::query_key, c.alibi = true; },
          [](Case& c) { c.softcap = 5, c.magnitude = 3; },
          [](Case& c) { c.seq_major = true; },
          [](Case& c) { c.dim_strided = true; },
          [](Case& c) { c.D = 19, c.Dv = 7; },
          [](Case& c) { c.Hkv = 1, c.B = 1; },  // MQA at batch 1: key tiles split over threads
          // dims of whole 32s (the bf16 units interleave rows in vectors), an odd key count
          [](Case& c) { c.Tk = 81, c.D = 64, c.Dv = 32, c.causal = true; },
          [](Case& c) { c.Tq = 90, c.causal = true, c.sinks = true; },
          [](Case& c) { c.Tk = 81, c.D = 64, c.Dv = 32, c.causal = true, c.dropout = 0.2f; },
      });
}

class DtypeBackward : public ::testing::TestWithParam<Case> {};

TEST_P(DtypeBackward, WithinTheRoundingBound) {
  const Case& c = GetParam();
  const Types bf16{TensorType::bf16, TensorType::bf16, TensorType::bf16};
  const Types bf16_f32_out{TensorType::bf16, TensorType::bf16, TensorType::f32};
  const Types f16{TensorType::f16, TensorType::f16, TensorType::f16};
  const Types f32_q{TensorType::f32, TensorType::bf16, TensorType::f32};  // against a bf16 cache
  expect_backward_within_bound(c, bf16, TensorType::bf16);
  expect_backward_within_bound(c, f32_q, TensorType::f32);
  expect_backward_within_bound(c, bf16, TensorType::f32);
  expect_backward_within_bound(c, bf16_f32_out, TensorType::f32);
  expect_backward_within_bound(c, f16, TensorType::f16);
}

INSTANTIATE_TEST_SUITE_P(Grid, DtypeBackward, ::testing::ValuesIn(backward_grid()),
                         [](const auto& info) { return info.param.name(); });

// ---- Bits, threads, errors ------------------------------------------------------------------

// The same bits for any thread count, forward (tiled and decoding) and backward.
TEST(DtypeThreads, SameBitsWithOneAndTwoThreads) {
  const Types t{TensorType::bf16, TensorType::bf16, TensorType::bf16};
  for (const Case& c :
       {Case{.B = 1, .Hq = 4, .Hkv = 2, .Tq = 200, .Tk = 300, .D = 64, .Dv = 64, .causal = true},
        Case{.B = 1, .Hq = 8, .Hkv = 2, .Tq = 1, .Tk = 5000, .D = 64, .Dv = 64}}) {
    auto run = [&](int threads) {
      const int saved = num_threads();
      set_num_threads(threads);
      TypedProblem tp(c, t);
      attention(tp.args);
      std::vector<uint16_t> bits = tp.storage.back()->bits;
      if (c.Tq > 1) {
        TypedGrads g(c, t.out, TensorType::bf16);
        attention_backward(tp.args, g.dout_view, g.dq_view, g.dk_view, g.dv_view);
        for (const auto& s : g.storage) bits.insert(bits.end(), s->bits.begin(), s->bits.end());
      }
      set_num_threads(saved);
      return bits;
    };
    EXPECT_EQ(run(1), run(2)) << c.name();
  }
}

// Outputs round to nearest even: an answer that lies exactly between two bf16 numbers.
TEST(DtypeRounding, OutputsRoundToNearestEven) {
  // One key: out = v exactly in fp32, so a v that bf16 cannot hold shows the output's rounding.
  // (fp16 holds these v exactly; a bf16 q may read an fp16 cache and write bf16.)
  std::vector<bf16> q(4, bf16{0});
  std::vector<f16> k(4, f16{0}), v(4);
  const float values[4] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), 1.0f + 0x1p-9f};
  for (int e = 0; e < 4; ++e) v[e] = f16{float_to_half(values[e])};
  std::vector<bf16> out(4);
  attention({.q = View(q.data(), {1, 1, 1, 4}),
             .k = View(k.data(), {1, 1, 1, 4}),
             .v = View(v.data(), {1, 1, 1, 4}),
             .out = View(out.data(), {1, 1, 1, 4})});
  // Ties go to the even neighbour: 1 + 2^-8 → 1, 1 + 3 · 2^-8 → 1 + 2^-6, not 1 + 2^-7.
  for (int e = 0; e < 4; ++e) EXPECT_EQ(out[e].bits, float_to_bf16(values[e])) << e;
  EXPECT_EQ(out[0].bits, 0x3f80);
  EXPECT_EQ(out[1].bits, 0x3f82);
  EXPECT_EQ(out[2].bits, 0xbf80);
  EXPECT_EQ(out[3].bits, 0x3f80);
}

// The conversions in the kernels against the scalar ones (number_format.cpp), bit for bit, on
// every SIMD target: with one key the output is the value row exactly (weight 1), so a 16-bit
// v shows the widening and a 16-bit out the rounding. Every fp16 and bf16 bit pattern, and
// floats around each rounding edge (ties, overflow to inf, subnormals, NaN). Tq = 1 runs the
// decoding kernel, Tq = 40 the tiled one.
TEST(DtypeConversions, EveryPatternWidensExactly) {
  for (TensorType type : {TensorType::f16, TensorType::bf16})
    for (int64_t Tq : {1, 40}) {
      const int64_t n = 65536;
      std::vector<uint16_t> q(Tq * 4, 0), k(4, 0), v(n);
      for (int64_t i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(i);
      auto view = [&](std::vector<uint16_t>& x, std::initializer_list<int64_t> shape) {
        View w(reinterpret_cast<bf16*>(x.data()), shape);
        w.type = type;
        return w;
      };
      Tensor out({1, 1, Tq, n});
      attention({.q = view(q, {1, 1, Tq, 4}),
                 .k = view(k, {1, 1, 1, 4}),
                 .v = view(v, {1, 1, 1, n}),
                 .out = out});
      // vdpbf16ps (and bfdot) read subnormal bf16 inputs as zero: on the bf16 units (which take
      // this forward, not this decoding: its dim is no multiple of 32) they may come out ±0.
      const bool flushes = testing::on_bf16_units_target() && type == TensorType::bf16;
      for (int64_t r = 0; r < Tq; ++r)
        for (int64_t i = 0; i < n; ++i) {
          const float want = widen(type, static_cast<uint16_t>(i)), got = out.view()(0, 0, r, i);
          if (flushes && std::fpclassify(want) == FP_SUBNORMAL && got == 0) continue;
          if (std::isnan(want)) ASSERT_TRUE(std::isnan(got)) << i;
          else if (want == 0) ASSERT_EQ(got, 0.0f) << i;  // −0: the sum from +0 gives +0
          else
            ASSERT_EQ(std::memcmp(&want, &got, 4), 0)
                << dtype_name(type) << " pattern " << i << ": " << got << ", not " << want;
        }
    }
}

TEST(DtypeConversions, OutputsRoundLikeTheScalarConversion) {
  std::vector<float> values;
  std::mt19937 rng(9);
  for (int i = 0; i < 20000; ++i) {  // random bit patterns: every exponent, NaN and inf too
    const uint32_t bits = rng();
    float x;
    std::memcpy(&x, &bits, 4);
    values.push_back(x);
  }
  for (uint32_t h = 0; h < 0x7c00; h += 7) {  // fp16's and bf16's ties and their neighbours
    const float a = half_to_float(static_cast<uint16_t>(h)), b = half_to_float(h + 1);
    values.insert(values.end(), {(a + b) / 2, std::nextafter((a + b) / 2, 0.0f),
                                 std::nextafter((a + b) / 2, 1e9f), -(a + b) / 2});
    const float c = bf16_to_float(static_cast<uint16_t>(h + 0x3000));
    const float d = bf16_to_float(static_cast<uint16_t>(h + 0x3001));
    values.insert(values.end(), {(c + d) / 2, -(c + d) / 2});
  }
  values.insert(values.end(), {65504.0f, 65519.996f, 65520.0f, 1e-8f, 0x1p-25f, 0x1p-24f, 3e38f,
                               INFINITY, -INFINITY, 0.0f, -0.0f});
  const int64_t n = static_cast<int64_t>(values.size());
  for (TensorType type : {TensorType::f16, TensorType::bf16})
    for (int64_t Tq : {1, 40}) {
      std::vector<uint16_t> q(Tq * 4, 0), out(Tq * n);
      Tensor k({1, 1, 1, 4}), v({1, 1, 1, n});
      std::copy(values.begin(), values.end(), v.data());
      auto view = [&](std::vector<uint16_t>& x, std::initializer_list<int64_t> shape) {
        View w(reinterpret_cast<bf16*>(x.data()), shape);
        w.type = type;
        return w;
      };
      // q in the 16-bit type (zeros), k and v fp32: out may be q's type.
      attention({.q = view(q, {1, 1, Tq, 4}), .k = k, .v = v, .out = view(out, {1, 1, Tq, n})});
      for (int64_t r = 0; r < Tq; ++r)
        for (int64_t i = 0; i < n; ++i) {
          const uint16_t want = round_to(type, values[i]), got = out[r * n + i];
          if (std::isnan(values[i])) ASSERT_TRUE(std::isnan(widen(type, got))) << i;
          else if (values[i] == 0) ASSERT_EQ(widen(type, got), 0.0f) << i;
          else ASSERT_EQ(got, want) << dtype_name(type) << " " << values[i] << " (row " << r << ")";
        }
    }
}

TEST(DtypeErrors, CombinationsOutsideTheRulesNameTheTypes) {
  Tensor q({1, 1, 4, 8}), k({1, 1, 4, 8}), v({1, 1, 4, 8}), out({1, 1, 4, 8});
  std::vector<bf16> kb(32), vb(32), ob(32);
  std::vector<f16> vh(32), oh(32);
  auto message = [](const AttentionArgs& a) {
    try {
      attention(a);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const View kbf(kb.data(), {1, 1, 4, 8}), vbf(vb.data(), {1, 1, 4, 8});
  // k and v in different types.
  EXPECT_NE(message({.q = q, .k = kbf, .v = View(vh.data(), {1, 1, 4, 8}), .out = out})
                .find("k is bf16 but v is fp16"),
            std::string::npos);
  // out in neither q's type nor fp32.
  EXPECT_NE(message({.q = q, .k = kbf, .v = vbf, .out = View(ob.data(), {1, 1, 4, 8})})
                .find("out is bf16 but must be fp32"),
            std::string::npos);
  EXPECT_NE(message({.q = View(kb.data(), {1, 1, 4, 8}),
                     .k = kbf,
                     .v = vbf,
                     .out = View(oh.data(), {1, 1, 4, 8})})
                .find("out is fp16 but must be bf16 or fp32"),
            std::string::npos);
  // A gradient in a third type.
  AttentionArgs a{.q = q, .k = kbf, .v = vbf, .out = out};
  Tensor lse({1, 1, 4});
  a.lse = lse.data();
  attention(a);
  Tensor dout({1, 1, 4, 8}), dq({1, 1, 4, 8}), dv({1, 1, 4, 8});
  std::vector<f16> dkh(32);
  try {
    attention_backward(a, dout, dq, View(dkh.data(), {1, 1, 4, 8}), dv);
    ADD_FAILURE() << "a fp16 dk for a bf16 k was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dk is fp16 but k is bf16"), std::string::npos)
        << e.what();
  }
  // An fp32 function handed a bf16 view says so.
  EXPECT_THROW(kbf.as<float>(), Error);
}

}  // namespace
}  // namespace qkv
