// The SIMD building blocks of the attention kernels, against plain scalar code.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention/simd.h"

namespace qkv {
namespace {

namespace hn = simd::hn;

// exp_nonpositive on each of `xs`, one lane at a time through whole vectors.
std::vector<float> simd_exp(const std::vector<float>& xs) {
  const size_t N = simd::lanes();
  std::vector<float> in(xs), out(xs.size() + N);
  in.resize((xs.size() + N - 1) / N * N, 0.0f);
  for (size_t i = 0; i < in.size(); i += N)
    hn::StoreU(simd::exp_nonpositive(hn::LoadU(simd::df, in.data() + i)), simd::df, out.data() + i);
  out.resize(xs.size());
  return out;
}

TEST(SimdExp, MatchesStdExpWithinFourTenthsOfAMillionthRelative) {
  std::vector<float> xs;
  for (double x = -87.3; x <= 0; x += 1e-4) xs.push_back(static_cast<float>(x));
  const std::vector<float> got = simd_exp(xs);
  double worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double want = std::exp(static_cast<double>(xs[i]));
    worst = std::max(worst, std::abs(got[i] - want) / want);
  }
  EXPECT_LT(worst, 4e-7);
}

TEST(SimdExp, ExactAtZeroAndZeroForMaskedAndUnderflowingScores) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> got = simd_exp({0.0f, -0.0f, -inf, -88.0f, -100.0f, -1e4f, -3e38f});
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], 1.0f);
  for (size_t i = 2; i < got.size(); ++i) EXPECT_EQ(got[i], 0.0f) << "entry " << i;
}

TEST(SimdExp, StaysWithinTheSmallestNormalNearTheUnderflowEdge) {
  // Between -87.7 and -87.3 the result may be subnormal; it stays within one smallest normal.
  std::vector<float> xs;
  for (double x = -88.0; x <= -87.0; x += 1e-3) xs.push_back(static_cast<float>(x));
  const std::vector<float> got = simd_exp(xs);
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_GE(got[i], 0.0f);
    EXPECT_NEAR(got[i], std::exp(static_cast<double>(xs[i])), std::numeric_limits<float>::min())
        << "x = " << xs[i];
  }
}

}  // namespace
}  // namespace qkv
