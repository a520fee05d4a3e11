// Sampling and the generation loop (see include/qkv/generate.h).
#include "qkv/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "qkv/clock.h"
#include "qkv/error.h"

namespace qkv {

Sampler::Sampler(const SamplingOptions& options) : options_(options), state_(options.seed) {
  check(options.temperature >= 0 && std::isfinite(options.temperature),
        "sampler: temperature must be >= 0, got ", options.temperature);
  check(options.top_k >= 0, "sampler: top_k must be >= 0 (0 = off), got ", options.top_k);
  check(std::isfinite(options.top_p), "sampler: top_p must be a number, got ", options.top_p);
  check(options.seed != 0, "sampler: the seed must not be 0 (xorshift would stay at 0)");
}

// xorshift64* (as run.c): 32 random bits per call, then the top 24 of them as a float.
float Sampler::uniform() {
  state_ ^= state_ >> 12;
  state_ ^= state_ << 25;
  state_ ^= state_ >> 27;
  const auto bits = static_cast<uint32_t>((state_ * 0x2545F4914F6CDD1Dull) >> 32);
  return static_cast<float>(bits >> 8) / 16777216.0f;
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  check(vocab >= 1, "sampler: empty vocabulary");
  for (int64_t i = 0; i < vocab; ++i)
    check(!std::isnan(logits[i]), "sampler: logit ", i, " is NaN");
  if (options_.temperature == 0)
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);

  // Softmax of logits / temperature, over the top-k tokens when top_k is on.
  probs_.assign(logits, logits + vocab);
  for (float& p : probs_) p /= options_.temperature;
  if (options_.top_k > 0 && options_.top_k < vocab) {
    sorted_.assign(probs_.begin(), probs_.end());
    std::nth_element(sorted_.begin(), sorted_.begin() + options_.top_k - 1, sorted_.end(),
                     std::greater<float>());
    const float kth = sorted_[options_.top_k - 1];
    for (float& p : probs_)
      if (p < kth) p = -std::numeric_limits<float>::infinity();
  }
  const float max = *std::max_element(probs_.begin(), probs_.end());
  float sum = 0;
  for (float& p : probs_) sum += (p = std::exp(p - max));
  for (float& p : probs_) p /= sum;
  const float coin = uniform();

  const float top_p = options_.top_p;
  if (top_p <= 0 || top_p >= 1) {  // the whole distribution
    float cdf = 0;
    for (int64_t i = 0; i < vocab; ++i)
      if (coin < (cdf += probs_[i])) return static_cast<int32_t>(i);
    return static_cast<int32_t>(vocab - 1);  // rounding left the cdf just under 1
  }
  // Nucleus: tokens below (1 − p)/(n − 1) can never be in it, so they are not sorted.
  const float cutoff = vocab > 1 ? (1.0f - top_p) / static_cast<float>(vocab - 1) : 0.0f;
  order_.clear();
  for (int64_t i = 0; i < vocab; ++i)
    if (probs_[i] >= cutoff) order_.push_back(static_cast<int32_t>(i));
  std::stable_sort(order_.begin(), order_.end(),
                   [&](int32_t a, int32_t b) { return probs_[a] > probs_[b]; });
  float total = 0;
  size_t last = order_.size() - 1;
  for (size_t i = 0; i < order_.size(); ++i)
    if ((total += probs_[order_[i]]) > top_p) {
      last = i;
      break;
    }
  const float r = coin * total;
  float cdf = 0;
  for (size_t i = 0; i <= last; ++i)
    if (r < (cdf += probs_[order_[i]])) return order_[i];
  return order_[last];
}

Generator::Generator(Model& model, std::vector<int32_t> prompt, const GenerateOptions& options)
    : model_(&model), options_(options), sampler_(options.sampling), tokens_(std::move(prompt)) {
  const ModelConfig& c = model.config();
  check(!tokens_.empty(), "generate: the prompt needs at least one token");
  for (int32_t t : tokens_)
    check(t >= 0 && t < c.vocab_size, "generate: prompt token ", t, " is not in the vocabulary of ",
          c.vocab_size);
  steps_ = options.steps <= 0 || options.steps > c.context ? c.context : options.steps;
  // As run.c: position p's logits choose token p + 1, so `steps` positions run give up to
  // `steps` tokens after the first. A prompt longer than that is only echoed.
  prompt_positions_ = std::min<int64_t>(tokens_.size(), steps_);
  done_ = static_cast<int64_t>(tokens_.size()) > steps_;
}

Generator::~Generator() = default;
Generator::Generator(Generator&&) noexcept = default;

int32_t Generator::next() {
  if (done_) return -1;
  const ModelConfig& c = model_->config();
  if (!cache_) {
    cache_ = std::make_unique<KVCache>(c, KVCacheOptions{.max_seq = steps_,
                                                         .type = options_.cache,
                                                         .key_type = options_.cache_k,
                                                         .value_type = options_.cache_v,
                                                         .rotation = options_.cache_rotation,
                                                         .ring = c.window > 0,
                                                         .scores = options_.cache_scores});
    const double t0 = now_seconds();
    logits_ = model_->forward_cached(*cache_, tokens_.data(), 1, prompt_positions_);
    prefill_seconds_ = now_seconds() - t0;
    pos_ = prompt_positions_ - 1;
  } else {
    logits_ = model_->forward_cached(*cache_, &tokens_.back(), 1, 1);
    ++pos_;
  }
  const int32_t next = sampler_.sample(logits_.data, c.vocab_size);
  const auto& stop = options_.stop_tokens;
  done_ = pos_ + 1 == steps_;  // the last position: the token drawn there is not run
  if (std::find(stop.begin(), stop.end(), next) != stop.end()) {
    done_ = true;
    return -1;
  }
  tokens_.push_back(next);
  return next;
}

GenerateStats generate(Model& model, const std::vector<int32_t>& prompt,
                       const GenerateOptions& options,
                       const std::function<bool(int32_t, int32_t)>& on_token) {
  Generator g(model, prompt, options);
  GenerateStats stats;
  stats.tokens = prompt;
  auto emit = [&](int32_t prev, int32_t token) { return !on_token || on_token(prev, token); };
  // The prompt streams first, before the prefill.
  for (int64_t i = 1; i < std::min<int64_t>(prompt.size(), g.prompt_positions() + 1); ++i)
    if (!emit(prompt[i - 1], prompt[i])) return stats;
  stats.prompt_tokens = g.prompt_positions();
  const double t0 = now_seconds();
  for (int32_t token; (token = g.next()) >= 0;) {
    const int32_t prev = stats.tokens.back();
    stats.tokens.push_back(token);
    ++stats.generated_tokens;
    if (!emit(prev, token)) break;
  }
  stats.prefill_seconds = g.prefill_seconds();
  stats.decode_seconds = std::max(0.0, now_seconds() - t0 - stats.prefill_seconds);
  stats.prefill_tokens_per_s = stats.prompt_tokens / std::max(stats.prefill_seconds, 1e-9);
  // Decoding ran generated − 1 forwards (the last token drawn is not run).
  stats.decode_tokens_per_s =
      std::max<int64_t>(0, stats.generated_tokens - 1) / std::max(stats.decode_seconds, 1e-9);
  return stats;
}

}  // namespace qkv
