// Fuzz target: any text given to parse_score ends in a score function or a qkv::Error. A
// function that reads back must print to a text that reads back to the same function (the same
// values at every point, NaN where it is NaN, and the same relative tables), and attention
// with it, forward and backward on a small problem, must end in a result or a qkv::Error.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/score_function.h"
#include "qkv/tensor.h"

namespace {

bool same(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  constexpr int64_t kH = 2, kT = 11, kD = 8;
  static std::vector<float> rel = {0.5f, -1.0f, 0.25f, 2.0f, -0.125f, 3.0f},
                            slopes = {0.5f, 0.0625f}, rel_grad(6);
  const std::vector<qkv::ScoreTensor> floats = {
      qkv::ScoreTensor("rel", {kH, 3}, rel.data(), rel_grad.data()),
      qkv::ScoreTensor("slopes", {kH}, slopes.data())};
  const std::vector<qkv::MaskTensor> ints = {qkv::MaskTensor(
      "bucket", {2 * kT - 1}, {2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2})};
  qkv::MaskExpr f(false);
  try {
    f = qkv::parse_score(text, floats, ints);
  } catch (const qkv::Error&) {
    return 0;
  }
  const qkv::MaskExpr again = qkv::parse_score(qkv::to_string(f), floats, ints);
  if (qkv::to_string(again) != qkv::to_string(f)) std::abort();
  for (double score : {-2.5, 0.0, 1.75})
    for (int64_t h = 0; h < kH; ++h)
      for (int64_t i = 0; i < kT; i += 3)
        for (int64_t j = 0; j < kT; j += 2) {
          double x = 0, y = 0;
          bool threw = false;
          try {
            x = qkv::evaluate_score(f, score, 0, h, i, j);
          } catch (const qkv::Error&) {
            threw = true;
          }
          try {
            y = qkv::evaluate_score(again, score, 0, h, i, j);
            if (threw) std::abort();
          } catch (const qkv::Error&) {
            if (!threw) std::abort();
          }
          if (!same(x, y)) std::abort();
        }
  qkv::ScoreFunction compiled;
  try {
    compiled = qkv::ScoreFunction(f);
  } catch (const qkv::Error&) {
    return 0;  // a boolean, or values that may leave 32 bits
  }
  if (qkv::ScoreFunction(again).tables() != compiled.tables()) std::abort();
  qkv::Tensor q({1, kH, kT, kD}), k({1, kH, kT, kD}), v({1, kH, kT, kD}), out({1, kH, kT, kD});
  qkv::Tensor dout({1, kH, kT, kD}), dq({1, kH, kT, kD}), dk({1, kH, kT, kD}), dv({1, kH, kT, kD});
  std::vector<float> lse(kH * kT);
  for (int64_t n = 0; n < q.numel(); ++n) {
    q.data()[n] = 0.1f * static_cast<float>(n % 13) - 0.6f;
    k.data()[n] = 0.1f * static_cast<float>(n % 7) - 0.3f;
    v.data()[n] = 0.1f * static_cast<float>(n % 5);
  }
  dout.fill(1.0f);
  qkv::AttentionArgs args{.q = q, .k = k, .v = v, .out = out, .lse = lse.data()};
  args.mask.causal = size % 2 == 0;
  args.score_mod = &compiled;
  try {
    qkv::attention(args);
    qkv::attention_backward(args, dout, dq, dk, dv);
  } catch (const qkv::Error&) {
  }
  return 0;
}
