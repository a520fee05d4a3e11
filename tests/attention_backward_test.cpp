// Attention gradients: the reference backward against finite differences of an independent
// double-precision forward, and the tiled backward against the reference backward.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "attention_problem.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/threads.h"

namespace qkv {
namespace {

using testing::BiasKind;
using testing::Case;
using testing::Grads;
using testing::Inputs;
using testing::Problem;

double loss(const Case& c, const Inputs& in, const Tensor& dout) {
  const testing::Expected e = testing::naive_attention(c, in);
  double l = 0;
  for (size_t i = 0; i < e.out.size(); ++i) l += e.out[i] * dout.data()[i];
  return l;
}

// Central differences in double precision, for every element of q, k and v.
void expect_matches_finite_differences(const Case& c) {
  Problem p(c);
  Grads g(c);
  std::vector<float> dsinks(c.Hq, NAN);
  reference::attention_backward(p.args, g.dout, g.dq, g.dk, g.dv,
                                {c.sinks ? dsinks.data() : nullptr});
  Inputs in = testing::inputs_of(p);
  const double h = 1e-6, h_step = h;
  double worst = 0;
  auto check = [&](std::vector<double>& x, const Tensor& grad, const char* name) {
    ASSERT_EQ(static_cast<int64_t>(x.size()), grad.numel());
    for (size_t i = 0; i < x.size(); ++i) {
      const double saved = x[i];
      x[i] = saved + h;
      const double up = loss(c, in, g.dout);
      x[i] = saved - h;
      const double down = loss(c, in, g.dout);
      x[i] = saved;
      const double numeric = (up - down) / (2 * h);
      // fp32 gradients: a few ulps of their magnitude, plus the finite-difference error.
      const double err = std::abs(grad.data()[i] - numeric) / (1 + std::abs(numeric));
      worst = std::max(worst, err);
      ASSERT_LT(err, 1e-5) << name << "[" << i << "] analytic " << grad.data()[i] << " numeric "
                           << numeric << " (" << c.name() << ")";
    }
  };
  check(in.q, g.dq, "dq");
  check(in.k, g.dk, "dk");
  check(in.v, g.dv, "dv");
  if (!c.sinks) return;
  // Head 0 has no sink (-inf): nothing flows to it.
  EXPECT_EQ(dsinks[0], 0.0f);
  std::vector<double> finite(in.sinks.begin() + 1, in.sinks.end());
  for (size_t h = 0; h < finite.size(); ++h) {
    const double saved = in.sinks[h + 1];
    in.sinks[h + 1] = saved + h_step;
    const double up = loss(c, in, g.dout);
    in.sinks[h + 1] = saved - h_step;
    const double down = loss(c, in, g.dout);
    in.sinks[h + 1] = saved;
    const double numeric = (up - down) / (2 * h_step);
    EXPECT_LT(std::abs(dsinks[h + 1] - numeric) / (1 + std::abs(numeric)), 1e-5)
        << "dsinks[" << h + 1 << "] analytic " << dsinks[h + 1] << " numeric " << numeric;
  }
}

class ReferenceBackward : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceBackward, MatchesFiniteDifferences) {
  expect_matches_finite_differences(GetParam());
}

std::vector<Case> tiny_grid() {
  return testing::variations(Case{.B = 2, .Hq = 2, .Hkv = 2, .Tq = 4, .Tk = 4, .D = 3, .Dv = 3},
                             {
                                 [](Case&) {}, [](Case& c) { c.causal = true; },
                                 [](Case& c) {
                                   c.Hq = 4;
                                   c.Hkv = 2;
                                   c.causal = true;
                                 },  // GQA sums over the group
                                 [](Case& c) {
                                   c.Hq = 4;
                                   c.Hkv = 1;
                                 },
                                 [](Case& c) {
                                   c.Tq = 3;
                                   c.Tk = 5;
                                   c.Dv = 2;
                                 },  // cross, Dv ≠ D
                                 [](Case& c) {
                                   c.window_left = 1;
                                   c.window_right = 1;
                                 },
                                 [](Case& c) {
                                   c.padding = true;
                                   c.causal = true;
                                 },
                                 [](Case& c) {
                                   c.softcap = 0.8f;
                                   c.magnitude = 2;
                                 },
                                 [](Case& c) {
                                   c.bias = BiasKind::full;
                                   c.alibi = true;
                                   c.scale = 0.7f;
                                 },
                                 [](Case& c) {
                                   c.Tq = 5;
                                   c.Tk = 2;
                                   c.causal = true;
                                 },  // rows that see nothing
                                 [](Case& c) {
                                   c.Hq = 4;
                                   c.Tq = 5;
                                   c.Tk = 3;
                                   c.causal = true;
                                   c.sinks = true;
                                 },  // a sink per head, and rows that see only their sink
                                 [](Case& c) { c.dropout = 0.3f; },
                                 [](Case& c) {
                                   c.Hq = 4;
                                   c.Hkv = 1;
                                   c.Tq = 5;
                                   c.Tk = 7;
                                   c.causal = true;
                                   c.sinks = true;
                                   c.dropout = 0.5f;
                                 },  // dropout with a sink, MQA and rows that see nothing
                             });
}

INSTANTIATE_TEST_SUITE_P(Tiny, ReferenceBackward, ::testing::ValuesIn(tiny_grid()),
                         [](const auto& info) { return info.param.name(); });

// ---- The tiled backward against the reference backward ------------------------------------

void expect_backward_matches_reference(const Case& c) {
  Problem fast(c), ref(c);
  attention(fast.args);            // the fast backward needs the forward's out and lse
  Grads gf(c, true), gr(c, true);  // the same layout: storage compares element by element
  std::vector<float> dsf(c.Hq, NAN), dsr(c.Hq, NAN);
  attention_backward(fast.args, gf.dout_view, gf.dq_view, gf.dk_view, gf.dv_view,
                     {c.sinks ? dsf.data() : nullptr});
  reference::attention_backward(ref.args, gr.dout_view, gr.dq_view, gr.dk_view, gr.dv_view,
                                {c.sinks ? dsr.data() : nullptr});
  // Gradients sum Tq (or Tk) products of values of size ~magnitude: scale the fp32
  // tolerance by the longer sum.
  const double tol = 64 * FLT_EPSILON * std::sqrt(double(std::max(c.Tq, c.Tk)) * c.D) *
                     c.magnitude * (1 + std::abs(c.softcap)) / (1 - c.dropout);
  auto compare = [&](const Tensor& a, const Tensor& b, const char* name) {
    double worst = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      ASSERT_FALSE(std::isnan(a.data()[i])) << name;
      worst = std::max<double>(worst,
                               std::abs(a.data()[i] - b.data()[i]) / (1 + std::abs(b.data()[i])));
    }
    EXPECT_LE(worst, tol) << name << " " << c.name();
  };
  compare(gf.dq, gr.dq, "dq");
  compare(gf.dk, gr.dk, "dk");
  compare(gf.dv, gr.dv, "dv");
  // A sink's gradient sums B · Tq terms, each within the fp32 error of out.
  for (int64_t h = 0; h < c.Hq && c.sinks; ++h)
    EXPECT_NEAR(dsf[h], dsr[h], tol * std::sqrt(double(c.B * c.Tq)) * (1 + std::abs(dsr[h])))
        << "dsinks[" << h << "] " << c.name();
}

class FlashBackward : public ::testing::TestWithParam<Case> {};

TEST_P(FlashBackward, MatchesReferenceBackward) { expect_backward_matches_reference(GetParam()); }

std::vector<Case> backward_grid() {
  return testing::variations(Case{.B = 2, .Hq = 4, .Hkv = 4, .Tq = 67, .Tk = 67, .D = 32, .Dv = 32},
                             {
                                 [](Case&) {},
                                 [](Case& c) {
                                   c.causal = true;
                                   c.dropout = 0.1f;
                                 },
                                 [](Case& c) {
                                   c.Hkv = 1;
                                   c.Tq = c.Tk = 129;
                                   c.window_left = 9;
                                   c.window_right = 30;
                                   c.dropout = 0.6f;
                                 },
                                 [](Case& c) { c.causal = true; },
                                 [](Case& c) {
                                   c.Tq = 1;
                                   c.Tk = 1;
                                 },
                                 [](Case& c) {
                                   c.Tq = 7;
                                   c.Tk = 130;
                                   c.causal = true;
                                 },
                                 [](Case& c) {
                                   c.Tq = 130;
                                   c.Tk = 7;
                                   c.causal = true;
                                 },
                                 [](Case& c) {
                                   c.Tq = c.Tk = 129;
                                   c.window_left = 20;
                                   c.causal = true;
                                 },
                                 [](Case& c) {
                                   c.Tq = c.Tk = 129;
                                   c.window_left = 9;
                                   c.window_right = 30;
                                 },
                                 [](Case& c) {
                                   c.padding = true;
                                   c.B = 3;
                                   c.causal = true;
                                 },
                                 [](Case& c) {
                                   c.bias = BiasKind::batch_key;
                                   c.alibi = true;
                                 },
                                 [](Case& c) {
                                   c.softcap = 1.5f;
                                   c.magnitude = 3;
                                 },
                                 [](Case& c) {
                                   c.Hkv = 2;
                                   c.causal = true;
                                 },
                                 [](Case& c) {
                                   c.Hkv = 1;
                                   c.Tq = c.Tk = 65;
                                 },
                                 [](Case& c) {
                                   c.Tq = 33;
                                   c.Tk = 100;
                                   c.D = 16;
                                   c.Dv = 40;
                                 },
                                 [](Case& c) {
                                   c.D = c.Dv = 80;
                                   c.Tq = c.Tk = 63;
                                   c.causal = true;
                                 },
                                 [](Case& c) {
                                   c.D = c.Dv = 128;
                                   c.Tq = c.Tk = 65;
                                   c.B = 1;
                                 },
                                 [](Case& c) {
                                   c.D = c.Dv = 256;
                                   c.Tq = c.Tk = 33;
                                   c.B = 1;
                                   c.Hq = c.Hkv = 2;
                                 },
                                 [](Case& c) {
                                   c.seq_major = true;
                                   c.Hkv = 2;
                                   c.causal = true;
                                   c.padding = true;
                                 },
                                 [](Case& c) {
                                   c.dim_strided = true;
                                   c.Hkv = 2;
                                   c.causal = true;
                                   c.Dv = 24;
                                 },
                                 [](Case& c) {
                                   c.Tq = c.Tk = 1000;
                                   c.D = c.Dv = 16;
                                   c.B = 1;
                                   c.Hq = 2;
                                   c.Hkv = 1;
                                   c.causal = true;
                                 },
                                 [](Case& c) { c.sinks = true; },
                                 [](Case& c) {
                                   c.Tq = 130;
                                   c.Tk = 7;
                                   c.Hkv = 2;
                                   c.causal = true;
                                   c.sinks = true;
                                 },
                             });
}

INSTANTIATE_TEST_SUITE_P(Grid, FlashBackward, ::testing::ValuesIn(backward_grid()),
                         [](const auto& info) { return info.param.name(); });

// With 2 key/value heads both thread counts give each thread whole heads; with 1 (MQA),
// 2 threads split the key tiles of each query tile instead (in batches of 64 key tiles, which
// 4,200 keys overrun); with 3 (batch 3, MQA) they take a head each, then split the third:
// the bits must not change.
TEST(FlashBackwardThreads, SameBitsWithOneAndTwoThreads) {
  const Case cases[] = {
      {.B = 1, .Hq = 4, .Hkv = 2, .Tq = 200, .Tk = 300, .D = 64, .Dv = 64, .causal = true},
      {.B = 1, .Hq = 4, .Hkv = 1, .Tq = 200, .Tk = 300, .D = 64, .Dv = 64, .causal = true},
      {.B = 1, .Hq = 2, .Hkv = 1, .Tq = 20, .Tk = 4200, .D = 16, .Dv = 16},
      {.B = 3, .Hq = 2, .Hkv = 1, .Tq = 130, .Tk = 150, .D = 32, .Dv = 32, .causal = true},
  };
  for (const Case& c : cases) {
    Problem p(c);
    attention(p.args);
    Grads one(c), two(c);
    const int saved = num_threads();
    set_num_threads(1);
    attention_backward(p.args, one.dout, one.dq, one.dk, one.dv);
    set_num_threads(2);
    attention_backward(p.args, two.dout, two.dq, two.dk, two.dv);
    set_num_threads(saved);
    for (auto [a, b] : {std::pair{&one.dq, &two.dq}, {&one.dk, &two.dk}, {&one.dv, &two.dv}})
      for (int64_t i = 0; i < a->numel(); ++i) ASSERT_EQ(a->data()[i], b->data()[i]) << c.name();
  }
}

// The sinks' gradient at 1, 2, 3 and 16 threads: the same bits.
TEST(FlashBackwardThreads, SinkGradientSameBitsAtAnyThreadCount) {
  const Case c{.B = 3,
               .Hq = 8,
               .Hkv = 2,
               .Tq = 150,
               .Tk = 150,
               .D = 32,
               .Dv = 32,
               .causal = true,
               .sinks = true};
  Problem p(c);
  attention(p.args);
  const int saved = num_threads();
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 2, 3, 16}) {
    set_num_threads(threads);
    Grads g(c);
    runs.emplace_back(c.Hq, NAN);
    attention_backward(p.args, g.dout, g.dq, g.dk, g.dv, {runs.back().data()});
  }
  set_num_threads(saved);
  for (size_t r = 1; r < runs.size(); ++r)
    for (int64_t h = 0; h < c.Hq; ++h)
      ASSERT_EQ(runs[r][h], runs[0][h]) << "run " << r << " head " << h;
}

// Rows past a sequence's kv_len may hold anything: NaN there must reach neither dq nor the
// other rows' dk and dv (and the rows past kv_len get zero gradients).
TEST(FlashBackwardEdges, KeysPastKvLenAreNeverRead) {
  const Case c{.B = 2, .Hq = 4, .Hkv = 2, .Tq = 150, .Tk = 300, .D = 32, .Dv = 32, .causal = true};
  testing::PaddedPair p(c, 170);
  attention(p.clean.args);
  attention(p.poisoned.args);
  Grads a(c), b(c);
  attention_backward(p.clean.args, a.dout, a.dq, a.dk, a.dv);
  attention_backward(p.poisoned.args, b.dout, b.dq, b.dk, b.dv);
  for (auto [x, y] : {std::pair{&a.dq, &b.dq}, {&a.dk, &b.dk}, {&a.dv, &b.dv}})
    for (int64_t i = 0; i < x->numel(); ++i) ASSERT_EQ(x->data()[i], y->data()[i]) << i;
  for (int64_t h = 0; h < c.Hkv; ++h)
    for (int64_t j = 170; j < c.Tk; ++j) ASSERT_EQ(b.dk.view()(1, h, j, 0), 0.0f);
}

TEST(FlashBackwardErrors, NeedsLseAndMatchingShapes) {
  Case c{.B = 1, .Hq = 2, .Hkv = 2, .Tq = 5, .Tk = 5, .D = 8, .Dv = 8};
  Problem p(c);
  Grads g(c);
  AttentionArgs a = p.args;
  a.lse = nullptr;
  EXPECT_THROW(attention_backward(a, g.dout, g.dq, g.dk, g.dv), Error);
  Tensor wrong({1, 2, 5, 4});
  try {
    attention_backward(p.args, g.dout, wrong, g.dk, g.dv);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dq is [1, 2, 5, 4] but q is [1, 2, 5, 8]"),
              std::string::npos)
        << e.what();
  }
  // The sinks' gradient without sinks; a sink that is NaN or +inf.
  auto expect_error = [&](const AttentionArgs& args, const ParameterGrads& grads,
                          const std::string& fragment) {
    try {
      attention_backward(args, g.dout, g.dq, g.dk, g.dv, grads);
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  float dsinks[2];
  expect_error(p.args, {dsinks}, "grads.sinks asks for the sinks' gradient, but args.sinks");
  float sinks[2] = {0, NAN};
  a = p.args;
  a.sinks = sinks;
  expect_error(a, {dsinks}, "the sink of head 1 is nan");
  sinks[1] = INFINITY;
  EXPECT_THROW(attention(a), Error);
}

}  // namespace
}  // namespace qkv
