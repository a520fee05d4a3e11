// Inference with a key/value cache: the decoder's layers (decoder.cpp) over the new tokens only,
// attention reading the earlier positions' keys and values from the cache instead of
// recomputing them. A prompt runs as one call (prefill: T tokens through the tiled kernel),
// then each generated token as a call of its own (T = 1: the split-KV decoding kernel over the
// cache; on more than one thread, every layer in one parallel region: decode_in_team).
//
// Legend as in decoder.h: B sequences, T new tokens each, N = B·T rows, C = d_model,
// F = d_ff, V = vocab.
#include <algorithm>

#include "model/decoder.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "qkv/model.h"
#include "qkv/threads.h"
#include "util/parallel.h"
#include "util/scratch.h"

namespace qkv {

namespace {

View rows(const Tensor& t, int64_t n) { return t.view().slice(0, 0, n); }

void grow(Tensor& t, int64_t rows, int64_t cols) {
  if (t.ndim() != 2 || t.size(0) < rows || t.size(1) != cols) t = Tensor({rows, cols});
}

}  // namespace

View Model::forward_cached(KVCache& cache, const int32_t* tokens, int64_t B, int64_t T,
                           const int64_t* seqs, bool all_logits) {
  const ModelConfig& c = config_;
  constexpr const char* where = "forward_cached";
  check(c.causal, where, ": a key/value cache needs a causal model");
  check(cache.layers() == c.n_layers && cache.kv_heads() == c.n_kv_heads &&
            cache.d_head() == c.d_head,
        where, ": the cache (", cache.layers(), " layers, ", cache.kv_heads(), " kv heads of ",
        cache.d_head(), ") was made for another model (", c.n_layers, ", ", c.n_kv_heads, ", ",
        c.d_head, ")");
  check(B >= 1 && T >= 1, where, ": need B, T >= 1, got ", B, ", ", T);
  check(B <= cache.batch(), where, ": ", B, " sequences but the cache holds ", cache.batch());
  if (!infer_) infer_ = std::make_unique<InferenceBuffers>();
  InferenceBuffers& s = *infer_;
  std::vector<int64_t>& seq = s.seq;
  seq.resize(B);
  for (int64_t i = 0; i < B; ++i) {
    seq[i] = seqs ? seqs[i] : i;
    check(seq[i] >= 0 && seq[i] < cache.batch(), where, ": sequence ", seq[i],
          " is not in the cache (batch ", cache.batch(), ")");
    for (int64_t j = 0; j < i; ++j)
      check(seq[j] != seq[i], where, ": sequence ", seq[i], " given twice");
    cache.check_room(seq[i], T);
  }

  const int64_t N = B * T, C = c.d_model, F = c.d_ff, V = c.vocab_size;
  if (s.capacity < N) {
    s.capacity = N;
    grow(s.x, N, C), grow(s.ln, N, C), grow(s.y, N, C);
    // h: SwiGLU's gate and up side by side in each row (one product can write both).
    grow(s.h, N, c.mlp == MlpKind::swiglu ? 2 * F : F), grow(s.g, N, F), grow(s.stat, 2 * N, 1);
  }
  const int64_t logit_rows = all_logits ? N : B;
  if (s.logit_rows < logit_rows) {
    s.logit_rows = logit_rows;
    grow(s.last, logit_rows, C), grow(s.logits, logit_rows, V);
  }
  s.pos.resize(N);
  for (int64_t i = 0; i < B; ++i)
    for (int64_t t = 0; t < T; ++t)
      s.pos[i * T + t] = static_cast<int32_t>(cache.length(seq[i]) + t);

  const View x = rows(s.x, N);
  Decoder::embed(*this, x, tokens, s.pos.data(), s.sinusoids);
  // Each layer updates x in place: x, mid and out one buffer, att and ffn the scratch y.
  Decoder::LayerRows r;
  r.x = r.mid = r.out = x;
  r.att = r.ffn = rows(s.y, N);
  r.ln1 = r.ln2 = rows(s.ln, N);
  r.mean1 = r.mean2 = s.stat.data(), r.rstd1 = r.rstd2 = s.stat.data() + N;
  if (c.mlp == MlpKind::swiglu) {
    r.h = View(s.h.data(), {N, F}, {2 * F, 1});
    r.u = View(s.h.data() + F, {N, F}, {2 * F, 1});
  } else {
    r.h = rows(s.h, N);
  }
  r.g = rows(s.g, N);
  const Decoder::Road road{
      .B = B, .T = T, .state = &s.attention, .cache = &cache, .seqs = seq.data()};
  const View logits = rows(s.logits, logit_rows);
  if (T == 1 && num_threads() > 1) {
    Decoder::decode_in_team(*this, r, road, logits);
  } else {
    for (int64_t l = 0; l < c.n_layers; ++l)
      Decoder::layer_forward(*this, l, r, road, TensorType::f32);
    // Final norm and logits: every position, or each sequence's last.
    View last = x;
    if (!all_logits) {
      last = rows(s.last, B);
      for (int64_t i = 0; i < B; ++i)
        std::copy(&x(i * T + T - 1, 0), &x(i * T + T - 1, 0) + C, &last(i, 0));
    }
    Decoder::norm(*this, last, s.stat.data(), s.stat.data() + N, last, w_->norm);
    Decoder::linear(*this, logits, last, w_->head, TensorType::f32);
  }
  for (int64_t i = 0; i < B; ++i) cache.advance(seq[i], T);
  return logits;
}

// One new position a sequence (B rows, each its sequence's last): every layer and the logits in
// one parallel region. The products and attention split their work over the team and write
// shared rows; each thread keeps the residual stream, the norms and SwiGLU's output for
// itself, so that only a product's or attention's end (and a cache write) makes the threads
// wait for one another. The same arithmetic on the same rows as without the team: the same
// bits for any thread count. Everything that could throw was checked by the caller, and the
// shared buffers are sized before the team.
void Model::Decoder::decode_in_team(const Model& m, const LayerRows& shared, const Road& road,
                                    View logits) {
  const ModelConfig& c = m.config_;
  const int64_t N = road.B, C = c.d_model, F = c.d_ff;
  multihead_reserve_cached(m.attention_layer(0), *road.state, N);
  detail::run_team(num_threads(), [&] {
    // This thread's rows: the stream, a norm's output, SwiGLU's (or GELU's), the statistics.
    float* own = detail::thread_scratch(detail::DecodeSlot::rows, N * (2 * C + F + 2));
    const View x(own, {N, C}), ln(own + N * C, {N, C}), g(own + 2 * N * C, {N, F});
    float* stat = own + N * (2 * C + F);
    std::copy(shared.x.data, shared.x.data + N * C, x.data);
    LayerRows r = shared;
    r.x = r.mid = r.out = x;
    r.ln1 = r.ln2 = ln;
    r.g = g;
    r.mean1 = r.mean2 = stat, r.rstd1 = r.rstd2 = stat + N;
    for (int64_t l = 0; l < c.n_layers; ++l) layer_forward(m, l, r, road, TensorType::f32);
    detail::alone([&] { norm(m, ln, stat, stat + N, x, m.w_->norm); });
    linear(m, logits, ln, m.w_->head, TensorType::f32);
  });
}

}  // namespace qkv
