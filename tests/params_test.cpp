// qkv params against the GPT-3 paper (Brown et al. 2020, table 2.1) and other published sizes.
#include <gtest/gtest.h>

#include "qkv/error.h"
#include "qkv/params.h"

namespace qkv {
namespace {

TEST(Params, Gpt3_175bHeadByHead) {
  const ParamCounts p = count_params(find_preset("gpt3-175b").config);
  // Each per-head map is d_head × d_model = 128 × 12,288.
  EXPECT_EQ(p.w_q, 1'572'864);
  EXPECT_EQ(p.w_k, 1'572'864);
  EXPECT_EQ(p.value_down, 1'572'864);
  EXPECT_EQ(p.value_up, 1'572'864);
  EXPECT_EQ(p.w_q + p.w_k + p.value_down + p.value_up, 6'291'456);
  // 96 heads per multi-head attention block.
  EXPECT_EQ(p.attention_weights, 603'979'776);
  // 175.0B in the paper.
  EXPECT_NEAR(p.total / 175.0e9, 1.0, 0.005);
}

TEST(Params, Gpt3FamilyMatchesThePaperTable) {
  const struct {
    const char* name;
    double billions;
  } table[] = {{"gpt3-small", 0.125}, {"gpt3-medium", 0.350}, {"gpt3-large", 0.760},
               {"gpt3-xl", 1.3},      {"gpt3-2.7b", 2.7},     {"gpt3-6.7b", 6.7},
               {"gpt3-13b", 13.0},    {"gpt3-175b", 175.0}};
  for (const auto& row : table) {
    const double total = count_params(find_preset(row.name).config).total / 1e9;
    // The paper rounds to 2-3 significant digits.
    EXPECT_NEAR(total / row.billions, 1.0, 0.03) << row.name << ": " << total << "B";
  }
}

TEST(Params, PublishedSizesOfOtherModels) {
  // GPT-2 small: 124,439,808 (the count of the released checkpoint).
  EXPECT_EQ(count_params(find_preset("gpt2").config).total, 124'439'808);
  // llama2.c's stories260K: 260,032 parameters (models/stories260K/README.md).
  EXPECT_EQ(count_params(find_preset("stories260k").config).total, 260'032);
  // Llama 2 7B: 6,738,415,616 (the released checkpoint).
  EXPECT_EQ(count_params(find_preset("llama2-7b").config).total, 6'738'415'616);
  // Llama 3 8B: 8,030,261,248.
  EXPECT_EQ(count_params(find_preset("llama3-8b").config).total, 8'030'261'248);
}

TEST(Params, GroupedQueryAttentionSharesKeysAndValues) {
  const ModelConfig c = find_preset("llama2-70b").config;
  const ParamCounts p = count_params(c);
  // 64 query heads, 8 key/value heads, d_head 128, d_model 8192.
  EXPECT_EQ(p.attention_weights, 64 * 2 * 128 * 8192 + 8 * 2 * 128 * 8192);
  const CostCounts k = count_costs(c, 4096);
  EXPECT_EQ(k.kv_cache_bytes_per_token_bf16, 2 * 80 * 8 * 128 * 2);
}

TEST(Params, CostsOfAttention) {
  const ModelConfig c = find_preset("gpt3-175b").config;
  const CostCounts k = count_costs(c, 2048);
  EXPECT_EQ(k.score_grid_entries, 4'194'304);  // 2048²
  EXPECT_EQ(k.score_grid_entries_all, 4'194'304LL * 96 * 96);
  EXPECT_EQ(k.kv_cache_bytes_per_token_fp32, 2LL * 96 * 12288 * 4);
  EXPECT_EQ(k.kv_cache_bytes_fp32, 2LL * 96 * 12288 * 4 * 2048);
  // About 2 FLOPs per parameter, plus attention over the context (Kaplan et al. 2020).
  const ParamCounts p = count_params(c);
  EXPECT_NEAR(double(k.forward_flops_matmul) / (2.0 * p.total), 1.0, 0.01);
  EXPECT_EQ(k.forward_flops_attention, 96LL * 96 * 4 * 2048 * 128);
}

TEST(Params, ClearErrors) {
  EXPECT_THROW(find_preset("gpt5"), Error);
  ModelConfig c;
  c.n_heads = 12;
  c.n_kv_heads = 5;
  EXPECT_THROW(count_params(c), Error);
  c.n_kv_heads = 0;
  EXPECT_THROW(count_params(c), Error);
  try {
    find_preset("nope");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gpt3-175b"), std::string::npos) << e.what();
  }
}

// Sizes whose counts would overflow int64 are refused, not printed negative.
TEST(Params, CountsThatWouldOverflowAreErrors) {
  auto expect_error = [](auto&& f, const char* fragment) {
    try {
      f();
      ADD_FAILURE() << "no error, expected " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  ModelConfig wide = find_preset("gpt3-175b").config;
  wide.d_model = 4'000'000'000;  // its FFN: 96 · 3 · 4e9 · 1.6e10 ≈ 1.8e22 > 2^63
  wide.d_ff = 4 * wide.d_model;
  expect_error([&] { count_params(wide); }, "parameters, more than qkv counts");
  ModelConfig deep = find_preset("gpt3-175b").config;
  deep.n_layers = 100'000'000'000;
  expect_error([&] { count_params(deep); }, "parameters, more than qkv counts");
  // GPT-3 at 10M tokens still counts (its grids: 1e14 · 96 · 96 ≈ 9.2e17); at 1e9 it cannot.
  const ModelConfig gpt3 = find_preset("gpt3-175b").config;
  EXPECT_EQ(count_costs(gpt3, 10'000'000).score_grid_entries, 100'000'000'000'000);
  expect_error([&] { count_costs(gpt3, 1'000'000'000); }, "is too long to count");
}

}  // namespace
}  // namespace qkv
