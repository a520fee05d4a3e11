// AdamW, gradient clipping and the learning-rate schedule.
#include <algorithm>
#include <cmath>

#include "qkv/error.h"
#include "qkv/threads.h"
#include "qkv/train.h"

namespace qkv {

AdamW::AdamW(const Model& model, AdamWConfig config)
    : config(config), m(model.num_params(), 0.0f), v(model.num_params(), 0.0f) {}

// m ← β1 m + (1 − β1) g;  v ← β2 v + (1 − β2) g²;  w ← w − lr (m̂ / (√v̂ + ε) + λ w)
// with bias-corrected m̂, v̂, and λ = weight_decay only for matrices and embeddings.
void AdamW::update(Model& model, float lr) {
  ++step;
  const float c1 = 1 - std::pow(config.beta1, static_cast<float>(step));
  const float c2 = 1 - std::pow(config.beta2, static_cast<float>(step));
  // The state covers [shard_begin, shard_end): m[j] and v[j] belong to parameter shard_begin + j.
  const int64_t shard_end = shard_begin + static_cast<int64_t>(m.size());
  float* w = model.weights() + shard_begin;
  const float* g = model.grads() + shard_begin;
  for (const ParamInfo& p : model.params()) {
    const float decay = p.decay ? config.weight_decay : 0.0f;
    const int64_t begin = std::max(p.offset, shard_begin) - shard_begin;
    const int64_t end = std::min(p.offset + p.rows * p.cols, shard_end) - shard_begin;
#pragma omp parallel for schedule(static) num_threads(num_threads())
    for (int64_t i = begin; i < end; ++i) {
      m[i] = config.beta1 * m[i] + (1 - config.beta1) * g[i];
      v[i] = config.beta2 * v[i] + (1 - config.beta2) * g[i] * g[i];
      const float mhat = m[i] / c1, vhat = v[i] / c2;
      w[i] -= lr * (mhat / (std::sqrt(vhat) + config.eps) + decay * w[i]);
    }
  }
}

void AdamW::keep_shard(int64_t begin, int64_t end) {
  const int64_t have_end = shard_begin + static_cast<int64_t>(m.size());
  check(begin >= shard_begin && begin <= end && end <= have_end, "AdamW::keep_shard: [", begin,
        ", ", end, ") is not inside the state held, [", shard_begin, ", ", have_end, ")");
  m = std::vector<float>(m.begin() + (begin - shard_begin), m.begin() + (end - shard_begin));
  v = std::vector<float>(v.begin() + (begin - shard_begin), v.begin() + (end - shard_begin));
  shard_begin = begin;
}

float clip_grad_norm(Model& model, float max_norm) {
  double sq = 0;
  float* g = model.grads();
  const int64_t n = model.num_params();
  for (int64_t i = 0; i < n; ++i) sq += double(g[i]) * g[i];  // serial: same bits always
  return clip_grads(g, n, sq, max_norm);
}

float clip_grads(float* g, int64_t n, double sq, float max_norm) {
  const float norm = static_cast<float>(std::sqrt(sq));
  check(std::isfinite(norm), "training: the gradient norm is ", norm,
        " (the loss diverged; try a lower learning rate)");
  if (max_norm > 0 && norm > max_norm) {
    const float scale = max_norm / norm;
    for (int64_t i = 0; i < n; ++i) g[i] *= scale;
  }
  return norm;
}

float learning_rate(int64_t step, int64_t total, int64_t warmup, float max_lr, float min_lr) {
  if (step < warmup) return max_lr * (step + 1) / warmup;
  if (step >= total) return min_lr;
  const double progress = double(step - warmup) / std::max<int64_t>(1, total - warmup);
  return static_cast<float>(min_lr + 0.5 * (max_lr - min_lr) * (1 + std::cos(M_PI * progress)));
}

}  // namespace qkv
