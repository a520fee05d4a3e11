// Reference attention against PyTorch: golden files made by tests/golden/make_golden.py.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/tensor.h"

namespace qkv {
namespace {

using nlohmann::json;

json load(const std::string& name) {
  const std::string path = std::string(QKV_GOLDEN_DIR) + "/attention_" + name + ".json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("missing golden file " + path);
  return json::parse(in);
}

Tensor tensor_from(const json& values, std::initializer_list<int64_t> shape) {
  Tensor t(shape);
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = values[i].get<float>();
  return t;
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, ReferenceMatchesPyTorch) {
  const json g = load(GetParam());
  const int64_t B = g["B"], Hq = g["Hq"], Hkv = g["Hkv"], Tq = g["Tq"], Tk = g["Tk"], D = g["D"],
                Dv = g["Dv"];
  Tensor q = tensor_from(g["q"], {B, Hq, Tq, D});
  Tensor k = tensor_from(g["k"], {B, Hkv, Tk, D});
  Tensor v = tensor_from(g["v"], {B, Hkv, Tk, Dv});
  Tensor out({B, Hq, Tq, Dv}), lse({B, Hq, Tq}), weights({B, Hq, Tq, Tk});
  AttentionArgs a;
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  a.lse = lse.data();
  a.scale = g["scale"];
  a.softcap = g["softcap"];
  a.mask.causal = g["causal"];
  a.mask.window_left = g["window_left"];
  a.mask.window_right = g["window_right"];
  std::vector<int32_t> kv_len;
  if (!g["kv_len"].is_null()) {
    kv_len = g["kv_len"].get<std::vector<int32_t>>();
    a.mask.kv_len = kv_len.data();
  }
  std::vector<float> alibi;
  if (!g["alibi"].is_null()) {
    alibi = g["alibi"].get<std::vector<float>>();
    a.mask.alibi = alibi.data();
  }
  Tensor bias;
  if (!g["bias"].is_null()) {
    const auto shape = g["bias_shape"].get<std::vector<int64_t>>();
    ASSERT_EQ(shape.size(), 2u);
    bias = tensor_from(g["bias"], {shape[0], shape[1]});
    a.mask.bias = bias;
  }

  reference::attention(a, weights);

  // Inputs are in [-1, 1] and scores stay below ~10: fp32 rounding of the scores moves each
  // weight by a few ulps of its score, and outputs are sums of Tk such products.
  const double tol = 64 * FLT_EPSILON;
  auto compare = [&](const Tensor& actual, const json& expected, const char* what) {
    ASSERT_EQ(static_cast<int64_t>(expected.size()), actual.numel()) << what;
    double worst = 0;
    for (int64_t i = 0; i < actual.numel(); ++i) {
      const double e = expected[i].get<double>(), x = actual.data()[i];
      ASSERT_FALSE(std::isnan(x)) << what << "[" << i << "] is NaN";
      worst = std::max(worst, std::abs(x - e) / (1 + std::abs(e)));
    }
    EXPECT_LE(worst, tol) << what;
  };
  compare(out, g["out"], "out");
  compare(weights, g["weights"], "weights");
  compare(lse, g["lse"], "lse");
}

INSTANTIATE_TEST_SUITE_P(PyTorch, Golden,
                         ::testing::Values("mha_padding", "mha_padding_causal", "gqa_cross_window",
                                           "bias_alibi_softcap"));

}  // namespace
}  // namespace qkv
