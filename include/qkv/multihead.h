// Multi-head attention as a layer: project into heads, attend, project back.
//
// Self-attention: q, k and v all come from x, through one fused matrix
//   qkv_w [(Hq + 2·Hkv)·d_head, C]   (rows: all query heads, then key heads, then value heads)
// Cross-attention: q comes from x, k and v from a second sequence (an encoder's output):
//   q_w [Hq·d_head, C],  kv_w [2·Hkv·d_head, C_context]
// Both then: heads are split by strides (no copies), optional rotary embedding on q and k,
// qkv::attention, and out_w [C, Hq·d_head] back to the model width.
//
// Per head, W_Q and W_K (and the value-down map) are the d_head × C slices of these
// matrices, and the value-up map is the C × d_head slice of out_w: the articles' view.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "qkv/attention.h"
#include "qkv/ops.h"
#include "qkv/quant.h"
#include "qkv/tensor.h"

namespace qkv {

class KVCache;

// Context parallelism: this process holds some positions of every sequence, and attention
// runs across processes (qkv::dist::ContextParallel fills this in with ring attention).
// Everything else in a block is per position and runs on the local rows as usual.
struct SequenceShard {
  int64_t seq_len = 0;  // positions in a whole sequence
  // The global positions of this process's rows, in local row order: (first, length) runs.
  std::vector<std::pair<int64_t, int64_t>> runs;
  // Attention and its gradients over this process's rows; the args' mask is the whole
  // sequence's (as qkv::attention would take it for all seq_len positions).
  std::function<void(const AttentionArgs&)> forward;
  std::function<void(const AttentionArgs&, View dout, View dq, View dk, View dv)> backward;
  int64_t local_len() const;
};

struct MultiHeadAttention {
  int64_t n_heads = 1, n_kv_heads = 1, d_head = 1;
  bool causal = true;
  int64_t window = 0;                    // > 0: sliding window, keys in [pos - window, pos]
  const float* alibi = nullptr;          // [n_heads] slopes, or null
  const float* sinks = nullptr;          // [n_heads] attention-sink logits, or null
  float* d_sinks = nullptr;              // their gradient, added into by the backward (or null)
  Dropout dropout;                       // attention dropout (training); p = 0: none. Not over
                                         //   a cache (forward_cached keeps every weight)
  const SequenceShard* shard = nullptr;  // self-attention across processes, or null
  bool rotary = false;
  float rope_theta = 10000;
  RopePairs rope_pairs = RopePairs::adjacent;
  // The operands of the products: f32, or bf16 (mixed precision): the projections' inputs and
  // weights and attention's q, k and v rounded to bf16, every sum in fp32, outputs and
  // gradients fp32 (attention on qkv's bf16 kernels).
  TensorType compute = TensorType::f32;

  // Parameters (the caller owns them). Set qkv_w for self-attention, or q_w and kv_w for
  // cross-attention. Biases may be null.
  View qkv_w, q_w, kv_w, out_w;
  const float *qkv_b = nullptr, *q_b = nullptr, *kv_b = nullptr, *out_b = nullptr;
  // Their gradients, same shapes, added into by the backward (empty / null: skipped).
  View d_qkv_w, d_q_w, d_kv_w, d_out_w;
  float *d_qkv_b = nullptr, *d_q_b = nullptr, *d_kv_b = nullptr, *d_out_b = nullptr;

  // Self-attention's projections held in a block format instead of qkv_w and out_w (a GGUF
  // model's matrices, in place), multiplied as `matmul` says: inference only
  // (multihead_backward refuses them).
  const std::vector<quant::Matrix>* qkv_blocks = nullptr;
  const std::vector<quant::Matrix>* out_blocks = nullptr;
  quant::Matmul matmul = quant::Matmul::exact;

  bool is_cross() const { return qkv_w.empty() && qkv_blocks == nullptr; }
};

// What the forward keeps for the backward, and the backward's scratch; sized on first use.
struct MultiHeadState {
  Tensor q,
      kv;  // self: q holds the fused [N, W] rows and kv is unused; cross: [N, Hq·dh], [M, 2·Hkv·dh]
  Tensor att, lse;              // [N, Hq·dh], [B·Hq·T]
  std::vector<bf16> q16, kv16;  // compute bf16: q and kv rounded, as attention saw them
  Tensor dq, dkv, datt;
};

// y [B·T, C] = attention block of x [B·T, C]; context [B·S, C_context] for cross-attention
// (ignored for self-attention, where S = T).
void multihead_forward(const MultiHeadAttention& m, MultiHeadState& s, View y, View x, View context,
                       int64_t B, int64_t T, int64_t S);
// Self-attention of T new positions of each of B sequences over a key/value cache: y [B·T, C]
// from x [B·T, C], whose rows i·T … i·T + T − 1 extend cache sequence seqs[i] (i when seqs is
// null) at the positions it has reached (the rotary embedding there). Stores their keys and
// values at `layer` and attends over the sequence so far (KVCache::attend); the caller
// advances the cache once every layer has run. s holds the projected rows. Not for
// cross-attention or a sequence shard.
void multihead_forward_cached(const MultiHeadAttention& m, MultiHeadState& s, View y, View x,
                              KVCache& cache, int64_t layer, const int64_t* seqs, int64_t B,
                              int64_t T);
// dx += ∂/∂x, dcontext += ∂/∂context (cross only), parameter gradients += … for dy = ∂L/∂y.
void multihead_backward(const MultiHeadAttention& m, MultiHeadState& s, View dx, View dcontext,
                        View dy, View x, View context, int64_t B, int64_t T, int64_t S);

// The softmax weights [B, Hq, T, S] of the last forward, from the reference kernel.
Tensor multihead_weights(const MultiHeadAttention& m, const MultiHeadState& s, int64_t B, int64_t T,
                         int64_t S);

}  // namespace qkv
