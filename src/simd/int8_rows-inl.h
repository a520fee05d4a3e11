// Rows of values rounded to int8 per block of 32 (Q8: d = max|x| / 127, q = x / d to nearest,
// ties to even), the activations' side of every integer product: the int8 weight products
// (src/quant/int8-inl.h) and decoding's integer Q·K (src/attention/decode_int8-inl.h) round
// their rows here. Per Highway target, like simd-inl.h.
#if defined(QKV_SIMD_INT8_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_SIMD_INT8_ROWS_INL_H_
#undef QKV_SIMD_INT8_ROWS_INL_H_
#else
#define QKV_SIMD_INT8_ROWS_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <hwy/highway.h>

#include "qkv/number_format.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::simd {
namespace HWY_NAMESPACE {
namespace int8 {

namespace hn = hwy::HWY_NAMESPACE;
// Values per block of q8_0, q4_0 and q4_1 (number_format.h), and per sub-block of a K-quant.
inline constexpr int64_t kBlock = kKvBlockValues;

// One row of a matmul's activations rounded to int8 (K values, blocks of 32), and what the
// kernels read beside the values, all in one float buffer (floats_per_row of them):
//   d, sums    per block: the scale d and d · Σ q
//   q          the int8 values in order
//   The AVX-512 DL kernel's pairs of blocks (b, b + 1):
//   q4         the values as that kernel lays out a pair of Q4 blocks: b's values 0–15, b + 1's
//              0–15, b's 16–31, b + 1's 16–31 (low nibbles, then high ones)
//   scales     (d_b, 1, d_b+1, 1): times the weight blocks' (d, m) pairs
//   terms      per weight type, what multiplies the blocks' (d, m, d, m) to give the part of
//              the product the integer sums leave out: Q8_0 (−128 s, 0, −128 s', 0) (its
//              weights are offset by 128 to be unsigned), Q4_0 (−8 s, 0, −8 s', 0), Q4_1
//              (0, s, 0, s'), with s = d · Σ q of each block
struct Row {
  const float *d, *sums, *scales, *terms;
  const int8_t *q, *q4;
};
inline int64_t floats_per_row(int64_t K) { return 10 * (K / kBlock) + K / 2; }
inline Row row_at(const float* base, int64_t K) {
  const int64_t nb = K / kBlock;
  const auto* bytes = reinterpret_cast<const int8_t*>(base + 10 * nb);
  return {base, base + nb, base + 2 * nb, base + 4 * nb, bytes, bytes + K};
}
inline constexpr int kTermsQ8_0 = 0, kTermsQ4_0 = 4, kTermsQ4_1 = 8;  // offsets in a pair's 12

// x (K values, whole blocks) into the row at `base`. A block with a value that is not finite
// gets d = NaN (its products are NaN, as the exact path's would be).
inline void quantize_row(const float* x, int64_t K, float* base) {
  const Row r = row_at(base, K);
  auto* d = const_cast<float*>(r.d);
  auto* sums = const_cast<float*>(r.sums);
  auto* q = const_cast<int8_t*>(r.q);
  const hn::CappedTag<float, 16> df;  // a block is whole vectors
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<int8_t, decltype(df)> d8;
  const size_t N = hn::Lanes(df);
  const auto largest = hn::Set(df, std::numeric_limits<float>::max());
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    auto amax = hn::Zero(df);
    auto bad = hn::FirstN(df, 0);  // no lane
    for (size_t j = 0; j < size_t(kBlock); j += N) {
      const auto a = hn::Abs(hn::LoadU(df, xb + j));
      bad = hn::Or(bad, hn::Not(hn::Le(a, largest)));  // inf or NaN
      amax = hn::Max(amax, a);
    }
    if (!hn::AllFalse(df, bad)) {
      std::fill(q + b * kBlock, q + (b + 1) * kBlock, int8_t{0});
      d[b] = sums[b] = NAN;
      continue;
    }
    const float scale = hn::GetLane(hn::MaxOfLanes(df, amax)) / 127;
    const auto inverse = hn::Set(df, scale != 0 ? 1 / scale : 0);
    auto sum = hn::Zero(di);
    for (size_t j = 0; j < size_t(kBlock); j += N) {
      const auto v = hn::NearestInt(hn::Mul(hn::LoadU(df, xb + j), inverse));  // |v| ≤ 127
      hn::StoreU(hn::DemoteTo(d8, v), d8, q + b * kBlock + j);
      sum = hn::Add(sum, v);
    }
    d[b] = scale;
    sums[b] = scale * static_cast<float>(hn::GetLane(hn::SumOfLanes(di, sum)));
  }
  auto* q4 = const_cast<int8_t*>(r.q4);
  auto* scales = const_cast<float*>(r.scales);
  auto* terms = const_cast<float*>(r.terms);
  for (int64_t p = 0; p < K / kBlock / 2; ++p) {
    const int64_t b = 2 * p;
    for (int j = 0; j < 16; ++j) {
      q4[64 * p + j] = q[b * kBlock + j];
      q4[64 * p + 16 + j] = q[(b + 1) * kBlock + j];
      q4[64 * p + 32 + j] = q[b * kBlock + 16 + j];
      q4[64 * p + 48 + j] = q[(b + 1) * kBlock + 16 + j];
    }
    const float s0 = sums[b], s1 = sums[b + 1];
    const float pair_scales[4] = {d[b], 1, d[b + 1], 1};
    const float pair_terms[12] = {-128 * s0, 0, -128 * s1, 0, -8 * s0, 0, -8 * s1, 0, 0, s0, 0, s1};
    std::copy(pair_scales, pair_scales + 4, scales + 4 * p);
    std::copy(pair_terms, pair_terms + 12, terms + 12 * p);
  }
}

}  // namespace int8
}  // namespace HWY_NAMESPACE
}  // namespace qkv::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
