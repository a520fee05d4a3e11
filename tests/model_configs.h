// Small model configurations shared by the model and training tests.
#pragma once

#include "qkv/model.h"

namespace qkv::testing {

// A 2-layer model of width d_model with 4 heads (2 key/value heads when Llama-style).
inline ModelConfig small_model(int64_t vocab, int64_t context, bool llama, int64_t d_model = 32) {
  ModelConfig c;
  c.vocab_size = vocab;
  c.context = context;
  c.d_model = d_model;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = llama ? 2 : 4;
  c.d_head = d_model / 4;
  c.d_ff = 2 * d_model;
  if (llama) use_llama_style(c);
  return c;
}

}  // namespace qkv::testing
