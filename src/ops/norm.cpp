// LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019), forward and backward.
#include <cmath>
#include <vector>

#include "ops/rows.h"
#include "qkv/ops.h"
#include "util/parallel.h"
#include "qkv/threads.h"

namespace qkv {

using detail::check_rows;
using detail::row;

void layernorm_forward(View y, float* mean, float* rstd, View x, const float* w, const float* b,
                       float eps) {
  constexpr const char* where = "layernorm_forward";
  check_rows(x, -1, -1, where, "x [N, C]");
  const int64_t N = x.shape[0], C = x.shape[1];
  check_rows(y, N, C, where, "y [N, C]");
  detail::parallel_for(N, detail::threads_for(N * C), [&](int64_t n) {
    const float* xr = row(x, n);
    double sum = 0, sq = 0;
    for (int64_t c = 0; c < C; ++c) sum += xr[c];
    const double mu = sum / C;
    for (int64_t c = 0; c < C; ++c) sq += (xr[c] - mu) * (xr[c] - mu);
    const float rs = static_cast<float>(1 / std::sqrt(sq / C + eps));
    float* yr = row(y, n);
    for (int64_t c = 0; c < C; ++c)
      yr[c] = (xr[c] - static_cast<float>(mu)) * rs * w[c] + (b ? b[c] : 0.0f);
    mean[n] = static_cast<float>(mu);
    rstd[n] = rs;
  });
}

// With x̂ = (x − mean) · rstd and g = dy ⊙ w:
//   dx = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂)),  dw += Σ_n dy ⊙ x̂,  db += Σ_n dy.
void layernorm_backward(View dx, float* dw, float* db, View dy, View x, const float* w,
                        const float* mean, const float* rstd) {
  constexpr const char* where = "layernorm_backward";
  const int64_t N = x.shape[0], C = x.shape[1];
  check_rows(dy, N, C, where, "dy [N, C]");
  check_rows(dx, N, C, where, "dx [N, C]");
  for (int64_t n = 0; n < N; ++n) {  // serial over rows: dw and db sum over them
    const float* xr = row(x, n);
    const float* gr = row(dy, n);
    double g_mean = 0, gx_mean = 0;
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (xr[c] - mean[n]) * rstd[n];
      g_mean += gr[c] * w[c];
      gx_mean += gr[c] * w[c] * xhat;
    }
    g_mean /= C;
    gx_mean /= C;
    float* dxr = row(dx, n);
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (xr[c] - mean[n]) * rstd[n];
      if (dw) dw[c] += gr[c] * xhat;
      if (db) db[c] += gr[c];
      dxr[c] += rstd[n] * static_cast<float>(gr[c] * w[c] - g_mean - xhat * gx_mean);
    }
  }
}

void rmsnorm_forward(View y, float* rstd, View x, const float* w, float eps) {
  constexpr const char* where = "rmsnorm_forward";
  check_rows(x, -1, -1, where, "x [N, C]");
  const int64_t N = x.shape[0], C = x.shape[1];
  check_rows(y, N, C, where, "y [N, C]");
  detail::parallel_for(N, detail::threads_for(N * C), [&](int64_t n) {
    const float* xr = row(x, n);
    double sq = 0;
    for (int64_t c = 0; c < C; ++c) sq += double(xr[c]) * xr[c];
    const float rs = static_cast<float>(1 / std::sqrt(sq / C + eps));
    float* yr = row(y, n);
    for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * rs * w[c];
    rstd[n] = rs;
  });
}

// With g = dy ⊙ w:  dx = rstd · (g − x · rstd² · mean(g ⊙ x)),  dw += Σ_n dy ⊙ x · rstd.
void rmsnorm_backward(View dx, float* dw, View dy, View x, const float* w, const float* rstd) {
  constexpr const char* where = "rmsnorm_backward";
  const int64_t N = x.shape[0], C = x.shape[1];
  check_rows(dy, N, C, where, "dy [N, C]");
  check_rows(dx, N, C, where, "dx [N, C]");
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = row(x, n);
    const float* gr = row(dy, n);
    double gx_mean = 0;
    for (int64_t c = 0; c < C; ++c) gx_mean += double(gr[c]) * w[c] * xr[c];
    gx_mean /= C;
    const float rs = rstd[n];
    float* dxr = row(dx, n);
    for (int64_t c = 0; c < C; ++c) {
      if (dw) dw[c] += gr[c] * xr[c] * rs;
      dxr[c] += rs * static_cast<float>(gr[c] * w[c] - xr[c] * rs * rs * gx_mean);
    }
  }
}

}  // namespace qkv
