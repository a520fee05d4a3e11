// quant::linear_forward, on every SIMD target, against the reference dequantizer and a
// float64 product: every block type, one row (the fused kernels) and many (the tile path),
// weights in parts, a bias, strided rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "qkv/error.h"
#include "qkv/quant.h"

namespace qkv {
namespace {

using qkv::TensorType;

// Random blocks of `type` with sane half-precision scales (values up to ~±10).
std::vector<uint8_t> random_blocks(TensorType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const int64_t rb = quant::row_bytes(type, cols);
  std::vector<uint8_t> data(rows * rb);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : data) b = static_cast<uint8_t>(byte(rng));
  // Half scales up to 2^-4, subnormal ones among them, either sign where the format allows it.
  std::uniform_int_distribution<int> mant(0, 0x3ff), expo(0, 10);
  auto half = [&](uint8_t* p, bool negative) {
    const uint16_t h = static_cast<uint16_t>((negative ? 0x8000 : 0) | expo(rng) << 10 | mant(rng));
    p[0] = h & 0xff, p[1] = h >> 8;
  };
  const BlockSize bs = block_of(type);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / bs.elements; ++b) {
      uint8_t* blk = data.data() + r * rb + b * bs.bytes;
      switch (type) {
        case TensorType::q8_0:
        case TensorType::q4_0:
          half(blk, byte(rng) & 1);
          break;
        case TensorType::q4_1:
          half(blk, false), half(blk + 2, true);
          break;
        case TensorType::q4_k:
          half(blk, false), half(blk + 2, false);
          break;
        case TensorType::q6_k:
          half(blk + 208, false);
          break;
        case TensorType::f16:
          half(blk, byte(rng) & 1), blk[1] += 0x14;
          break;  // ~±1
        case TensorType::bf16:
          blk[1] = static_cast<uint8_t>((blk[1] & 0x80) | 0x3f);
          break;
        case TensorType::f32: {
          const float f = std::uniform_real_distribution<float>(-1, 1)(rng);
          std::memcpy(blk, &f, 4);
          break;
        }
        default:
          break;
      }
    }
  return data;
}

class QuantLinear : public ::testing::TestWithParam<TensorType> {};

TEST_P(QuantLinear, MatchesTheReferenceDequantizer) {
  const TensorType type = GetParam();
  std::mt19937 rng(static_cast<unsigned>(type) + 7);
  const int64_t K = 512;  // whole blocks of every type (256 for the K-quants)
  const std::vector<int64_t> part_rows = {37, 64, 5};  // ragged: rows left over per chunk and step
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<quant::Matrix> parts;
  for (int64_t rows : part_rows) {
    bytes.push_back(random_blocks(type, rows, K, rng));
    parts.push_back(quant::matrix("w", type, bytes.back().data(), rows, K));
  }
  int64_t N = 0;
  for (int64_t r : part_rows) N += r;
  std::vector<float> w(N * K);
  for (size_t p = 0, row = 0; p < parts.size(); row += parts[p].rows, ++p)
    quant::dequantize_rows(parts[p], 0, parts[p].rows, w.data() + row * K);
  std::vector<float> bias(N);
  std::normal_distribution<float> normal;
  for (float& b : bias) b = normal(rng);
  for (int64_t M : {1, 2, 5, 33}) {
    for (bool with_bias : {false, true}) {
      const int64_t ldx = K + 3, ldy = N + 5;  // strided rows
      std::vector<float> x(M * ldx), y(M * ldy, NAN);
      for (float& v : x) v = normal(rng);
      quant::linear_forward(View(y.data(), {M, N}, {ldy, 1}), View(x.data(), {M, K}, {ldx, 1}),
                            parts, with_bias ? bias.data() : nullptr);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t n = 0; n < N; ++n) {
          double want = with_bias ? bias[n] : 0, size = 0;
          for (int64_t k = 0; k < K; ++k) {
            want += static_cast<double>(w[n * K + k]) * x[i * ldx + k];
            size += std::abs(static_cast<double>(w[n * K + k]) * x[i * ldx + k]);
          }
          ASSERT_NEAR(y[i * ldy + n], want, 1e-6 * size + 1e-6)
              << to_string(type) << " M " << M << " row " << i << " output " << n;
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, QuantLinear,
                         ::testing::Values(TensorType::f32, TensorType::f16, TensorType::bf16,
                                           TensorType::q8_0, TensorType::q4_0, TensorType::q4_1,
                                           TensorType::q4_k, TensorType::q6_k),
                         [](const auto& info) { return to_string(info.param); });

TEST(QuantLinear, BadShapesAreClearErrors) {
  std::vector<uint8_t> blocks(34 * 4);
  EXPECT_THROW(quant::matrix("w", TensorType::q8_0, blocks.data(), 2, 48),
               Error);  // not whole blocks
  EXPECT_THROW(quant::matrix("w", TensorType::q5_0, blocks.data(), 1, 32), Error);  // unsupported
  const quant::Matrix m = quant::matrix("w", TensorType::q8_0, blocks.data(), 2, 64);
  std::vector<float> x(64), y(3);
  EXPECT_THROW(quant::linear_forward(View(y.data(), {1, 3}), View(x.data(), {1, 64}), {m}), Error);
  EXPECT_THROW(quant::linear_forward(View(y.data(), {1, 2}), View(x.data(), {2, 32}), {m}), Error);
}

// The quantizers against llama.cpp's (tests/golden/make_quantize.py): the same bytes.
TEST(Quantize, MatchesLlamaCppsQuantizers) {
  std::ifstream in(std::string(QKV_GOLDEN_DIR) + "/../data/quantize_blocks.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  auto hex = [](const std::vector<uint8_t>& b) {
    std::string s;
    char buf[3];
    for (uint8_t x : b) std::snprintf(buf, sizeof buf, "%02x", x), s += buf;
    return s;
  };
  const std::vector<float> x = golden["values"];
  for (TensorType t : {TensorType::q8_0, TensorType::q4_0}) {
    const std::string want = golden[to_string(t)];
    const std::string got = hex(quant::quantize(t, x.data(), static_cast<int64_t>(x.size())));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); i += 2)
      ASSERT_EQ(got.substr(i, 2), want.substr(i, 2)) << to_string(t) << " byte " << i / 2;
  }
  const std::vector<float> h = golden["f16_values"];
  const std::string want = golden["F16"];
  const std::string got =
      hex(quant::quantize(TensorType::f16, h.data(), static_cast<int64_t>(h.size())));
  for (size_t i = 0; i < h.size(); ++i)
    EXPECT_EQ(got.substr(4 * i, 4), want.substr(4 * i, 4)) << "half of " << h[i];
  EXPECT_THROW(quant::quantize(TensorType::q4_1, x.data(), 32), Error);
  EXPECT_THROW(quant::quantize(TensorType::q8_0, x.data(), 31), Error);
}

}  // namespace
}  // namespace qkv
