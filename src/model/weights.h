// A model's parameters as per-layer views, built once when the model is laid out (llm.c's
// ParameterTensors): forward, backward and cached decoding read these instead of looking
// each weight up by name (~15 string builds and searches per layer per call).
#pragma once

#include <vector>

#include "qkv/model.h"

namespace qkv {

struct Model::Weights {
  struct Norm {
    const float *w = nullptr, *b = nullptr;  // b: LayerNorm only
    float *dw = nullptr, *db = nullptr;      // gradients (null in an inference-only model)
  };
  struct Linear {
    View w;                    // [out, in]; empty when held in a block format
    const float* b = nullptr;  // null without biases
    View dw;
    float* db = nullptr;
    const std::vector<quant::Matrix>* blocks = nullptr;  // the weight in its file's block format
  };
  struct Layer {
    Norm norm1, norm2;
    Linear qkv, out, fc, gate, up, proj;  // fc for GELU MLPs, gate and up for SwiGLU
    // gate's blocks then up's, when both are in a block format without biases: one product
    // for both (one parallel region, the activations rounded once for int8).
    std::vector<quant::Matrix> gate_up;
    const float* sinks = nullptr;  // [n_heads] attention-sink logits, when the model has them
    float* d_sinks = nullptr;
  };
  View token, position;  // token: empty when held in a block format
  View d_token, d_position;
  const std::vector<quant::Matrix>* token_blocks = nullptr;
  std::vector<Layer> layers;
  Norm norm;
  Linear head;  // the token table again when tied
};

}  // namespace qkv
