// Perplexity of a model on a text, windowed as llama.cpp's llama-perplexity does it, so that
// the numbers compare: the tokens (BOS first when the tokenizer adds one) are cut into chunks
// of `ctx`; each chunk is run on its own (an empty cache), its first token replaced by BOS
// when the tokenizer adds one, and only the predictions of its second half are scored (each
// position from ctx/2 on predicts the next token: ctx − 1 − ctx/2 per chunk), so every scored
// token has at least ctx/2 tokens of context. A last partial chunk is not used.
//   perplexity = exp(− mean log p(token | the chunk's tokens before it))
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/kv_cache.h"
#include "qkv/model.h"

namespace qkv {

struct PerplexityResult {
  double perplexity = 0;                    // exp of the mean negative log-likelihood
  double nll = 0;                           // that mean, in nats per token
  double nll_stderr = 0;                    // its standard error over the scored tokens
  int64_t ctx = 0, chunks = 0, scored = 0;  // scored = chunks · (ctx − 1 − ctx/2)
  std::vector<double> chunk_perplexity;     // after each chunk, over the chunks so far
  double seconds = 0;
};

// `tokens` as the tokenizer gives them for the whole text; bos: the BOS that starts each
// chunk (Tokenizer::adds_bos), or −1 to keep the text's own first token; cache: how the KV
// cache stores each chunk's keys and values (what a quantized cache costs in quality shows
// as the perplexity's rise over the f32 cache's); rotation: whether it rotates its rows
// (KVCacheOptions::rotation); scores: how decoding queries meet a block cache's keys
// (KVCacheOptions::scores); decode: feed each chunk's scored positions one token at a time
// through the cache (the split-KV decoding kernels, as generation runs them) after a prefill
// of its first half, instead of the whole chunk at once (the tiled forward).
// Throws qkv::Error when ctx is below 4 or above the model's context, or the text has fewer
// than ctx tokens (not one chunk).
PerplexityResult perplexity(Model& model, const std::vector<int32_t>& tokens, int64_t ctx,
                            int32_t bos, CacheType cache = CacheType::f32,
                            CacheRotation rotation = CacheRotation::automatic,
                            CacheScores scores = CacheScores::int8, bool decode = false);
// The same with the cache described whole (its types, keys' and values' of their own
// included, rotation and scores; batch and max_seq are the chunk's).
PerplexityResult perplexity(Model& model, const std::vector<int32_t>& tokens, int64_t ctx,
                            int32_t bos, const KVCacheOptions& cache, bool decode = false);

}  // namespace qkv
