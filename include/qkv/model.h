// ModelConfig: the shape of a decoder-only transformer.
// It covers GPT-2/GPT-3-style models (LayerNorm, GELU MLP, learned positions, biases, tied
// embeddings) and Llama-style ones (RMSNorm, SwiGLU, rotary positions, GQA, no biases).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "qkv/multihead.h"
#include "qkv/quant.h"
#include "qkv/tensor.h"

namespace qkv {

class KVCache;

enum class NormKind { layer_norm, rms_norm };
enum class MlpKind { gelu, swiglu };  // gelu: W2·gelu(W1 x); swiglu: W2·(silu(W1 x) ⊙ W3 x)
enum class PositionKind { learned, sinusoidal, rotary, alibi, none };

struct ModelConfig {
  int64_t vocab_size = 50257;
  int64_t context = 1024;  // longest sequence (learned position table size)
  int64_t d_model = 768;   // width of the residual stream (the embedding)
  int64_t n_layers = 12;
  int64_t n_heads = 12;     // query heads
  int64_t n_kv_heads = 12;  // key/value heads: n_heads (MHA), fewer (GQA), 1 (MQA)
  int64_t d_head = 64;      // per-head width of queries, keys and values
  int64_t d_ff = 3072;      // hidden width of the feed-forward block
  NormKind norm = NormKind::layer_norm;
  MlpKind mlp = MlpKind::gelu;
  PositionKind positions = PositionKind::learned;
  bool bias = true;             // biases in the linear layers (and LayerNorm)
  bool tied_embeddings = true;  // the language-model head reuses the token embedding
  float norm_eps = 1e-5f;
  float rope_theta = 10000;  // rotary base frequency
  bool rope_halves = false;  // rotary pairs (j, j + D/2) as GPT-NeoX; false: (2j, 2j+1)
  bool causal = true;        // a decoder; false only for experiments on symmetry
  int64_t window = 0;        // sliding window (Mistral): each position sees itself and the
                             // `window` positions before it; 0 = the whole prefix
  bool sinks = false;        // a learned attention-sink logit per query head and layer (gpt-oss):
                             // parameter layers.L.attn.sinks [n_heads], starting at 0
  float attn_dropout = 0;    // attention dropout p in training mode (Model::set_training); 0: none
  float init_std = 0.02f;    // std of the random initial weights (GPT-2: 0.02)
};

std::string to_string(NormKind);
std::string to_string(MlpKind);
std::string to_string(PositionKind);

// Throws qkv::Error naming the first field that is out of range or inconsistent.
void validate(const ModelConfig& config);

// Switches a config to Llama's conventions: RMSNorm, SwiGLU, rotary positions, no biases,
// an untied language-model head. Sizes are left as they are.
void use_llama_style(ModelConfig& config);

// A Llama-style config of these sizes (d_head = d_model / heads), the head tied to the
// embedding when `tied`. Not validated: callers that take sizes from outside call validate().
ModelConfig llama_config(int64_t layers, int64_t d_model, int64_t heads, int64_t kv_heads,
                         int64_t d_ff, int64_t vocab, int64_t context, bool tied = false);

// One named tensor inside the flat parameter buffer.
struct ParamInfo {
  std::string name;    // e.g. "layers.3.attn.qkv.weight"
  int64_t offset = 0;  // in floats, into Model::weights and Model::grads
  int64_t rows = 0, cols = 1;
  bool decay = false;     // matrices and embeddings get weight decay; biases and norms do not
  bool external = false;  // held outside the buffer, as ExternalWeights (offset −1)
};

// Weight matrices a model reads where they lie, in their block format (a GGUF file's
// quantized tensors, memory-mapped), by parameter name: each is one or more row blocks
// stacked (q, k and v of a fused attn.qkv.weight).
struct ExternalWeights {
  std::map<std::string, std::vector<quant::Matrix>> matrices;
  std::shared_ptr<const void> owner;  // keeps their memory alive (the file's mapping)
};

// A decoder-only transformer with its parameters, gradients and activations.
// Parameters and gradients are each one flat buffer (the llm.c layout): zeroing gradients is
// one fill, an optimizer step one loop, a checkpoint one write.
class Model {
 public:
  // Random initialisation as GPT-2: N(0, 0.02) weights, residual projections scaled by
  // 1/sqrt(2 · n_layers), zero biases, unit norm weights.
  Model(const ModelConfig& config, uint64_t seed);
  // For running pretrained weights: all zero (the loader fills them), and no gradient buffer
  // (half the memory; backward is an error).
  struct InferenceOnly {};
  Model(const ModelConfig& config, InferenceOnly);
  // Inference from weights held elsewhere: the named matrices stay where they are (no fp32
  // copy; the fp32 buffer holds only the rest, norms and biases, for the loader to fill).
  // forward (every position's logits, attention maps) and forward_cached run such a model;
  // backward, weight() of those names and saving are errors that say so.
  Model(const ModelConfig& config, InferenceOnly, ExternalWeights external);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  // The parameters a model of this config has, without allocating them (validates it).
  static std::vector<ParamInfo> param_layout(const ModelConfig& config);
  const ParamInfo& param(const std::string& name) const;
  View weight(const std::string& name) const;  // [rows, cols] view into weights
  View grad(const std::string& name) const;
  // The blocks of an external weight, or null when `name` is in the fp32 buffer.
  const std::vector<quant::Matrix>* external(const std::string& name) const;
  bool has_external_weights() const { return !external_.matrices.empty(); }
  int64_t num_params() const { return num_params_; }
  float* weights() const { return weights_.data(); }
  float* grads() const { return grads_.data(); }
  bool trainable() const { return grads_.data() != nullptr; }

  // Forward over tokens [B, T] (every position at once, causal). With targets [B, T]
  // (kIgnoreIndex where a position does not count) it returns the mean cross-entropy and
  // keeps what backward needs; without, it returns 0. Logits [B·T, vocab] stay readable.
  float forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T);
  // After a forward with targets: grads += dloss · ∂loss/∂params (dloss weights this batch's
  // mean in a larger one: data-parallel training passes its share of the global batch).
  void backward(float dloss = 1.0f);
  void zero_grad();
  View logits() const;
  // The softmax weights [B, Hq, T, T] of one layer's attention in the last forward, from the
  // reference kernel (the fast kernel never stores them).
  Tensor attention_weights(int64_t layer) const;
  // Layer `layer`'s attention as a MultiHeadAttention over this model's weights and grads.
  MultiHeadAttention attention_layer(int64_t layer) const;

  // Context parallelism: from now on forward() and backward() run this process's positions
  // `shard` of each sequence (T = shard->local_len()), with attention across processes.
  // The caller keeps `shard` alive; null returns to whole sequences.
  void set_sequence_shard(const SequenceShard* shard) { shard_ = shard; }

  // The operands of forward() and backward()'s products: f32 (the default), or bf16 for
  // mixed-precision training: every linear layer's inputs, weights and gradients and
  // attention's q, k and v rounded to bf16 as they enter a product, every sum in fp32; the
  // weights, gradients, activations and optimizer state stay fp32 (include/qkv/ops.h,
  // linear_forward). forward_cached is not affected. Throws qkv::Error for another type.
  void set_compute_type(TensorType type);
  // Training mode: while it is on, forward() and backward() apply config().attn_dropout to each
  // layer's attention weights (off, the default: every weight is kept). Each forward in
  // training mode draws new masks: seed = the model's seed, offset = forwards so far in training
  // mode · n_layers + layer, mod 2³² (include/qkv/attention.h, struct Dropout). A backward
  // follows its forward's mode.
  void set_training(bool on) { training_ = on; }
  bool training() const { return training_; }
  // Where the masks stand: the next forward in training mode draws masks `draws` + 1 (a resumed
  // run, or a test that repeats one forward, sets it), its rows those of rows batch_offset … of
  // a larger batch (a data-parallel rank's share: each rank then draws its own rows' masks).
  void set_dropout_draws(uint32_t draws, int64_t batch_offset = 0) {
    dropout_forwards_ = draws, dropout_batch_offset_ = batch_offset;
  }
  // The seed the model was made with (its dropout masks' too; a checkpoint keeps it).
  uint64_t seed() const { return seed_; }
  TensorType compute_type() const { return compute_; }

  // How forward and forward_cached multiply activations with Q8_0, Q4_0, Q4_1, Q4_K and Q6_K
  // weights held in their block format (quant::Matmul: exact fp32, or int8 as llama.cpp).
  // Default exact. int8 repacks the matrices whose unit reads a layout of its own
  // (quant::repack_for_int8: on AVX-512 DL the Q8_0, Q4_0 and Q4_1 ones), a copy as large as
  // they are, held until the mode changes back; the results are the same bits either way.
  void set_matmul(quant::Matmul mode);
  quant::Matmul matmul() const { return matmul_; }

  // Inference with a key/value cache (src/model/inference.cpp). Runs T new tokens of each of
  // B sequences (tokens [B, T]; row i extends cache sequence seqs[i], or i when seqs is null)
  // at the positions their cache has reached, stores their keys and values, and returns the
  // logits of every new position [B·T, V] (all_logits) or of each sequence's last [B, V].
  // The view stays valid until the next call. Throws qkv::Error when a sequence would
  // outgrow the cache.
  View forward_cached(KVCache& cache, const int32_t* tokens, int64_t B, int64_t T,
                      const int64_t* seqs = nullptr, bool all_logits = false);

 private:
  struct Activations;
  struct InferenceBuffers;
  struct Weights;
  struct Decoder;  // the embedding, the layers and the head, written once (src/model/decoder.h)
  void lay_out();  // names the parameters, allocates the weights
  void bind_weights();  // the per-layer views of weights and gradients (src/model/weights.h)
  ModelConfig config_;
  std::vector<ParamInfo> params_;
  int64_t num_params_ = 0;
  Tensor weights_, grads_;
  ExternalWeights external_;
  std::vector<std::vector<uint8_t>> packed_;  // external_'s matrices repacked for int8
  std::vector<float> alibi_;                  // ALiBi slopes, when the model uses them
  const SequenceShard* shard_ = nullptr;
  quant::Matmul matmul_ = quant::Matmul::exact;
  TensorType compute_ = TensorType::f32;
  uint64_t seed_ = 0;  // the initialisation's, and the dropout masks'
  bool training_ = false;
  bool dropout_now_ = false;       // the last forward dropped weights (its backward does too)
  uint32_t dropout_forwards_ = 0;  // forwards in training mode with dropout so far
  int64_t dropout_batch_offset_ = 0;
  std::unique_ptr<Weights> w_;
  std::unique_ptr<Activations> acts_;
  std::unique_ptr<InferenceBuffers> infer_;
};

}  // namespace qkv
