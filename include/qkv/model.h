// ModelConfig: the shape of a decoder-only transformer.
// It covers GPT-2/GPT-3-style models (LayerNorm, GELU MLP, learned positions, biases, tied
// embeddings) and Llama-style ones (RMSNorm, SwiGLU, rotary positions, GQA, no biases).
#pragma once

#include <cstdint>
#include <string>

namespace qkv {

enum class NormKind { layer_norm, rms_norm };
enum class MlpKind { gelu, swiglu };  // gelu: W2·gelu(W1 x); swiglu: W2·(silu(W1 x) ⊙ W3 x)
enum class PositionKind { learned, sinusoidal, rotary, alibi, none };

struct ModelConfig {
  int64_t vocab_size = 50257;
  int64_t context = 1024;     // longest sequence (learned position table size)
  int64_t d_model = 768;      // width of the residual stream (the embedding)
  int64_t n_layers = 12;
  int64_t n_heads = 12;       // query heads
  int64_t n_kv_heads = 12;    // key/value heads: n_heads (MHA), fewer (GQA), 1 (MQA)
  int64_t d_head = 64;        // per-head width of queries, keys and values
  int64_t d_ff = 3072;        // hidden width of the feed-forward block
  NormKind norm = NormKind::layer_norm;
  MlpKind mlp = MlpKind::gelu;
  PositionKind positions = PositionKind::learned;
  bool bias = true;            // biases in the linear layers (and LayerNorm)
  bool tied_embeddings = true; // the language-model head reuses the token embedding
};

std::string to_string(NormKind);
std::string to_string(MlpKind);
std::string to_string(PositionKind);

// Throws qkv::Error naming the first field that is out of range or inconsistent.
void validate(const ModelConfig& config);

}  // namespace qkv
