// The layers around attention, each a forward/backward pair over views (the llm.c habit:
// no autograd, the caller owns every buffer).
//
// Conventions:
// - Activations are 2-d views [N, C]: N = B·T rows (tokens), C features, rows contiguous
//   (stride[1] == 1; any row stride).
// - Backward functions ADD into their gradient outputs (dx +=, dW +=): the caller zeroes the
//   gradients once per step, and residual branches sum for free. A gradient view that is
//   empty (or a null pointer) is skipped.
// - Shapes are checked; a mismatch throws qkv::Error naming the function and the shapes.
#pragma once

#include <cstdint>

#include "qkv/tensor.h"

namespace qkv {

// ---- linear (src/ops/linear.cpp) -----------------------------------------------------------
// y[N, out] = x[N, in] · Wᵀ + b, W [out, in] (PyTorch's nn.Linear layout), b [out] or null.
// `products` f32 multiplies the fp32 operands; bf16 rounds them to bf16 (nearest even) and
// sums the products in fp32, as mixed-precision training does (on oneDNN's bf16 matmul where
// the CPU has bf16 units or AMX: `qkv info`'s gemm line). Views and outputs stay fp32.
void linear_forward(View y, View x, View W, const float* b, TensorType products = TensorType::f32);
// dx += dy · W;  dW += dyᵀ · x;  db += Σ_n dy (products as in the forward: dy, W and x rounded).
void linear_backward(View dx, View dW, float* db, View dy, View x, View W,
                     TensorType products = TensorType::f32);

// ---- normalisation (src/ops/norm.cpp) -------------------------------------------------------
// LayerNorm: y = (x − mean) · rstd · w + b, rstd = 1/sqrt(var + eps); saves mean, rstd [N].
void layernorm_forward(View y, float* mean, float* rstd, View x, const float* w, const float* b,
                       float eps);
void layernorm_backward(View dx, float* dw, float* db, View dy, View x, const float* w,
                        const float* mean, const float* rstd);
// RMSNorm: y = x · rstd · w, rstd = 1/sqrt(mean(x²) + eps); saves rstd [N].
void rmsnorm_forward(View y, float* rstd, View x, const float* w, float eps);
void rmsnorm_backward(View dx, float* dw, View dy, View x, const float* w, const float* rstd);

// ---- activations (src/ops/activation.cpp) ---------------------------------------------------
enum class Gelu { tanh, exact };  // tanh: GPT-2's approximation; exact: x · Φ(x) with erf
void gelu_forward(View y, View x, Gelu kind);
void gelu_backward(View dx, View dy, View x, Gelu kind);
// SwiGLU: y = silu(gate) ⊙ up, silu(a) = a · sigmoid(a).
void swiglu_forward(View y, View gate, View up);
void swiglu_backward(View dgate, View dup, View dy, View gate, View up);
// Residual: y = a + b (y may alias a).
void residual_forward(View y, View a, View b);
void residual_backward(View da, View db, View dy);

// ---- positions and embeddings (src/ops/position.cpp) ---------------------------------------
// y[n] = table[tokens[n]] (+ positions[pos[n]] when positions is given): token and learned
// position embeddings. Token ids are checked against the table size.
void embedding_forward(View y, const int32_t* tokens, View table, const int32_t* pos,
                       View positions);
void embedding_backward(View dtable, const int32_t* tokens, View dy, const int32_t* pos,
                        View dpositions);
// Sinusoidal encodings (Vaswani et al. 2017): table[t, 2i] = sin(t / 10000^(2i/C)),
// table[t, 2i+1] = cos(…). Fills a [T, C] table; add it like learned positions.
void sinusoidal_table(View table);
// Rotary embeddings (Su et al. 2021) on x [B, T, H, D] in place, token t at position
// pos0 + t: each pair of features rotates by angle pos · theta^(−2j/D). Pairs are adjacent
// (2j, 2j+1: GPT-J, llama2.c) or halves (j, j + D/2: GPT-NeoX, Hugging Face Llama).
enum class RopePairs { adjacent, halves };
void rope_forward(View x, int64_t pos0, float theta, RopePairs pairs);
// The gradient through the rotation: rotate dx back by the same angles, in place.
void rope_backward(View dx, int64_t pos0, float theta, RopePairs pairs);
// ALiBi slopes for n heads (Press et al. 2022): 2^(−8h/n) for h = 1..n when n is a power of
// two, else the paper's interleaving of the two nearest powers of two.
void alibi_slopes(int64_t n_heads, float* slopes);

// ---- loss (src/ops/loss.cpp) ---------------------------------------------------------------
inline constexpr int32_t kIgnoreIndex = -100;  // as PyTorch's cross_entropy
// Softmax cross-entropy over a vocabulary: mean over the positions whose target is not
// kIgnoreIndex of −log softmax(logits[n])[target[n]]. Writes probs [N, V] (for the
// backward) and returns the mean loss (0 when no position counts).
float cross_entropy_forward(View probs, View logits, const int32_t* targets);
// dlogits += (probs − onehot(target)) · dloss / count, 0 on ignored rows.
void cross_entropy_backward(View dlogits, View probs, const int32_t* targets, float dloss);
// The same gradient written over probs itself (llm.c's habit): for a real vocabulary the
// [N, V] buffers are the largest of a model, and the probabilities are not needed after.
void cross_entropy_backward_inplace(View probs, const int32_t* targets, float dloss);

}  // namespace qkv
