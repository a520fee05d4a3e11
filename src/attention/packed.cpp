#include "attention/packed.h"

#include <limits>
#include <vector>

#include "qkv/error.h"

namespace qkv::detail {

void validate_packed(const AttentionArgs& a, const char* where) {
  const Packed& p = a.packed;
  if (p.num_seqs == 0) return;
  check(p.num_seqs > 0, where, ": packed.num_seqs must be >= 0, got ", p.num_seqs);
  check(p.cu_seqlens_q && p.cu_seqlens_k, where,
        ": packed sequences need both cu_seqlens_q and cu_seqlens_k");
  check(a.q.shape[0] == 1, where, ": packed sequences need batch 1, q is ", shape_of(a.q));
  check(a.mask.kv_len == nullptr, where,
        ": kv_len (padding) and packed sequences do not mix; packing needs no padding");
  const struct {
    const int32_t* cu;
    int64_t total;
    const char* name;
  } lists[] = {{p.cu_seqlens_q, a.q.shape[2], "cu_seqlens_q"},
               {p.cu_seqlens_k, a.k.shape[2], "cu_seqlens_k"}};
  for (const auto& l : lists) {
    check(l.cu[0] == 0, where, ": ", l.name, "[0] must be 0, got ", l.cu[0]);
    for (int s = 0; s < p.num_seqs; ++s)
      check(l.cu[s] <= l.cu[s + 1], where, ": ", l.name, " must not decrease, but [", s,
            "] = ", l.cu[s], " > [", s + 1, "] = ", l.cu[s + 1]);
    check(l.cu[p.num_seqs] == l.total, where, ": ", l.name, "[", p.num_seqs,
          "] = ", l.cu[p.num_seqs], " must equal the packed length ", l.total);
  }
}

View sequence_queries(const AttentionArgs& a, int s, const View& per_query) {
  return per_query.slice(2, a.packed.cu_seqlens_q[s], a.packed.cu_seqlens_q[s + 1]);
}

View sequence_keys(const AttentionArgs& a, int s, const View& per_key) {
  return per_key.slice(2, a.packed.cu_seqlens_k[s], a.packed.cu_seqlens_k[s + 1]);
}

namespace {

// The arguments of sequence s; lse points at `lse_buffer` (contiguous [1, Hq, Tq_s]).
AttentionArgs sequence_args(const AttentionArgs& a, int s, float* lse_buffer) {
  AttentionArgs r = a;
  r.packed = {};
  r.dropout.batch_offset += s;  // (sequence s draws batch s's mask)
  r.q = sequence_queries(a, s, a.q);
  r.out = sequence_queries(a, s, a.out);
  r.k = sequence_keys(a, s, a.k);
  r.v = sequence_keys(a, s, a.v);
  r.lse = a.lse ? lse_buffer : nullptr;
  if (!a.mask.bias.empty()) {
    // The bias is aligned right against [B, Hq, Tq, Tk]: narrow its query and key dims
    // unless they broadcast.
    View bias = a.mask.bias;
    const int dq = bias.ndim - 2, dk = bias.ndim - 1;
    if (bias.shape[dq] != 1)
      bias = bias.slice(dq, a.packed.cu_seqlens_q[s], a.packed.cu_seqlens_q[s + 1]);
    if (bias.shape[dk] != 1)
      bias = bias.slice(dk, a.packed.cu_seqlens_k[s], a.packed.cu_seqlens_k[s + 1]);
    r.mask.bias = bias;
  }
  return r;
}

// lse between the packed [1, Hq, Tq] layout and sequence s's contiguous [Hq, Tq_s] buffer.
void scatter_lse(const AttentionArgs& a, int s, const float* from, float* to) {
  const int64_t Hq = a.q.shape[1], Tq = a.q.shape[2];
  const int64_t begin = a.packed.cu_seqlens_q[s], n = a.packed.cu_seqlens_q[s + 1] - begin;
  for (int64_t h = 0; h < Hq; ++h)
    for (int64_t i = 0; i < n; ++i) to[h * Tq + begin + i] = from[h * n + i];
}

void gather_lse(const AttentionArgs& a, int s, const float* from, float* to) {
  const int64_t Hq = a.q.shape[1], Tq = a.q.shape[2];
  const int64_t begin = a.packed.cu_seqlens_q[s], n = a.packed.cu_seqlens_q[s + 1] - begin;
  for (int64_t h = 0; h < Hq; ++h)
    for (int64_t i = 0; i < n; ++i) to[h * n + i] = from[h * Tq + begin + i];
}

void fill(const View& t, float value) {
  for (int64_t a = 0; a < t.shape[0]; ++a)
    for (int64_t b = 0; b < t.shape[1]; ++b)
      for (int64_t c = 0; c < t.shape[2]; ++c)
        for (int64_t d = 0; d < t.shape[3]; ++d) t(a, b, c, d) = value;
}

template <typename Kernel, typename NoKeys>
void for_each_sequence(const AttentionArgs& a, bool lse_is_input, Kernel&& kernel,
                       NoKeys&& no_keys) {
  std::vector<float> lse(a.lse ? a.q.shape[1] * a.q.shape[2] : 0);
  for (int s = 0; s < a.packed.num_seqs; ++s) {
    const int64_t tq = a.packed.cu_seqlens_q[s + 1] - a.packed.cu_seqlens_q[s];
    const int64_t tk = a.packed.cu_seqlens_k[s + 1] - a.packed.cu_seqlens_k[s];
    if (tq == 0) continue;
    if (tk == 0) {
      no_keys(s);
      continue;
    }
    const AttentionArgs seq = sequence_args(a, s, lse.data());
    if (a.lse && lse_is_input) gather_lse(a, s, a.lse, lse.data());
    kernel(seq, s);
    if (a.lse && !lse_is_input) scatter_lse(a, s, lse.data(), a.lse);
  }
}

}  // namespace

void run_packed_forward(const AttentionArgs& a, const ForwardKernel& kernel) {
  for_each_sequence(a, /*lse_is_input=*/false, kernel, [&](int s) {
    fill(sequence_queries(a, s, a.out), 0.0f);
    if (a.lse)
      for (int64_t h = 0; h < a.q.shape[1]; ++h)
        for (int32_t i = a.packed.cu_seqlens_q[s]; i < a.packed.cu_seqlens_q[s + 1]; ++i)
          a.lse[h * a.q.shape[2] + i] =
              a.sinks ? a.sinks[h] : -std::numeric_limits<float>::infinity();
  });
}

void run_packed_backward(const AttentionArgs& a, const View& dout, const View& dq, const View& dk,
                         const View& dv, const BackwardKernel& kernel) {
  fill(dk, 0.0f);  // keys of sequences without queries get no gradient
  fill(dv, 0.0f);
  for_each_sequence(
      a, /*lse_is_input=*/true,
      [&](const AttentionArgs& seq, int s) {
        kernel(seq, sequence_queries(a, s, dout), sequence_queries(a, s, dq),
               sequence_keys(a, s, dk), sequence_keys(a, s, dv));
      },
      [&](int s) { fill(sequence_queries(a, s, dq), 0.0f); });
}

}  // namespace qkv::detail
