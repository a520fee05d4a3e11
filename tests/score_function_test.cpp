// Score functions: the expression with floats (kinds, text, evaluation), the relative tables
// the compiler finds, the tiled forward and backward against a float64 formula written by
// hand in C++, the learnable tensors' gradients against finite differences and across thread
// counts, the fixed options (softcap, ALiBi, bias) against the same score functions, and the
// errors.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attention_problem.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/mask_function.h"
#include "qkv/score_function.h"
#include "qkv/threads.h"

namespace qkv {
namespace {

namespace sa = score_args;
using testing::Case;
using testing::Problem;

void expect_error(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one with \"" << fragment << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

// ---- The expression --------------------------------------------------------------------------

TEST(ScoreExpression, KindsFollowPython) {
  EXPECT_TRUE((sa::score + 1).is_real());   // int + float is a float
  EXPECT_FALSE((sa::q_idx / 2).is_real());  // floor division of integers stays an integer
  EXPECT_TRUE((to_float(sa::q_idx) / 2).is_real());
  EXPECT_TRUE((sa::score > 0).is_bool());
  EXPECT_DOUBLE_EQ(evaluate_score(to_float(sa::q_idx - 7) / 2, 0, 0, 0, 0, 0), -3.5);
  EXPECT_DOUBLE_EQ(evaluate_score(to_float((sa::q_idx - 7) / 2), 0, 0, 0, 0, 0), -4.0);
  EXPECT_DOUBLE_EQ(evaluate_score(sa::score * 2 + 0.5, 1.25, 0, 0, 0, 0), 3.0);
  EXPECT_DOUBLE_EQ(evaluate_score(where(sa::score > 1.0, sa::score, -INFINITY), 0.5, 0, 0, 0, 0),
                   -INFINITY);
  EXPECT_NEAR(
      evaluate_score(
          sigmoid(sa::score) + tanh(sa::score) + exp(sa::score) + log(sa::score) + sqrt(sa::score),
          2.0, 0, 0, 0, 0),
      1 / (1 + std::exp(-2.0)) + std::tanh(2.0) + std::exp(2.0) + std::log(2.0) + std::sqrt(2.0),
      1e-12);
  expect_error([] { (void)(sa::score % 2); }, "% takes integers");
  expect_error([] { (void)(sa::score && sa::score); }, "takes booleans");
  expect_error([] { ScoreFunction f(sa::score > 0); }, "is a boolean");
  // A mask with floats is a score function's business.
  expect_error([] { create_block_mask(to_float(sa::q_idx) < 2.5, 1, 1, 8, 8); },
               "floats and the score are for score functions");
}

TEST(ScoreExpression, TextRoundTrips) {
  std::vector<float> bias_values(2 * 5, 0.5f);
  const ScoreTensor bias("bias", {2, 5}, bias_values.data());
  const MaskTensor bucket("bucket", {9}, {0, 1, 2, 3, 4, 4, 4, 4, 4});
  const ScoreTensor tensors[] = {bias};
  const MaskTensor ints[] = {bucket};
  for (const char* text :
       {"score + 1.5", "where(score > 0.0, score, -inf)", "tanh(score / 30.0) * 30.0",
        "score - 0.25 * float(abs(q_idx - kv_idx))", "score + bias[h, bucket[q_idx - kv_idx + 4]]",
        "score * 1e-07 + nan", "exp(-score) + log(sqrt(score * score + 1.0))",
        "sigmoid(score) * 2.0"}) {
    const MaskExpr f = parse_score(text, tensors, ints);
    EXPECT_EQ(to_string(f), text);
    EXPECT_EQ(to_string(parse_score(to_string(f), tensors, ints)), to_string(f));
  }
  // Integers become floats where they meet one: "score + 1" prints the constant as 1.0.
  EXPECT_EQ(to_string(parse_score("score + 1")), "score + 1.0");
  EXPECT_EQ(to_string(parse_score("score * float(q_idx)")), "score * float(q_idx)");
  expect_error([] { parse_score("score + exp(1.5"); }, "column 16");
  expect_error([] { parse_score("score + foo"); }, "expected score, b, h, q_idx");
  expect_error([] { parse_mask("score > 1"); }, "expected b, h, q_idx, kv_idx");
  expect_error([&] { parse_score("bias[h, 1.5]", tensors); }, "an index into bias is a float");
}

// T5's bucketed relative positions, as integers: distance d = q_idx − kv_idx clamped to
// [−(Tk − 1), Tq − 1], the bucket of each from a table made on the host.
std::vector<int32_t> t5_buckets(int64_t Tq, int64_t Tk, int32_t buckets) {
  std::vector<int32_t> out;
  for (int64_t d = -(Tk - 1); d <= Tq - 1; ++d) {
    const int64_t n = std::abs(d);
    const int32_t half = buckets / 2;
    int32_t b = n < half / 2 ? static_cast<int32_t>(n)
                             : static_cast<int32_t>(std::min<double>(
                                   half - 1, half / 2 + std::log2(double(n) / (half / 2)) * 2));
    out.push_back(b + (d < 0 ? half : 0));
  }
  return out;
}

TEST(ScoreProgram, RelativeSubexpressionsBecomeTables) {
  std::vector<float> values(64, 0.1f);
  const ScoreTensor slopes("slopes", {4}, values.data());
  const ScoreTensor bias("bias", {4, 8}, values.data());
  const MaskTensor bucket("bucket", {15}, t5_buckets(8, 8, 8));
  const ScoreTensor grid("grid", {4, 7, 7}, values.data());
  using sa::h;
  using sa::kv_idx;
  using sa::q_idx;
  using sa::score;
  EXPECT_EQ(ScoreFunction(score - slopes[h] * abs(q_idx - kv_idx)).tables(), 1);
  EXPECT_EQ(ScoreFunction(score + bias.at({h, bucket[q_idx - kv_idx + 7]})).tables(), 1);
  EXPECT_EQ(ScoreFunction(tanh(score / 20.0) * 20.0).tables(), 0);
  // A 2-D grid's offsets read q_idx and kv_idx apart: evaluated per pair.
  EXPECT_EQ(
      ScoreFunction(score + grid.at({h, q_idx / 4 - kv_idx / 4 + 3, q_idx % 4 - kv_idx % 4 + 3}))
          .tables(),
      0);
}

// ---- The gallery, written twice: as an expression, and as a C++ formula ---------------------

// One score function of a problem: the expression over its tensors, and the same by hand.
struct Gallery {
  std::string name;
  std::vector<float> params;   // a learnable tensor's values ([] if none)
  std::vector<int64_t> shape;  // its shape
  std::vector<int32_t> ints;   // an integer tensor's ([] if none)
  std::function<MaskExpr(const ScoreTensor&, const MaskTensor&)> expr;
  // The formula; p: the learnable tensor's values in double (perturbed by finite differences).
  std::function<double(const std::vector<double>& p, double s, int64_t b, int64_t h, int64_t i,
                       int64_t j)>
      formula;
};

std::vector<Gallery> gallery(const Case& c) {
  using sa::h;
  using sa::kv_idx;
  using sa::q_idx;
  using sa::score;
  std::vector<Gallery> g;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  auto random = [&](int64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
  };
  const int64_t offset = c.Tk - c.Tq;  // qkv's ALiBi measures |i + Tk − Tq − j|
  g.push_back({"softcap",
               {},
               {},
               {},
               [](auto&, auto&) { return tanh(score / 2.0) * 2.0; },
               [](auto&, double s, auto, auto, auto, auto) { return 2 * std::tanh(s / 2); }});
  {
    std::vector<float> slopes = random(c.Hq);
    for (float& x : slopes) x = std::abs(x) * 0.5f;
    g.push_back({"alibi_learned",
                 slopes,
                 {c.Hq},
                 {},
                 [offset](const ScoreTensor& t, auto&) {
                   return score - t[h] * abs(q_idx - kv_idx + static_cast<int>(offset));
                 },
                 [offset](const std::vector<double>& p, double s, auto, int64_t hh, int64_t i,
                          int64_t j) { return s - p[hh] * std::abs(double(i - j + offset)); }});
  }
  {
    const int32_t buckets = 8;
    const std::vector<int32_t> bucket = t5_buckets(c.Tq, c.Tk, buckets);
    const int64_t Tk = c.Tk;
    g.push_back({"t5_bias",
                 random(c.Hq * buckets),
                 {c.Hq, buckets},
                 bucket,
                 [Tk](const ScoreTensor& t, const MaskTensor& bk) {
                   return score + t.at({h, bk[q_idx - kv_idx + static_cast<int>(Tk - 1)]});
                 },
                 [bucket, Tk, buckets](const std::vector<double>& p, double s, auto, int64_t hh,
                                       int64_t i, int64_t j) {
                   return s + p[hh * buckets + bucket[i - j + Tk - 1]];
                 }});
  }
  {
    const int W = 8;  // a grid of rows of W positions
    const int64_t rows = (std::max(c.Tq, c.Tk) + W - 1) / W;
    g.push_back(
        {"grid_2d",
         random(c.Hq * (2 * rows - 1) * (2 * W - 1)),
         {c.Hq, 2 * rows - 1, 2 * W - 1},
         {},
         [rows](const ScoreTensor& t, auto&) {
           const int R = static_cast<int>(rows);
           return score +
                  t.at({h, q_idx / W - kv_idx / W + (R - 1), q_idx % W - kv_idx % W + (W - 1)});
         },
         [rows](const std::vector<double>& p, double s, auto, int64_t hh, int64_t i, int64_t j) {
           const int64_t r = i / W - j / W + rows - 1, col = i % W - j % W + W - 1;
           return s + p[(hh * (2 * rows - 1) + r) * (2 * W - 1) + col];
         }});
  }
  {
    std::vector<float> gates = random(c.Hq);
    g.push_back(
        {"gated",
         gates,
         {c.Hq},
         {},
         [](const ScoreTensor& t, auto&) {
           return score * sigmoid(t[h]) * 2.0 - 0.1 * log(1.0 + to_float(abs(q_idx - kv_idx))) +
                  exp(score * 0.1);
         },
         [](const std::vector<double>& p, double s, auto, int64_t hh, int64_t i, int64_t j) {
           return s / (1 + std::exp(-p[hh])) * 2 - 0.1 * std::log(1.0 + std::abs(i - j)) +
                  std::exp(s * 0.1);
         }});
  }
  // Divisions by constants (the kernels multiply by reciprocals: 1/−3 and 1/7 are inexact).
  g.push_back({"divided",
               {},
               {},
               {},
               [](auto&, auto&) { return score / -3.0 + score / 7.0 * 2.0; },
               [](auto&, double s, auto, auto, auto, auto) { return s / -3 + s / 7 * 2; }});
  // A mask by −inf (and a row that sees nothing when Tq > Tk): PyTorch's causal, top-left.
  g.push_back({"minus_inf",
               {},
               {},
               {},
               [](auto&, auto&) { return where(kv_idx <= q_idx - 3, score, -INFINITY); },
               [](auto&, double s, auto, auto, int64_t i, int64_t j) {
                 return j <= i - 3 ? s : -INFINITY;
               }});
  return g;
}

// A problem with one gallery function on it: its tensors and the ScoreFunction.
struct ScoredProblem {
  Problem p;
  Gallery g;
  std::vector<float> values, grad;
  std::vector<double> as_double;
  std::unique_ptr<ScoreTensor> tensor;
  std::unique_ptr<MaskTensor> ints;
  ScoreFunction fn;
  ScoredProblem(const Case& c, const Gallery& gallery, bool learn)
      : p(c), g(gallery), values(gallery.params), grad(values.size(), NAN) {
    as_double.assign(values.begin(), values.end());
    const bool none = values.empty();
    if (none) values = {0.0f};  // a tensor the function does not read
    tensor = std::make_unique<ScoreTensor>("t", none ? std::vector<int64_t>{1} : g.shape,
                                           values.data(), learn && !none ? grad.data() : nullptr);
    ints = std::make_unique<MaskTensor>("bucket",
                                        std::vector<int64_t>{std::max<int64_t>(1, g.ints.size())},
                                        g.ints.empty() ? std::vector<int32_t>{0} : g.ints);
    fn = ScoreFunction(g.expr(*tensor, *ints));
    p.args.score_mod = &fn;
  }
  testing::ScoreFn formula() const {
    return [this](double s, int64_t b, int64_t h, int64_t i, int64_t j) {
      return g.formula(as_double, s, b, h, i, j);
    };
  }
};

std::vector<Case> forward_cases() {
  return testing::variations(
      Case{.B = 2, .Hq = 4, .Hkv = 2, .Tq = 67, .Tk = 80, .D = 32, .Dv = 24},
      {
          [](Case&) {},
          [](Case& c) { c.causal = true; },
          [](Case& c) { c.Tq = 130, c.Tk = 7, c.causal = true; },
          // Decoding (split-KV): rows in registers, in tiles (16 and more per key/value
          // head), with the keys in the lanes (head dims below a vector), over chunks.
          [](Case& c) { c.Tq = 1, c.Tk = 300; },
          [](Case& c) { c.Hq = 32, c.Tq = 3, c.Tk = 300; },
          [](Case& c) { c.D = c.Dv = 4, c.Tq = 2, c.Tk = 200; },
          [](Case& c) { c.Tq = 2, c.Tk = 2100, c.causal = true; },
          [](Case& c) { c.D = c.Dv = 64, c.Tq = c.Tk = 129, c.sinks = true; },
      });
}

class ScoreForward : public ::testing::TestWithParam<Case> {};

TEST_P(ScoreForward, GalleryMatchesTheFormula) {
  const Case c = GetParam();
  for (const Gallery& g : gallery(c))
    for (bool fast : {true, false}) {
      ScoredProblem sp(c, g, false);
      if (fast) attention(sp.p.args);
      else reference::attention(sp.p.args);
      const testing::Expected e =
          testing::naive_attention(c, testing::inputs_of(sp.p), {}, sp.formula());
      // The function in fp32 moves a score by a few ulps of its largest intermediate.
      const double tol = 4 * testing::attention_tolerance(c, e.max_abs_score + 4);
      EXPECT_LE(testing::max_error(sp.p.args.out, e.out), tol)
          << g.name << (fast ? " fast " : " reference ") << c.name();
      EXPECT_LE(testing::max_lse_error(sp.p.lse.data(), e.lse), tol)
          << g.name << (fast ? " fast " : " reference ") << c.name();
    }
}

INSTANTIATE_TEST_SUITE_P(Gallery, ScoreForward, ::testing::ValuesIn(forward_cases()),
                         [](const auto& info) { return info.param.name(); });

// The fixed options are score functions: the same numbers either way.
TEST(ScoreForward, FixedOptionsAreTheSameFunctions) {
  using sa::h;
  using sa::kv_idx;
  using sa::q_idx;
  using sa::score;
  const Case base{.B = 2, .Hq = 4, .Hkv = 2, .Tq = 67, .Tk = 90, .D = 32, .Dv = 32, .causal = true};
  std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  std::vector<float> bias_values(base.Hq * base.Tq * base.Tk);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2, 2);
  for (float& x : bias_values) x = u(rng);
  const ScoreTensor slope_t("slopes", {base.Hq}, slopes.data());
  const ScoreTensor bias_t("bias", {base.Hq, base.Tq, base.Tk}, bias_values.data());
  const int offset = static_cast<int>(base.Tk - base.Tq);
  struct Pair {
    const char* name;
    std::function<void(AttentionArgs&)> fixed;
    MaskExpr f;
  };
  Tensor bias({base.Hq, base.Tq, base.Tk});
  std::copy(bias_values.begin(), bias_values.end(), bias.data());
  const Pair pairs[] = {
      {"softcap", [](AttentionArgs& a) { a.softcap = 3; }, tanh(score / 3.0) * 3.0},
      {"alibi", [&](AttentionArgs& a) { a.mask.alibi = slopes.data(); },
       score - slope_t[h] * abs(q_idx - kv_idx + offset)},
      {"bias", [&](AttentionArgs& a) { a.mask.bias = bias.view(); },
       score + bias_t.at({h, q_idx, kv_idx})},
  };
  for (const Pair& pair : pairs) {
    Problem fixed(base), scored(base);
    pair.fixed(fixed.args);
    const ScoreFunction fn(pair.f);
    scored.args.score_mod = &fn;
    attention(fixed.args);
    attention(scored.args);
    double worst = 0;
    for (int64_t i = 0; i < fixed.out.numel(); ++i)
      worst = std::max<double>(worst, std::abs(fixed.out.data()[i] - scored.out.data()[i]));
    EXPECT_LE(worst, 1e-5) << pair.name;
    // And the gradients.
    Tensor dout({base.B, base.Hq, base.Tq, base.Dv}), g1[3], g2[3];
    for (int64_t i = 0; i < dout.numel(); ++i) dout.data()[i] = u(rng);
    for (Tensor* g : {g1, g2}) {
      g[0] = Tensor({base.B, base.Hq, base.Tq, base.D});
      g[1] = Tensor({base.B, base.Hkv, base.Tk, base.D});
      g[2] = Tensor({base.B, base.Hkv, base.Tk, base.Dv});
    }
    attention_backward(fixed.args, dout, g1[0], g1[1], g1[2]);
    attention_backward(scored.args, dout, g2[0], g2[1], g2[2]);
    for (int t = 0; t < 3; ++t) {
      double err = 0;
      for (int64_t i = 0; i < g1[t].numel(); ++i)
        err = std::max<double>(err, std::abs(g1[t].data()[i] - g2[t].data()[i]));
      EXPECT_LE(err, 2e-5) << pair.name << " gradient " << t;
    }
  }
}

// ---- Gradients ------------------------------------------------------------------------------

// L = Σ out ∘ dout of the float64 formula.
double loss(const Case& c, const testing::Inputs& in, const testing::ScoreFn& f,
            const std::vector<float>& dout) {
  const testing::Expected e = testing::naive_attention(c, in, {}, f);
  double l = 0;
  for (size_t i = 0; i < e.out.size(); ++i) l += e.out[i] * dout[i];
  return l;
}

std::vector<float> random_dout(const Case& c) {
  std::vector<float> d(c.B * c.Hq * c.Tq * c.Dv);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& x : d) x = u(rng);
  return d;
}

// The reference backward against central differences of the formula: q, k, v and the
// learnable tensor.
TEST(ScoreBackward, ReferenceMatchesFiniteDifferences) {
  const Case c{.B = 2, .Hq = 2, .Hkv = 1, .Tq = 5, .Tk = 6, .D = 3, .Dv = 3, .causal = true};
  for (const Gallery& g : gallery(c)) {
    ScoredProblem sp(c, g, true);
    const std::vector<float> dout_values = random_dout(c);
    Tensor dout({c.B, c.Hq, c.Tq, c.Dv}), dq({c.B, c.Hq, c.Tq, c.D}), dk({c.B, c.Hkv, c.Tk, c.D}),
        dv({c.B, c.Hkv, c.Tk, c.Dv});
    std::copy(dout_values.begin(), dout_values.end(), dout.data());
    reference::attention_backward(sp.p.args, dout, dq, dk, dv);
    testing::Inputs in = testing::inputs_of(sp.p);
    const double step = 1e-6;
    auto check = [&](std::vector<double>& x, const float* grad, const char* name) {
      for (size_t i = 0; i < x.size(); ++i) {
        const double saved = x[i];
        x[i] = saved + step;
        const double up = loss(c, in, sp.formula(), dout_values);
        x[i] = saved - step;
        const double down = loss(c, in, sp.formula(), dout_values);
        x[i] = saved;
        const double numeric = (up - down) / (2 * step);
        ASSERT_LT(std::abs(grad[i] - numeric) / (1 + std::abs(numeric)), 2e-5)
            << g.name << " " << name << "[" << i << "] analytic " << grad[i] << " numeric "
            << numeric;
      }
    };
    check(in.q, dq.data(), "dq");
    check(in.k, dk.data(), "dk");
    check(in.v, dv.data(), "dv");
    check(sp.as_double, sp.grad.data(), "tensor");
  }
}

// The tiled backward against the reference backward, and its learnable tensors' gradients the
// same bits at 1, 2, 3 and 16 threads.
TEST(ScoreBackward, TiledMatchesTheReference) {
  for (const Case& c :
       {Case{.B = 2, .Hq = 4, .Hkv = 2, .Tq = 67, .Tk = 80, .D = 32, .Dv = 24},
        Case{.B = 1, .Hq = 2, .Hkv = 1, .Tq = 130, .Tk = 130, .D = 16, .Dv = 16, .causal = true}})
    for (const Gallery& g : gallery(c)) {
      ScoredProblem fast(c, g, true), ref(c, g, true);
      attention(fast.p.args);
      const std::vector<float> dout_values = random_dout(c);
      Tensor dout({c.B, c.Hq, c.Tq, c.Dv});
      std::copy(dout_values.begin(), dout_values.end(), dout.data());
      Tensor grads[2][3];
      for (auto& t : grads) {
        t[0] = Tensor({c.B, c.Hq, c.Tq, c.D});
        t[1] = Tensor({c.B, c.Hkv, c.Tk, c.D});
        t[2] = Tensor({c.B, c.Hkv, c.Tk, c.Dv});
      }
      attention_backward(fast.p.args, dout, grads[0][0], grads[0][1], grads[0][2]);
      reference::attention_backward(ref.p.args, dout, grads[1][0], grads[1][1], grads[1][2]);
      const double tol = 64 * FLT_EPSILON * std::sqrt(double(std::max(c.Tq, c.Tk)) * c.D) * 4;
      const char* names[] = {"dq", "dk", "dv"};
      for (int t = 0; t < 3; ++t)
        for (int64_t i = 0; i < grads[0][t].numel(); ++i)
          ASSERT_NEAR(grads[0][t].data()[i], grads[1][t].data()[i],
                      tol * (1 + std::abs(grads[1][t].data()[i])))
              << g.name << " " << names[t] << " " << c.name();
      // A tensor element's gradient sums up to B · Hq · Tq · Tk terms: normwise.
      double worst = 0, largest = 0;
      for (size_t i = 0; i < fast.grad.size(); ++i) {
        worst = std::max<double>(worst, std::abs(fast.grad[i] - ref.grad[i]));
        largest = std::max<double>(largest, std::abs(ref.grad[i]));
      }
      EXPECT_LE(worst, tol * std::sqrt(double(c.B * c.Hq * c.Tq)) * (1 + largest))
          << g.name << " tensor " << c.name();
      // The same bits at any thread count.
      const int saved = num_threads();
      const std::vector<float> first = fast.grad;
      for (int threads : {1, 3, 16}) {
        set_num_threads(threads);
        attention_backward(fast.p.args, dout, grads[0][0], grads[0][1], grads[0][2]);
        for (size_t i = 0; i < first.size(); ++i)
          ASSERT_EQ(fast.grad[i], first[i]) << g.name << " at " << threads << " threads";
      }
      set_num_threads(saved);
    }
}

// ---- Errors and edges -------------------------------------------------------------------------

TEST(ScoreErrors, IndicesOutsideATensorAreNamed) {
  using sa::h;
  using sa::kv_idx;
  using sa::q_idx;
  using sa::score;
  const Case c{.B = 1, .Hq = 2, .Hkv = 2, .Tq = 20, .Tk = 20, .D = 8, .Dv = 8};
  std::vector<float> values(2 * 10, 0.0f);
  const ScoreTensor short_rows("bias", {2, 10}, values.data());
  {
    Problem p(c);
    const ScoreFunction f(score + short_rows.at({h, q_idx}));  // q_idx reaches 19
    p.args.score_mod = &f;
    expect_error([&] { attention(p.args); }, "index 10 is outside bias (dim 1 has 10 elements)");
    expect_error([&] { reference::attention(p.args); }, "is outside bias (dim 1 has 10 elements)");
  }
  {
    Problem p(c);
    const ScoreFunction f(score + short_rows.at({h, q_idx - kv_idx}));  // a table, d < 0
    p.args.score_mod = &f;
    expect_error([&] { attention(p.args); },
                 "is outside bias (dim 1 has 10 elements) at h = 0, q_idx - kv_idx = -19");
  }
  {
    Problem p(c);
    const ScoreFunction f(sa::score * 2);
    p.args.score_mod = &f;
    p.args.softcap = 5;
    expect_error([&] { attention(p.args); }, "does not mix with softcap, bias or alibi");
  }
}

// A score function that gives NaN gives NaN; −inf everywhere in a row gives 0 and lse −inf.
TEST(ScoreEdges, NanAndMinusInfinity) {
  const Case c{.B = 1, .Hq = 2, .Hkv = 2, .Tq = 70, .Tk = 70, .D = 8, .Dv = 8};
  {
    Problem p(c);
    const ScoreFunction f(where(sa::q_idx == 5, NAN, sa::score));
    p.args.score_mod = &f;
    attention(p.args);
    EXPECT_TRUE(std::isnan(p.args.out(0, 0, 5, 0)));
    EXPECT_FALSE(std::isnan(p.args.out(0, 0, 6, 0)));
  }
  {
    Problem p(c);
    const ScoreFunction f(where(sa::q_idx < 3, -INFINITY, sa::score));
    p.args.score_mod = &f;
    attention(p.args);
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(p.lse.data()[i], -INFINITY);
      EXPECT_EQ(p.args.out(0, 0, i, 0), 0.0f);
    }
  }
}

}  // namespace
}  // namespace qkv
