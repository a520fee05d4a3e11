// Parameter, memory and FLOP counts of a transformer, head by head.
//
// Per head, the articles' view: W_Q and W_K map the embedding (d_model) down to the head
// space (d_head); the value map is low-rank — a "value-down" d_head × d_model map, then a
// "value-up" d_model × d_head map. The value-up maps of all heads side by side are the output
// projection W_O. With GQA, W_K and value-down belong to a key/value head shared by
// n_heads / n_kv_heads query heads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qkv/model.h"

namespace qkv {

struct ParamCounts {
  // One attention head (a query head; W_K and value-down are per key/value head).
  int64_t w_q = 0, w_k = 0, value_down = 0, value_up = 0;
  // One layer.
  int64_t attention_weights = 0;  // all heads' W_Q, W_K, value-down, value-up
  int64_t attention_biases = 0;
  int64_t mlp = 0;    // weights and biases
  int64_t norms = 0;  // the two norms of a block
  int64_t layer = 0;  // all of the above
  // The whole model.
  int64_t token_embedding = 0;
  int64_t position_embedding = 0;  // learned positions only
  int64_t lm_head = 0;             // 0 when tied to the token embedding
  int64_t final_norm = 0;
  int64_t total = 0;
  int64_t non_embedding = 0;  // total minus token and position embeddings
};

struct CostCounts {
  int64_t context = 0;                 // the sequence length the costs below are for
  int64_t score_grid_entries = 0;      // context², per head per layer: attention is quadratic
  int64_t score_grid_entries_all = 0;  // × heads × layers
  int64_t kv_cache_bytes_per_token_fp32 = 0;  // keys + values, every layer
  int64_t kv_cache_bytes_per_token_bf16 = 0;
  int64_t kv_cache_bytes_fp32 = 0;  // for a full context
  int64_t kv_cache_bytes_bf16 = 0;
  int64_t weight_bytes_fp32 = 0;
  // Forward FLOPs (multiply + add = 2) for one token that attends to the whole context:
  // 2 per weight of every matrix (embedding lookups excluded, the LM head included), plus
  // q·k and p·v over `context` keys in every head of every layer. Training ≈ 3× forward.
  int64_t forward_flops_matmul = 0;
  int64_t forward_flops_attention = 0;
  int64_t forward_flops_per_token = 0;
};

ParamCounts count_params(const ModelConfig& config);

// Training FLOPs per token of a sequence of `context` tokens (forward + backward, for MFU):
// 6 per parameter, plus q·k and p·v under the causal mask, 6 · layers · heads · d_head ·
// context (half of the full 12).
double training_flops_per_token(const ModelConfig& config, int64_t num_params, int64_t context);
CostCounts count_costs(const ModelConfig& config, int64_t context);

struct Preset {
  std::string name;
  std::string description;  // where the numbers come from, and the size it is known by
  ModelConfig config;
};

// GPT-3 (Brown et al. 2020, table 2.1), GPT-2 (Radford et al. 2019), Llama 2/3, stories260K.
const std::vector<Preset>& presets();
// Throws qkv::Error listing the known names when `name` is not one of them.
const Preset& find_preset(const std::string& name);

}  // namespace qkv
