// Multi-head attention as a layer (see include/qkv/multihead.h).
#include "qkv/multihead.h"

#include <algorithm>
#include <vector>

#include "ops/gemm.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "util/parallel.h"
#include "util/scratch.h"

namespace qkv {

namespace {

// [rows, cols] storage that grows to the largest size asked for; returns its first rows.
View rows_of(Tensor& t, int64_t rows, int64_t cols) {
  if (t.ndim() != 2 || t.size(0) < rows || t.size(1) != cols) t = Tensor({rows, cols});
  return t.view().slice(0, 0, rows);
}

struct Heads {
  View q, k, v, out;    // [B, H, T or S, dh]
  View q_bthd, k_bthd;  // [B, T or S, H, dh], for the rotary embedding
};

// Heads as strided views of the projected rows (fp32, or their bf16 copies): q rows of width qw
// starting at column 0, k and v rows of width kvw starting at columns k0 and k0 + Hkv·dh.
template <typename E>
Heads split(const MultiHeadAttention& m, E* q_rows, int64_t qw, E* kv_rows, int64_t kvw, int64_t k0,
            float* att, int64_t B, int64_t T, int64_t S) {
  const int64_t dh = m.d_head, Hq = m.n_heads, Hkv = m.n_kv_heads, A = Hq * dh;
  Heads h;
  h.q = View(q_rows, {B, Hq, T, dh}, {T * qw, dh, qw, 1});
  h.k = View(kv_rows + k0, {B, Hkv, S, dh}, {S * kvw, dh, kvw, 1});
  h.v = View(kv_rows + k0 + Hkv * dh, {B, Hkv, S, dh}, {S * kvw, dh, kvw, 1});
  h.out = View(att, {B, Hq, T, dh}, {T * A, dh, A, 1});
  h.q_bthd = h.q.transpose(1, 2);
  h.k_bthd = h.k.transpose(1, 2);
  return h;
}

template <typename E>
Heads heads_of(const MultiHeadAttention& m, E* q, E* kv, const Tensor& att, int64_t B, int64_t T,
               int64_t S) {
  const int64_t Hq = m.n_heads, dh = m.d_head;
  if (!m.is_cross()) {
    const int64_t W = (Hq + 2 * m.n_kv_heads) * dh;
    return split(m, q, W, q, W, Hq * dh, att.data(), B, T, T);
  }
  return split(m, q, Hq * dh, kv, 2 * m.n_kv_heads * dh, 0, att.data(), B, T, S);
}

Heads heads_of(const MultiHeadAttention& m, const Tensor& q, const Tensor& kv, const Tensor& att,
               int64_t B, int64_t T, int64_t S) {
  return heads_of(m, q.data(), kv.data(), att, B, T, S);
}

// The heads attention reads: the fp32 rows, or with compute bf16 their rounded copies (made
// by the forward, after the rotary embedding; kept for the backward).
Heads attended_heads(const MultiHeadAttention& m, MultiHeadState& s, int64_t B, int64_t T,
                     int64_t S, bool round) {
  if (m.compute != TensorType::bf16) return heads_of(m, s.q, s.kv, s.att, B, T, S);
  const int64_t N = B * T, dh = m.d_head;
  const int64_t q_width = m.is_cross() ? m.n_heads * dh : (m.n_heads + 2 * m.n_kv_heads) * dh;
  if (round) {
    s.q16.resize(N * q_width);
    detail::round_to_bf16(s.q.data(), &s.q16[0].bits, N * q_width);
    if (m.is_cross()) {
      const int64_t kv_count = B * S * 2 * m.n_kv_heads * dh;
      s.kv16.resize(kv_count);
      detail::round_to_bf16(s.kv.data(), &s.kv16[0].bits, kv_count);
    }
  }
  return heads_of(m, s.q16.data(), m.is_cross() ? s.kv16.data() : s.q16.data(), s.att, B, T, S);
}

// y ← x wᵀ + b through the layer's fp32 weight or its blocks.
void project(const MultiHeadAttention& m, View y, View x, const View& w, const float* b,
             const std::vector<quant::Matrix>* blocks) {
  if (blocks) quant::linear_forward(y, x, *blocks, b, m.matmul);
  else linear_forward(y, x, w, b, m.compute);
}

AttentionArgs args_of(const MultiHeadAttention& m, const Heads& h, float* lse) {
  AttentionArgs a{.q = h.q, .k = h.k, .v = h.v, .out = h.out, .lse = lse};
  a.mask.causal = m.causal;
  if (m.window > 0) a.mask.window_left = static_cast<int>(m.window);
  a.mask.alibi = m.alibi;
  a.sinks = m.sinks;
  a.dropout = m.dropout;
  return a;
}

// Rotary embeddings (or their gradient) on q and k of self-attention at this process's
// positions: one run of consecutive positions at a time.
void rotate(const MultiHeadAttention& m, const Heads& h, bool backward) {
  auto one = [&](View x, int64_t pos0) {
    if (backward) rope_backward(x, pos0, m.rope_theta, m.rope_pairs);
    else rope_forward(x, pos0, m.rope_theta, m.rope_pairs);
  };
  int64_t row = 0;
  for (const auto& [first, length] : m.shard->runs) {
    one(h.q_bthd.slice(1, row, row + length), first);
    one(h.k_bthd.slice(1, row, row + length), first);
    row += length;
  }
}

}  // namespace

int64_t SequenceShard::local_len() const {
  int64_t n = 0;
  for (const auto& run : runs) n += run.second;
  return n;
}

void multihead_forward(const MultiHeadAttention& m, MultiHeadState& s, View y, View x, View context,
                       int64_t B, int64_t T, int64_t S) {
  check(m.n_heads % m.n_kv_heads == 0, "multihead_forward: ", m.n_heads,
        " query heads is not a multiple of ", m.n_kv_heads, " key/value heads");
  const int64_t N = B * T, dh = m.d_head, Hq = m.n_heads, Hkv = m.n_kv_heads;
  if (!m.is_cross()) {
    S = T;
    project(m, rows_of(s.q, N, (Hq + 2 * Hkv) * dh), x, m.qkv_w, m.qkv_b, m.qkv_blocks);
  } else {
    check(!context.empty() && context.shape[0] == B * S,
          "multihead_forward: cross-attention "
          "needs a context of B·S = ",
          B * S, " rows, got ", shape_of(context));
    linear_forward(rows_of(s.q, N, Hq * dh), x, m.q_w, m.q_b, m.compute);
    linear_forward(rows_of(s.kv, B * S, 2 * Hkv * dh), context, m.kv_w, m.kv_b, m.compute);
  }
  rows_of(s.att, N, Hq * dh);
  rows_of(s.lse, B * Hq * T, 1);
  const Heads h = heads_of(m, s.q, s.kv, s.att, B, T, S);
  if (m.shard) {
    check(!m.is_cross() && m.alibi == nullptr && m.sinks == nullptr && m.dropout.p == 0,
          "multihead_forward: across processes only "
          "self-attention without ALiBi, sinks or dropout runs");
    check(m.shard->local_len() == T, "multihead_forward: the sequence shard holds ",
          m.shard->local_len(), " positions, the input ", T);
    if (m.rotary) rotate(m, h, false);
    m.shard->forward(args_of(m, h, s.lse.data()));
    project(m, y, s.att.view().slice(0, 0, N), m.out_w, m.out_b, m.out_blocks);
    return;
  }
  if (m.rotary) {
    rope_forward(h.q_bthd, S - T, m.rope_theta, m.rope_pairs);  // queries are the last T
    rope_forward(h.k_bthd, 0, m.rope_theta, m.rope_pairs);
  }
  attention(args_of(m, attended_heads(m, s, B, T, S, true), s.lse.data()));
  project(m, y, s.att.view().slice(0, 0, N), m.out_w, m.out_b, m.out_blocks);
}

void multihead_reserve_cached(const MultiHeadAttention& m, MultiHeadState& s, int64_t N) {
  rows_of(s.q, N, (m.n_heads + 2 * m.n_kv_heads) * m.d_head);
  rows_of(s.att, N, m.n_heads * m.d_head);
}

void multihead_forward_cached(const MultiHeadAttention& m, MultiHeadState& s, View y, View x,
                              KVCache& cache, int64_t layer, const int64_t* seqs, int64_t B,
                              int64_t T) {
  check(!m.is_cross() && m.shard == nullptr,
        "multihead_forward_cached: self-attention on one process only");
  const int64_t N = B * T, dh = m.d_head, Hq = m.n_heads, Hkv = m.n_kv_heads;
  const int64_t W = (Hq + 2 * Hkv) * dh, A = Hq * dh;
  const View q = rows_of(s.q, N, W), att = rows_of(s.att, N, A);
  project(m, q, x, m.qkv_w, m.qkv_b, m.qkv_blocks);
  // One sequence at a time: each has its own length.
  for (int64_t i = 0; i < B; ++i) {
    const int64_t seq = seqs ? seqs[i] : i, pos0 = cache.length(seq);
    float* r = &q(i * T, 0);
    if (m.rotary && detail::in_team()) {  // (each thread rotates a copy of its own)
      float* own = detail::thread_scratch(detail::DecodeSlot::queries, T * W);
      std::copy(r, r + T * W, own);
      r = own;
    }
    float* k_new = r + Hq * dh;
    float* v_new = r + (Hq + Hkv) * dh;
    if (m.rotary)  // the new queries and keys at their positions, before caching
      detail::alone([&] {
        rope_forward(View(r, {1, T, Hq, dh}, {T * W, W, dh, 1}), pos0, m.rope_theta, m.rope_pairs);
        rope_forward(View(k_new, {1, T, Hkv, dh}, {T * W, W, dh, 1}), pos0, m.rope_theta,
                     m.rope_pairs);
      });
    Heads h;
    h.q = View(r, {1, Hq, T, dh}, {T * W, dh, W, 1});
    h.out = View(&att(i * T, 0), {1, Hq, T, dh}, {T * A, dh, A, 1});
    AttentionArgs a = args_of(m, h, nullptr);
    a.dropout = {};  // (decoding keeps every weight)
    cache.attend(layer, seq, a, k_new, v_new, W);
  }
  project(m, y, att, m.out_w, m.out_b, m.out_blocks);
}

void multihead_backward(const MultiHeadAttention& m, MultiHeadState& s, View dx, View dcontext,
                        View dy, View x, View context, int64_t B, int64_t T, int64_t S) {
  check(m.qkv_blocks == nullptr && m.out_blocks == nullptr,
        "multihead_backward: weights held in a block format are for inference only");
  const int64_t N = B * T, dh = m.d_head, Hq = m.n_heads, Hkv = m.n_kv_heads;
  if (!m.is_cross()) S = T;
  const View datt = rows_of(s.datt, N, Hq * dh);
  std::fill(datt.data, datt.data + datt.numel(), 0.0f);
  linear_backward(datt, m.d_out_w, m.d_out_b, dy, s.att.view().slice(0, 0, N), m.out_w, m.compute);
  // Gradients of the projected rows, laid out like the forward's q / kv.
  if (!m.is_cross()) rows_of(s.dq, N, (Hq + 2 * Hkv) * dh);
  else rows_of(s.dq, N, Hq * dh), rows_of(s.dkv, B * S, 2 * Hkv * dh);
  const Heads h = heads_of(m, s.q, s.kv, s.att, B, T, S);
  const Heads d = heads_of(m, s.dq, s.dkv, s.datt, B, T, S);
  if (m.shard) {
    m.shard->backward(args_of(m, h, s.lse.data()), d.out, d.q, d.k, d.v);
    if (m.rotary) rotate(m, d, true);
  } else {
    // Written, not added; with compute bf16 the gradients of the rounded q, k, v (fp32). The
    // sinks' gradient is written to a buffer of its own, then added.
    std::vector<float> d_sinks(m.sinks && m.d_sinks ? Hq : 0);
    attention_backward(args_of(m, attended_heads(m, s, B, T, S, false), s.lse.data()), d.out, d.q,
                       d.k, d.v, {d_sinks.empty() ? nullptr : d_sinks.data()});
    for (int64_t i = 0; i < static_cast<int64_t>(d_sinks.size()); ++i) m.d_sinks[i] += d_sinks[i];
  }
  if (m.rotary && !m.shard) {
    rope_backward(d.q_bthd, S - T, m.rope_theta, m.rope_pairs);
    rope_backward(d.k_bthd, 0, m.rope_theta, m.rope_pairs);
  }
  if (!m.is_cross()) {
    linear_backward(dx, m.d_qkv_w, m.d_qkv_b, s.dq.view().slice(0, 0, N), x, m.qkv_w, m.compute);
  } else {
    linear_backward(dx, m.d_q_w, m.d_q_b, s.dq.view().slice(0, 0, N), x, m.q_w, m.compute);
    linear_backward(dcontext, m.d_kv_w, m.d_kv_b, s.dkv.view().slice(0, 0, B * S), context, m.kv_w,
                    m.compute);
  }
}

Tensor multihead_weights(const MultiHeadAttention& m, const MultiHeadState& s, int64_t B, int64_t T,
                         int64_t S) {
  check(m.shard == nullptr,
        "attention weights: not of a model whose sequence is split across "
        "processes");
  if (!m.is_cross()) S = T;
  Tensor out({B, m.n_heads, T, m.d_head}), weights({B, m.n_heads, T, S});
  const Heads h = heads_of(m, s.q, s.kv, s.att, B, T, S);
  AttentionArgs a = args_of(m, h, nullptr);
  a.out = out;
  reference::attention(a, weights);
  return weights;
}

}  // namespace qkv
