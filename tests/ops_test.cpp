// Every op's backward against central differences of its forward, on tiny sizes; and the
// forward passes against values worked out independently.
#include <gtest/gtest.h>

#include <cmath>

#include "finite_differences.h"
#include "qkv/error.h"
#include "qkv/ops.h"

namespace qkv {
namespace {

using testing::dot;
using testing::expect_gradient;
using testing::random_vector;

constexpr int64_t N = 5, C = 7;

TEST(Linear, ForwardIsXWTransposedPlusB) {
  float x[6] = {1, 2, 3, 4, 5, 6}, W[6] = {1, 0, -1, 2, 1, 0}, b[2] = {0.5f, -1}, y[4];
  linear_forward(View(y, {2, 2}), View(x, {2, 3}), View(W, {2, 3}), b);
  // Row 1: [1,2,3]·[1,0,-1] + 0.5 = -1.5; [1,2,3]·[2,1,0] − 1 = 3.
  EXPECT_FLOAT_EQ(y[0], -1.5f);
  EXPECT_FLOAT_EQ(y[1], 3.0f);
  EXPECT_FLOAT_EQ(y[2], -1.5f);  // [4,5,6]·[1,0,-1] + 0.5
  EXPECT_FLOAT_EQ(y[3], 12.0f);  // [4,5,6]·[2,1,0] − 1
}

// Few rows (decoding) take qkv's own GEMV, many rows BLAS: both against a double loop, with
// widths that are not multiples of the vector length and more columns than one thread's chunk.
TEST(Linear, FewAndManyRowsMatchADoubleLoop) {
  for (int64_t rows : {1, 2, 3, 4, 5, 17})
    for (int64_t in : {8, 172, 200})
      for (int64_t out : {3, 64, 400}) {  // 400 × 200 splits across threads
        const auto x = random_vector(rows * in, 1, 1.0f), W = random_vector(out * in, 2, 1.0f);
        const auto b = random_vector(out, 3, 1.0f);
        std::vector<float> y(rows * out);
        linear_forward(View(y.data(), {rows, out}), View(const_cast<float*>(x.data()), {rows, in}),
                       View(const_cast<float*>(W.data()), {out, in}), b.data());
        for (int64_t n = 0; n < rows; ++n)
          for (int64_t o = 0; o < out; ++o) {
            double sum = b[o];
            for (int64_t i = 0; i < in; ++i) sum += double(x[n * in + i]) * W[o * in + i];
            ASSERT_NEAR(y[n * out + o], sum, 1e-4 * (1 + std::abs(sum)))
                << rows << " rows, in " << in << ", out " << out;
          }
      }
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  const int64_t in = 4, out = 3;
  auto x = random_vector(N * in, 1), W = random_vector(out * in, 2), b = random_vector(out, 3);
  const auto g = random_vector(N * out, 4);
  std::vector<float> y(N * out), dx(N * in), dW(out * in), db(out);
  auto loss = [&] {
    linear_forward(View(y.data(), {N, out}), View(x.data(), {N, in}), View(W.data(), {out, in}),
                   b.data());
    return dot(y.data(), g);
  };
  loss();
  linear_backward(View(dx.data(), {N, in}), View(dW.data(), {out, in}), db.data(),
                  View(const_cast<float*>(g.data()), {N, out}), View(x.data(), {N, in}),
                  View(W.data(), {out, in}));
  expect_gradient(x.data(), dx.data(), x.size(), loss, "dx");
  expect_gradient(W.data(), dW.data(), W.size(), loss, "dW");
  expect_gradient(b.data(), db.data(), b.size(), loss, "db");
}

TEST(LayerNorm, NormalisesEachRowAndBackwardMatches) {
  auto x = random_vector(N * C, 5, 2), w = random_vector(C, 6), b = random_vector(C, 7);
  const auto g = random_vector(N * C, 8);
  std::vector<float> y(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
  auto loss = [&] {
    layernorm_forward(View(y.data(), {N, C}), mean.data(), rstd.data(), View(x.data(), {N, C}),
                      w.data(), b.data(), 1e-5f);
    return dot(y.data(), g);
  };
  loss();
  // With w = 1, b = 0 each row would have mean 0 and variance 1: check via x̂ directly.
  for (int64_t n = 0; n < N; ++n) {
    double s = 0, sq = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (x[n * C + c] - mean[n]) * rstd[n];
      s += xhat, sq += xhat * xhat;
    }
    EXPECT_NEAR(s / C, 0, 1e-6);
    EXPECT_NEAR(sq / C, 1, 1e-4);
  }
  layernorm_backward(View(dx.data(), {N, C}), dw.data(), db.data(),
                     View(const_cast<float*>(g.data()), {N, C}), View(x.data(), {N, C}), w.data(),
                     mean.data(), rstd.data());
  expect_gradient(x.data(), dx.data(), x.size(), loss, "dx");
  expect_gradient(w.data(), dw.data(), w.size(), loss, "dw");
  expect_gradient(b.data(), db.data(), b.size(), loss, "db");
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  auto x = random_vector(N * C, 9, 2), w = random_vector(C, 10);
  const auto g = random_vector(N * C, 11);
  std::vector<float> y(N * C), rstd(N), dx(N * C), dw(C);
  auto loss = [&] {
    rmsnorm_forward(View(y.data(), {N, C}), rstd.data(), View(x.data(), {N, C}), w.data(), 1e-5f);
    return dot(y.data(), g);
  };
  loss();
  double sq = 0;
  for (int64_t c = 0; c < C; ++c) sq += double(x[c]) * x[c];
  EXPECT_NEAR(rstd[0], 1 / std::sqrt(sq / C + 1e-5), 1e-5);
  rmsnorm_backward(View(dx.data(), {N, C}), dw.data(), View(const_cast<float*>(g.data()), {N, C}),
                   View(x.data(), {N, C}), w.data(), rstd.data());
  expect_gradient(x.data(), dx.data(), x.size(), loss, "dx");
  expect_gradient(w.data(), dw.data(), w.size(), loss, "dw");
}

TEST(Gelu, KnownValuesAndBackward) {
  for (Gelu kind : {Gelu::tanh, Gelu::exact}) {
    float one = 1, y;
    gelu_forward(View(&y, {1, 1}), View(&one, {1, 1}), kind);
    // GELU(1) = Φ(1) = 0.841345 exactly; the tanh form gives 0.841192.
    EXPECT_NEAR(y, kind == Gelu::exact ? 0.8413447f : 0.8411920f, 1e-6);
    // Width 37: two whole vectors and a scalar tail, both paths of the kernel.
    for (const int64_t W : {C, int64_t{37}}) {
      auto x = random_vector(N * W, 12, 3);
      const auto g = random_vector(N * W, 13);
      std::vector<float> out(N * W), dx(N * W);
      auto loss = [&] {
        gelu_forward(View(out.data(), {N, W}), View(x.data(), {N, W}), kind);
        return dot(out.data(), g);
      };
      loss();
      for (int64_t i = 0; i < N * W; ++i) {  // the formula, in double
        const double v = x[i], t = std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v));
        EXPECT_NEAR(
            out[i],
            kind == Gelu::exact ? 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))) : 0.5 * v * (1 + t),
            2e-6 * (1 + std::abs(v)));
      }
      gelu_backward(View(dx.data(), {N, W}), View(const_cast<float*>(g.data()), {N, W}),
                    View(x.data(), {N, W}), kind);
      expect_gradient(x.data(), dx.data(), x.size(), loss, "dx");
    }
  }
}

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  for (const int64_t W : {C, int64_t{37}}) {  // 37: the vector path and the scalar tail
    auto a = random_vector(N * W, 14, 3), u = random_vector(N * W, 15);
    const auto g = random_vector(N * W, 16);
    std::vector<float> y(N * W), da(N * W), du(N * W);
    auto loss = [&] {
      swiglu_forward(View(y.data(), {N, W}), View(a.data(), {N, W}), View(u.data(), {N, W}));
      return dot(y.data(), g);
    };
    loss();
    for (int64_t i = 0; i < N * W; ++i)
      EXPECT_NEAR(y[i], a[i] / (1 + std::exp(-double(a[i]))) * u[i], 2e-6 * (1 + std::abs(a[i])));
    swiglu_backward(View(da.data(), {N, W}), View(du.data(), {N, W}),
                    View(const_cast<float*>(g.data()), {N, W}), View(a.data(), {N, W}),
                    View(u.data(), {N, W}));
    expect_gradient(a.data(), da.data(), a.size(), loss, "dgate");
    expect_gradient(u.data(), du.data(), u.size(), loss, "dup");
  }
}

TEST(Residual, AddsAndPassesGradientToBoth) {
  auto a = random_vector(N * C, 17), b = random_vector(N * C, 18);
  const auto g = random_vector(N * C, 19);
  std::vector<float> y(N * C), da(N * C), db(N * C);
  residual_forward(View(y.data(), {N, C}), View(a.data(), {N, C}), View(b.data(), {N, C}));
  EXPECT_EQ(y[3], a[3] + b[3]);
  residual_backward(View(da.data(), {N, C}), View(db.data(), {N, C}),
                    View(const_cast<float*>(g.data()), {N, C}));
  EXPECT_EQ(da[4], g[4]);
  EXPECT_EQ(db[4], g[4]);
}

TEST(Embedding, LooksUpAndAccumulatesRepeatedTokens) {
  auto table = random_vector(6 * C, 20), positions = random_vector(4 * C, 21);
  const int32_t tokens[N] = {3, 1, 3, 0, 5}, pos[N] = {0, 1, 2, 3, 0};
  const auto g = random_vector(N * C, 22);
  std::vector<float> y(N * C), dtable(6 * C), dpos(4 * C);
  auto loss = [&] {
    embedding_forward(View(y.data(), {N, C}), tokens, View(table.data(), {6, C}), pos,
                      View(positions.data(), {4, C}));
    return dot(y.data(), g);
  };
  loss();
  EXPECT_EQ(y[2 * C + 1], table[3 * C + 1] + positions[2 * C + 1]);
  embedding_backward(View(dtable.data(), {6, C}), tokens,
                     View(const_cast<float*>(g.data()), {N, C}), pos, View(dpos.data(), {4, C}));
  expect_gradient(table.data(), dtable.data(), table.size(), loss, "dtable");
  expect_gradient(positions.data(), dpos.data(), positions.size(), loss, "dpositions");
  const int32_t bad[N] = {0, 1, 6, 0, 0};
  EXPECT_THROW(
      embedding_forward(View(y.data(), {N, C}), bad, View(table.data(), {6, C}), nullptr, View()),
      Error);
}

TEST(Sinusoidal, MatchesTheFormula) {
  std::vector<float> t(10 * 8);
  sinusoidal_table(View(t.data(), {10, 8}));
  // Position 3, dims 2 and 3: sin and cos of 3 / 10000^(2/8).
  EXPECT_NEAR(t[3 * 8 + 2], std::sin(3 / std::pow(10000.0, 0.25)), 1e-6);
  EXPECT_NEAR(t[3 * 8 + 3], std::cos(3 / std::pow(10000.0, 0.25)), 1e-6);
  EXPECT_EQ(t[0], 0.0f);
  EXPECT_EQ(t[1], 1.0f);
}

TEST(Rope, RotatesPairsAndKeepsDotProductsRelative) {
  for (RopePairs pairs : {RopePairs::adjacent, RopePairs::halves}) {
    // q at position 5 and k at position 2 score like q at 3 and k at 0: only the offset counts.
    const int64_t D = 8;
    const auto q = random_vector(D, 23), k = random_vector(D, 24);
    auto score = [&](int64_t pq, int64_t pk) {
      std::vector<float> a = q, b = k;
      rope_forward(View(a.data(), {1, 1, 1, D}), pq, 10000, pairs);
      rope_forward(View(b.data(), {1, 1, 1, D}), pk, 10000, pairs);
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += double(a[d]) * b[d];
      return s;
    };
    EXPECT_NEAR(score(5, 2), score(3, 0), 1e-5);
    EXPECT_GT(std::abs(score(5, 2) - score(2, 2)), 1e-3);  // and the offset does count
    // Pair (0, 1) (adjacent) or (0, 4) (halves) at position 1 rotates by 1 radian.
    std::vector<float> x(D, 0);
    x[0] = 1;
    rope_forward(View(x.data(), {1, 1, 1, D}), 1, 10000, pairs);
    EXPECT_NEAR(x[0], std::cos(1.0), 1e-6);
    EXPECT_NEAR(x[pairs == RopePairs::adjacent ? 1 : 4], std::sin(1.0), 1e-6);
  }
}

TEST(Rope, BackwardMatchesFiniteDifferences) {
  for (RopePairs pairs : {RopePairs::adjacent, RopePairs::halves}) {
    auto x = random_vector(2 * 3 * 2 * 6, 25);
    const auto g = random_vector(x.size(), 26);
    std::vector<float> y(x.size());
    auto loss = [&] {
      y = x;
      rope_forward(View(y.data(), {2, 3, 2, 6}), 4, 100, pairs);
      return dot(y.data(), g);
    };
    std::vector<float> dx = g;
    rope_backward(View(dx.data(), {2, 3, 2, 6}), 4, 100, pairs);
    expect_gradient(x.data(), dx.data(), x.size(), loss, "dx");
  }
}

TEST(Alibi, SlopesOfThePaper) {
  float s8[8], s6[6];
  alibi_slopes(8, s8);
  EXPECT_FLOAT_EQ(s8[0], 0.5f);        // 2^-1
  EXPECT_FLOAT_EQ(s8[7], 1.0f / 256);  // 2^-8
  alibi_slopes(6, s6);                 // 4 from the sequence for 4, then 2 from that for 8
  EXPECT_FLOAT_EQ(s6[0], 0.25f);
  EXPECT_FLOAT_EQ(s6[3], 1.0f / 256);
  EXPECT_FLOAT_EQ(s6[4], std::exp2(-1.0f));
  EXPECT_FLOAT_EQ(s6[5], std::exp2(-3.0f));
}

TEST(CrossEntropy, LossAndBackward) {
  for (const int64_t V : {int64_t{6}, int64_t{45}}) {  // 45: two whole vectors and a tail
    auto logits = random_vector(N * V, 27, 3);
    const int32_t targets[N] = {2, kIgnoreIndex, 0, 5, 1};
    std::vector<float> probs(N * V), dlogits(N * V);
    auto loss = [&] {
      return double(
          cross_entropy_forward(View(probs.data(), {N, V}), View(logits.data(), {N, V}), targets));
    };
    const double l = loss();
    // By hand: mean of −log softmax over the 4 counted rows.
    double expected = 0;
    for (int64_t n : {0, 2, 3, 4}) {
      double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(double(logits[n * V + v]));
      expected += std::log(z) - logits[n * V + targets[n]];
    }
    EXPECT_NEAR(l, expected / 4, 1e-5);
    cross_entropy_backward(View(dlogits.data(), {N, V}), View(probs.data(), {N, V}), targets, 1);
    std::vector<float> inplace = probs;  // the in-place form gives the same gradient
    cross_entropy_backward_inplace(View(inplace.data(), {N, V}), targets, 1);
    for (size_t i = 0; i < inplace.size(); ++i) EXPECT_FLOAT_EQ(inplace[i], dlogits[i]);
    for (int64_t v = 0; v < V; ++v) EXPECT_EQ(dlogits[1 * V + v], 0.0f);  // ignored row
    expect_gradient(logits.data(), dlogits.data(), logits.size(), loss, "dlogits");
    const int32_t bad[N] = {0, 0, static_cast<int32_t>(V), 0, 0};
    EXPECT_THROW(
        cross_entropy_forward(View(probs.data(), {N, V}), View(logits.data(), {N, V}), bad), Error);
  }
}

TEST(Ops, ShapeErrorsNameTheOp) {
  float a[12], b[12];
  try {
    linear_forward(View(a, {2, 2}), View(b, {2, 3}), View(a, {4, 2}), nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_forward: x [N, in] is [2, 3], expected [any, 2]"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace qkv
