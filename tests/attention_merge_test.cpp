// The merge of partial attention results (src/attention/merge.h) against one softmax over all
// the keys at once, in double precision; and its rules for rows no part saw and for NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "attention/merge.h"

namespace qkv::detail {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// One part's (m, l, o) over keys [begin, end), computed plainly.
struct Part {
  float m = kMinusInf, l = 0;
  std::vector<float> o;
};
Part part_of(const std::vector<float>& s, const std::vector<std::vector<float>>& v, size_t begin,
             size_t end, size_t Dv) {
  Part p;
  p.o.assign(Dv, 0);
  for (size_t j = begin; j < end; ++j) p.m = std::max(p.m, s[j]);
  if (p.m == kMinusInf) return p;
  for (size_t j = begin; j < end; ++j) {
    const float w = std::exp(s[j] - p.m);
    p.l += w;
    for (size_t e = 0; e < Dv; ++e) p.o[e] += w * v[j][e];
  }
  return p;
}

TEST(MergePartials, EqualsOneSoftmaxOverEveryKey) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0, 3);
  const size_t keys = 50, Dv = 7;
  std::vector<float> s(keys);
  std::vector<std::vector<float>> v(keys, std::vector<float>(Dv));
  for (size_t j = 0; j < keys; ++j) {
    s[j] = n(rng);
    for (float& x : v[j]) x = n(rng);
  }
  for (size_t j = 20; j < 30; ++j) s[j] = kMinusInf;  // a part that sees no key
  double top = -1e300, z = 0;
  for (float x : s) top = std::max(top, double(x));
  std::vector<double> want(Dv, 0);
  for (size_t j = 0; j < keys; ++j) {
    const double w = std::exp(double(s[j]) - top);
    z += w;
    for (size_t e = 0; e < Dv; ++e) want[e] += w * v[j][e];
  }
  const size_t cuts[] = {0, 7, 20, 30, 31, 50};
  std::vector<Part> parts;
  std::vector<PartialRow> rows;
  for (size_t c = 0; c + 1 < std::size(cuts); ++c)
    parts.push_back(part_of(s, v, cuts[c], cuts[c + 1], Dv));
  for (const Part& p : parts) rows.push_back({p.m, p.l, p.o.data()});
  std::vector<float> out(2 * Dv, -1);  // every other element: out_stride 2
  auto part = [&](int64_t c) { return rows[c]; };
  float lse = 0;
  merge_partials(static_cast<int64_t>(rows.size()), part, Dv, out.data(), 2, &lse);
  EXPECT_NEAR(lse, top + std::log(z), 1e-5);
  for (size_t e = 0; e < Dv; ++e) {
    EXPECT_NEAR(out[2 * e], want[e] / z, 1e-5) << e;
    EXPECT_EQ(out[2 * e + 1], -1) << "wrote between the strided elements";
  }
  // Into the first part's own output (the ring merges into its running result): the same
  // numbers.
  std::vector<float> expected(Dv);
  for (size_t e = 0; e < Dv; ++e) expected[e] = out[2 * e];
  merge_partials(static_cast<int64_t>(rows.size()), part, Dv, parts[0].o.data(), 1, nullptr);
  for (size_t e = 0; e < Dv; ++e) EXPECT_EQ(parts[0].o[e], expected[e]) << e;
}

TEST(MergePartials, RowThatNoPartSawIsZeroWithMinusInfinity) {
  const float o[2] = {NAN, 5};  // never read: the part saw nothing
  const PartialRow rows[2] = {{kMinusInf, 0, o}, {kMinusInf, 0, o}};
  float out[2] = {7, 7};
  float lse = 0;
  merge_partials(
      2, [&](int64_t c) { return rows[c]; }, 2, out, 1, &lse);
  EXPECT_EQ(lse, kMinusInf);
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[1], 0);
}

TEST(MergePartials, NanInAPartMakesTheRowNan) {
  const float o[2] = {1, 2};
  const PartialRow rows[2] = {{0.5f, 1, o}, {NAN, 1, o}};
  float out[2] = {0, 0};
  float lse = 0;
  merge_partials(
      2, [&](int64_t c) { return rows[c]; }, 2, out, 1, &lse);
  EXPECT_TRUE(std::isnan(lse));
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1]));
}

}  // namespace
}  // namespace qkv::detail
