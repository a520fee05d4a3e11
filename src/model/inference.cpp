// Inference with a key/value cache: the same decoder as model.cpp's forward, but each call
// runs only the new tokens, and attention reads the earlier positions' keys and values from
// the cache instead of recomputing them. A prompt runs as one call (prefill: T tokens through
// the tiled kernel), then each generated token as a call of its own (T = 1: the split-KV
// decoding kernel over the cache).
//
// Legend as in model.cpp: B sequences, T new tokens each, N = B·T rows, C = d_model,
// Hq/Hkv heads, dh = d_head, W = (Hq + 2 Hkv)·dh, A = Hq·dh, F = d_ff, V = vocab.
#include <algorithm>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "qkv/model.h"
#include "qkv/ops.h"
#include "model/inference_buffers.h"
#include "model/weights.h"

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
  std::vector<int64_t>& pos0 = s.pos0;
  seq.resize(B), pos0.resize(B);
  for (int64_t i = 0; i < B; ++i) {
    seq[i] = seqs ? seqs[i] : i;
    check(seq[i] >= 0 && seq[i] < cache.batch(), where, ": sequence ", seq[i],
          " is not in the cache (batch ", cache.batch(), ")");
    for (int64_t j = 0; j < i; ++j)
      check(seq[j] != seq[i], where, ": sequence ", seq[i], " given twice");
    cache.check_room(seq[i], T);
    pos0[i] = cache.length(seq[i]);
  }

  const int64_t N = B * T, C = c.d_model, F = c.d_ff, V = c.vocab_size;
  const int64_t Hq = c.n_heads, Hkv = c.n_kv_heads, dh = c.d_head;
  const int64_t W = (Hq + 2 * Hkv) * dh, A = Hq * dh;
  if (s.capacity < N) {
    s.capacity = N;
    grow(s.x, N, C), grow(s.ln, N, C), grow(s.y, N, C), grow(s.qkv, N, W), grow(s.att, N, A);
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
    for (int64_t t = 0; t < T; ++t) s.pos[i * T + t] = static_cast<int32_t>(pos0[i] + t);

  const bool ln = c.norm == NormKind::layer_norm;
  const Weights& w = *w_;
  if (w.token_blocks)
    check(w.token_blocks->size() == 1 && c.positions != PositionKind::learned &&
              c.positions != PositionKind::sinusoidal,
          where,
          ": a block-format embedding must be one matrix, with no position table added to it");
  float* mean = s.stat.data();
  float* rstd = s.stat.data() + N;
  auto norm = [&](View y, View x, const Weights::Norm& n) {
    if (ln) layernorm_forward(y, mean, rstd, x, n.w, n.b, c.norm_eps);
    else rmsnorm_forward(y, rstd, x, n.w, c.norm_eps);
  };
  auto linear_rows = [&](View y, View x, const Weights::Linear& f) {
    if (f.blocks) quant::linear_forward(y, x, *f.blocks, f.b, matmul_);
    else linear_forward(y, x, f.w, f.b);
  };
  auto linear = [&](const Tensor& y, const Tensor& x, const Weights::Linear& f) {
    linear_rows(rows(y, N), rows(x, N), f);
  };

  // Embeddings, plus learned or sinusoidal positions.
  View positions = w.position;
  if (c.positions == PositionKind::sinusoidal) {
    const int64_t need = *std::max_element(s.pos.begin(), s.pos.end()) + 1;
    if (s.sinusoids.ndim() != 2 || s.sinusoids.size(0) < need) {
      s.sinusoids = Tensor({std::max(need, c.context), C});
      sinusoidal_table(s.sinusoids);
    }
    positions = s.sinusoids;
  }
  const View x = rows(s.x, N);
  if (const std::vector<quant::Matrix>* q = w.token_blocks) {  // (GGUF's llama: no position table)
    for (int64_t i = 0; i < N; ++i) {
      check(tokens[i] >= 0 && tokens[i] < V, where, ": token ", tokens[i], " out of range [0, ", V,
            ")");
      quant::dequantize_rows((*q)[0], tokens[i], 1, &x(i, 0));
    }
  } else {
    embedding_forward(x, tokens, w.token, positions.empty() ? nullptr : s.pos.data(), positions);
  }

  const MultiHeadAttention m = attention_layer(0);  // positions and masks: every layer's
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const Weights::Layer& L = w.layers[l];
    // x += attn(norm(x)), the attention one sequence at a time: each has its own length.
    norm(rows(s.ln, N), x, L.norm1);
    linear(s.qkv, s.ln, L.qkv);
    for (int64_t i = 0; i < B; ++i) {
      float* r = s.qkv.data() + i * T * W;
      float* k_new = r + Hq * dh;
      float* v_new = r + (Hq + Hkv) * dh;
      if (m.rotary) {  // rotate the new queries and keys at their positions, before caching
        rope_forward(View(r, {1, T, Hq, dh}, {T * W, W, dh, 1}), pos0[i], m.rope_theta,
                     m.rope_pairs);
        rope_forward(View(k_new, {1, T, Hkv, dh}, {T * W, W, dh, 1}), pos0[i], m.rope_theta,
                     m.rope_pairs);
      }
      AttentionArgs a{.q = View(r, {1, Hq, T, dh}, {T * W, dh, W, 1}),
                      .out = View(s.att.data() + i * T * A, {1, Hq, T, dh}, {T * A, dh, A, 1})};
      a.mask.causal = true;
      a.mask.alibi = m.alibi;
      if (m.window > 0) a.mask.window_left = static_cast<int>(m.window);
      cache.attend(l, seq[i], a, k_new, v_new, W);
    }
    linear(s.y, s.att, L.out);
    residual_forward(x, x, rows(s.y, N));
    // x += ffn(norm(x))
    norm(rows(s.ln, N), x, L.norm2);
    if (c.mlp == MlpKind::gelu) {
      linear(s.h, s.ln, L.fc);
      gelu_forward(rows(s.g, N), rows(s.h, N), Gelu::tanh);
    } else {
      const View h(s.h.data(), {N, F}, {2 * F, 1}), u(s.h.data() + F, {N, F}, {2 * F, 1});
      if (!L.gate_up.empty()) {
        quant::linear_forward(View(s.h.data(), {N, 2 * F}), rows(s.ln, N), L.gate_up, nullptr,
                              matmul_);
      } else {
        linear_rows(h, rows(s.ln, N), L.gate);
        linear_rows(u, rows(s.ln, N), L.up);
      }
      swiglu_forward(rows(s.g, N), h, u);
    }
    linear(s.y, s.g, L.proj);
    residual_forward(x, x, rows(s.y, N));
  }
  for (int64_t i = 0; i < B; ++i) cache.advance(seq[i], T);

  // Final norm and logits: every position, or each sequence's last.
  View last = x;
  if (!all_logits) {
    last = rows(s.last, B);
    for (int64_t i = 0; i < B; ++i)
      std::copy(&x(i * T + T - 1, 0), &x(i * T + T - 1, 0) + C, &last(i, 0));
  }
  norm(last, last, w.norm);
  const View logits = rows(s.logits, logit_rows);
  linear_rows(logits, last, w.head);
  return logits;
}

}  // namespace qkv
