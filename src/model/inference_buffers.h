// The buffers of Model::forward_cached (src/model/inference.cpp), grown to the largest call
// and reused: generating a token allocates nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/model.h"

namespace qkv {

struct Model::InferenceBuffers {
  int64_t capacity = 0, logit_rows = 0, gathered = 0;
  Tensor x, ln, qkv, att, y, h, u, g, stat, last, logits, k, v, sinusoids;
  std::vector<int32_t> pos;
  std::vector<int64_t> seq, pos0;  // each row's cache sequence and first position

  // The parameters by layer, looked up by name once: a decoded token should not build and
  // search for ~15 names per layer. (The weights never move after construction.)
  struct Norm {
    const float *w = nullptr, *b = nullptr;
  };
  struct Linear {
    View w;
    const float* b = nullptr;
    const std::vector<quant::Matrix>* q = nullptr;  // the weight in a block format, in place
  };
  struct Layer {
    MultiHeadAttention attn;
    Norm norm1, norm2;
    Linear qkv, out, fc, gate, up, proj;  // fc for GELU MLPs, gate and up for SwiGLU
  };
  std::vector<Layer> layers;
  Norm norm;
  Linear head;
  const std::vector<quant::Matrix>* embedding = nullptr;  // the token table in a block format
  View token_table, position_table;
};

}  // namespace qkv
