// The reference attention: the oracle every fast kernel is tested against.
//
// It is written to be read, not to be fast. For each (batch, head) it materialises the
// Tq × Tk grid of scores and applies the steps of include/qkv/attention.h one at a time:
//   S = scale · Q Kᵀ  →  softcap  →  + bias, ALiBi  →  mask (-inf)  →  P = softmax(S)
//   →  dropout (P ∘ Z, Z = 0 or 1/(1 − p), the scalar Philox of attention/dropout.h)  →  O = P V
// It reads and writes every element type (fp32, bf16, fp16: widened as read, outputs rounded to
// nearest even); sums run in double so the oracle is the more exact side.
#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <vector>

#include <omp.h>

#include "attention/dropout.h"
#include "attention/masks.h"
#include "attention/packed.h"
#include "mask/expr.h"
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

// Row-wise softmax in place: S becomes P; writes lse[i] when asked. `sink` is one more logit
// in each row's denominator with no value (−inf: none). Subtracting the row max keeps exp()
// in range for logits of any size; a row whose scores are all -inf (fully masked) becomes all
// zeros with lse = sink instead of 0/0 = NaN.
void softmax_rows(float* S, int64_t Tq, int64_t Tk, float* lse, float sink) {
  for (int64_t i = 0; i < Tq; ++i) {
    float* row = S + i * Tk;
    const float max = std::max(*std::max_element(row, row + Tk), sink);
    if (max == kMinusInf) {
      std::fill(row, row + Tk, 0.0f);
      if (lse) lse[i] = kMinusInf;
      continue;
    }
    double sum = std::exp(double(sink) - max);
    for (int64_t j = 0; j < Tk; ++j) sum += std::exp(double(row[j]) - max);
    for (int64_t j = 0; j < Tk; ++j)
      row[j] = static_cast<float>(std::exp(double(row[j]) - max) / sum);
    if (lse) lse[i] = static_cast<float>(max + std::log(sum));
  }
}

float sink_of(const AttentionArgs& a, int64_t h) { return a.sinks ? a.sinks[h] : kMinusInf; }

// The first exception a loop body throws inside an OpenMP region (where none may leave it),
// thrown again after it: a score function's index outside its tensor, at any score.
class LoopErrors {
 public:
  template <class F>
  void run(F&& body) {
    try {
      body();
    } catch (...) {
#pragma omp critical(qkv_reference_errors)
      if (!first_) first_ = std::current_exception();
    }
  }
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::exception_ptr first_;
};

// The float tensors a score function reads that have a grad, each once.
std::vector<const detail::MaskTensorData*> learnable_tensors(const AttentionArgs& a) {
  std::vector<const detail::MaskTensorData*> found;
  if (!a.score_mod) return found;
  std::vector<const detail::MaskNode*> todo = {&a.score_mod->expr().node()};
  std::vector<const detail::MaskNode*> seen;
  while (!todo.empty()) {
    const detail::MaskNode* x = todo.back();
    todo.pop_back();
    if (std::find(seen.begin(), seen.end(), x) != seen.end()) continue;
    seen.push_back(x);
    const detail::MaskTensorData* t = x->tensor.get();
    if (t && t->grad && std::find(found.begin(), found.end(), t) == found.end()) found.push_back(t);
    for (const auto& c : x->args) todo.push_back(c.get());
  }
  return found;
}

// Per learnable tensor, its gradient summed in double.
using TensorSums = std::vector<std::vector<double>>;

// O = (P ∘ Z) V for one (b, h), Z the dropout's factors (1 without dropout).
void weighted_values(const AttentionArgs& a, const Dims& n, const detail::DropoutRule& drop,
                     int64_t b, int64_t h, const float* P) {
  const int64_t hkv = h / (n.Hq / n.Hkv);
  std::vector<double> acc(n.Dv);
  for (int64_t i = 0; i < n.Tq; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < n.Tk; ++j) {
      const double p = double(P[i * n.Tk + j]) * drop.factor(b, h, i, j);
      if (p == 0) continue;
      for (int64_t e = 0; e < n.Dv; ++e) acc[e] += p * a.v.get(b, hkv, j, e);
    }
    for (int64_t e = 0; e < n.Dv; ++e) a.out.set(b, h, i, e, static_cast<float>(acc[e]));
  }
}

// dq, dk, dv for one (batch, key/value head): every query head of its group.
void backward_group(const AttentionArgs& a, const Dims& n, const detail::ScoreRule& rule,
                    float scale, const View& dout, const View& dq, const View& dk, const View& dv,
                    int64_t b, int64_t hkv, float* P, double* dsinks,
                    const std::vector<const detail::MaskTensorData*>& learnable, TensorSums& sums) {
  const int64_t group = n.Hq / n.Hkv;
  const detail::DropoutRule drop(a.dropout, n.Hq);
  std::vector<double> dK(n.Tk * n.D, 0.0), dV(n.Tk * n.Dv, 0.0), dS(n.Tk), Z(n.Tk);
  for (int64_t h = hkv * group; h < (hkv + 1) * group; ++h) {
    scores(a, n, rule, scale, b, h, P);
    std::vector<float> row_lse(n.Tq);
    softmax_rows(P, n.Tq, n.Tk, row_lse.data(), sink_of(a, h));
    double dsink = 0;  // −Σ_i p_i,sink D_i
    for (int64_t i = 0; i < n.Tq; ++i) {
      const float* p = P + i * n.Tk;
      // dP_ij = (dO_i · v_j) Z_ij (the dropout's factor: the weight V met is P_ij Z_ij), and
      // D_i = Σ_j P_ij dP_ij (= dO_i · O_i).
      double Di = 0;
      for (int64_t j = 0; j < n.Tk; ++j) {
        Z[j] = drop.factor(b, h, i, j);
        double dP = 0;
        for (int64_t e = 0; e < n.Dv; ++e)
          dP += double(dout.get(b, h, i, e)) * a.v.get(b, hkv, j, e);
        dP *= Z[j];
        dS[j] = dP;
        Di += p[j] * dP;
      }
      // The sink's weight in the row's softmax (none: 0).
      const double p_sink = a.sinks && a.sinks[h] != kMinusInf
                                ? std::exp(double(a.sinks[h]) - double(row_lse[i]))
                                : 0.0;
      dsink -= p_sink * Di;
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
        if (a.score_mod) {  // through the score function, at the score the forward gave it
          double dot = 0;
          for (int64_t d = 0; d < n.D; ++d)
            dot += double(a.q.get(b, h, i, d)) * a.k.get(b, hkv, j, d);
          const float raw = static_cast<float>(dot) * scale;
          const detail::ScoreGradient g =
              detail::differentiate(a.score_mod->expr().node(), raw, b, h, i, j);
          double d_score = 0;
          for (const detail::Derivative& d : g.derivatives) {
            if (!d.tensor) {
              d_score += d.value;
              continue;
            }
            const auto at = std::find(learnable.begin(), learnable.end(), d.tensor);
            if (at != learnable.end()) sums[at - learnable.begin()][d.index] += ds * d.value;
          }
          ds *= d_score;
        }
        for (int64_t d = 0; d < n.D; ++d) {
          dQ[d] += scale * ds * a.k.get(b, hkv, j, d);
          dK[j * n.D + d] += scale * ds * a.q.get(b, h, i, d);
        }
        for (int64_t e = 0; e < n.Dv; ++e)
          dV[j * n.Dv + e] += p[j] * Z[j] * double(dout.get(b, h, i, e));
      }
      for (int64_t d = 0; d < n.D; ++d) dq.set(b, h, i, d, static_cast<float>(dQ[d]));
    }
    if (dsinks) dsinks[b * n.Hq + h] = dsink;
  }
  for (int64_t j = 0; j < n.Tk; ++j) {
    for (int64_t d = 0; d < n.D; ++d) dk.set(b, hkv, j, d, static_cast<float>(dK[j * n.D + d]));
    for (int64_t e = 0; e < n.Dv; ++e) dv.set(b, hkv, j, e, static_cast<float>(dV[j * n.Dv + e]));
  }
}

}  // namespace

void attention_backward(const AttentionArgs& a, View dout, View dq, View dk, View dv,
                        const ParameterGrads& grads) {
  constexpr const char* where = "reference::attention_backward";
  validate_backward(a, dout, dq, dk, dv, where, grads);
  if (a.packed.num_seqs > 0) {
    // The sinks' gradient summed over the sequences, in their order.
    const int64_t Hq = a.q.shape[1];
    std::vector<float> of_sequence(grads.sinks ? Hq : 0);
    if (grads.sinks) std::fill(grads.sinks, grads.sinks + Hq, 0.0f);
    return detail::run_packed_backward(
        a, dout, dq, dk, dv,
        [&](const AttentionArgs& seq, const View& g, const View& gq, const View& gk,
            const View& gv) {
          reference::attention_backward(seq, g, gq, gk, gv,
                                        {grads.sinks ? of_sequence.data() : nullptr});
          for (int64_t h = 0; h < static_cast<int64_t>(of_sequence.size()); ++h)
            grads.sinks[h] += of_sequence[h];
        });
  }
  const Dims n(a);
  const detail::ScoreRule rule = detail::score_rule(a, where);
  const float scale = detail::effective_scale(a);
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), n.B * n.Hkv));
  std::vector<std::vector<float>> grids(threads, std::vector<float>(n.Tq * n.Tk));
  std::vector<double> dsinks(grads.sinks ? n.B * n.Hq : 0);  // per (b, h), summed over b below
  // The score function's learnable tensors: per (b, kv head), summed in that order below.
  const std::vector<const detail::MaskTensorData*> learnable = learnable_tensors(a);
  std::vector<TensorSums> sums(n.B * n.Hkv);
  for (TensorSums& s : sums)
    for (const detail::MaskTensorData* t : learnable) s.emplace_back(t->numel, 0.0);
  // One (batch, kv head) per iteration: it owns its dk and dv rows, so no two threads write
  // the same gradient.
  LoopErrors errors;
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
  for (int64_t b = 0; b < n.B; ++b)
    for (int64_t hkv = 0; hkv < n.Hkv; ++hkv)
      errors.run([&] {
        backward_group(a, n, rule, scale, dout, dq, dk, dv, b, hkv,
                       grids[omp_get_thread_num()].data(), grads.sinks ? dsinks.data() : nullptr,
                       learnable, sums[b * n.Hkv + hkv]);
      });
  errors.rethrow();
  for (size_t t = 0; t < learnable.size(); ++t)
    for (int64_t e = 0; e < learnable[t]->numel; ++e) {
      double total = 0;
      for (const TensorSums& s : sums) total += s[t][e];
      learnable[t]->grad[e] = static_cast<float>(total);
    }
  if (grads.sinks)
    for (int64_t h = 0; h < n.Hq; ++h) {
      double sum = 0;
      for (int64_t b = 0; b < n.B; ++b) sum += dsinks[b * n.Hq + h];
      grads.sinks[h] = static_cast<float>(sum);
    }
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

  // One score grid per thread, allocated here (and a score function's errors caught: nothing
  // may leave the parallel loop).
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), n.B * n.Hq));
  const detail::DropoutRule drop(a.dropout, n.Hq);
  std::vector<std::vector<float>> grids(threads, std::vector<float>(n.Tq * n.Tk));

  LoopErrors errors;
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
  for (int64_t b = 0; b < n.B; ++b) {
    for (int64_t h = 0; h < n.Hq; ++h)
      errors.run([&] {
        float* S = grids[omp_get_thread_num()].data();
        scores(a, n, rule, scale, b, h, S);
        softmax_rows(S, n.Tq, n.Tk, a.lse ? a.lse + (b * n.Hq + h) * n.Tq : nullptr, sink_of(a, h));
        weighted_values(a, n, drop, b, h, S);
        if (!weights.empty())
          for (int64_t i = 0; i < n.Tq; ++i)
            for (int64_t j = 0; j < n.Tk; ++j) weights(b, h, i, j) = S[i * n.Tk + j];
      });
  }
  errors.rethrow();
}

}  // namespace qkv::reference
