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
      if (c.bias) add(p + "mlp.gate.bias", c.d_ff, 1, false), add(p + "mlp.up.bias", c.d_ff, 1, false);
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
        check(m.cols == p.cols, "model: external \"", name, "\" has ", m.cols, " columns, not ", p.cols);
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

Model::Model(const ModelConfig& config, InferenceOnly) : config_(config) { lay_out(); }

Model::Model(const ModelConfig& config, InferenceOnly, ExternalWeights external)
    : config_(config), external_(std::move(external)) {
  lay_out();
}

const std::vector<quant::Matrix>* Model::external(const std::string& name) const {
  const auto it = external_.matrices.find(name);
  return it == external_.matrices.end() ? nullptr : &it->second;
}

Model::Model(const ModelConfig& config, uint64_t seed) : config_(config) {
  lay_out();
  const ModelConfig& c = config_;
  grads_ = Tensor({num_params_});
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, c.init_std);
  const float residual_scale = 1.0f / std::sqrt(2.0f * c.n_layers);
  for (const ParamInfo& p : params_) {
    float* w = weights_.data() + p.offset;
    const int64_t n = p.rows * p.cols;
    const bool is_norm = p.name.find("norm") != std::string::npos && p.name.ends_with("weight");
    const bool is_residual = p.name.ends_with("attn.out.weight") || p.name.ends_with("mlp.proj.weight");
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
        gguf::to_string(external_.matrices.at(name)[0].type), "), not as fp32; this needs the model "
        "loaded as fp32 (load_gguf with GgufWeights::fp32; Python: dequantize=True)");
  return View(weights_.data() + p.offset, {p.rows, p.cols});
}

View Model::grad(const std::string& name) const {
  const ParamInfo& p = param(name);
  if (p.external) return View();
  if (!trainable()) return {};
  return View(grads_.data() + p.offset, {p.rows, p.cols});
}

void Model::zero_grad() {
  check(trainable(), "model: no gradients in a model loaded for inference only");
  grads_.fill(0);
}

View Model::logits() const {
  check(!acts_->logits.view().empty(), "model: logits before any forward");
  return acts_->logits.view().slice(0, 0, acts_->B * acts_->T);
}

namespace {

const float* bias_or_null(const Model& m, const std::string& name) {
  return m.config().bias ? m.weight(name).data : nullptr;
}

}  // namespace

Tensor Model::attention_weights(int64_t layer) const {
  const Activations& a = *acts_;
  check(!a.layers.empty() && a.B > 0, "model: attention weights before any forward");
  check(layer >= 0 && layer < config_.n_layers, "model: layer ", layer, " of ", config_.n_layers);
  return multihead_weights(attention_layer(layer), a.layers[layer].attention, a.B, a.T, a.T);
}

MultiHeadAttention Model::attention_layer(int64_t layer) const {
  const ModelConfig& c = config_;
  const std::string p = "layers." + std::to_string(layer) + ".attn.";
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
  if (!external(p + "qkv.weight")) m.qkv_w = weight(p + "qkv.weight");
  if (!external(p + "out.weight")) m.out_w = weight(p + "out.weight");
  m.d_qkv_w = grad(p + "qkv.weight");
  m.d_out_w = grad(p + "out.weight");
  if (c.bias) {
    m.qkv_b = weight(p + "qkv.bias").data;
    m.out_b = weight(p + "out.bias").data;
    m.d_qkv_b = grad(p + "qkv.bias").data;
    m.d_out_b = grad(p + "out.bias").data;
  }
  return m;
}

float Model::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) {
  const ModelConfig& c = config_;
  check(B >= 1 && T >= 1, "model forward: need B, T >= 1, got ", B, ", ", T);
  check(!has_external_weights(), "model forward: the weights are held quantized in the model file; "
        "forward_cached (generation) runs them, the full forward (training, attention maps) needs "
        "the model loaded as fp32 (load_gguf with GgufWeights::fp32; Python: dequantize=True)");
  const int64_t seq_len = shard_ ? shard_->seq_len : T;
  check(seq_len <= c.context || c.positions != PositionKind::learned, "model forward: T = ",
        seq_len, " is longer than the context of ", c.context, " learned positions");
  check(!shard_ || shard_->local_len() == T, "model forward: the sequence shard holds ",
        shard_ ? shard_->local_len() : 0, " positions of each sequence, the batch ", T);
  check(!shard_ || c.positions != PositionKind::alibi, "model forward: ALiBi does not run "
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
  auto norm = [&](View y, float* mean, float* rstd, View x, const std::string& name) {
    if (ln) layernorm_forward(y, mean, rstd, x, weight(name + ".weight").data,
                              weight(name + ".bias").data, c.norm_eps);
    else rmsnorm_forward(y, rstd, x, weight(name + ".weight").data, c.norm_eps);
  };

  // Embeddings, plus learned or sinusoidal positions.
  thread_local Tensor sinusoids;
  View positions;
  if (c.positions == PositionKind::learned) positions = weight("embedding.position");
  if (c.positions == PositionKind::sinusoidal) {
    if (sinusoids.numel() < seq_len * C) sinusoids = zeros(std::max(seq_len, c.context), C);
    sinusoidal_table(sinusoids);
    positions = sinusoids;
  }
  embedding_forward(rows(a.resid[0]), a.tokens.data(), weight("embedding.token"),
                    positions.empty() ? nullptr : a.pos.data(), positions);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    auto& L = a.layers[l];
    // x += attn(norm(x))
    norm(rows(L.ln1), L.mean1.data(), L.rstd1.data(), rows(a.resid[l]), p + "norm1");
    multihead_forward(attention_layer(l), L.attention, rows(L.mid), rows(L.ln1), View{}, B, T, T);
    residual_forward(rows(L.mid), rows(L.mid), rows(a.resid[l]));
    // x += ffn(norm(x))
    norm(rows(L.ln2), L.mean2.data(), L.rstd2.data(), rows(L.mid), p + "norm2");
    if (c.mlp == MlpKind::gelu) {
      linear_forward(rows(L.h), rows(L.ln2), weight(p + "mlp.fc.weight"),
                     bias_or_null(*this, p + "mlp.fc.bias"));
      gelu_forward(rows(L.g), rows(L.h), Gelu::tanh);
    } else {
      linear_forward(rows(L.h), rows(L.ln2), weight(p + "mlp.gate.weight"),
                     bias_or_null(*this, p + "mlp.gate.bias"));
      linear_forward(rows(L.u), rows(L.ln2), weight(p + "mlp.up.weight"),
                     bias_or_null(*this, p + "mlp.up.bias"));
      swiglu_forward(rows(L.g), rows(L.h), rows(L.u));
    }
    linear_forward(rows(a.resid[l + 1]), rows(L.g), weight(p + "mlp.proj.weight"),
                   bias_or_null(*this, p + "mlp.proj.bias"));
    residual_forward(rows(a.resid[l + 1]), rows(a.resid[l + 1]), rows(L.mid));
  }
  norm(rows(a.lnf), a.meanf.data(), a.rstdf.data(), rows(a.resid[c.n_layers]), "norm");
  const View head = c.tied_embeddings ? weight("embedding.token") : weight("lm_head.weight");
  linear_forward(rows(a.logits), rows(a.lnf), head, nullptr);
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
  auto norm_backward = [&](View dx, View dy, View x, const float* mean, const float* rstd,
                           const std::string& name) {
    if (ln) layernorm_backward(dx, grad(name + ".weight").data, grad(name + ".bias").data, dy, x,
                               weight(name + ".weight").data, mean, rstd);
    else rmsnorm_backward(dx, grad(name + ".weight").data, dy, x, weight(name + ".weight").data,
                          rstd);
  };
  auto bias_grad = [&](const std::string& name) { return c.bias ? grad(name).data : nullptr; };

  // Loss → logits → final norm.
  cross_entropy_backward_inplace(rows(a.probs), a.targets.data(), dloss);  // probs → dlogits
  zero(a.dlnf);
  const std::string head = c.tied_embeddings ? "embedding.token" : "lm_head.weight";
  linear_backward(rows(a.dlnf), grad(head), nullptr, rows(a.probs), rows(a.lnf), weight(head));
  zero(a.dresid);
  norm_backward(rows(a.dresid), rows(a.dlnf), rows(a.resid[c.n_layers]), a.meanf.data(),
                a.rstdf.data(), "norm");

  for (int64_t l = c.n_layers - 1; l >= 0; --l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    auto& L = a.layers[l];
    // dresid holds ∂loss/∂(output of layer l). Through x_out = mid + proj(g):
    zero(a.dg);
    linear_backward(rows(a.dg), grad(p + "mlp.proj.weight"), bias_grad(p + "mlp.proj.bias"),
                    rows(a.dresid), rows(L.g), weight(p + "mlp.proj.weight"));
    zero(a.dh);
    zero(a.dln);
    if (c.mlp == MlpKind::gelu) {
      gelu_backward(rows(a.dh), rows(a.dg), rows(L.h), Gelu::tanh);
      linear_backward(rows(a.dln), grad(p + "mlp.fc.weight"), bias_grad(p + "mlp.fc.bias"),
                      rows(a.dh), rows(L.ln2), weight(p + "mlp.fc.weight"));
    } else {
      zero(a.du);
      swiglu_backward(rows(a.dh), rows(a.du), rows(a.dg), rows(L.h), rows(L.u));
      linear_backward(rows(a.dln), grad(p + "mlp.gate.weight"), bias_grad(p + "mlp.gate.bias"),
                      rows(a.dh), rows(L.ln2), weight(p + "mlp.gate.weight"));
      linear_backward(rows(a.dln), grad(p + "mlp.up.weight"), bias_grad(p + "mlp.up.bias"),
                      rows(a.du), rows(L.ln2), weight(p + "mlp.up.weight"));
    }
    // dmid = dresid (residual) + norm2's backward.
    std::copy(a.dresid.data(), a.dresid.data() + N * c.d_model, a.dmid.data());
    norm_backward(rows(a.dmid), rows(a.dln), rows(L.mid), L.mean2.data(), L.rstd2.data(),
                  p + "norm2");
    // Through mid = x + attention(norm1(x)):
    zero(a.dln);
    multihead_backward(attention_layer(l), L.attention, rows(a.dln), View{}, rows(a.dmid),
                       rows(L.ln1), View{}, B, T, T);
    // dresid(layer input) = dmid (residual) + norm1's backward.
    std::copy(a.dmid.data(), a.dmid.data() + N * c.d_model, a.dresid.data());
    norm_backward(rows(a.dresid), rows(a.dln), rows(a.resid[l]), L.mean1.data(), L.rstd1.data(),
                  p + "norm1");
  }
  const bool learned = c.positions == PositionKind::learned;
  embedding_backward(grad("embedding.token"), a.tokens.data(), rows(a.dresid),
                     learned ? a.pos.data() : nullptr,
                     learned ? grad("embedding.position") : View{});
}

}  // namespace qkv
