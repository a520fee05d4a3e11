// The decoder (see decoder.h): embeddings → n_layers × (x += attn(norm(x)); x += ffn(norm(x)))
// → norm → logits, forward over every position at once and the full backward (llm.c's
// structure, with qkv's attention kernels in the middle). Cached inference runs the same
// layers (inference.cpp).
#include "model/decoder.h"

#include <algorithm>

#include "qkv/error.h"
#include "qkv/ops.h"
#include "util/parallel.h"

namespace qkv {

namespace {

Tensor zeros(int64_t rows, int64_t cols) { return Tensor({rows, cols}); }

}  // namespace

void Model::Decoder::embed(const Model& m, View x, const int32_t* tokens, const int32_t* pos,
                           Tensor& sinusoids) {
  const ModelConfig& c = m.config_;
  const Weights& w = *m.w_;
  const int64_t N = x.shape[0];
  if (const std::vector<quant::Matrix>* q = w.token_blocks) {  // (GGUF's llama: no position table)
    check(q->size() == 1 && c.positions != PositionKind::learned &&
              c.positions != PositionKind::sinusoidal,
          "model: a block-format embedding must be one matrix, with no position table added to it");
    for (int64_t i = 0; i < N; ++i) {
      check(tokens[i] >= 0 && tokens[i] < c.vocab_size, "model: token ", tokens[i],
            " out of range [0, ", c.vocab_size, ")");
      quant::dequantize_rows((*q)[0], tokens[i], 1, &x(i, 0));
    }
    return;
  }
  View positions;
  if (c.positions == PositionKind::learned) positions = w.position;
  if (c.positions == PositionKind::sinusoidal) {
    const int64_t need = *std::max_element(pos, pos + N) + 1;
    if (sinusoids.ndim() != 2 || sinusoids.size(0) < need) {
      sinusoids = zeros(std::max(need, c.context), c.d_model);
      sinusoidal_table(sinusoids);
    }
    positions = sinusoids;
  }
  embedding_forward(x, tokens, w.token, positions.empty() ? nullptr : pos, positions);
}

void Model::Decoder::norm(const Model& m, View y, float* mean, float* rstd, View x,
                          const Weights::Norm& n) {
  const ModelConfig& c = m.config_;
  if (c.norm == NormKind::layer_norm) layernorm_forward(y, mean, rstd, x, n.w, n.b, c.norm_eps);
  else rmsnorm_forward(y, rstd, x, n.w, c.norm_eps);
}

void Model::Decoder::norm_backward(const Model& m, View dx, View dy, View x, const float* mean,
                                   const float* rstd, const Weights::Norm& n) {
  if (m.config_.norm == NormKind::layer_norm)
    layernorm_backward(dx, n.dw, n.db, dy, x, n.w, mean, rstd);
  else rmsnorm_backward(dx, n.dw, dy, x, n.w, rstd);
}

void Model::Decoder::linear(const Model& m, View y, View x, const Weights::Linear& f,
                            TensorType products) {
  if (f.blocks) quant::linear_forward(y, x, *f.blocks, f.b, m.matmul_);
  else linear_forward(y, x, f.w, f.b, products);
}

void Model::Decoder::layer_forward(const Model& m, int64_t l, const LayerRows& r, const Road& road,
                                   TensorType products) {
  const ModelConfig& c = m.config_;
  const Weights::Layer& P = m.w_->layers[l];
  using detail::alone;  // (in a team: each thread's own rows, see LayerRows)
  // x + attn(norm(x))
  alone([&] { norm(m, r.ln1, r.mean1, r.rstd1, r.x, P.norm1); });
  MultiHeadAttention attention = m.attention_layer(l);
  attention.compute = products;
  if (road.cache) {
    attention.shard = nullptr;  // (a sequence shard splits the full forward only)
    multihead_forward_cached(attention, *road.state, r.att, r.ln1, *road.cache, l, road.seqs,
                             road.B, road.T);
  } else {
    multihead_forward(attention, *road.state, r.att, r.ln1, View{}, road.B, road.T, road.T);
  }
  alone([&] { residual_forward(r.mid, r.att, r.x); });
  // mid + ffn(norm(mid))
  alone([&] { norm(m, r.ln2, r.mean2, r.rstd2, r.mid, P.norm2); });
  if (c.mlp == MlpKind::gelu) {
    linear(m, r.h, r.ln2, P.fc, products);
    alone([&] { gelu_forward(r.g, r.h, Gelu::tanh); });
  } else {
    if (!P.gate_up.empty()) {  // gate's and up's blocks: one product into both halves
      quant::linear_forward(View(r.h.data, {r.h.shape[0], 2 * c.d_ff}), r.ln2, P.gate_up, nullptr,
                            m.matmul_);
    } else {
      linear(m, r.h, r.ln2, P.gate, products);
      linear(m, r.u, r.ln2, P.up, products);
    }
    alone([&] { swiglu_forward(r.g, r.h, r.u); });
  }
  linear(m, r.ffn, r.g, P.proj, products);
  alone([&] { residual_forward(r.out, r.ffn, r.mid); });
}

Model::Decoder::LayerRows Model::Decoder::layer_rows(const Model& m, Activations& a, int64_t l) {
  const ModelConfig& c = m.config_;
  const int64_t N = a.B * a.T, F = c.d_ff;
  auto rows = [N](const Tensor& t) { return t.view().slice(0, 0, N); };
  Activations::Layer& L = a.layers[a.shared ? 0 : l];
  LayerRows r;
  r.x = rows(a.resid[a.stream(l)]);
  r.ln1 = rows(L.ln1), r.mean1 = L.mean1.data(), r.rstd1 = L.rstd1.data();
  r.att = r.mid = rows(L.mid);
  r.ln2 = rows(L.ln2), r.mean2 = L.mean2.data(), r.rstd2 = L.rstd2.data();
  if (c.mlp == MlpKind::swiglu) {
    r.h = View(L.h.data(), {N, F}, {2 * F, 1});
    r.u = View(L.h.data() + F, {N, F}, {2 * F, 1});
  } else {
    r.h = rows(L.h);
  }
  r.g = rows(L.g);
  r.ffn = r.out = rows(a.resid[a.stream(l + 1)]);
  return r;
}

void Model::Decoder::layer_backward(const Model& m, int64_t l, Activations& a) {
  const ModelConfig& c = m.config_;
  const Weights::Layer& P = m.w_->layers[l];
  const int64_t N = a.B * a.T;
  const LayerRows r = layer_rows(m, a, l);
  auto rows = [N](const Tensor& t) { return t.view().slice(0, 0, N); };
  auto zero = [&](const Tensor& t) { std::fill(t.data(), t.data() + rows(t).numel(), 0.0f); };
  auto linear_backward_of = [&](View dx, View dy, View x, const Weights::Linear& f) {
    linear_backward(dx, f.dw, f.db, dy, x, f.w, m.compute_);
  };
  // dresid holds ∂loss/∂(output of layer l). Through out = mid + proj(g):
  zero(a.dg);
  linear_backward_of(rows(a.dg), rows(a.dresid), r.g, P.proj);
  zero(a.dh);
  zero(a.dln);
  if (c.mlp == MlpKind::gelu) {
    gelu_backward(rows(a.dh), rows(a.dg), r.h, Gelu::tanh);
    linear_backward_of(rows(a.dln), rows(a.dh), r.ln2, P.fc);
  } else {
    zero(a.du);
    swiglu_backward(rows(a.dh), rows(a.du), rows(a.dg), r.h, r.u);
    linear_backward_of(rows(a.dln), rows(a.dh), r.ln2, P.gate);
    linear_backward_of(rows(a.dln), rows(a.du), r.ln2, P.up);
  }
  // dmid = dresid (residual) + norm2's backward.
  std::copy(a.dresid.data(), a.dresid.data() + N * c.d_model, a.dmid.data());
  norm_backward(m, rows(a.dmid), rows(a.dln), r.mid, r.mean2, r.rstd2, P.norm2);
  // Through mid = x + attention(norm1(x)):
  zero(a.dln);
  multihead_backward(m.attention_layer(l), a.layers[l].attention, rows(a.dln), View{}, rows(a.dmid),
                     r.ln1, View{}, a.B, a.T, a.T);
  // dresid(layer input) = dmid (residual) + norm1's backward.
  std::copy(a.dmid.data(), a.dmid.data() + N * c.d_model, a.dresid.data());
  norm_backward(m, rows(a.dresid), rows(a.dln), r.x, r.mean1, r.rstd1, P.norm1);
}

float Model::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) {
  const ModelConfig& c = config_;
  check(B >= 1 && T >= 1, "model forward: need B, T >= 1, got ", B, ", ", T);
  const int64_t seq_len = shard_ ? shard_->seq_len : T;
  check(seq_len <= c.context || c.positions != PositionKind::learned,
        "model forward: T = ", seq_len, " is longer than the context of ", c.context,
        " learned positions");
  check(!shard_ || shard_->local_len() == T, "model forward: the sequence shard holds ",
        shard_ ? shard_->local_len() : 0, " positions of each sequence, the batch ", T);
  check(!shard_ || c.positions != PositionKind::alibi,
        "model forward: ALiBi does not run "
        "with the sequence split across processes");
  const int64_t N = B * T, C = c.d_model, F = c.d_ff, V = c.vocab_size;
  const bool swiglu = c.mlp == MlpKind::swiglu;
  dropout_now_ = training_ && c.attn_dropout > 0;
  if (dropout_now_) ++dropout_forwards_;  // new masks (the backward's: the same)
  Activations& a = *acts_;
  if (a.capacity < N) {  // (re)allocate for a larger batch; smaller ones use the first rows
    a.capacity = N;
    a.shared = !trainable();
    a.resid.clear();
    for (int64_t l = 0; l <= (a.shared ? 1 : c.n_layers); ++l) a.resid.push_back(zeros(N, C));
    a.layers.clear();
    a.layers.resize(c.n_layers);
    for (auto& L : a.layers) {
      L.ln1 = zeros(N, C), L.mean1 = zeros(N, 1), L.rstd1 = zeros(N, 1);
      L.mid = zeros(N, C), L.ln2 = zeros(N, C), L.mean2 = zeros(N, 1), L.rstd2 = zeros(N, 1);
      L.h = zeros(N, swiglu ? 2 * F : F), L.g = zeros(N, F);
      if (a.shared) break;  // layer 0's serve every layer
    }
    a.lnf = zeros(N, C), a.meanf = zeros(N, 1), a.rstdf = zeros(N, 1);
    a.logits = zeros(N, V), a.probs = Tensor();
    if (trainable()) {
      a.dresid = zeros(N, C), a.dmid = zeros(N, C), a.dln = zeros(N, C);
      a.dh = zeros(N, F), a.dg = zeros(N, F);
      a.dlnf = zeros(N, C);
      if (swiglu) a.du = zeros(N, F);
    }
  }
  a.B = B, a.T = T;
  a.tokens.assign(tokens, tokens + N);
  a.targets.assign(N, kIgnoreIndex);
  if (targets) a.targets.assign(targets, targets + N);
  a.have_targets = targets != nullptr;
  a.pos.resize(N);
  for (int64_t n = 0; n < N; ++n) a.pos[n] = static_cast<int32_t>(n % T);
  if (shard_) {  // the global positions of the rows this process holds
    int64_t row = 0;
    for (const auto& [first, length] : shard_->runs)
      for (int64_t i = 0; i < length; ++i, ++row)
        for (int64_t b = 0; b < B; ++b) a.pos[b * T + row] = static_cast<int32_t>(first + i);
  }
  auto rows = [N](const Tensor& t) { return t.view().slice(0, 0, N); };
  Decoder::embed(*this, rows(a.resid[0]), a.tokens.data(), a.pos.data(), a.sinusoids);
  for (int64_t l = 0; l < c.n_layers; ++l)
    Decoder::layer_forward(*this, l, Decoder::layer_rows(*this, a, l),
                           {.B = B, .T = T, .state = &a.layers[l].attention}, compute_);
  Decoder::norm(*this, rows(a.lnf), a.meanf.data(), a.rstdf.data(),
                rows(a.resid[a.stream(c.n_layers)]), w_->norm);
  Decoder::linear(*this, rows(a.logits), rows(a.lnf), w_->head, compute_);
  if (!targets) return 0;
  if (a.probs.numel() < a.capacity * V) a.probs = zeros(a.capacity, V);
  return cross_entropy_forward(rows(a.probs), rows(a.logits), a.targets.data());
}

void Model::backward(float dloss) {
  const ModelConfig& c = config_;
  Activations& a = *acts_;
  check(a.have_targets, "model backward: the last forward had no targets");
  check(trainable(), "model backward: no gradients in a model loaded for inference only");
  const int64_t N = a.B * a.T;
  auto rows = [N](const Tensor& t) { return t.view().slice(0, 0, N); };
  const Weights& w = *w_;
  // Loss → logits → final norm.
  cross_entropy_backward_inplace(rows(a.probs), a.targets.data(), dloss);  // probs → dlogits
  std::fill(a.dlnf.data(), a.dlnf.data() + N * c.d_model, 0.0f);
  linear_backward(rows(a.dlnf), w.head.dw, w.head.db, rows(a.probs), rows(a.lnf), w.head.w,
                  compute_);
  std::fill(a.dresid.data(), a.dresid.data() + N * c.d_model, 0.0f);
  Decoder::norm_backward(*this, rows(a.dresid), rows(a.dlnf), rows(a.resid[c.n_layers]),
                         a.meanf.data(), a.rstdf.data(), w.norm);
  for (int64_t l = c.n_layers - 1; l >= 0; --l) Decoder::layer_backward(*this, l, a);
  const bool learned = c.positions == PositionKind::learned;
  embedding_backward(w.d_token, a.tokens.data(), rows(a.dresid), learned ? a.pos.data() : nullptr,
                     w.d_position);
}

}  // namespace qkv
