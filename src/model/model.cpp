// A decoder-only model's parameters: their names and layout in one flat buffer (or held in a
// file's block format), initialisation, and the per-layer views the decoder reads
// (decoder.cpp runs it).
//
// Legend: C = d_model, Hq/Hkv heads, W = (Hq + 2 Hkv) · d_head the fused QKV width,
// A = Hq · d_head, F = d_ff.
#include <cmath>
#include <random>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/model.h"
#include "qkv/multihead.h"
#include "qkv/ops.h"
#include "model/decoder.h"

namespace qkv {

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
    if (c.sinks) add(p + "attn.sinks", c.n_heads, 1, false);
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

Model::Model(const ModelConfig& config, uint64_t seed) : config_(config), seed_(seed) {
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

void Model::set_matmul(quant::Matmul mode) {
  matmul_ = mode;
  packed_.clear();
  for (auto& [name, parts] : external_.matrices)
    for (quant::Matrix& m : parts) {
      m.packed = nullptr;
      // (An untied token table is read a row at a time, never multiplied.)
      const bool multiplied = name != "embedding.token" || config_.tied_embeddings;
      if (mode != quant::Matmul::int8 || !multiplied) continue;
      std::vector<uint8_t> packed = quant::repack_for_int8(m);
      if (packed.empty()) continue;
      m.packed = packed.data();
      packed_.push_back(std::move(packed));
    }
  if (w_) bind_weights();  // the layers' copies of the matrices (gate_up) see the change
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
    if (c.sinks)
      L.sinks = in_buffer(p + "attn.sinks").data, L.d_sinks = grad(p + "attn.sinks").data;
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
  m.sinks = L.sinks, m.d_sinks = L.d_sinks;
  if (dropout_now_)
    m.dropout = {c.attn_dropout, seed_,
                 static_cast<uint32_t>(uint64_t{dropout_forwards_} * c.n_layers + layer),
                 dropout_batch_offset_};
  m.shard = shard_;
  m.rotary = c.positions == PositionKind::rotary;
  m.rope_theta = c.rope_theta;
  m.rope_pairs = c.rope_halves ? RopePairs::halves : RopePairs::adjacent;
  m.qkv_w = L.qkv.w, m.qkv_b = L.qkv.b, m.d_qkv_w = L.qkv.dw, m.d_qkv_b = L.qkv.db;
  m.out_w = L.out.w, m.out_b = L.out.b, m.d_out_w = L.out.dw, m.d_out_b = L.out.db;
  m.qkv_blocks = L.qkv.blocks, m.out_blocks = L.out.blocks, m.matmul = matmul_;
  m.compute = compute_;
  return m;
}

void Model::set_compute_type(TensorType type) {
  check(type == TensorType::f32 || type == TensorType::bf16, "model: compute type ",
        dtype_name(type), " is not one of fp32, bf16");
  compute_ = type;
}

}  // namespace qkv
