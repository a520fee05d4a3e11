// Generation: a prompt through the model once (prefill), then one token at a time with the
// key/value cache (decode), each new token drawn from the model's next-token distribution.
//
// Sampling follows llama2.c's run.c, so the same seed gives the same tokens: temperature 0 is
// greedy (the first largest logit); otherwise logits / temperature, softmax, one uniform draw
// from a xorshift generator, then top-p (nucleus: the smallest set of most likely tokens whose
// probability passes p) or, with top-p off, the whole distribution. Top-k (not in run.c)
// keeps the k most likely tokens before top-p.
#pragma once

#include <cstdint>
#include <optional>
#include <functional>
#include <memory>
#include <vector>

#include "qkv/kv_cache.h"
#include "qkv/model.h"

namespace qkv {

struct SamplingOptions {
  float temperature = 1.0f;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  float top_p = 0.9f;        // <= 0 or >= 1 = off
  uint64_t seed = 1;
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  // The next token from logits [vocab] (not modified).
  int32_t sample(const float* logits, int64_t vocab);
  float uniform();  // in [0, 1), 24 random bits

 private:
  SamplingOptions options_;
  uint64_t state_;
  std::vector<float> probs_, sorted_;  // reused from token to token
  std::vector<int32_t> order_;
};

struct GenerateOptions {
  // Positions run through the model, prompt included (llama2.c's -n); 0 or more than the
  // model's context means the context.
  int64_t steps = 256;
  SamplingOptions sampling;
  std::vector<int32_t> stop_tokens;  // generation ends when one is drawn (it is not emitted)
  CacheType cache = CacheType::f32;
  std::optional<CacheType> cache_k, cache_v;  // (KVCacheOptions::key_type, value_type)
  CacheRotation cache_rotation = CacheRotation::automatic;  // (KVCacheOptions::rotation)
  CacheScores cache_scores = CacheScores::int8;             // (KVCacheOptions::scores)
};

struct GenerateStats {
  int64_t prompt_tokens = 0, generated_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  double prefill_tokens_per_s = 0, decode_tokens_per_s = 0;
  std::vector<int32_t> tokens;  // the whole sequence: prompt, then the generated tokens
};

// Generation one token per call, for callers that pull tokens (a Python iterator) rather
// than take a callback: the first next() runs the prompt (prefill) and draws a token, each
// later one runs the previous token through the cache and draws the next. generate() below
// is this loop.
class Generator {
 public:
  // Checks the prompt (at least one token, each in the vocabulary). The model must outlive
  // the generator.
  Generator(Model& model, std::vector<int32_t> prompt, const GenerateOptions& options);
  ~Generator();
  Generator(Generator&&) noexcept;

  // The next token, or -1 once generation has ended: a stop token drawn (not returned), the
  // steps run out, or a prompt longer than the steps (only echoed).
  int32_t next();
  const std::vector<int32_t>& tokens() const { return tokens_; }  // prompt, then each drawn
  int64_t prompt_positions() const { return prompt_positions_; }  // of the prompt, run
  double prefill_seconds() const { return prefill_seconds_; }

 private:
  Model* model_;
  GenerateOptions options_;
  Sampler sampler_;
  std::unique_ptr<KVCache> cache_;  // made by the first next()
  View logits_;
  std::vector<int32_t> tokens_;
  int64_t steps_ = 0, prompt_positions_ = 0, pos_ = 0;
  bool done_ = false;
  double prefill_seconds_ = 0;
};

// Runs `prompt` (at least one token) and generates. `on_token(prev, token)` is called for every
// token after the first, prompt tokens first (before the prefill, so they stream at once), then
// each generated token as it is drawn; it returns false to stop early.
GenerateStats generate(Model& model, const std::vector<int32_t>& prompt,
                       const GenerateOptions& options,
                       const std::function<bool(int32_t prev, int32_t token)>& on_token = {});

}  // namespace qkv
