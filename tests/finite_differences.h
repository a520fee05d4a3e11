// Gradient checks by central differences.
//
// The ops are fp32, so the loss is accumulated in double and the step h is large enough
// (1e-2 · max(1, |x|)) that fp32 rounding of the outputs (~1e-7 relative) stays far below
// the differences; the truncation error is O(h²) ≈ 1e-4 relative. Hence the tolerance.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace qkv::testing {

inline std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = uniform(rng);
  return v;
}

// Σ y ⊙ g in double: a scalar loss whose gradient with respect to y is g.
inline double dot(const float* y, const std::vector<float>& g) {
  double s = 0;
  for (size_t i = 0; i < g.size(); ++i) s += double(y[i]) * g[i];
  return s;
}

// Expects grad[i] ≈ ∂loss/∂x[i] for every i, where loss() recomputes from the current x.
template <typename Loss>
void expect_gradient(float* x, const float* grad, size_t n, Loss&& loss, const char* name,
                     double tol = 3e-3) {
  for (size_t i = 0; i < n; ++i) {
    const float saved = x[i];
    const float h = 1e-2f * std::max(1.0f, std::abs(saved));
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (2.0 * h);
    ASSERT_NEAR(grad[i], numeric, tol * (1 + std::abs(numeric)))
        << name << "[" << i << "] analytic " << grad[i] << " numeric " << numeric;
  }
}

}  // namespace qkv::testing
