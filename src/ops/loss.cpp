// Softmax cross-entropy over the vocabulary, mean over the positions that count.
// Compiled once per SIMD target; the entry points below dispatch (see src/simd/dispatch.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/loss.cpp"
#include <hwy/foreach_target.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>

#include "simd/simd-inl.h"
#include "simd/kernel_namespace.h"
#include "ops/rows.h"
#include "qkv/ops.h"
#include "qkv/threads.h"
#include "simd/dispatch.h"

QKV_KERNEL_BEGIN(qkv)

using detail::check_rows;
using detail::row;

namespace {

// p = e^(l − max(l)) over one row, vectorised (a vocabulary of 50,257 makes this the largest
// elementwise loop of a training step); returns max and Σ p.
std::pair<float, double> exp_row(const float* l, float* p, int64_t V) {
  const int64_t N = static_cast<int64_t>(simd::lanes());
  Vf m = hn::Set(df, simd::kMinusInf);
  int64_t v = 0;
  for (; v + N <= V; v += N) m = hn::Max(m, hn::LoadU(df, l + v));
  float max = hn::GetLane(hn::MaxOfLanes(df, m));
  for (int64_t t = v; t < V; ++t) max = std::max(max, l[t]);
  const Vf shift = hn::Set(df, max);
  Vf sum0 = hn::Zero(df), sum1 = hn::Zero(df);
  v = 0;
  for (; v + 2 * N <= V; v += 2 * N) {
    const Vf e0 = simd::exp_nonpositive(hn::Sub(hn::LoadU(df, l + v), shift));
    const Vf e1 = simd::exp_nonpositive(hn::Sub(hn::LoadU(df, l + v + N), shift));
    hn::StoreU(e0, df, p + v);
    hn::StoreU(e1, df, p + v + N);
    sum0 = hn::Add(sum0, e0);
    sum1 = hn::Add(sum1, e1);
  }
  double z = hn::GetLane(hn::SumOfLanes(df, hn::Add(sum0, sum1)));
  for (; v < V; ++v) z += (p[v] = std::exp(l[v] - max));
  return {max, z};
}

}  // namespace

float cross_entropy_forward(View probs, View logits, const int32_t* targets) {
  constexpr const char* where = "cross_entropy_forward";
  check_rows(logits, -1, -1, where, "logits [N, V]");
  const int64_t N = logits.shape[0], V = logits.shape[1];
  check_rows(probs, N, V, where, "probs [N, V]");
  for (int64_t n = 0; n < N; ++n)
    check(targets[n] == kIgnoreIndex || (targets[n] >= 0 && targets[n] < V), where, ": targets[", n,
          "] = ", targets[n], " is outside [0, ", V, ") and not the ignore index");
  double total = 0;
  int64_t count = 0;
#pragma omp parallel for schedule(static) num_threads(num_threads()) reduction(+ : total, count)
  for (int64_t n = 0; n < N; ++n) {
    const float* l = row(logits, n);
    float* p = row(probs, n);
    const auto [max, z] = exp_row(l, p, V);
    const float inv = static_cast<float>(1 / z);
    for (int64_t v = 0; v < V; ++v) p[v] *= inv;
    if (targets[n] == kIgnoreIndex) continue;
    total += std::log(z) + max - l[targets[n]];  // −log softmax, without underflow
    ++count;
  }
  return count ? static_cast<float>(total / count) : 0.0f;
}

QKV_KERNEL_END();  // qkv::HWY_NAMESPACE

#if HWY_ONCE
namespace qkv {

using detail::check_rows;
using detail::row;

HWY_EXPORT(cross_entropy_forward);
float cross_entropy_forward(View probs, View logits, const int32_t* targets) {
  return QKV_DISPATCH(cross_entropy_forward)(probs, logits, targets);
}

// The backward passes are plain loops: compiled once.
void cross_entropy_backward(View dlogits, View probs, const int32_t* targets, float dloss) {
  const int64_t N = probs.shape[0], V = probs.shape[1];
  check_rows(dlogits, N, V, "cross_entropy_backward", "dlogits [N, V]");
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) count += targets[n] != kIgnoreIndex;
  if (count == 0) return;
  const float scale = dloss / count;
#pragma omp parallel for schedule(static) num_threads(num_threads())
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == kIgnoreIndex) continue;
    const float* p = row(probs, n);
    float* d = row(dlogits, n);
    for (int64_t v = 0; v < V; ++v) d[v] += scale * (p[v] - (v == targets[n] ? 1.0f : 0.0f));
  }
}

void cross_entropy_backward_inplace(View probs, const int32_t* targets, float dloss) {
  const int64_t N = probs.shape[0], V = probs.shape[1];
  check_rows(probs, N, V, "cross_entropy_backward_inplace", "probs [N, V]");
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) count += targets[n] != kIgnoreIndex;
  const float scale = count ? dloss / count : 0.0f;
#pragma omp parallel for schedule(static) num_threads(num_threads())
  for (int64_t n = 0; n < N; ++n) {
    float* p = row(probs, n);
    if (targets[n] == kIgnoreIndex) {
      std::fill(p, p + V, 0.0f);
      continue;
    }
    for (int64_t v = 0; v < V; ++v) p[v] *= scale;
    p[targets[n]] -= scale;
  }
}

}  // namespace qkv
#endif  // HWY_ONCE
