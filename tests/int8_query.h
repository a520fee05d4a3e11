// The query as int8 cache scores round it (CacheScores::int8, src/attention/decode_int8-inl.h),
// written here from its definition for the tests' references: each 32-block of the scaled
// query x = scale · q gets d = max|x| / 127 and x · (1 / d) to nearest (ties to even), and the
// result is d · round(...) / scale, so that the reference's own scaling gives back the products
// the kernel forms.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

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

}  // namespace qkv::testing
