// The reference attention: the articles' numbers by hand, every option against an independent
// double-precision loop, edge semantics, and clear errors on bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "attention_problem.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/threads.h"

namespace qkv {
namespace {

using testing::BiasKind;
using testing::Case;
using testing::Problem;

// ---- The articles' worked example, checked against numbers worked by hand ----------------

// fluffy, blue, creature: q, k, v as 2-d vectors, one row per token.
struct Article {
  float q[6] = {1, 0, 0, 1, 2, 1};
  float k[6] = {1, 1, 0, 2, 2, 0};
  float v[6] = {1, 0, 0, 2, 3, 1};
  float out[6] = {};
  float weights[9] = {};
  float lse[3] = {};
  void run(bool causal) {
    AttentionArgs a;
    a.q = View(q, {1, 1, 3, 2});
    a.k = View(k, {1, 1, 3, 2});
    a.v = View(v, {1, 1, 3, 2});
    a.out = View(out, {1, 1, 3, 2});
    a.lse = lse;
    a.mask.causal = causal;
    reference::attention(a, View(weights, {1, 1, 3, 3}));
  }
};

TEST(ArticleExample, CreatureAttendsToFluffyBlueAndItself) {
  Article ex;
  ex.run(/*causal=*/false);
  // creature's query [2, 1] against the keys: raw 3, 2, 4; scaled by 1/√2: 2.121, 1.414,
  // 2.828; e^x: 8.342, 4.113, 16.919; Z = 29.374; weights 0.284, 0.140, 0.576.
  EXPECT_NEAR(ex.weights[6], 0.284, 5e-4);
  EXPECT_NEAR(ex.weights[7], 0.140, 5e-4);
  EXPECT_NEAR(ex.weights[8], 0.576, 5e-4);
  // output = 0.284·[1,0] + 0.140·[0,2] + 0.576·[3,1] = [2.012, 0.856]
  EXPECT_NEAR(ex.out[4], 2.012, 5e-4);
  EXPECT_NEAR(ex.out[5], 0.856, 5e-4);
  EXPECT_NEAR(ex.lse[2], std::log(29.374), 1e-4);
}

TEST(ArticleExample, CausalMaskGivesFutureKeysExactlyZeroWeight) {
  Article ex;
  ex.run(/*causal=*/true);
  // fluffy sees only itself: weight 1, output = its own value [1, 0].
  EXPECT_EQ(ex.weights[0], 1.0f);
  EXPECT_EQ(ex.weights[1], 0.0f);
  EXPECT_EQ(ex.weights[2], 0.0f);
  EXPECT_EQ(ex.out[0], 1.0f);
  EXPECT_EQ(ex.out[1], 0.0f);
  // blue [0, 1] sees fluffy (score 1/√2) and itself (2/√2): weights 1/(1+e^0.707) = 0.330,
  // 0.670; the future key gets exactly 0.
  EXPECT_NEAR(ex.weights[3], 0.330, 5e-4);
  EXPECT_NEAR(ex.weights[4], 0.670, 5e-4);
  EXPECT_EQ(ex.weights[5], 0.0f);
  // creature is last: the mask hides nothing from it.
  EXPECT_NEAR(ex.weights[8], 0.576, 5e-4);
}

TEST(ArticleExample, SoftmaxOfTwoOneZero) {
  // softmax(2, 1, 0) = 0.665, 0.245, 0.090 (the articles' softmax example): one query [1]
  // against keys [2], [1], [0] with scale 1 gives exactly those scores.
  float q[1] = {1}, k[3] = {2, 1, 0}, v[3] = {0, 0, 0}, out[1], w[3];
  AttentionArgs a;
  a.q = View(q, {1, 1, 1, 1});
  a.k = View(k, {1, 1, 3, 1});
  a.v = View(v, {1, 1, 3, 1});
  a.out = View(out, {1, 1, 1, 1});
  a.scale = 1;
  reference::attention(a, View(w, {1, 1, 1, 3}));
  EXPECT_NEAR(w[0], 0.665, 5e-4);
  EXPECT_NEAR(w[1], 0.245, 5e-4);
  EXPECT_NEAR(w[2], 0.090, 5e-4);
}

// ---- Every option against the double-precision loop ---------------------------------------

std::vector<Case> option_grid() {
  return testing::variations(Case{.B = 2, .Hq = 4, .Hkv = 4, .Tq = 7, .Tk = 7, .D = 16, .Dv = 16},
                             {
                                 [](Case&) {},
                                 [](Case& c) { c.causal = true; },
                                 [](Case& c) {
                                   c.Tq = 1;
                                   c.Tk = 1;
                                 },
                                 [](Case& c) {
                                   c.Tq = 3;
                                   c.Tk = 11;
                                   c.causal = true;
                                 },  // bottom-right aligned
                                 [](Case& c) {
                                   c.Tq = 11;
                                   c.Tk = 3;
                                   c.causal = true;
                                 },  // first rows see nothing
                                 [](Case& c) {
                                   c.window_left = 2;
                                   c.causal = true;
                                 },  // causal sliding window
                                 [](Case& c) {
                                   c.window_left = 1;
                                   c.window_right = 2;
                                 },  // two-sided window
                                 [](Case& c) {
                                   c.padding = true;
                                   c.B = 3;
                                 },
                                 [](Case& c) {
                                   c.padding = true;
                                   c.causal = true;
                                   c.B = 3;
                                 },
                                 [](Case& c) { c.bias = BiasKind::full; },
                                 [](Case& c) { c.bias = BiasKind::query_key; },
                                 [](Case& c) { c.bias = BiasKind::batch_key; },
                                 [](Case& c) {
                                   c.bias = BiasKind::head_query_key;
                                   c.causal = true;
                                 },
                                 [](Case& c) {
                                   c.alibi = true;
                                   c.causal = true;
                                 },
                                 [](Case& c) { c.alibi = true; },
                                 [](Case& c) {
                                   c.softcap = 1.5f;
                                   c.magnitude = 3;
                                 },
                                 [](Case& c) { c.scale = 0.3f; },
                                 [](Case& c) { c.Hkv = 2; },  // GQA
                                 [](Case& c) {
                                   c.Hkv = 1;
                                   c.causal = true;
                                 },  // MQA
                                 [](Case& c) {
                                   c.Tq = 5;
                                   c.Tk = 13;
                                   c.D = 8;
                                   c.Dv = 24;
                                 },                                    // cross-attention, Dv ≠ D
                                 [](Case& c) { c.seq_major = true; },  // [B, T, H, D] storage
                                 [](Case& c) {
                                   c.seq_major = true;
                                   c.Hkv = 2;
                                   c.causal = true;
                                   c.padding = true;
                                 },
                                 [](Case& c) {  // everything at once
                                   c.Hkv = 2;
                                   c.Tq = 6;
                                   c.Tk = 9;
                                   c.Dv = 12;
                                   c.causal = true;
                                   c.window_left = 4;
                                   c.padding = true;
                                   c.bias = BiasKind::batch_key;
                                   c.alibi = true;
                                   c.softcap = 2;
                                   c.seq_major = true;
                                 },
                                 [](Case& c) {
                                   c.Tq = 65;
                                   c.Tk = 129;
                                   c.D = 80;
                                   c.Dv = 80;
                                   c.causal = true;
                                 },
                             });
}

class ReferenceOptions : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceOptions, MatchesDoublePrecisionLoop) {
  Problem p(GetParam());
  Tensor weights({p.c.B, p.c.Hq, p.c.Tq, p.c.Tk});
  reference::attention(p.args, weights);
  const testing::Expected e = testing::naive_attention(p);
  const double tol = testing::attention_tolerance(p.c, e.max_abs_score);
  EXPECT_LE(testing::max_error(p.args.out, e.out), tol);
  EXPECT_LE(testing::max_error(weights, e.weights), tol);
  EXPECT_LE(testing::max_lse_error(p.lse.data(), e.lse), tol);
}

INSTANTIATE_TEST_SUITE_P(Grid, ReferenceOptions, ::testing::ValuesIn(option_grid()),
                         [](const auto& info) { return info.param.name(); });

// ---- Edge semantics -----------------------------------------------------------------------

TEST(ReferenceEdges, FullyMaskedRowsGiveZeroAndMinusInfNeverNaN) {
  Case c{.B = 2, .Hq = 2, .Hkv = 1, .Tq = 4, .Tk = 4, .D = 8, .Dv = 8};
  c.padding = true;
  Problem p(c);
  p.kv_len = {4, 0};  // batch 1 has no keys at all
  reference::attention(p.args);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 4; ++i) {
      EXPECT_EQ(p.lse.data()[(1 * 2 + h) * 4 + i], -INFINITY);
      for (int64_t d = 0; d < 8; ++d) EXPECT_EQ(p.args.out(1, h, i, d), 0.0f);
    }
  for (int64_t i = 0; i < 4; ++i) EXPECT_TRUE(std::isfinite(p.lse.data()[i]));
}

TEST(ReferenceEdges, BiasOfMinusInfinityMasksLikeAMask) {
  Case c{.B = 1, .Hq = 1, .Hkv = 1, .Tq = 3, .Tk = 3, .D = 4, .Dv = 4};
  c.bias = BiasKind::query_key;
  Problem p(c);
  for (int64_t i = 0; i < 9; ++i) p.bias_storage.data()[i] = -INFINITY;
  p.bias_storage.data()[0] = 0;  // row 0 sees key 0 only; rows 1 and 2 see nothing
  Tensor w({1, 1, 3, 3});
  reference::attention(p.args, w);
  EXPECT_EQ(w.data()[0], 1.0f);
  for (int64_t d = 0; d < 4; ++d) EXPECT_EQ(p.args.out(0, 0, 0, d), p.args.v(0, 0, 0, d));
  for (int64_t i = 1; i < 3; ++i) {
    EXPECT_EQ(p.lse.data()[i], -INFINITY);
    for (int64_t d = 0; d < 4; ++d) EXPECT_EQ(p.args.out(0, 0, i, d), 0.0f);
  }
}

TEST(ReferenceEdges, LogitsOfTenThousandDoNotOverflow) {
  // Integer inputs make every score exact in fp32, so the answer is known in closed form:
  // scores 10000, 9999, -10000 → weights e^0, e^-1, e^-20000 over their sum.
  float q[1] = {1}, k[3] = {10000, 9999, -10000}, v[6] = {1, 0, 0, 1, 5, 5}, out[2], w[3], lse[1];
  AttentionArgs a;
  a.q = View(q, {1, 1, 1, 1});
  a.k = View(k, {1, 1, 3, 1});
  a.v = View(v, {1, 1, 3, 2});
  a.out = View(out, {1, 1, 1, 2});
  a.lse = lse;
  a.scale = 1;
  reference::attention(a, View(w, {1, 1, 1, 3}));
  const double e1 = std::exp(-1.0);
  EXPECT_NEAR(w[0], 1 / (1 + e1), 1e-6);
  EXPECT_NEAR(w[1], e1 / (1 + e1), 1e-6);
  EXPECT_EQ(w[2], 0.0f);
  EXPECT_NEAR(out[0], 1 / (1 + e1), 1e-6);
  EXPECT_NEAR(out[1], e1 / (1 + e1), 1e-6);
  EXPECT_NEAR(lse[0], 10000 + std::log1p(e1), 1e-3);
  // And negative: all scores near -1e4 still give a proper distribution.
  q[0] = -1;
  reference::attention(a, View(w, {1, 1, 1, 3}));
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.0, 1e-6);
  EXPECT_NEAR(w[2], 1.0, 1e-6);
}

TEST(ReferenceEdges, LargeRandomLogitsMatchDoubleLoop) {
  Case c{.B = 1, .Hq = 2, .Hkv = 2, .Tq = 9, .Tk = 9, .D = 16, .Dv = 16};
  c.causal = true;
  c.scale = 400;  // scores of several thousand
  Problem p(c);
  reference::attention(p.args);
  const testing::Expected e = testing::naive_attention(p);
  EXPECT_GT(e.max_abs_score, 1000);
  // The softmax is then nearly one-hot; fp32 score rounding (~1e-3 at 1e4) can still move
  // near-ties, so compare outputs against the value scale.
  EXPECT_LE(testing::max_error(p.args.out, e.out), 1e-2 * c.magnitude);
  EXPECT_LE(testing::max_lse_error(p.lse.data(), e.lse), 1e-6);
}

TEST(ReferenceEdges, WeightsSumToOneAndMaskedAreExactlyZero) {
  Case c{.B = 2, .Hq = 2, .Hkv = 2, .Tq = 6, .Tk = 6, .D = 8, .Dv = 8};
  c.causal = true;
  c.window_left = 2;
  Problem p(c);
  Tensor w({2, 2, 6, 6});
  reference::attention(p.args, w);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 6; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < 6; ++j) {
          sum += w.view()(b, h, i, j);
          if (j > i || j < i - 2) {
            EXPECT_EQ(w.view()(b, h, i, j), 0.0f);
          }
        }
        EXPECT_NEAR(sum, 1.0, 1e-6);
      }
}

TEST(ReferenceLayouts, SeqMajorAndHeadMajorGiveIdenticalBits) {
  Case c{.B = 2, .Hq = 4, .Hkv = 2, .Tq = 5, .Tk = 6, .D = 8, .Dv = 4};
  c.causal = true;
  Problem head_major(c);
  c.seq_major = true;
  Problem seq_major(c);
  // Same numbers, different storage order.
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Tq; ++i)
        for (int64_t d = 0; d < c.D; ++d)
          seq_major.args.q(b, h, i, d) = head_major.args.q(b, h, i, d);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hkv; ++h)
      for (int64_t j = 0; j < c.Tk; ++j) {
        for (int64_t d = 0; d < c.D; ++d)
          seq_major.args.k(b, h, j, d) = head_major.args.k(b, h, j, d);
        for (int64_t d = 0; d < c.Dv; ++d)
          seq_major.args.v(b, h, j, d) = head_major.args.v(b, h, j, d);
      }
  reference::attention(head_major.args);
  reference::attention(seq_major.args);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Tq; ++i)
        for (int64_t d = 0; d < c.Dv; ++d)
          EXPECT_EQ(seq_major.args.out(b, h, i, d), head_major.args.out(b, h, i, d));
}

TEST(ReferenceLayouts, KeysAndValuesAsSubViewsOfALargerCache) {
  // A cache of 16 positions of which the first 7 are filled: attention over the slice equals
  // attention over a compact copy.
  Case c{.B = 1, .Hq = 2, .Hkv = 2, .Tq = 3, .Tk = 16, .D = 8, .Dv = 8};
  Problem cache(c);
  c.Tk = 7;
  Problem compact(c);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t d = 0; d < 8; ++d) compact.args.q(0, h, i, d) = cache.args.q(0, h, i, d);
    for (int64_t j = 0; j < 7; ++j)
      for (int64_t d = 0; d < 8; ++d) {
        compact.args.k(0, h, j, d) = cache.args.k(0, h, j, d);
        compact.args.v(0, h, j, d) = cache.args.v(0, h, j, d);
      }
  }
  AttentionArgs sliced = cache.args;
  sliced.k = cache.args.k.slice(2, 0, 7);
  sliced.v = cache.args.v.slice(2, 0, 7);
  reference::attention(sliced);
  reference::attention(compact.args);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t d = 0; d < 8; ++d)
        EXPECT_EQ(cache.args.out(0, h, i, d), compact.args.out(0, h, i, d));
}

TEST(ReferenceThreads, SameBitsWithOneAndTwoThreads) {
  Case c{.B = 2, .Hq = 4, .Hkv = 2, .Tq = 33, .Tk = 33, .D = 16, .Dv = 16};
  c.causal = true;
  Problem one(c), two(c);
  const int saved = num_threads();
  set_num_threads(1);
  reference::attention(one.args);
  set_num_threads(2);
  reference::attention(two.args);
  set_num_threads(saved);
  for (int64_t i = 0; i < one.out.numel(); ++i) ASSERT_EQ(one.out.data()[i], two.out.data()[i]);
}

// ---- Bad input: a clear error naming what is wrong -----------------------------------------

void expect_error(const AttentionArgs& a, const std::string& fragment) {
  try {
    reference::attention(a);
    ADD_FAILURE() << "expected an error containing \"" << fragment << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << "message: " << e.what();
  }
}

TEST(ReferenceErrors, NameTheArgumentAndShapes) {
  Case c{.B = 2, .Hq = 4, .Hkv = 2, .Tq = 5, .Tk = 6, .D = 8, .Dv = 4};
  Problem p(c);
  Tensor k80({2, 2, 6, 80});
  AttentionArgs a = p.args;
  a.k = k80;
  expect_error(a, "k has head dim 80 but q has 8");

  Tensor k3({2, 3, 6, 8}), v3({2, 3, 6, 4});
  a = p.args;
  a.k = k3;
  a.v = v3;
  expect_error(a, "q has 4 heads, not a multiple of the 3 key/value heads");

  a = p.args;
  a.out = p.args.out.slice(3, 0, 2);
  expect_error(a, "out is [2, 4, 5, 2], expected [2, 4, 5, 4]");

  a = p.args;
  a.q = p.args.q.slice(2, 0, 0);
  expect_error(a, "q has an empty dim");

  a = p.args;
  a.v = View();
  expect_error(a, "v [B, Hkv, Tk, Dv] is missing");

  a = p.args;
  a.q = View(p.q.data(), {2, 4, 40});
  expect_error(a, "q [B, Hq, Tq, D] must have 4 dims, got [2, 4, 40]");

  int32_t lengths[2] = {6, 7};
  a = p.args;
  a.mask.kv_len = lengths;
  expect_error(a, "kv_len[1] = 7 is outside [0, Tk = 6]");

  Tensor bias({3, 6});
  a = p.args;
  a.mask.bias = bias;
  expect_error(a, "bias [3, 6] does not broadcast to [B, Hq, Tq, Tk] = [2, 4, 5, 6]");

  a = p.args;
  a.softcap = -1;
  expect_error(a, "softcap must be >= 0");

  a = p.args;
  a.mask.window_left = -3;
  expect_error(a, "window sizes must be >= 0");

  Tensor w({2, 4, 5, 5});
  try {
    reference::attention(p.args, w);
    ADD_FAILURE() << "weights of the wrong shape were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weights is [2, 4, 5, 5], expected [2, 4, 5, 6]"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace qkv
