// The buffers of Model::forward_cached (src/model/inference.cpp), grown to the largest call
// and reused: generating a token allocates nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/model.h"

namespace qkv {

struct Model::InferenceBuffers {
  int64_t capacity = 0, logit_rows = 0;
  Tensor x, ln, qkv, att, y, h, g, stat, last, logits, sinusoids;
  std::vector<int32_t> pos;
  std::vector<int64_t> seq, pos0;  // each row's cache sequence and first position
};

}  // namespace qkv
