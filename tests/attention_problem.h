// Test problems for attention kernels: random inputs for one combination of options, the
// AttentionArgs that point at them, and an independent double-precision answer.
//
// The double-precision loop below is written from the formula, not from the kernels: it
// tests each mask condition key by key (no shared KeyRange helper) and keeps every
// intermediate in double. Kernels are checked against it, and fast kernels against the
// reference kernel.
#pragma once

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/targets.h"
#include "qkv/tensor.h"

namespace qkv::testing {

enum class BiasKind { none, full, query_key, batch_key, head_query_key };

inline constexpr uint64_t kDropoutSeed = 0x0123456789ABCDEFull;
inline constexpr uint32_t kDropoutOffset = 5;

struct Case {
  int64_t B = 1, Hq = 2, Hkv = 2, Tq = 5, Tk = 5, D = 8, Dv = 8;
  bool causal = false;
  int window_left = -1, window_right = -1;
  bool padding = false;  // kv_len[b] = random in [0, Tk], batch 0 always full
  BiasKind bias = BiasKind::none;
  bool alibi = false;
  float softcap = 0;
  float scale = 0;
  bool seq_major = false;    // store q, k, v, out as [B, T, H, D] and pass transposed views
  bool dim_strided = false;  // store them as [B, H, D, T]: the head dim has stride T
  float magnitude = 1;       // inputs uniform in [-magnitude, magnitude]
  bool sinks = false;        // a sink logit per head (head 0's is -inf: none)
  float dropout = 0;         // dropout p (seed and offset: kDropoutSeed, kDropoutOffset)

  std::string name() const;
};

// gtest prints a parameter with PrintTo; the name reads better than the bytes.
inline void PrintTo(const Case& c, std::ostream* os);

inline std::string Case::name() const {
  // Appended piece by piece: `"B" + std::to_string(B) + ...` trips GCC 12's false -Wrestrict.
  std::string s = "B";
  s += std::to_string(B) + "_Hq" + std::to_string(Hq) + "_Hkv" + std::to_string(Hkv) + "_Tq" +
       std::to_string(Tq) + "_Tk" + std::to_string(Tk) + "_D" + std::to_string(D) + "_Dv" +
       std::to_string(Dv);
  if (causal) s += "_causal";  // window sizes below are printed + 1: 0 means unbounded
  if (window_left >= 0 || window_right >= 0)
    s += "_win" + std::to_string(window_left + 1) + "_" + std::to_string(window_right + 1);
  if (padding) s += "_pad";
  if (bias != BiasKind::none) s += "_bias" + std::to_string(static_cast<int>(bias));
  if (alibi) s += "_alibi";
  if (softcap > 0) s += "_softcap";
  if (scale != 0) s += "_scale";
  if (seq_major) s += "_bthd";
  if (dim_strided) s += "_bhdt";
  if (sinks) s += "_sinks";
  if (dropout > 0) s += "_drop" + std::to_string(static_cast<int>(dropout * 100));
  return s;
}

inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

// A grid of cases: `base` changed by each edit in turn (an empty edit keeps it as it is).
inline std::vector<Case> variations(const Case& base,
                                    std::initializer_list<std::function<void(Case&)>> edits) {
  std::vector<Case> cases;
  for (const auto& edit : edits) {
    Case c = base;
    edit(c);
    cases.push_back(c);
  }
  return cases;
}

// Makes t a [B, H, T, D] tensor stored in the case's layout; returns the view that reads it
// as [B, H, T, D].
inline View layout_view(const Case& c, Tensor& t, int64_t H, int64_t T, int64_t D) {
  if (c.seq_major) {
    t = Tensor({c.B, T, H, D});
    return t.view().transpose(1, 2);
  }
  if (c.dim_strided) {
    t = Tensor({c.B, H, D, T});
    return t.view().transpose(2, 3);
  }
  t = Tensor({c.B, H, T, D});
  return t.view();
}

// Owns the inputs and outputs of one attention call.
struct Problem {
  Case c;
  Tensor q, k, v, out, lse, bias_storage;
  std::vector<int32_t> kv_len;
  std::vector<float> alibi;
  std::vector<float> sinks;
  AttentionArgs args;

  explicit Problem(const Case& c, uint32_t seed = 1) : c(c) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-c.magnitude, c.magnitude);
    auto make = [&](int64_t H, int64_t T, int64_t D, Tensor& t, bool fill) {
      const View view = layout_view(c, t, H, T, D);
      if (fill)
        for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = uniform(rng);
      return view;
    };
    args.q = make(c.Hq, c.Tq, c.D, q, true);
    args.k = make(c.Hkv, c.Tk, c.D, k, true);
    args.v = make(c.Hkv, c.Tk, c.Dv, v, true);
    args.out = make(c.Hq, c.Tq, c.Dv, out, false);
    out.fill(std::numeric_limits<float>::quiet_NaN());  // a kernel must write every output
    lse = Tensor({c.B, c.Hq, c.Tq});
    args.lse = lse.data();
    args.scale = c.scale;
    args.softcap = c.softcap;
    args.mask.causal = c.causal;
    args.mask.window_left = c.window_left;
    args.mask.window_right = c.window_right;
    if (c.padding) {
      std::uniform_int_distribution<int32_t> len(0, static_cast<int32_t>(c.Tk));
      for (int64_t b = 0; b < c.B; ++b) kv_len.push_back(b == 0 ? c.Tk : len(rng));
      args.mask.kv_len = kv_len.data();
    }
    if (c.bias != BiasKind::none) {
      switch (c.bias) {
        case BiasKind::full:
          bias_storage = Tensor({c.B, c.Hq, c.Tq, c.Tk});
          break;
        case BiasKind::query_key:
          bias_storage = Tensor({c.Tq, c.Tk});
          break;
        case BiasKind::batch_key:
          bias_storage = Tensor({c.B, 1, 1, c.Tk});
          break;
        case BiasKind::head_query_key:
          bias_storage = Tensor({c.Hq, c.Tq, c.Tk});
          break;
        case BiasKind::none:
          break;
      }
      for (int64_t i = 0; i < bias_storage.numel(); ++i) bias_storage.data()[i] = uniform(rng);
      args.mask.bias = bias_storage.view();
    }
    if (c.alibi) {
      // The ALiBi paper's slopes for Hq heads: 2^(-8 h / Hq), h = 1..Hq.
      for (int64_t h = 1; h <= c.Hq; ++h) alibi.push_back(std::exp2(-8.0f * h / c.Hq));
      args.mask.alibi = alibi.data();
    }
    if (c.sinks) {
      // Head 0 without one; the others from below the scores to well above them.
      for (int64_t h = 0; h < c.Hq; ++h)
        sinks.push_back(h == 0 ? -INFINITY : -1.5f + 3.0f * static_cast<float>(h % 4) / 3);
      args.sinks = sinks.data();
    }
    args.dropout = {c.dropout, kDropoutSeed, kDropoutOffset};
  }

  // The bias entry for (b, h, i, j), broadcasting by hand.
  double bias_at(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const float* p = bias_storage.data();
    switch (c.bias) {
      case BiasKind::full:
        return p[((b * c.Hq + h) * c.Tq + i) * c.Tk + j];
      case BiasKind::query_key:
        return p[i * c.Tk + j];
      case BiasKind::batch_key:
        return p[b * c.Tk + j];
      case BiasKind::head_query_key:
        return p[(h * c.Tq + i) * c.Tk + j];
      case BiasKind::none:
        return 0;
    }
    return 0;
  }
};

// Gradients of one problem, with dout drawn at random; the loss is L = Σ out ∘ dout.
// Stored [B, H, T, D], or in the case's layout when `in_layout` (the tensors hold the
// storage, the views read it as [B, H, T, D]).
struct Grads {
  Tensor dout, dq, dk, dv;
  View dout_view, dq_view, dk_view, dv_view;
  explicit Grads(const Case& c, bool in_layout = false, uint32_t seed = 3) {
    Case layout = c;
    if (!in_layout) layout.seq_major = layout.dim_strided = false;
    dout_view = layout_view(layout, dout, c.Hq, c.Tq, c.Dv);
    dq_view = layout_view(layout, dq, c.Hq, c.Tq, c.D);
    dk_view = layout_view(layout, dk, c.Hkv, c.Tk, c.D);
    dv_view = layout_view(layout, dv, c.Hkv, c.Tk, c.Dv);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-1, 1);
    for (int64_t i = 0; i < dout.numel(); ++i) dout.data()[i] = uniform(rng);
  }
};

// The inputs in double precision, canonical order: q [B, Hq, Tq, D], k [B, Hkv, Tk, D],
// v [B, Hkv, Tk, Dv], bias expanded to [B, Hq, Tq, Tk] (empty when none).
// A padded pair of problems, the same but for NaN in the key and value rows of batch 1 past
// its kv_len (which both get): the kernels must never read those rows.
struct PaddedPair {
  static Case padded(Case c) {
    c.padding = true;
    return c;
  }
  Problem clean, poisoned;
  PaddedPair(const Case& c, int32_t kv_len_1) : clean(padded(c)), poisoned(padded(c)) {
    clean.kv_len = poisoned.kv_len = std::vector<int32_t>(c.B, static_cast<int32_t>(c.Tk));
    clean.kv_len[1] = poisoned.kv_len[1] = kv_len_1;
    clean.args.mask.kv_len = clean.kv_len.data();
    poisoned.args.mask.kv_len = poisoned.kv_len.data();
    for (int64_t h = 0; h < c.Hkv; ++h)
      for (int64_t j = kv_len_1; j < c.Tk; ++j) {
        for (int64_t d = 0; d < c.D; ++d) poisoned.args.k(1, h, j, d) = NAN;
        for (int64_t e = 0; e < c.Dv; ++e) poisoned.args.v(1, h, j, e) = NAN;
      }
  }
};

struct Inputs {
  std::vector<double> q, k, v, bias;
  std::vector<int32_t> kv_len;
  std::vector<float> alibi;
  std::vector<double> sinks;  // [Hq] when the case has sinks
  std::vector<uint8_t> keep;  // [B, Hq, Tq, Tk] when the case has dropout: dropout_mask's
};

inline Inputs inputs_of(const Problem& p) {
  const Case& c = p.c;
  Inputs in;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Tq; ++i)
        for (int64_t d = 0; d < c.D; ++d) in.q.push_back(p.args.q(b, h, i, d));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hkv; ++h)
      for (int64_t j = 0; j < c.Tk; ++j) {  // both canonical: k row j, then v row j
        for (int64_t d = 0; d < c.D; ++d) in.k.push_back(p.args.k(b, h, j, d));
        for (int64_t e = 0; e < c.Dv; ++e) in.v.push_back(p.args.v(b, h, j, e));
      }
  if (c.bias != BiasKind::none)
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t i = 0; i < c.Tq; ++i)
          for (int64_t j = 0; j < c.Tk; ++j) in.bias.push_back(p.bias_at(b, h, i, j));
  in.kv_len = p.kv_len;
  in.alibi = p.alibi;
  in.sinks.assign(p.sinks.begin(), p.sinks.end());
  if (c.dropout > 0) {
    in.keep.resize(c.B * c.Hq * c.Tq * c.Tk);
    dropout_mask(p.args.dropout, c.B, c.Hq, c.Tq, c.Tk, in.keep.data());
  }
  return in;
}

// The answer in double precision: out [B, Hq, Tq, Dv], lse [B, Hq, Tq] and weights
// [B, Hq, Tq, Tk] (before dropout), all flattened in that order. Dropout multiplies the weights
// that reach the values by keep / (1 − p).
struct Expected {
  std::vector<double> out, lse, weights;
  double max_abs_score = 0;  // over visible scores: sets the tolerance
};

// `visible`, when given, is a further mask written by hand (a mask function's formula): key j
// is hidden from query i of (b, h) where it returns false.
using VisibleFn = std::function<bool(int64_t b, int64_t h, int64_t i, int64_t j)>;
// `score_fn`, when given, is a score function written by hand: the score of query i and key j
// of (b, h) becomes score_fn(scale · q·k, b, h, i, j) (before the fixed steps, which a score
// function replaces).
using ScoreFn = std::function<double(double s, int64_t b, int64_t h, int64_t i, int64_t j)>;

inline Expected naive_attention(const Case& c, const Inputs& in, const VisibleFn& visible = {},
                                const ScoreFn& score_fn = {}) {
  const double scale = c.scale != 0 ? c.scale : 1 / std::sqrt(double(c.D));
  const double inf = std::numeric_limits<double>::infinity();
  Expected e;
  e.out.assign(c.B * c.Hq * c.Tq * c.Dv, 0);
  e.lse.assign(c.B * c.Hq * c.Tq, -inf);
  e.weights.assign(c.B * c.Hq * c.Tq * c.Tk, 0);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Tq; ++i) {
        const int64_t row = (b * c.Hq + h) * c.Tq + i;
        const int64_t hkv = h * c.Hkv / c.Hq;  // query heads are grouped in order
        const int64_t pos = i + c.Tk - c.Tq;
        const double* q = &in.q[row * c.D];
        std::vector<double> s(c.Tk, -inf);
        for (int64_t j = 0; j < c.Tk; ++j) {
          if (c.causal && j > pos) continue;
          if (c.window_left >= 0 && j < pos - c.window_left) continue;
          if (c.window_right >= 0 && j > pos + c.window_right) continue;
          if (c.padding && j >= in.kv_len[b]) continue;
          if (visible && !visible(b, h, i, j)) continue;
          const double* k = &in.k[((b * c.Hkv + hkv) * c.Tk + j) * c.D];
          double dot = 0;
          for (int64_t d = 0; d < c.D; ++d) dot += q[d] * k[d];
          double x = dot * scale;
          if (score_fn) x = score_fn(x, b, h, i, j);
          if (c.softcap > 0) x = c.softcap * std::tanh(x / c.softcap);
          if (!in.bias.empty()) x += in.bias[row * c.Tk + j];
          if (c.alibi) x -= in.alibi[h] * std::abs(double(pos - j));
          s[j] = x;
          if (std::isfinite(x)) e.max_abs_score = std::max(e.max_abs_score, std::abs(x));
        }
        // A sink: one more logit in the denominator, with no value.
        const double sink = c.sinks ? in.sinks[h] : -inf;
        double max = sink;
        for (double x : s) max = std::max(max, x);
        if (max == -inf) continue;  // fully masked: out 0, lse -inf, weights 0
        double z = sink == -inf ? 0 : std::exp(sink - max);
        for (double x : s) z += std::exp(x - max);
        e.lse[row] = max + std::log(z);
        for (int64_t j = 0; j < c.Tk; ++j) {
          const double w = std::exp(s[j] - max) / z;
          e.weights[row * c.Tk + j] = w;
          const double z = c.dropout == 0 ? 1 : in.keep[row * c.Tk + j] / (1 - double(c.dropout));
          const double* v = &in.v[((b * c.Hkv + hkv) * c.Tk + j) * c.Dv];
          for (int64_t d = 0; d < c.Dv; ++d) e.out[row * c.Dv + d] += w * z * v[d];
        }
      }
  return e;
}

inline Expected naive_attention(const Problem& p) { return naive_attention(p.c, inputs_of(p)); }

// Tolerance for fp32 attention against the double answer: each score carries a rounding
// error of a few ulps of its magnitude (plus D products summed), which moves a weight by
// about that much relative; outputs are weighted sums of values of size `magnitude`.
inline double attention_tolerance(const Case& c, double max_abs_score) {
  const double score_error = 8 * FLT_EPSILON * (1 + max_abs_score) * std::sqrt(double(c.D));
  return (score_error + 8 * FLT_EPSILON) * c.magnitude / (1 - c.dropout);
}

// Largest |actual - expected| over a view [B, H, T, X] against a flat [B, H, T, X] vector.
// Any NaN counts as infinitely wrong.
inline double max_error(const View& actual, const std::vector<double>& expected) {
  double worst = 0;
  int64_t n = 0;
  for (int64_t a = 0; a < actual.shape[0]; ++a)
    for (int64_t b = 0; b < actual.shape[1]; ++b)
      for (int64_t c = 0; c < actual.shape[2]; ++c)
        for (int64_t d = 0; d < actual.shape[3]; ++d, ++n) {
          const double x = actual(a, b, c, d);
          if (std::isnan(x)) return std::numeric_limits<double>::infinity();
          worst = std::max(worst, std::abs(x - expected[n]));
        }
  return worst;
}

// lse compared where finite; -inf must match -inf exactly.
inline double max_lse_error(const float* lse, const std::vector<double>& expected) {
  double worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::isinf(expected[i]) || std::isinf(lse[i])) {
      if (lse[i] != expected[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (std::isnan(lse[i])) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, std::abs(lse[i] - expected[i]) / (1 + std::abs(expected[i])));
  }
  return worst;
}

// Whether the target in force runs the tiled kernels on the CPU's bf16 units (avx512_bf16 on
// x86-64, neon_bf16 on AArch64): they round P (and in the backward dS) to bf16 for their
// products, and read subnormal bf16 inputs as zero.
inline bool on_bf16_units_target() {
  const std::string t = current_target();
  return t == "avx512_bf16" || t == "neon_bf16";
}

}  // namespace qkv::testing
