#include "qkv/perplexity.h"

#include <algorithm>
#include <cmath>

#include "qkv/clock.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"

namespace qkv {

PerplexityResult perplexity(Model& model, const std::vector<int32_t>& tokens, int64_t ctx,
                            int32_t bos, CacheType storage, CacheRotation rotation,
                            CacheScores scores, bool decode) {
  return perplexity(model, tokens, ctx, bos,
                    KVCacheOptions{.type = storage, .rotation = rotation, .scores = scores},
                    decode);
}

PerplexityResult perplexity(Model& model, const std::vector<int32_t>& tokens, int64_t ctx,
                            int32_t bos, const KVCacheOptions& options, bool decode) {
  const ModelConfig& c = model.config();
  check(ctx >= 4 && ctx <= c.context, "perplexity: --ctx ", ctx,
        " must be from 4 to the model's context of ", c.context);
  const auto n = static_cast<int64_t>(tokens.size());
  check(n >= ctx, "perplexity: the text has ", n, " tokens, fewer than one chunk of --ctx ", ctx);
  PerplexityResult r;
  r.ctx = ctx;
  r.chunks = n / ctx;
  const int64_t first = ctx / 2, V = c.vocab_size;
  KVCacheOptions chunk_cache = options;
  chunk_cache.batch = 1, chunk_cache.max_seq = ctx;
  KVCache cache(c, chunk_cache);
  std::vector<float> decoded;  // (decode: the scored positions' logits, a row each)
  std::vector<int32_t> chunk(ctx);
  double sum = 0, sum_sq = 0;  // of the scored tokens' negative log-likelihoods
  const double t0 = now_seconds();
  for (int64_t k = 0; k < r.chunks; ++k) {
    std::copy(tokens.begin() + k * ctx, tokens.begin() + (k + 1) * ctx, chunk.begin());
    if (bos >= 0) chunk[0] = bos;
    cache.reset();
    View logits;
    if (decode) {
      model.forward_cached(cache, chunk.data(), 1, first);
      decoded.resize((ctx - 1 - first) * V);
      for (int64_t j = first; j + 1 < ctx; ++j) {
        const View step = model.forward_cached(cache, &chunk[j], 1, 1);
        std::copy(step.data, step.data + V, decoded.data() + (j - first) * V);
      }
    } else {
      logits = model.forward_cached(cache, chunk.data(), 1, ctx, nullptr, true);
    }
    for (int64_t j = first; j + 1 < ctx; ++j) {
      const float* z = decode ? decoded.data() + (j - first) * V : &logits(j, 0);
      const float zmax = *std::max_element(z, z + V);
      double total = 0;
      for (int64_t v = 0; v < V; ++v) total += std::exp(static_cast<double>(z[v]) - zmax);
      const double nll = zmax + std::log(total) - z[tokens[k * ctx + j + 1]];
      sum += nll, sum_sq += nll * nll;
      ++r.scored;
    }
    r.chunk_perplexity.push_back(std::exp(sum / static_cast<double>(r.scored)));
  }
  r.seconds = now_seconds() - t0;
  const auto m = static_cast<double>(r.scored);
  r.nll = sum / m;
  r.nll_stderr = m > 1 ? std::sqrt(std::max(0.0, sum_sq / m - r.nll * r.nll) / (m - 1)) : 0;
  r.perplexity = std::exp(r.nll);
  return r;
}

}  // namespace qkv
