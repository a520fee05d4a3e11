// The model: its full backward against finite differences, and the articles' claim about
// order (attention alone is blind to it; positional information breaks the symmetry).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "finite_differences.h"
#include "model_configs.h"
#include "qkv/model.h"
#include "qkv/ops.h"
#include "qkv/params.h"

namespace qkv {
namespace {

ModelConfig tiny(bool llama) {
  ModelConfig c = testing::small_model(11, 8, llama, 8);
  c.d_head = 4;
  c.n_heads = 2;
  c.n_kv_heads = llama ? 1 : 2;
  c.d_ff = 12;
  return c;
}

// Logits [T, V] of one sequence.
std::vector<float> logits_of(Model& m, const std::vector<int32_t>& tokens) {
  m.forward(tokens.data(), nullptr, 1, static_cast<int64_t>(tokens.size()));
  const View l = m.logits();
  std::vector<float> out;
  for (int64_t n = 0; n < l.shape[0]; ++n)
    for (int64_t v = 0; v < l.shape[1]; ++v) out.push_back(l(n, v));
  return out;
}

void expect_model_gradients(const ModelConfig& c) {
  Model m(c, 7);
  // With attention dropout: in training mode, every forward drawing the first forward's masks.
  m.set_training(c.attn_dropout > 0);
  // Larger weights than the 0.02 init, so every path carries a visible gradient.
  const auto w = testing::random_vector(m.num_params(), 3, 0.5f);
  // (And the sinks, which start at 0 as biases do.)
  for (const ParamInfo& p : m.params())
    if (p.decay || p.name.ends_with("attn.sinks"))
      for (int64_t i = 0; i < p.rows * p.cols; ++i) m.weights()[p.offset + i] = w[p.offset + i];
  const int64_t B = 2, T = 5;
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i)
    tokens[i] = (i * 7 + 3) % c.vocab_size, targets[i] = (i * 5 + 1) % c.vocab_size;
  targets[3] = kIgnoreIndex;
  m.zero_grad();
  m.set_dropout_draws(0);
  m.forward(tokens.data(), targets.data(), B, T);
  m.backward();
  std::vector<float> grads(m.grads(), m.grads() + m.num_params());
  testing::expect_gradient(
      m.weights(), grads.data(), m.num_params(),
      [&] {
        m.set_dropout_draws(0);
        return double(m.forward(tokens.data(), targets.data(), B, T));
      },
      "params", 5e-3);
}

TEST(ModelGradients, AttentionDropoutMatchesFiniteDifferencesWithItsMasks) {
  ModelConfig c = tiny(false);
  c.attn_dropout = 0.3f;
  expect_model_gradients(c);
}

// Dropout is on in training mode only: off, the model is the one without dropout to the bit;
// on, each forward draws new masks, and set_dropout_draws repeats one.
TEST(ModelDropout, TrainingModeOnly) {
  ModelConfig c = tiny(true), plain_config = c;
  c.attn_dropout = 0.5f;
  Model m(c, 7), plain(plain_config, 7);
  const std::vector<int32_t> tokens = {1, 4, 7, 2, 9, 5, 3, 8};
  EXPECT_EQ(logits_of(m, tokens), logits_of(plain, tokens));
  m.set_training(true);
  const auto first = logits_of(m, tokens), second = logits_of(m, tokens);
  EXPECT_NE(first, logits_of(plain, tokens));
  EXPECT_NE(first, second);
  m.set_dropout_draws(0);
  EXPECT_EQ(logits_of(m, tokens), first);
  m.set_training(false);
  EXPECT_EQ(logits_of(m, tokens), logits_of(plain, tokens));
}

TEST(ModelGradients, Gpt2StyleMatchesFiniteDifferences) { expect_model_gradients(tiny(false)); }

TEST(ModelGradients, LlamaStyleMatchesFiniteDifferences) { expect_model_gradients(tiny(true)); }

TEST(ModelGradients, SinksMatchFiniteDifferences) {
  ModelConfig c = tiny(true);
  c.sinks = true;
  expect_model_gradients(c);
}

TEST(ModelGradients, SinusoidalAndAlibiMatchFiniteDifferences) {
  ModelConfig c = tiny(false);
  c.positions = PositionKind::sinusoidal;
  expect_model_gradients(c);
  c.positions = PositionKind::alibi;
  expect_model_gradients(c);
}

// Without positional information and without the causal mask, a permutation of the tokens
// permutes the outputs and changes nothing else.
TEST(Order, AttentionAloneIsBlindToOrder) {
  const std::vector<int32_t> tokens = {1, 4, 7, 2, 9, 5}, perm = {3, 0, 5, 1, 4, 2};
  std::vector<int32_t> shuffled(tokens.size());
  for (size_t i = 0; i < perm.size(); ++i) shuffled[i] = tokens[perm[i]];
  const int64_t V = 11;
  for (PositionKind pk : {PositionKind::none, PositionKind::learned, PositionKind::sinusoidal,
                          PositionKind::rotary, PositionKind::alibi}) {
    ModelConfig c = tiny(false);
    c.causal = false;
    c.positions = pk;
    Model m(c, 11);
    // Non-zero positions and larger weights, so that any positional signal shows.
    const auto w = testing::random_vector(m.num_params(), 5, 0.5f);
    for (const ParamInfo& p : m.params())
      if (p.decay)
        for (int64_t i = 0; i < p.rows * p.cols; ++i) m.weights()[p.offset + i] = w[p.offset + i];
    const auto a = logits_of(m, tokens), b = logits_of(m, shuffled);
    double worst = 0;
    for (size_t i = 0; i < perm.size(); ++i)
      for (int64_t v = 0; v < V; ++v)
        worst = std::max<double>(worst, std::abs(b[i * V + v] - a[perm[i] * V + v]));
    if (pk == PositionKind::none)
      EXPECT_LT(worst, 1e-5) << "without positions the outputs must just permute";
    else EXPECT_GT(worst, 1e-3) << "positions kind " << to_string(pk) << " must break the symmetry";
  }
}

TEST(Model, ParameterCountMatchesTheCalculator) {
  // `qkv params` counts the same model from its formulas; the model lays out its buffers.
  for (bool llama : {false, true}) {
    const ModelConfig c = tiny(llama);
    EXPECT_EQ(Model(c, 1).num_params(), count_params(c).total);
  }
  EXPECT_EQ(Model(find_preset("stories260k").config, 1).num_params(), 260032);
}

}  // namespace
}  // namespace qkv
