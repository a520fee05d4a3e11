// The query as int8 cache scores round it (CacheScores::int8, src/attention/decode_int8-inl.h),
// written here from its definition for the tests' references: each 32-block of the scaled
// query x = scale · q gets d = max|x| / 127 and x · (1 / d) to nearest (ties to even), and the
// result is d · round(...) / scale, so that the reference's own scaling gives back the products
// the kernel forms.
//
// And the bound on P·V's rounding where P is rounded to u8 (src/attention/int8_values-inl.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace qkv::testing {

// out[0, n) from q[0, n) (n a multiple of 32, blocks along the head dim).
inline void round_query_like_int8_scores(const float* q, int64_t n, float scale, float* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    float x[32], amax = 0;
    for (int i = 0; i < 32; ++i)
      x[i] = q[32 * b + i] * scale, amax = std::max(amax, std::abs(x[i]));
    const float d = amax / 127, inverse = d != 0 ? 1 / d : 0;
    for (int i = 0; i < 32; ++i) out[32 * b + i] = d * std::nearbyint(x[i] * inverse) / scale;
  }
}

// A row's bound on |Δo_e| from P rounded per block of 64 keys and block b of 32 columns to
// `levels` steps (127 for q4_0's s8, else 255 for u8): Σ_k W_k,b / (2 levels) ·
// |n_k,e| / l, where p_k = e^(s_k − max s) over the visible keys [0, end),
// l = Σ p, n the stored integers and W_k,b the largest p_k' |d_k',b| of the keys within 63 of k
// (so the bound holds wherever the kernel's blocks of 64 keys begin). d: [keys][Dv / 32] block
// scales, n: [keys][Dv] integers.
inline std::vector<double> int8_p_bound(const std::vector<double>& s, int64_t end, const float* d,
                                        const float* n, int64_t Dv, double levels) {
  const int64_t blocks = Dv / 32;
  double top = -INFINITY, l = 0;
  for (int64_t k = 0; k < end; ++k) top = std::max(top, s[k]);
  std::vector<double> p(end), bound(Dv, 0.0);
  for (int64_t k = 0; k < end; ++k) l += p[k] = std::exp(s[k] - top);
  for (int64_t k = 0; k < end; ++k)
    for (int64_t b = 0; b < blocks; ++b) {
      double w = 0;
      for (int64_t j = std::max<int64_t>(0, k - 63); j < std::min(end, k + 64); ++j)
        w = std::max(w, p[j] * std::abs(d[j * blocks + b]));
      for (int64_t e = 32 * b; e < 32 * b + 32; ++e)
        bound[e] += w / (2 * levels) * std::abs(n[k * Dv + e]);
    }
  for (double& x : bound) x /= l;
  return bound;
}

}  // namespace qkv::testing
