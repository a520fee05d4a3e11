// The decoder: embeddings → n_layers × (x += attn(norm(x)); x += ffn(norm(x))) → norm →
// logits, forward over every position at once and the full backward (llm.c's structure,
// with qkv's attention kernels in the middle).
//
// Legend: B batch, T positions, N = B·T rows, C = d_model, Hq/Hkv heads, dh = d_head,
// W = (Hq + 2 Hkv) · dh the fused QKV width, F = d_ff, V = vocab.
#include <cmath>
#include <random>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/model.h"
#include "qkv/multihead.h"
#include "qkv/ops.h"
#include "model/inference_buffers.h"
#include "model/weights.h"

namespace qkv {

namespace {

Tensor zeros(int64_t rows, int64_t cols) { return Tensor({rows, cols}); }

}  // namespace

// Everything the forward keeps for the backward, and the backward's scratch.
struct Model::Activations {
  int64_t B = 0, T = 0;
  int64_t capacity = 0;  // rows the buffers hold: they grow, never shrink
  std::vector<int32_t> tokens, targets, pos;
  struct Layer {
    Tensor ln1, mean1, rstd1, mid, ln2, mean2, rstd2, h, u, g;
    MultiHeadState attention;
  };
  std::vector<Tensor> resid;  // [L + 1] × [N, C]: the residual stream before each layer
  std::vector<Layer> layers;
  Tensor lnf, meanf, rstdf, logits, probs;
  // Backward scratch.
  Tensor dresid, dmid, dln, dh, du, dg, dlnf;
  bool have_targets = false;
};

Model::~Model() = default;

std::vector<ParamInfo> Model::param_layout(const ModelConfig& c) {
  validate(c);
  std::vector<ParamInfo> params;
  int64_t offset = 0;
  const int64_t C = c.d_model, W = (c.n_heads + 2 * c.n_kv_heads) * c.d_head;
  const int64_t A = c.n_heads * c.d_head;
  auto add = [&](const std::string& name, int64_t rows, int64_t cols, bool decay) {
    params.push_back({name, offset, rows, cols, decay});
    offset += rows * cols;
  };
  add("embedding.token", c.vocab_size, C, true);
  if (c.positions == PositionKind::learned) add("embedding.position", c.context, C, true);
  const bool ln = c.norm == NormKind::layer_norm;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "norm1.weight", C, 1, false);
    if (ln) add(p + "norm1.bias", C, 1, false);
    add(p + "attn.qkv.weight", W, C, true);
    if (c.bias) add(p + "attn.qkv.bias", W, 1, false);
    add(p + "attn.out.weight", C, A, true);
    if (c.bias) add(p + "attn.out.bias", C, 1, false);
    add(p + "norm2.weight", C, 1, false);
    if (ln) add(p + "norm2.bias", C, 1, false);
    if (c.mlp == MlpKind::gelu) {
      add(p + "mlp.fc.weight", c.d_ff, C, true);
      if (c.bias) add(p + "mlp.fc.bias", c.d_ff, 1, false);
    } else {
      add(p + "mlp.gate.weight", c.d_ff, C, true);
      add(p + "mlp.up.weight", c.d_ff, C, true);
      if (c.bias)
        add(p + "mlp.gate.bias", c.d_ff, 1, false), add(p + "mlp.up.bias", c.d_ff, 1, false);
    }
    add(p + "mlp.proj.weight", C, c.d_ff, true);
    if (c.bias) add(p + "mlp.proj.bias", C, 1, false);
  }
  add("norm.weight", C, 1, false);
  if (ln) add("norm.bias", C, 1, false);
  if (!c.tied_embeddings) add("lm_head.weight", c.vocab_size, C, true);
  return params;
}

void Model::lay_out() {
  params_ = param_layout(config_);
  num_params_ = params_.back().offset + params_.back().rows * params_.back().cols;
  int64_t in_buffer = num_params_;
  if (!external_.matrices.empty()) {  // the buffer holds the other parameters, in order
    for (const auto& [name, parts] : external_.matrices) {
      const ParamInfo& p = param(name);
      int64_t rows = 0;
      for (const quant::Matrix& m : parts) {
        check(m.cols == p.cols, "model: external \"", name, "\" has ", m.cols, " columns, not ",
              p.cols);
        rows += m.rows;
      }
      check(rows == p.rows, "model: external \"", name, "\" has ", rows, " rows, not ", p.rows);
    }
    in_buffer = 0;
    for (ParamInfo& p : params_) {
      p.external = external_.matrices.count(p.name) > 0;
      p.offset = p.external ? -1 : in_buffer;
      if (!p.external) in_buffer += p.rows * p.cols;
    }
  }
  weights_ = Tensor({in_buffer});
  if (config_.positions == PositionKind::alibi) {
    alibi_.resize(config_.n_heads);
    alibi_slopes(config_.n_heads, alibi_.data());
  }
  acts_ = std::make_unique<Activations>();
}

Model::Model(const ModelConfig& config, InferenceOnly) : config_(config) {
  lay_out();
  bind_weights();
}

Model::Model(const ModelConfig& config, InferenceOnly, ExternalWeights external)
    : config_(config), external_(std::move(external)) {
  lay_out();
  bind_weights();
}

const std::vector<quant::Matrix>* Model::external(const std::string& name) const {
  const auto it = external_.matrices.find(name);
  return it == external_.matrices.end() ? nullptr : &it->second;
}

Model::Model(const ModelConfig& config, uint64_t seed) : config_(config) {
  lay_out();
  const ModelConfig& c = config_;
  grads_ = Tensor({num_params_});
  bind_weights();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, c.init_std);
  const float residual_scale = 1.0f / std::sqrt(2.0f * c.n_layers);
  for (const ParamInfo& p : params_) {
    float* w = weights_.data() + p.offset;
    const int64_t n = p.rows * p.cols;
    const bool is_norm = p.name.find("norm") != std::string::npos && p.name.ends_with("weight");
    const bool is_residual =
        p.name.ends_with("attn.out.weight") || p.name.ends_with("mlp.proj.weight");
    for (int64_t i = 0; i < n; ++i) {
      if (is_norm) w[i] = 1;
      else if (p.decay) w[i] = normal(rng) * (is_residual ? residual_scale : 1.0f);
      else w[i] = 0;
    }
  }
}

const ParamInfo& Model::param(const std::string& name) const {
  for (const ParamInfo& p : params_)
    if (p.name == name) return p;
  fail("model: no parameter named \"", name, "\"");
}

View Model::weight(const std::string& name) const {
  const ParamInfo& p = param(name);
  if (p.external)
    fail("model: \"", name, "\" is held in its file's block format (",
         to_string(external_.matrices.at(name)[0].type),
         "), not as fp32; this needs the model "
         "loaded as fp32 (load_gguf with GgufWeights::fp32; Python: dequantize=True)");
  return View(weights_.data() + p.offset, {p.rows, p.cols});
}

View Model::grad(const std::string& name) const {
  const ParamInfo& p = param(name);
  if (p.external) return View();
  if (!trainable()) return {};
  return View(grads_.data() + p.offset, {p.rows, p.cols});
}

void Model::bind_weights() {
  const ModelConfig& c = config_;
  const bool ln = c.norm == NormKind::layer_norm;
  w_ = std::make_unique<Weights>();
  Weights& w = *w_;
  auto in_buffer = [&](const std::string& name) {
    const ParamInfo& p = param(name);
    return p.external ? View() : View(weights_.data() + p.offset, {p.rows, p.cols});
  };
  auto norm_of = [&](const std::string& name) {
    Weights::Norm n{.w = in_buffer(name + ".weight").data, .dw = grad(name + ".weight").data};
    if (ln) n.b = in_buffer(name + ".bias").data, n.db = grad(name + ".bias").data;
    return n;
  };
  auto linear_of = [&](const std::string& name, bool bias) {
    Weights::Linear f{.w = in_buffer(name + ".weight"),
                      .dw = grad(name + ".weight"),
                      .blocks = external(name + ".weight")};
    if (bias) f.b = in_buffer(name + ".bias").data, f.db = grad(name + ".bias").data;
    return f;
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    Weights::Layer L{.norm1 = norm_of(p + "norm1"),
                     .norm2 = norm_of(p + "norm2"),
                     .qkv = linear_of(p + "attn.qkv", c.bias),
                     .out = linear_of(p + "attn.out", c.bias),
                     .proj = linear_of(p + "mlp.proj", c.bias)};
    if (c.mlp == MlpKind::gelu) L.fc = linear_of(p + "mlp.fc", c.bias);
    else L.gate = linear_of(p + "mlp.gate", c.bias), L.up = linear_of(p + "mlp.up", c.bias);
    if (L.gate.blocks && L.up.blocks && !c.bias) {
      L.gate_up = *L.gate.blocks;
      L.gate_up.insert(L.gate_up.end(), L.up.blocks->begin(), L.up.blocks->end());
    }
    w.layers.push_back(L);
  }
  w.token = in_buffer("embedding.token");
  w.d_token = grad("embedding.token");
  w.token_blocks = external("embedding.token");
  if (c.positions == PositionKind::learned) {
    w.position = in_buffer("embedding.position");
    w.d_position = grad("embedding.position");
  }
  w.norm = norm_of("norm");
  if (c.tied_embeddings) w.head = {.w = w.token, .dw = w.d_token, .blocks = w.token_blocks};
  else w.head = linear_of("lm_head", false);
}

void Model::zero_grad() {
  check(trainable(), "model: no gradients in a model loaded for inference only");
  grads_.fill(0);
}

View Model::logits() const {
  check(!acts_->logits.view().empty(), "model: logits before any forward");
  return acts_->logits.view().slice(0, 0, acts_->B * acts_->T);
}

Tensor Model::attention_weights(int64_t layer) const {
  const Activations& a = *acts_;
  check(!a.layers.empty() && a.B > 0, "model: attention weights before any forward");
  check(layer >= 0 && layer < config_.n_layers, "model: layer ", layer, " of ", config_.n_layers);
  return multihead_weights(attention_layer(layer), a.layers[layer].attention, a.B, a.T, a.T);
}

MultiHeadAttention Model::attention_layer(int64_t layer) const {
  const ModelConfig& c = config_;
  check(layer >= 0 && layer < c.n_layers, "model: layer ", layer, " of ", c.n_layers);
  const Weights::Layer& L = w_->layers[layer];
  MultiHeadAttention m;
  m.n_heads = c.n_heads;
  m.n_kv_heads = c.n_kv_heads;
  m.d_head = c.d_head;
  m.causal = c.causal;
  m.window = c.window;
  m.alibi = c.positions == PositionKind::alibi ? alibi_.data() : nullptr;
  m.shard = shard_;
  m.rotary = c.positions == PositionKind::rotary;
  m.rope_theta = c.rope_theta;
  m.rope_pairs = c.rope_halves ? RopePairs::halves : RopePairs::adjacent;
  m.qkv_w = L.qkv.w, m.qkv_b = L.qkv.b, m.d_qkv_w = L.qkv.dw, m.d_qkv_b = L.qkv.db;
  m.out_w = L.out.w, m.out_b = L.out.b, m.d_out_w = L.out.dw, m.d_out_b = L.out.db;
  m.compute = compute_;
  return m;
}

void Model::set_compute_type(TensorType type) {
  check(type == TensorType::f32 || type == TensorType::bf16, "model: compute type ",
        dtype_name(type), " is not one of fp32, bf16");
  compute_ = type;
}

float Model::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) {
  const ModelConfig& c = config_;
  check(B >= 1 && T >= 1, "model forward: need B, T >= 1, got ", B, ", ", T);
  check(!has_external_weights(),
        "model forward: the weights are held quantized in the model file; "
        "forward_cached (generation) runs them, the full forward (training, attention maps) needs "
        "the model loaded as fp32 (load_gguf with GgufWeights::fp32; Python: dequantize=True)");
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
  Activations& a = *acts_;
  if (a.capacity < N) {  // (re)allocate for a larger batch; smaller ones use the first rows
    a.capacity = N;
    a.resid.clear();
    for (int64_t l = 0; l <= c.n_layers; ++l) a.resid.push_back(zeros(N, C));
    a.layers.clear();
    a.layers.resize(c.n_layers);
    for (auto& L : a.layers) {
      L.ln1 = zeros(N, C), L.mean1 = zeros(N, 1), L.rstd1 = zeros(N, 1);
      L.mid = zeros(N, C), L.ln2 = zeros(N, C), L.mean2 = zeros(N, 1), L.rstd2 = zeros(N, 1);
      L.h = zeros(N, F), L.g = zeros(N, F);
      if (c.mlp == MlpKind::swiglu) L.u = zeros(N, F);
    }
    a.lnf = zeros(N, C), a.meanf = zeros(N, 1), a.rstdf = zeros(N, 1);
    a.logits = zeros(N, V), a.probs = zeros(N, V);
    a.dresid = zeros(N, C), a.dmid = zeros(N, C), a.dln = zeros(N, C);
    a.dh = zeros(N, F), a.dg = zeros(N, F);
    a.dlnf = zeros(N, C);
    if (c.mlp == MlpKind::swiglu) a.du = zeros(N, F);
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
  const bool ln = c.norm == NormKind::layer_norm;
  const Weights& w = *w_;
  auto norm = [&](View y, float* mean, float* rstd, View x, const Weights::Norm& n) {
    if (ln) layernorm_forward(y, mean, rstd, x, n.w, n.b, c.norm_eps);
    else rmsnorm_forward(y, rstd, x, n.w, c.norm_eps);
  };

  // Embeddings, plus learned or sinusoidal positions.
  thread_local Tensor sinusoids;
  View positions;
  if (c.positions == PositionKind::learned) positions = w.position;
  if (c.positions == PositionKind::sinusoidal) {
    if (sinusoids.numel() < seq_len * C) sinusoids = zeros(std::max(seq_len, c.context), C);
    sinusoidal_table(sinusoids);
    positions = sinusoids;
  }
  embedding_forward(rows(a.resid[0]), a.tokens.data(), w.token,
                    positions.empty() ? nullptr : a.pos.data(), positions);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const Weights::Layer& P = w.layers[l];
    auto& L = a.layers[l];
    // x += attn(norm(x))
    norm(rows(L.ln1), L.mean1.data(), L.rstd1.data(), rows(a.resid[l]), P.norm1);
    multihead_forward(attention_layer(l), L.attention, rows(L.mid), rows(L.ln1), View{}, B, T, T);
    residual_forward(rows(L.mid), rows(L.mid), rows(a.resid[l]));
    // x += ffn(norm(x))
    norm(rows(L.ln2), L.mean2.data(), L.rstd2.data(), rows(L.mid), P.norm2);
    if (c.mlp == MlpKind::gelu) {
      linear_forward(rows(L.h), rows(L.ln2), P.fc.w, P.fc.b, compute_);
      gelu_forward(rows(L.g), rows(L.h), Gelu::tanh);
    } else {
      linear_forward(rows(L.h), rows(L.ln2), P.gate.w, P.gate.b, compute_);
      linear_forward(rows(L.u), rows(L.ln2), P.up.w, P.up.b, compute_);
      swiglu_forward(rows(L.g), rows(L.h), rows(L.u));
    }
    linear_forward(rows(a.resid[l + 1]), rows(L.g), P.proj.w, P.proj.b, compute_);
    residual_forward(rows(a.resid[l + 1]), rows(a.resid[l + 1]), rows(L.mid));
  }
  norm(rows(a.lnf), a.meanf.data(), a.rstdf.data(), rows(a.resid[c.n_layers]), w.norm);
  linear_forward(rows(a.logits), rows(a.lnf), w.head.w, nullptr, compute_);
  if (!targets) return 0;
  return cross_entropy_forward(rows(a.probs), rows(a.logits), a.targets.data());
}

void Model::backward(float dloss) {
  const ModelConfig& c = config_;
  Activations& a = *acts_;
  check(a.have_targets, "model backward: the last forward had no targets");
  check(trainable(), "model backward: no gradients in a model loaded for inference only");
  const int64_t B = a.B, T = a.T, N = B * T;
  auto rows = [N](const Tensor& t) { return t.view().slice(0, 0, N); };
  auto zero = [&](const Tensor& t) { std::fill(t.data(), t.data() + rows(t).numel(), 0.0f); };
  const bool ln = c.norm == NormKind::layer_norm;
  const Weights& w = *w_;
  auto norm_backward = [&](View dx, View dy, View x, const float* mean, const float* rstd,
                           const Weights::Norm& n) {
    if (ln) layernorm_backward(dx, n.dw, n.db, dy, x, n.w, mean, rstd);
    else rmsnorm_backward(dx, n.dw, dy, x, n.w, rstd);
  };
  auto linear_backward_of = [&](View dx, View dy, View x, const Weights::Linear& f) {
    linear_backward(dx, f.dw, f.db, dy, x, f.w, compute_);
  };

  // Loss → logits → final norm.
  cross_entropy_backward_inplace(rows(a.probs), a.targets.data(), dloss);  // probs → dlogits
  zero(a.dlnf);
  linear_backward_of(rows(a.dlnf), rows(a.probs), rows(a.lnf), w.head);
  zero(a.dresid);
  norm_backward(rows(a.dresid), rows(a.dlnf), rows(a.resid[c.n_layers]), a.meanf.data(),
                a.rstdf.data(), w.norm);

  for (int64_t l = c.n_layers - 1; l >= 0; --l) {
    const Weights::Layer& P = w.layers[l];
    auto& L = a.layers[l];
    // dresid holds ∂loss/∂(output of layer l). Through x_out = mid + proj(g):
    zero(a.dg);
    linear_backward_of(rows(a.dg), rows(a.dresid), rows(L.g), P.proj);
    zero(a.dh);
    zero(a.dln);
    if (c.mlp == MlpKind::gelu) {
      gelu_backward(rows(a.dh), rows(a.dg), rows(L.h), Gelu::tanh);
      linear_backward_of(rows(a.dln), rows(a.dh), rows(L.ln2), P.fc);
    } else {
      zero(a.du);
      swiglu_backward(rows(a.dh), rows(a.du), rows(a.dg), rows(L.h), rows(L.u));
      linear_backward_of(rows(a.dln), rows(a.dh), rows(L.ln2), P.gate);
      linear_backward_of(rows(a.dln), rows(a.du), rows(L.ln2), P.up);
    }
    // dmid = dresid (residual) + norm2's backward.
    std::copy(a.dresid.data(), a.dresid.data() + N * c.d_model, a.dmid.data());
    norm_backward(rows(a.dmid), rows(a.dln), rows(L.mid), L.mean2.data(), L.rstd2.data(), P.norm2);
    // Through mid = x + attention(norm1(x)):
    zero(a.dln);
    multihead_backward(attention_layer(l), L.attention, rows(a.dln), View{}, rows(a.dmid),
                       rows(L.ln1), View{}, B, T, T);
    // dresid(layer input) = dmid (residual) + norm1's backward.
    std::copy(a.dmid.data(), a.dmid.data() + N * c.d_model, a.dresid.data());
    norm_backward(rows(a.dresid), rows(a.dln), rows(a.resid[l]), L.mean1.data(), L.rstd1.data(),
                  P.norm1);
  }
  const bool learned = c.positions == PositionKind::learned;
  embedding_backward(w.d_token, a.tokens.data(), rows(a.dresid), learned ? a.pos.data() : nullptr,
                     w.d_position);
}

}  // namespace qkv
