// Generation: the sampler, the llama2.c loader and tokenizer, and a real pretrained model
// (stories260K, models/) against its reference output.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>

#include "model_configs.h"
#include "qkv/error.h"
#include "qkv/generate.h"
#include "qkv/io.h"
#include "qkv/ops.h"
#include "qkv/perplexity.h"
#include "qkv/targets.h"
#include "qkv/tokenizer.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;

fs::path models_dir() {
  const char* env = std::getenv("QKV_MODELS");
  return env ? fs::path(env) : fs::path(QKV_MODELS_DIR);
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

#define REQUIRE_STORIES260K()                                                        \
  const fs::path dir = models_dir() / "stories260K";                                 \
  ASSERT_TRUE(fs::exists(dir / "stories260K.bin") && fs::exists(dir / "tok512.bin")) \
      << "stories260K not found in " << dir << " (it ships in models/; QKV_MODELS overrides)";

// ---- perplexity ---------------------------------------------------------------------------

// perplexity() (cached inference, llama-perplexity's windows) against the training forward's
// mean cross-entropy over the same scored positions, chunk by chunk: another code path.
TEST(Perplexity, IsTheTrainingForwardsLossOverTheScoredHalves) {
  const int64_t ctx = 24, V = 50;
  Model model(testing::small_model(V, 64, /*llama=*/true), 7);
  std::mt19937 rng(5);
  std::vector<int32_t> tokens(3 * ctx + 5);  // three chunks and a partial one, not used
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % V);
  for (const int32_t bos : {-1, 1})
    for (const bool decode : {false, true}) {  // (decode: one token at a time through the cache)
      const PerplexityResult r = perplexity(model, tokens, ctx, bos, CacheType::f32,
                                            CacheRotation::automatic, CacheScores::int8, decode);
      EXPECT_EQ(r.chunks, 3);
      EXPECT_EQ(r.scored, 3 * (ctx - 1 - ctx / 2));
      double loss = 0;
      for (int64_t k = 0; k < 3; ++k) {
        std::vector<int32_t> chunk(tokens.begin() + k * ctx, tokens.begin() + (k + 1) * ctx);
        if (bos >= 0) chunk[0] = bos;
        std::vector<int32_t> targets(ctx, kIgnoreIndex);
        for (int64_t j = ctx / 2; j + 1 < ctx; ++j) targets[j] = tokens[k * ctx + j + 1];
        loss += model.forward(chunk.data(), targets.data(), 1, ctx) / 3;
      }
      EXPECT_NEAR(r.nll, loss, 1e-5 * loss) << "bos " << bos << " decode " << decode;
      EXPECT_NEAR(r.perplexity, std::exp(loss), 1e-5 * std::exp(loss));
      EXPECT_NEAR(r.chunk_perplexity.back(), r.perplexity, 1e-9 * r.perplexity);
    }
  // Through a q8_0 cache (head dim 32), decoded: int8 scores within 10⁻³ of exact ones.
  Model wide(testing::small_model(V, 64, /*llama=*/true, 128), 7);
  const PerplexityResult exact = perplexity(wide, tokens, ctx, -1, CacheType::q8_0,
                                            CacheRotation::automatic, CacheScores::exact, true);
  const PerplexityResult int8 = perplexity(wide, tokens, ctx, -1, CacheType::q8_0,
                                           CacheRotation::automatic, CacheScores::int8, true);
  EXPECT_NEAR(int8.perplexity, exact.perplexity, 1e-3 * exact.perplexity);
  const std::string target = current_target();  // (int8 scores: x86-64 from AVX2)
  if (target == "avx2" || target.rfind("avx512", 0) == 0) {
    EXPECT_NE(int8.perplexity, exact.perplexity);  // (they ran)
  }
  EXPECT_THROW(perplexity(model, tokens, 2, -1), Error);                         // ctx too small
  EXPECT_THROW(perplexity(model, tokens, 65, -1), Error);                        // past the context
  EXPECT_THROW(perplexity(model, std::vector<int32_t>(10, 1), ctx, -1), Error);  // not one chunk
}

// ---- sampler ------------------------------------------------------------------------------

TEST(Sampler, UniformIsRunCsXorshift) {
  // Worked in Python from run.c's formula: xorshift64*, top 24 of the high 32 bits.
  Sampler s({.seed = 1});
  EXPECT_FLOAT_EQ(s.uniform(), 0.28083503246307373f);
  EXPECT_FLOAT_EQ(s.uniform(), 0.6711372137069702f);
  EXPECT_FLOAT_EQ(s.uniform(), 0.7258461117744446f);
}

TEST(Sampler, GreedyTakesTheFirstLargest) {
  const float logits[] = {0.5f, 2.0f, -1.0f, 2.0f};
  Sampler s({.temperature = 0});
  EXPECT_EQ(s.sample(logits, 4), 1);
  Sampler k1({.temperature = 1, .top_k = 1, .top_p = 0});
  for (int i = 0; i < 20; ++i) EXPECT_NE(k1.sample(logits, 4), 2);  // only the ties survive
}

// Frequencies over many draws match the distribution the options describe.
std::vector<double> frequencies(const SamplingOptions& o, const std::vector<float>& logits) {
  Sampler s(o);
  std::vector<double> f(logits.size());
  const int n = 40000;
  for (int i = 0; i < n; ++i) f[s.sample(logits.data(), logits.size())] += 1.0 / n;
  return f;
}

TEST(Sampler, TemperatureTopKAndTopP) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  auto full = frequencies({.temperature = 1, .top_p = 0}, logits);
  EXPECT_NEAR(full[0], 0.5, 0.01);
  EXPECT_NEAR(full[3], 0.05, 0.01);
  // top-p 0.7: the smallest set past 0.7 is {0, 1} (0.8), renormalised: 0.625, 0.375.
  auto nucleus = frequencies({.temperature = 1, .top_p = 0.7f}, logits);
  EXPECT_NEAR(nucleus[0], 0.625, 0.01);
  EXPECT_NEAR(nucleus[1], 0.375, 0.01);
  EXPECT_EQ(nucleus[2] + nucleus[3], 0);
  // top-k 3: 0.5, 0.3, 0.15 renormalised over 0.95.
  auto topk = frequencies({.temperature = 1, .top_k = 3, .top_p = 0}, logits);
  EXPECT_NEAR(topk[2], 0.15 / 0.95, 0.01);
  EXPECT_EQ(topk[3], 0);
  // Temperature 2 flattens: p ∝ sqrt(p).
  auto hot = frequencies({.temperature = 2, .top_p = 0}, logits);
  const double z = std::sqrt(0.5) + std::sqrt(0.3) + std::sqrt(0.15) + std::sqrt(0.05);
  EXPECT_NEAR(hot[3], std::sqrt(0.05) / z, 0.01);
}

TEST(Sampler, SameSeedSameTokens) {
  const std::vector<float> logits = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
  Sampler a({.seed = 42}), b({.seed = 42}), c({.seed = 43});
  std::vector<int32_t> x, y, z;
  for (int i = 0; i < 50; ++i)
    x.push_back(a.sample(logits.data(), 5)), y.push_back(b.sample(logits.data(), 5)),
        z.push_back(c.sample(logits.data(), 5));
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
}

TEST(Sampler, BadOptionsAndNaNAreErrors) {
  EXPECT_THROW(Sampler({.temperature = -1}), Error);
  EXPECT_THROW(Sampler({.seed = 0}), Error);
  const float nan_logits[] = {0, std::nanf(""), 1};
  Sampler s({});
  EXPECT_THROW(s.sample(nan_logits, 3), Error);
}

// ---- llama2.c checkpoints -----------------------------------------------------------------

ModelConfig llama2c_style(bool tied) {
  ModelConfig c = testing::small_model(40, 16, /*llama=*/true, 32);
  c.tied_embeddings = tied;
  c.init_std = 0.2f;
  return c;
}

std::vector<float> logits_of(Model& m, const std::vector<int32_t>& tokens) {
  m.forward(tokens.data(), nullptr, 1, tokens.size());
  const View l = m.logits();
  return std::vector<float>(l.data, l.data + l.numel());
}

fs::path temp_file(const std::string& name) { return fs::temp_directory_path() / ("qkv_" + name); }

TEST(Llama2c, Version0RoundTrip) {
  for (bool tied : {true, false}) {
    Model m(llama2c_style(tied), 3);
    const fs::path path = temp_file("v0.bin");
    save_llama2c(path, m);
    const auto loaded = load_llama2c(path);
    EXPECT_FALSE(loaded->trainable());
    EXPECT_EQ(loaded->config().tied_embeddings, tied);
    ASSERT_EQ(loaded->num_params(), m.num_params());
    EXPECT_TRUE(std::equal(m.weights(), m.weights() + m.num_params(), loaded->weights()));
    fs::remove(path);
  }
}

// A version-1 file written here from the format's description, byte by byte.
TEST(Llama2c, Version1HasNormsFirstAndNoRopeTables) {
  Model m(llama2c_style(false), 4);
  const ModelConfig& c = m.config();
  std::string bytes(256, '\0');
  const int32_t header[9] = {0x616b3432,
                             1,
                             int32_t(c.d_model),
                             int32_t(c.d_ff),
                             int32_t(c.n_layers),
                             int32_t(c.n_heads),
                             int32_t(c.n_kv_heads),
                             int32_t(c.vocab_size),
                             int32_t(c.context)};
  std::memcpy(bytes.data(), header, sizeof header);
  bytes[36] = 0;  // not shared
  auto put = [&](const std::string& name, int64_t row0, int64_t rows) {
    const View w = m.weight(name);
    bytes.append(reinterpret_cast<const char*>(&w(row0, 0)), 4 * rows * w.shape[1]);
  };
  const int64_t A = c.n_heads * c.d_head, KV = c.n_kv_heads * c.d_head;
  auto each = [&](const char* rest, int64_t row0, int64_t rows) {
    for (int64_t l = 0; l < c.n_layers; ++l)
      put("layers." + std::to_string(l) + "." + rest, row0, rows);
  };
  each("norm1.weight", 0, c.d_model);
  each("norm2.weight", 0, c.d_model);
  put("norm.weight", 0, c.d_model);
  put("embedding.token", 0, c.vocab_size);
  each("attn.qkv.weight", 0, A);
  each("attn.qkv.weight", A, KV);
  each("attn.qkv.weight", A + KV, KV);
  each("attn.out.weight", 0, c.d_model);
  each("mlp.gate.weight", 0, c.d_ff);
  each("mlp.proj.weight", 0, c.d_model);
  each("mlp.up.weight", 0, c.d_ff);
  put("lm_head.weight", 0, c.vocab_size);
  const auto loaded =
      load_llama2c_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  EXPECT_TRUE(std::equal(m.weights(), m.weights() + m.num_params(), loaded->weights()));
  const std::vector<int32_t> tokens = {1, 5, 9, 2};
  EXPECT_EQ(logits_of(m, tokens), logits_of(*loaded, tokens));
}

void expect_error(const std::string& bytes, const std::string& words) {
  try {
    load_llama2c_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ADD_FAILURE() << "no error for a file that should fail with \"" << words << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(Llama2c, CorruptAndTruncatedFilesAreClearErrors) {
  Model m(llama2c_style(true), 5);
  const fs::path path = temp_file("corrupt.bin");
  save_llama2c(path, m);
  const std::string good = read_file(path);
  fs::remove(path);
  expect_error(good.substr(0, good.size() - 1), "truncated");
  expect_error(good.substr(0, 20), "too short");
  expect_error(good + "x", "needs");
  std::string bad = good;
  const int32_t huge = 1 << 30;
  std::memcpy(bad.data(), &huge, 4);  // dim
  expect_error(bad, "dim = 1073741824 is out of range");
  bad = good;
  const int32_t three = 3;
  std::memcpy(bad.data() + 16, &three, 4);  // n_kv_heads 3 of 4 heads
  expect_error(bad, "not a multiple of n_kv_heads");
  std::string v2(256, '\0');
  const int32_t magic[2] = {0x616b3432, 2};
  std::memcpy(v2.data(), magic, 8);
  expect_error(v2, "version 2 is not supported");
  EXPECT_THROW(load_llama2c("/nonexistent/model.bin"), Error);
}

// ---- the tokenizer ------------------------------------------------------------------------

TEST(Tokenizer, CorruptFilesAreClearErrors) {
  const std::string t = std::string("\x04\0\0\0", 4) + std::string("\0\0\0\0\x02\0\0\0ab", 10);
  auto load = [&](const std::string& bytes, int64_t vocab) {
    return Tokenizer::from_llama2c_bytes(reinterpret_cast<const uint8_t*>(bytes.data()),
                                         bytes.size(), vocab);
  };
  EXPECT_THROW(load(t, 3), Error);                // ends after one token of three
  EXPECT_THROW(load(t.substr(0, 12), 3), Error);  // ends inside a token
  EXPECT_THROW(load(std::string("\xff\xff\xff\xff", 4), 3), Error);  // negative max length
  EXPECT_THROW(Tokenizer::load_llama2c("/nonexistent/tok.bin", 512), Error);
}

TEST(Tokenizer, BytesRoundTrip) {
  const Tokenizer t = Tokenizer::bytes();
  const std::string text = "héllo\n\t";
  const auto ids = t.encode(text);
  EXPECT_EQ(ids.size(), text.size());
  std::string back;
  for (size_t i = 0; i < ids.size(); ++i) back += t.decode(i ? ids[i - 1] : -1, ids[i]);
  EXPECT_EQ(back, text);
}

TEST(Stories260K, TokenizerMatchesTheReferenceEncoding) {
  REQUIRE_STORIES260K();
  const Tokenizer t = Tokenizer::load_llama2c(dir / "tok512.bin", 512);
  // From the model's README: "Once upon a time" → 1 403 407 261 378.
  EXPECT_EQ(t.encode("Once upon a time"), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(t.encode(""), (std::vector<int32_t>{1}));
  // Round trip, through byte tokens too (é, 日 and the emoji have no pieces of their own).
  for (const std::string text :
       {"Once upon a time", "Tom said: \"hi!\"\nThe end.", "café 日本 🙂", "  two spaces"}) {
    const auto ids = t.encode(text);
    std::string back;
    for (size_t i = 1; i < ids.size(); ++i) back += t.decode(ids[i - 1], ids[i]);
    EXPECT_EQ(back, text);
  }
}

TEST(Stories260K, GreedyOutputMatchesTheReference) {
  REQUIRE_STORIES260K();
  const auto model = load_llama2c(dir / "stories260K.bin");
  const ModelConfig& c = model->config();
  EXPECT_EQ(c.d_model, 64);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.d_ff, 172);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.context, 512);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(model->num_params(), 260032);
  const Tokenizer t = Tokenizer::load_llama2c(dir / "tok512.bin", 512);
  std::string text;
  const auto stats =
      generate(*model, t.encode("Once upon a time"),
               {.steps = 200, .sampling = {.temperature = 0}, .stop_tokens = {t.bos()}},
               [&](int32_t prev, int32_t token) {
                 text += t.decode(prev, token);
                 return true;
               });
  EXPECT_EQ(text + "\n", read_file(dir / "greedy_once_upon_a_time.txt"));
  EXPECT_EQ(stats.prompt_tokens, 5);
  EXPECT_EQ(stats.generated_tokens, 196);
  // The same through a bf16 cache: tokens may drift late, but the start is the same.
  const auto bf16 =
      generate(*model, t.encode("Once upon a time"),
               {.steps = 40, .sampling = {.temperature = 0}, .cache = CacheType::bf16});
  EXPECT_EQ(std::vector<int32_t>(bf16.tokens.begin(), bf16.tokens.begin() + 20),
            std::vector<int32_t>(stats.tokens.begin(), stats.tokens.begin() + 20));
}

TEST(Stories260K, CachedDecodingMatchesFullForward) {
  REQUIRE_STORIES260K();
  const auto model = load_llama2c(dir / "stories260K.bin");
  const Tokenizer t = Tokenizer::load_llama2c(dir / "tok512.bin", 512);
  const auto run =
      generate(*model, t.encode("Lily and Tom"), {.steps = 60, .sampling = {.temperature = 0}});
  const auto& tokens = run.tokens;
  const auto full = logits_of(*model, tokens);
  KVCache cache(model->config(), {.max_seq = 64});
  double worst = 0;
  for (size_t p = 0; p < tokens.size(); ++p) {
    const View l = model->forward_cached(cache, &tokens[p], 1, 1);
    double diff = 0, scale = 0;
    for (int64_t v = 0; v < 512; ++v)
      diff = std::max(diff, std::abs(double(l(0, v)) - full[p * 512 + v])),
      scale = std::max(scale, std::abs(double(full[p * 512 + v])));
    worst = std::max(worst, diff / scale);
  }
  EXPECT_LE(worst, 1e-5);
}

TEST(Generate, PromptLongerThanStepsIsEchoedAndStopTokensStop) {
  Model m(llama2c_style(true), 6);
  std::vector<int32_t> seen;
  auto collect = [&](int32_t, int32_t token) { return seen.push_back(token), true; };
  auto s = generate(m, {1, 2, 3, 4, 5}, {.steps = 3}, collect);
  EXPECT_EQ(seen, (std::vector<int32_t>{2, 3, 4}));
  EXPECT_EQ(s.generated_tokens, 0);
  // With every token a stop token, nothing is generated after the prompt.
  std::vector<int32_t> all(40);
  for (int i = 0; i < 40; ++i) all[i] = i;
  seen.clear();
  s = generate(m, {1, 2}, {.steps = 10, .stop_tokens = all}, collect);
  EXPECT_EQ(seen, (std::vector<int32_t>{2}));
  EXPECT_EQ(s.generated_tokens, 0);
  // -n counts positions: 10 steps from a 2-token prompt draw 9 tokens.
  s = generate(m, {1, 2}, {.steps = 10, .sampling = {.temperature = 0.8f, .seed = 7}});
  EXPECT_EQ(s.generated_tokens, 9);
  EXPECT_EQ(s.tokens.size(), 11u);
  EXPECT_THROW(generate(m, {}, {}), Error);
  EXPECT_THROW(generate(m, {1, 99}, {}), Error);
}

}  // namespace
}  // namespace qkv
