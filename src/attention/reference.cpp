// The reference attention: the oracle every fast kernel is tested against.
//
// It is written to be read, not to be fast. For each (batch, head) it materialises the
// Tq × Tk grid of scores and applies the steps of include/qkv/attention.h one at a time:
//   S = scale · Q Kᵀ  →  softcap  →  + bias, ALiBi  →  mask (-inf)  →  P = softmax(S)  →  O = P V
// It reads and writes every element type (fp32, bf16, fp16: widened as read, outputs rounded to
// nearest even); sums run in double so the oracle is the more exact side.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <omp.h>

#include "attention/masks.h"
#include "attention/packed.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/threads.h"

namespace qkv::reference {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

struct Dims {
  int64_t B, Hq, Hkv, Tq, Tk, D, Dv;
  explicit Dims(const AttentionArgs& a)
      : B(a.q.shape[0]),
        Hq(a.q.shape[1]),
        Hkv(a.k.shape[1]),
        Tq(a.q.shape[2]),
        Tk(a.k.shape[2]),
        D(a.q.shape[3]),
        Dv(a.v.shape[3]) {}
};

// S[i, j] for one (b, h): every step up to and including the mask.
void scores(const AttentionArgs& a, const Dims& n, const detail::ScoreRule& rule, float scale,
            int64_t b, int64_t h, float* S) {
  const int64_t hkv = h / (n.Hq / n.Hkv);  // the key/value head this query head reads
  for (int64_t i = 0; i < n.Tq; ++i) {
    const detail::KeyRange visible = rule.visible(b, i);
    for (int64_t j = 0; j < n.Tk; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < n.D; ++d) dot += double(a.q.get(b, h, i, d)) * a.k.get(b, hkv, j, d);
      float s = static_cast<float>(dot) * scale;
      s = rule.transform(b, h, i, j, s);
      if (j < visible.begin || j >= visible.end || rule.function_hides(b, h, i, j)) s = kMinusInf;
      S[i * n.Tk + j] = s;
    }
  }
}

// Row-wise softmax in place: S becomes P. Returns nothing; writes lse[i] when asked.
// Subtracting the row max keeps exp() in range for logits of any size; a row whose scores
// are all -inf (fully masked) becomes all zeros with lse = -inf instead of 0/0 = NaN.
void softmax_rows(float* S, int64_t Tq, int64_t Tk, float* lse) {
  for (int64_t i = 0; i < Tq; ++i) {
    float* row = S + i * Tk;
    const float max = *std::max_element(row, row + Tk);
    if (max == kMinusInf) {
      std::fill(row, row + Tk, 0.0f);
      if (lse) lse[i] = kMinusInf;
      continue;
    }
    double sum = 0;
    for (int64_t j = 0; j < Tk; ++j) sum += std::exp(double(row[j]) - max);
    for (int64_t j = 0; j < Tk; ++j)
      row[j] = static_cast<float>(std::exp(double(row[j]) - max) / sum);
    if (lse) lse[i] = static_cast<float>(max + std::log(sum));
  }
}

// O = P V for one (b, h).
void weighted_values(const AttentionArgs& a, const Dims& n, int64_t b, int64_t h, const float* P) {
  const int64_t hkv = h / (n.Hq / n.Hkv);
  std::vector<double> acc(n.Dv);
  for (int64_t i = 0; i < n.Tq; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < n.Tk; ++j) {
      const double p = P[i * n.Tk + j];
      if (p == 0) continue;
      for (int64_t e = 0; e < n.Dv; ++e) acc[e] += p * a.v.get(b, hkv, j, e);
    }
    for (int64_t e = 0; e < n.Dv; ++e) a.out.set(b, h, i, e, static_cast<float>(acc[e]));
  }
}

// dq, dk, dv for one (batch, key/value head): every query head of its group.
void backward_group(const AttentionArgs& a, const Dims& n, const detail::ScoreRule& rule,
                    float scale, const View& dout, const View& dq, const View& dk, const View& dv,
                    int64_t b, int64_t hkv, float* P) {
  const int64_t group = n.Hq / n.Hkv;
  std::vector<double> dK(n.Tk * n.D, 0.0), dV(n.Tk * n.Dv, 0.0), dS(n.Tk);
  for (int64_t h = hkv * group; h < (hkv + 1) * group; ++h) {
    scores(a, n, rule, scale, b, h, P);
    softmax_rows(P, n.Tq, n.Tk, nullptr);
    for (int64_t i = 0; i < n.Tq; ++i) {
      const float* p = P + i * n.Tk;
      // dP_ij = dO_i · v_j, and D_i = Σ_j P_ij dP_ij (= dO_i · O_i).
      double Di = 0;
      for (int64_t j = 0; j < n.Tk; ++j) {
        double dP = 0;
        for (int64_t e = 0; e < n.Dv; ++e)
          dP += double(dout.get(b, h, i, e)) * a.v.get(b, hkv, j, e);
        dS[j] = dP;
        Di += p[j] * dP;
      }
      std::vector<double> dQ(n.D, 0.0);
      for (int64_t j = 0; j < n.Tk; ++j) {
        if (p[j] == 0) continue;          // masked (or underflowed): no gradient flows
        double ds = p[j] * (dS[j] - Di);  // ∂L/∂s_ij through the softmax
        if (a.softcap > 0) {              // s = c · tanh(x / c): ∂s/∂x = 1 − tanh²
          double dot = 0;
          for (int64_t d = 0; d < n.D; ++d)
            dot += double(a.q.get(b, h, i, d)) * a.k.get(b, hkv, j, d);
          const double t = std::tanh(dot * scale / a.softcap);
          ds *= 1 - t * t;
        }
        for (int64_t d = 0; d < n.D; ++d) {
          dQ[d] += scale * ds * a.k.get(b, hkv, j, d);
          dK[j * n.D + d] += scale * ds * a.q.get(b, h, i, d);
        }
        for (int64_t e = 0; e < n.Dv; ++e) dV[j * n.Dv + e] += p[j] * double(dout.get(b, h, i, e));
      }
      for (int64_t d = 0; d < n.D; ++d) dq.set(b, h, i, d, static_cast<float>(dQ[d]));
    }
  }
  for (int64_t j = 0; j < n.Tk; ++j) {
    for (int64_t d = 0; d < n.D; ++d) dk.set(b, hkv, j, d, static_cast<float>(dK[j * n.D + d]));
    for (int64_t e = 0; e < n.Dv; ++e) dv.set(b, hkv, j, e, static_cast<float>(dV[j * n.Dv + e]));
  }
}

}  // namespace

void attention_backward(const AttentionArgs& a, View dout, View dq, View dk, View dv) {
  constexpr const char* where = "reference::attention_backward";
  validate_backward(a, dout, dq, dk, dv, where);
  if (a.packed.num_seqs > 0)
    return detail::run_packed_backward(a, dout, dq, dk, dv, attention_backward);
  const Dims n(a);
  const detail::ScoreRule rule = detail::score_rule(a, where);
  const float scale = detail::effective_scale(a);
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), n.B * n.Hkv));
  std::vector<std::vector<float>> grids(threads, std::vector<float>(n.Tq * n.Tk));
  // One (batch, kv head) per iteration: it owns its dk and dv rows, so no two threads write
  // the same gradient.
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
  for (int64_t b = 0; b < n.B; ++b)
    for (int64_t hkv = 0; hkv < n.Hkv; ++hkv)
      backward_group(a, n, rule, scale, dout, dq, dk, dv, b, hkv,
                     grids[omp_get_thread_num()].data());
}

void attention(const AttentionArgs& a, View weights) {
  constexpr const char* where = "reference::attention";
  validate(a, where);
  const Dims n(a);
  if (!weights.empty()) {
    check_ndim(weights, 4, where, "weights [B, Hq, Tq, Tk]");
    check(weights.shape[0] == n.B && weights.shape[1] == n.Hq && weights.shape[2] == n.Tq &&
              weights.shape[3] == n.Tk,
          where, ": weights is ", shape_of(weights), ", expected [", n.B, ", ", n.Hq, ", ", n.Tq,
          ", ", n.Tk, "]");
  }
  if (a.packed.num_seqs > 0) {
    // Each sequence alone; weights across sequences stay 0.
    if (!weights.empty())
      for (int64_t h = 0; h < weights.shape[1]; ++h)
        for (int64_t i = 0; i < weights.shape[2]; ++i)
          for (int64_t j = 0; j < weights.shape[3]; ++j) weights(0, h, i, j) = 0;
    return detail::run_packed_forward(a, [&](const AttentionArgs& seq, int s) {
      const Packed& p = a.packed;
      attention(seq, weights.empty() ? View{}
                                     : weights.slice(2, p.cu_seqlens_q[s], p.cu_seqlens_q[s + 1])
                                           .slice(3, p.cu_seqlens_k[s], p.cu_seqlens_k[s + 1]));
    });
  }
  const detail::ScoreRule rule = detail::score_rule(a, where);
  const float scale = detail::effective_scale(a);

  // One score grid per thread, allocated here: nothing may throw inside the parallel loop.
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), n.B * n.Hq));
  std::vector<std::vector<float>> grids(threads, std::vector<float>(n.Tq * n.Tk));

#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
  for (int64_t b = 0; b < n.B; ++b) {
    for (int64_t h = 0; h < n.Hq; ++h) {
      float* S = grids[omp_get_thread_num()].data();
      scores(a, n, rule, scale, b, h, S);
      softmax_rows(S, n.Tq, n.Tk, a.lse ? a.lse + (b * n.Hq + h) * n.Tq : nullptr);
      weighted_values(a, n, b, h, S);
      if (!weights.empty())
        for (int64_t i = 0; i < n.Tq; ++i)
          for (int64_t j = 0; j < n.Tk; ++j) weights(b, h, i, j) = S[i * n.Tk + j];
    }
  }
}

}  // namespace qkv::reference
