// The decoder, written once: the embedding, one function per layer (forward and backward) and
// the head, with the buffers of the two ways it runs. The full forward over every position
// (Model::forward, training, attention maps, a block-format model's logits) keeps what the
// backward needs in Activations; cached inference (Model::forward_cached) runs the new
// positions with the residual stream updated in place in InferenceBuffers. A layer's attention
// goes over the batch's own positions or through a key/value cache: the one difference.
//
// Legend: B sequences, T positions (new ones, with a cache), N = B·T rows, C = d_model,
// Hq/Hkv heads, dh = d_head, F = d_ff, V = vocab.
#pragma once

#include <cstdint>
#include <vector>

#include "model/weights.h"
#include "qkv/kv_cache.h"
#include "qkv/model.h"
#include "qkv/multihead.h"

namespace qkv {

// Everything the full forward keeps for the backward, and the backward's scratch. Buffers grow
// to the largest batch and are reused for smaller ones.
struct Model::Activations {
  int64_t B = 0, T = 0;
  int64_t capacity = 0;
  std::vector<int32_t> tokens, targets, pos;
  struct Layer {
    // h: SwiGLU's gate and up side by side in each row [N, 2F] (one product can write both;
    // GELU: [N, F]).
    Tensor ln1, mean1, rstd1, mid, ln2, mean2, rstd2, h, g;
    MultiHeadState attention;
  };
  std::vector<Tensor> resid;  // [L + 1] (shared: 2) × [N, C]: the residual stream before a layer
  std::vector<Layer> layers;
  // A model that cannot train keeps no layer's activations for a backward: its layers share
  // layer 0's buffers and two residual streams, alternating; each keeps its attention state
  // (attention_weights reads it).
  bool shared = false;
  int64_t stream(int64_t l) const { return shared ? l % 2 : l; }  // resid before layer l
  Tensor lnf, meanf, rstdf, logits, probs, sinusoids;             // probs: with targets only
  Tensor dresid, dmid, dln, dh, du, dg, dlnf;                     // backward scratch
  bool have_targets = false;
};

// The buffers of cached inference, grown to the largest call and reused: generating a token
// allocates nothing.
struct Model::InferenceBuffers {
  int64_t capacity = 0, logit_rows = 0;
  Tensor x, ln, y, h, g, stat, last, logits, sinusoids;
  MultiHeadState attention;  // the projected rows
  std::vector<int32_t> pos;
  std::vector<int64_t> seq;  // each row's cache sequence
};

// Sizes s for multihead_forward_cached of N rows (src/model/multihead.cpp), so that a thread
// team's calls allocate nothing shared.
void multihead_reserve_cached(const MultiHeadAttention& m, MultiHeadState& s, int64_t N);

struct Model::Decoder {
  // One layer's rows for one call, views of N rows: x in, out = mid + ffn(norm2(mid)) with
  // mid = x + att, att = attention(norm1(x)). Cached inference updates the stream in place
  // (x, mid and out one buffer; att and ffn one scratch). h and u: SwiGLU's gate and up, the
  // halves of one [N, 2F] buffer (GELU: h alone).
  // Inside a thread team (a decoded token in one parallel region, inference.cpp) the products
  // and attention split their work over the team and write shared rows (att, h, u, ffn), and
  // every thread computes the norms, residual sums and activation for itself (detail::alone):
  // x, mid, out, ln1, ln2, g and the norms' statistics are then each thread's own.
  struct LayerRows {
    View x, ln1, att, mid, ln2, h, u, g, ffn, out;
    float *mean1 = nullptr, *rstd1 = nullptr, *mean2 = nullptr, *rstd2 = nullptr;
  };
  // Where a layer's attention finds its keys and values: the batch's own positions (state
  // keeps what the backward needs), or a cache (rows of sequence seqs[i], i when null).
  struct Road {
    int64_t B = 0, T = 0;
    MultiHeadState* state = nullptr;
    KVCache* cache = nullptr;
    const int64_t* seqs = nullptr;
  };

  // x [N, C] ← the embeddings of tokens at positions pos (learned or sinusoidal positions
  // added; a block-format token table dequantized row by row). sinusoids: the caller's table.
  static void embed(const Model& m, View x, const int32_t* tokens, const int32_t* pos,
                    Tensor& sinusoids);
  static void norm(const Model& m, View y, float* mean, float* rstd, View x,
                   const Weights::Norm& n);
  // dx += ∂/∂x and the norm's gradients += … for dy, from the forward's mean and rstd.
  static void norm_backward(const Model& m, View dx, View dy, View x, const float* mean,
                            const float* rstd, const Weights::Norm& n);
  // y ← x wᵀ + b through the fp32 weight (products f32 or bf16) or its blocks.
  static void linear(const Model& m, View y, View x, const Weights::Linear& f, TensorType products);
  static void layer_forward(const Model& m, int64_t l, const LayerRows& r, const Road& road,
                            TensorType products);
  // The backward of layer l of the last full forward: a.dresid holds ∂loss/∂(its output) on
  // entry and ∂loss/∂(its input) on return; the layer's gradients are added.
  static void layer_backward(const Model& m, int64_t l, Activations& a);
  // Cached inference of one new position a sequence (road.T == 1, road.B rows) with every
  // layer and the logits in one parallel region of num_threads() threads (inference.cpp):
  // `shared` holds the embedded rows in x and the buffers the team shares.
  static void decode_in_team(const Model& m, const LayerRows& shared, const Road& road,
                             View logits);
  // Layer l's rows in the full forward's activations.
  static LayerRows layer_rows(const Model& m, Activations& a, int64_t l);
};

}  // namespace qkv
