// The SIMD building blocks of the attention kernels, against plain scalar code, on the target
// in force (ctest runs this once per SIMD target, with QKV_TARGET set).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention_simd_test.cpp"
#include <hwy/foreach_target.h>
#include <hwy/highway.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <limits>
#include <vector>

#include "simd/dispatch.h"
#include "simd/simd-inl.h"
#include "simd/transpose-inl.h"

// The pieces under test, compiled per target.
HWY_BEFORE_NAMESPACE();
namespace qkv::simd {
namespace HWY_NAMESPACE {

size_t lanes_here() { return lanes(); }

// exp_nonpositive on each of `xs`, one lane at a time through whole vectors.
std::vector<float> exp_each(const std::vector<float>& xs) {
  const size_t N = lanes();
  std::vector<float> in(xs), out(xs.size() + N);
  in.resize((xs.size() + N - 1) / N * N, 0.0f);
  for (size_t i = 0; i < in.size(); i += N)
    hn::StoreU(exp_nonpositive(hn::LoadU(df, in.data() + i)), df, out.data() + i);
  out.resize(xs.size());
  return out;
}

void pack(const float* src, int64_t src_stride, int64_t rows, int64_t cols, float scale, float* dst,
          int64_t dst_stride) {
  pack_transposed(src, src_stride, rows, cols, scale, dst, dst_stride);
}

void unpack(const float* src, int64_t src_stride, int64_t rows, int64_t cols,
            const float* row_scale, float* dst, int64_t dst_stride, bool stream) {
  unpack_transposed(src, src_stride, rows, cols, row_scale, dst, dst_stride, stream);
  if (stream) hwy::FlushStream();
}

}  // namespace HWY_NAMESPACE
}  // namespace qkv::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qkv::simd {
HWY_EXPORT(lanes_here);
HWY_EXPORT(exp_each);
HWY_EXPORT(pack);
HWY_EXPORT(unpack);
}  // namespace qkv::simd

namespace qkv {
namespace {

std::vector<float> simd_exp(const std::vector<float>& xs) {
  using namespace simd;
  return QKV_DISPATCH(exp_each)(xs);
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

// Aligned storage of n floats (and a vector to spare), filled with `fill`.
struct Aligned {
  explicit Aligned(size_t n, float fill = 0)
      // aligned_alloc wants a size that is a multiple of the alignment.
      : data(static_cast<float*>(std::aligned_alloc(64, (n + 31) / 16 * 64))) {
    std::fill(data, data + (n + 31) / 16 * 16, fill);
  }
  ~Aligned() { std::free(data); }
  float* data;
};

TEST(SimdTranspose, PacksRowsIntoQueryLanesAndBackForOddSizes) {
  using namespace simd;
  const int64_t N = static_cast<int64_t>(QKV_DISPATCH(lanes_here)());
  for (int64_t rows : {int64_t{1}, N - 1, N, N + 3, 4 * N})
    for (int64_t cols : {int64_t{1}, int64_t{7}, N, int64_t{80}, int64_t{129}}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
      const int64_t src_stride = cols + 5, lanes = (rows + N - 1) / N * N;
      std::vector<float> src(rows * src_stride);
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i % 1009) - 500;
      Aligned packed(cols * lanes, 99.0f);
      QKV_DISPATCH(pack)(src.data(), src_stride, rows, cols, 0.5f, packed.data, lanes);
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t r = 0; r < lanes; ++r)
          ASSERT_EQ(packed.data[c * lanes + r], r < rows ? 0.5f * src[r * src_stride + c] : 0.0f)
              << "c " << c << " r " << r;

      Aligned row_scale(lanes);
      for (int64_t r = 0; r < lanes; ++r) row_scale.data[r] = static_cast<float>(r + 1);
      // Unaligned rows with plain stores; then aligned rows (a stride of whole vectors)
      // with streaming stores, which whole blocks take and the rest does not.
      for (const bool stream : {false, true}) {
        SCOPED_TRACE(stream ? "streaming" : "plain");
        const int64_t dst_stride = stream ? (cols + 3 + N - 1) / N * N : cols + 3;
        Aligned dst(rows * dst_stride + 8, -7.0f);
        float* out = stream ? dst.data : dst.data + 1;
        QKV_DISPATCH(unpack)
        (packed.data, lanes, rows, cols, row_scale.data, out, dst_stride, stream);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < dst_stride; ++c)
            ASSERT_EQ(out[r * dst_stride + c],
                      c < cols ? 0.5f * src[r * src_stride + c] * (r + 1) : -7.0f)
                << "r " << r << " c " << c << " (columns past cols must stay untouched)";
        for (int64_t i = rows * dst_stride; i < rows * dst_stride + 7; ++i)
          ASSERT_EQ(out[i], -7.0f);
      }
    }
}

}  // namespace
}  // namespace qkv
#endif  // HWY_ONCE
