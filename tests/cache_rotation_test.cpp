// The rotation of a quantized key/value cache: the normalised Walsh–Hadamard transform against
// Sylvester's matrix written out element by element, and a cache that rotates against one that
// does not (f32 storage: the same logits within fp32 rounding), whichever way it is asked for.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "model_configs.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "qkv/model.h"
#include "qkv/quant.h"

namespace qkv {
namespace {

// Sylvester's Hadamard matrix of order n, normalised: H[i][j] = (−1)^popcount(i & j) / √n.
double sylvester(int64_t n, int64_t i, int64_t j) {
  return (std::popcount(static_cast<uint64_t>(i & j)) % 2 ? -1.0 : 1.0) / std::sqrt(double(n));
}

TEST(HadamardRotate, IsSylvestersMatrixOnEachBlock) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-2, 2);
  for (int64_t block : {1, 2, 4, 8, 32, 64, 128})
    for (int64_t blocks : {1, 3}) {
      const int64_t dim = block * blocks;
      std::vector<float> x(dim), y;
      for (float& e : x) e = u(rng);
      y = x;
      hadamard_rotate(y.data(), dim, block);
      for (int64_t b = 0; b < blocks; ++b)
        for (int64_t i = 0; i < block; ++i) {
          double expected = 0;
          for (int64_t j = 0; j < block; ++j) expected += sylvester(block, i, j) * x[b * block + j];
          ASSERT_NEAR(y[b * block + i], expected, 1e-5)
              << "block " << block << " of " << dim << ", element " << b * block + i;
        }
    }
}

TEST(HadamardRotate, IsItsOwnInverseAndKeepsLengths) {
  std::mt19937 rng(6);
  std::normal_distribution<float> n(0, 1);
  std::vector<float> x(128);
  for (float& e : x) e = n(rng);
  for (int64_t block : {16, 128}) {
    std::vector<float> y = x;
    hadamard_rotate(y.data(), 128, block);
    double before = 0, after = 0;
    for (int64_t i = 0; i < 128; ++i) before += double(x[i]) * x[i], after += double(y[i]) * y[i];
    EXPECT_NEAR(after, before, 1e-4 * before);
    hadamard_rotate(y.data(), 128, block);
    for (int64_t i = 0; i < 128; ++i) ASSERT_NEAR(y[i], x[i], 1e-5) << "block " << block;
  }
}

TEST(HadamardRotate, BlocksArePowersOfTwoThatDivideTheDim) {
  EXPECT_EQ(rotation_block(64), 64);
  EXPECT_EQ(rotation_block(96), 32);
  EXPECT_EQ(rotation_block(80), 16);
  EXPECT_EQ(rotation_block(7), 1);
  std::vector<float> x(48);
  EXPECT_THROW(hadamard_rotate(x.data(), 48, 32), Error);  // does not divide 48
  EXPECT_THROW(hadamard_rotate(x.data(), 48, 6), Error);   // not a power of two
  EXPECT_THROW(rotation_block(0), Error);
}

ModelConfig config_of(const std::string& style) {
  ModelConfig c = testing::small_model(37, 64, style != "gpt2", 128);  // head dim 32
  c.init_std = 0.25f;
  if (style == "window") c.window = 3;
  return c;
}

std::vector<int32_t> tokens_of(int64_t n, int64_t vocab) {
  std::mt19937 rng(2);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

// max |a − b| / max |a| over a prefill of 9 tokens and 11 decoded one at a time.
double logits_gap(Model& m, KVCacheOptions plain, KVCacheOptions rotated) {
  const int64_t V = m.config().vocab_size;
  const auto tokens = tokens_of(20, V);
  KVCache a(m.config(), plain), b(m.config(), rotated);
  double gap = 0, scale = 0;
  auto compare = [&](const View& x, const View& y, int64_t rows) {
    for (int64_t i = 0; i < rows * V; ++i)
      gap = std::max(gap, std::abs(double(x.data[i]) - y.data[i])),
      scale = std::max(scale, std::abs(double(x.data[i])));
  };
  const View pa = m.forward_cached(a, tokens.data(), 1, 9, nullptr, true);
  const std::vector<float> first(pa.data, pa.data + 9 * V);
  compare(View(const_cast<float*>(first.data()), {9, V}),
          m.forward_cached(b, tokens.data(), 1, 9, nullptr, true), 9);
  for (int64_t t = 9; t < 20; ++t) {
    const View la = m.forward_cached(a, &tokens[t], 1, 1);
    const std::vector<float> row(la.data, la.data + V);
    compare(View(const_cast<float*>(row.data()), {1, V}), m.forward_cached(b, &tokens[t], 1, 1), 1);
  }
  return gap / scale;
}

// Exact in real arithmetic: an f32 cache rotated gives the unrotated logits within fp32
// rounding, for the model styles and a ring.
TEST(CacheRotation, AnF32CacheRotatedGivesTheSameLogits) {
  for (const char* style : {"gpt2", "llama", "window"}) {
    Model m(config_of(style), 3);
    const bool ring = std::string(style) == "window";
    EXPECT_LE(logits_gap(m, {.max_seq = 20, .rotation = CacheRotation::off, .ring = ring},
                         {.max_seq = 20, .rotation = CacheRotation::on, .ring = ring}),
              1e-5)
        << style;
  }
}

// Three sequences of different lengths in one rotated cache, one reset and run again, then
// decoded together: the unrotated cache's logits within fp32 rounding.
TEST(CacheRotation, BatchesOfDifferentLengthsAndResets) {
  const ModelConfig c = config_of("llama");
  Model m(c, 5);
  const int64_t V = c.vocab_size;
  const auto tokens = tokens_of(30, V);
  std::vector<float> got[2];
  for (CacheRotation rotation : {CacheRotation::off, CacheRotation::on}) {
    KVCache batch(c, {.batch = 3, .max_seq = 30, .rotation = rotation});
    const int64_t prompt[3] = {12, 5, 9};
    for (int64_t s = 0; s < 3; ++s) m.forward_cached(batch, tokens.data(), 1, prompt[s], &s);
    batch.reset(1);
    const int64_t seq1 = 1;
    m.forward_cached(batch, tokens.data(), 1, prompt[1], &seq1);
    for (int64_t step = 0; step < 10; ++step) {
      int32_t next[3];
      for (int s = 0; s < 3; ++s) next[s] = tokens[prompt[s] + step];
      const View l = m.forward_cached(batch, next, 3, 1);
      got[rotation == CacheRotation::on].insert(got[rotation == CacheRotation::on].end(), l.data,
                                                l.data + 3 * V);
    }
  }
  double gap = 0, scale = 0;
  for (size_t i = 0; i < got[0].size(); ++i)
    gap = std::max(gap, std::abs(double(got[0][i]) - got[1][i])),
    scale = std::max(scale, std::abs(double(got[0][i])));
  EXPECT_LE(gap / scale, 1e-5);
}

TEST(CacheRotation, OnByDefaultForTheBlockFormatsOnly) {
  const ModelConfig c = config_of("llama");
  for (const std::string& name : cache_type_names()) {
    const CacheType t = cache_type(name);
    const bool blocks = t == CacheType::q8_0 || t == CacheType::q4_0 || t == CacheType::q4_1;
    EXPECT_EQ(KVCache(c, {.max_seq = 8, .type = t}).rotation(), blocks ? 32 : 0) << name;
    EXPECT_EQ(KVCache(c, {.max_seq = 8, .type = t, .rotation = CacheRotation::on}).rotation(), 32);
    EXPECT_EQ(KVCache(c, {.max_seq = 8, .type = t, .rotation = CacheRotation::off}).rotation(), 0);
  }
  EXPECT_EQ(cache_rotation("auto"), CacheRotation::automatic);
  EXPECT_EQ(std::string(cache_rotation_name(cache_rotation("off"))), "off");
  try {
    cache_rotation("yes");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("auto, on or off"), std::string::npos) << e.what();
  }
}

// What the rotation is for: keys and values with an outlier channel (as real models' have),
// stored as q4_0. Unrotated, the outlier sets each block's scale and the other values get few
// of the 16 levels; rotated, it is spread over the block first. Attention over the rotated
// storage lands much closer to attention over the exact rows.
TEST(CacheRotation, SpreadsOutliersBeforeTheBlockScaleIsChosen) {
  const int64_t H = 2, L = 200, D = 64;
  std::mt19937 rng(9);
  std::normal_distribution<float> n(0, 1);
  Tensor k({1, H, L, D}), v({1, H, L, D}), q({1, H, 1, D}), exact({1, H, 1, D});
  for (Tensor* t : {&k, &v, &q})
    for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = n(rng);
  for (int64_t r = 0; r < H * L; ++r) k.data()[r * D + 5] *= 25, v.data()[r * D + 40] *= 25;
  AttentionArgs a{.q = q, .k = k, .v = v, .out = exact};
  attention(a);
  auto error_of = [&](int64_t rotation) {
    std::vector<uint8_t> kq, vq;
    std::vector<float> row(D);
    for (Tensor* t : {&k, &v})
      for (int64_t r = 0; r < H * L; ++r) {
        std::copy(t->data() + r * D, t->data() + (r + 1) * D, row.begin());
        if (rotation) hadamard_rotate(row.data(), D, rotation);
        const auto bytes = quant::quantize(TensorType::q4_0, row.data(), D);
        (t == &k ? kq : vq).insert((t == &k ? kq : vq).end(), bytes.begin(), bytes.end());
      }
    const StoredKV kv{.type = TensorType::q4_0,
                      .k = kq.data(),
                      .v = vq.data(),
                      .batch_stride = H * L * D,
                      .head_stride = L * D,
                      .row_stride = D,
                      .heads = H,
                      .dim_k = D,
                      .dim_v = D,
                      .length = L,
                      .rotation = rotation};
    Tensor out({1, H, 1, D});
    attention(AttentionArgs{.q = q, .out = out}, kv);
    double err = 0;
    for (int64_t i = 0; i < out.numel(); ++i)
      err += std::pow(double(out.data()[i]) - exact.data()[i], 2);
    return std::sqrt(err);
  };
  const double plain = error_of(0), rotated = error_of(D);
  EXPECT_LT(rotated, plain / 2) << "q4_0 error: unrotated " << plain << ", rotated " << rotated;
}

}  // namespace
}  // namespace qkv
