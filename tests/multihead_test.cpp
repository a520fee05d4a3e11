// The multi-head attention layer: cross-attention (queries from one sequence, keys and values
// from another) against a composition of independent pieces, and its backward against
// finite differences; self-attention's backward likewise.
#include <gtest/gtest.h>

#include <cmath>

#include "finite_differences.h"
#include "qkv/attention.h"
#include "qkv/multihead.h"

namespace qkv {
namespace {

using testing::dot;
using testing::expect_gradient;
using testing::random_vector;

constexpr int64_t B = 2, T = 3, S = 5, C = 8, Cc = 6, Hq = 4, Hkv = 2, dh = 3;

struct Cross {
  std::vector<float> x = random_vector(B * T * C, 1), ctx = random_vector(B * S * Cc, 2);
  std::vector<float> q_w = random_vector(Hq * dh * C, 3, 0.5f), q_b = random_vector(Hq * dh, 4);
  std::vector<float> kv_w = random_vector(2 * Hkv * dh * Cc, 5, 0.5f),
                     kv_b = random_vector(2 * Hkv * dh, 6);
  std::vector<float> out_w = random_vector(C * Hq * dh, 7, 0.5f), out_b = random_vector(C, 8);
  std::vector<float> dq_w = std::vector<float>(q_w.size()), dkv_w = std::vector<float>(kv_w.size()),
                     dout_w = std::vector<float>(out_w.size());
  MultiHeadAttention m;
  MultiHeadState state;
  Cross() {
    m.n_heads = Hq, m.n_kv_heads = Hkv, m.d_head = dh, m.causal = false;
    m.q_w = View(q_w.data(), {Hq * dh, C}), m.q_b = q_b.data();
    m.kv_w = View(kv_w.data(), {2 * Hkv * dh, Cc}), m.kv_b = kv_b.data();
    m.out_w = View(out_w.data(), {C, Hq * dh}), m.out_b = out_b.data();
    m.d_q_w = View(dq_w.data(), {Hq * dh, C});
    m.d_kv_w = View(dkv_w.data(), {2 * Hkv * dh, Cc});
    m.d_out_w = View(dout_w.data(), {C, Hq * dh});
  }
  std::vector<float> forward() {
    std::vector<float> y(B * T * C);
    multihead_forward(m, state, View(y.data(), {B * T, C}), View(x.data(), {B * T, C}),
                      View(ctx.data(), {B * S, Cc}), B, T, S);
    return y;
  }
};

TEST(CrossAttention, EqualsProjectionsAroundTheReferenceKernel) {
  Cross c;
  const std::vector<float> y = c.forward();
  // By hand: project q from x and k, v from the context with linear_forward, lay them out
  // as contiguous [B, H, T, dh] tensors, run the reference kernel, project back.
  std::vector<float> qr(B * T * Hq * dh), kvr(B * S * 2 * Hkv * dh);
  linear_forward(View(qr.data(), {B * T, Hq * dh}), View(c.x.data(), {B * T, C}), c.m.q_w,
                 c.q_b.data());
  linear_forward(View(kvr.data(), {B * S, 2 * Hkv * dh}), View(c.ctx.data(), {B * S, Cc}), c.m.kv_w,
                 c.kv_b.data());
  Tensor q({B, Hq, T, dh}), k({B, Hkv, S, dh}), v({B, Hkv, S, dh}), o({B, Hq, T, dh});
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t d = 0; d < dh; ++d)
          q.view()(b, h, t, d) = qr[(b * T + t) * Hq * dh + h * dh + d];
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t d = 0; d < dh; ++d) {
          k.view()(b, h, s, d) = kvr[(b * S + s) * 2 * Hkv * dh + h * dh + d];
          v.view()(b, h, s, d) = kvr[(b * S + s) * 2 * Hkv * dh + (Hkv + h) * dh + d];
        }
  }
  AttentionArgs a{.q = q, .k = k, .v = v, .out = o};
  reference::attention(a);
  std::vector<float> att(B * T * Hq * dh), expected(B * T * C);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t d = 0; d < dh; ++d)
          att[(b * T + t) * Hq * dh + h * dh + d] = o.view()(b, h, t, d);
  linear_forward(View(expected.data(), {B * T, C}), View(att.data(), {B * T, Hq * dh}), c.m.out_w,
                 c.out_b.data());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-5);
  const Tensor w = multihead_weights(c.m, c.state, B, T, S);
  EXPECT_EQ(w.size(3), S);
}

TEST(CrossAttention, BackwardMatchesFiniteDifferences) {
  Cross c;
  const auto g = random_vector(B * T * C, 9);
  auto loss = [&] { return dot(c.forward().data(), g); };
  loss();
  std::vector<float> dx(c.x.size()), dctx(c.ctx.size());
  multihead_backward(c.m, c.state, View(dx.data(), {B * T, C}), View(dctx.data(), {B * S, Cc}),
                     View(const_cast<float*>(g.data()), {B * T, C}), View(c.x.data(), {B * T, C}),
                     View(c.ctx.data(), {B * S, Cc}), B, T, S);
  expect_gradient(c.x.data(), dx.data(), c.x.size(), loss, "dx");
  expect_gradient(c.ctx.data(), dctx.data(), c.ctx.size(), loss, "dcontext");
  expect_gradient(c.q_w.data(), c.dq_w.data(), c.q_w.size(), loss, "dq_w");
  expect_gradient(c.kv_w.data(), c.dkv_w.data(), c.kv_w.size(), loss, "dkv_w");
  expect_gradient(c.out_w.data(), c.dout_w.data(), c.out_w.size(), loss, "dout_w");
}

TEST(SelfAttention, RotaryCausalBackwardMatchesFiniteDifferences) {
  const int64_t d = 4, W = (Hq + 2 * Hkv) * d;  // rotary needs an even head dim
  auto x = random_vector(B * T * C, 11), w = random_vector(W * C, 12, 0.5f),
       o = random_vector(C * Hq * d, 13, 0.5f);
  std::vector<float> dw(w.size()), dov(o.size()), dx(x.size()), y(B * T * C);
  MultiHeadAttention m;
  m.n_heads = Hq, m.n_kv_heads = Hkv, m.d_head = d, m.rotary = true;
  m.qkv_w = View(w.data(), {W, C}), m.out_w = View(o.data(), {C, Hq * d});
  m.d_qkv_w = View(dw.data(), {W, C}), m.d_out_w = View(dov.data(), {C, Hq * d});
  MultiHeadState state;
  const auto g = random_vector(B * T * C, 14);
  auto loss = [&] {
    multihead_forward(m, state, View(y.data(), {B * T, C}), View(x.data(), {B * T, C}), View{}, B,
                      T, T);
    return dot(y.data(), g);
  };
  loss();
  multihead_backward(m, state, View(dx.data(), {B * T, C}), View{},
                     View(const_cast<float*>(g.data()), {B * T, C}), View(x.data(), {B * T, C}),
                     View{}, B, T, T);
  expect_gradient(x.data(), dx.data(), x.size(), loss, "dx");
  expect_gradient(w.data(), dw.data(), w.size(), loss, "dqkv_w");
  expect_gradient(o.data(), dov.data(), o.size(), loss, "dout_w");
}

}  // namespace
}  // namespace qkv
