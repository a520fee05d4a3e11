// Keys and values stored in 32-value blocks (a key/value cache in Q8_0, Q4_0 or Q4_1), as the
// attention kernels read them: one place per block format (block_ints, block_min, kDataOffset;
// with_block_format names them all), read by every kernel. split-KV decoding widens a block's
// values in registers (block_ints, block_scale) as it multiplies them; the tiled kernels widen a
// tile of rows at a time to fp32 in the thread's scratch (widen_rows), where the fp32 micro-kernels
// multiply them. Each stored byte is read once per pass and the cache is never copied whole. Per
// Highway target, like src/simd/simd-inl.h.
//
// Where the rows are comes from the row source (kv_rows.h), whose strides count values: a
// row's block is its value offset / 32.
#if defined(QKV_ATTENTION_BLOCK_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_BLOCK_ROWS_INL_H_
#undef QKV_ATTENTION_BLOCK_ROWS_INL_H_
#else
#define QKV_ATTENTION_BLOCK_ROWS_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <hwy/highway.h>

#include "attention/kv_rows.h"
#include "qkv/number_format.h"
#include "qkv/tensor.h"
#include "simd/half-inl.h"
#include "simd/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace simd = ::qkv::simd::HWY_NAMESPACE;

inline constexpr int64_t kBlockValues = kKvBlockValues;

// Calls f(std::integral_constant<TensorType, T>{}) for a block format attention reads (the
// one list of them here: q8_0, q4_0, q4_1).
template <typename F>
decltype(auto) with_block_format(TensorType type, F&& f) {
  switch (type) {
    case TensorType::q8_0:
      return f(std::integral_constant<TensorType, TensorType::q8_0>{});
    case TensorType::q4_0:
      return f(std::integral_constant<TensorType, TensorType::q4_0>{});
    default:
      return f(std::integral_constant<TensorType, TensorType::q4_1>{});
  }
}

template <TensorType kType>
inline constexpr int64_t kBlockBytes = block_size(static_cast<uint32_t>(kType))->bytes;

// Each format's block: an fp16 scale d first, then (Q4_1) an fp16 offset m, then the values:
//   Q8_0  x = d · q            q: 32 int8
//   Q4_0  x = d · (q − 8)      q: 16 bytes of nibbles, value i < 16 byte i's low, 16 + i its high
//   Q4_1  x = d · q + m        the same nibbles
template <TensorType kType>
inline constexpr bool kHasMin = kType == TensorType::q4_1;
template <TensorType kType>
inline constexpr int64_t kDataOffset = kHasMin<kType> ? 4 : 2;

// A block's scale d, and its offset m (0 for formats without one).
HWY_INLINE float block_scale(const uint8_t* blk) { return simd::half_in_block(blk); }
template <TensorType kType>
HWY_INLINE float block_min(const uint8_t* blk) {
  if constexpr (kHasMin<kType>) return simd::half_in_block(blk + 2);
  else return 0.0f;
}

// Values [i, i + N) of one block (N divides 32, i a multiple of N) as fp32 before the scale
// and offset: q, q − 8 or q as the format says. Kernels multiply by d (and add m) once per
// block, not once per vector.
template <TensorType kType>
HWY_INLINE simd::Vf block_ints(const uint8_t* blk, int64_t i) {
  namespace hn = simd::hn;
  const simd::Df df;
  const hn::RebindToSigned<simd::Df> di;
  const uint8_t* q = blk + kDataOffset<kType>;
  if constexpr (kType == TensorType::q8_0) {
    const hn::Rebind<int8_t, simd::Df> di8;
    return hn::ConvertTo(df,
                         hn::PromoteTo(di, hn::LoadU(di8, reinterpret_cast<const int8_t*>(q) + i)));
  } else {
    const hn::Rebind<uint8_t, simd::Df> du8;
    const auto v = hn::PromoteTo(di, hn::LoadU(du8, q + i % (kBlockValues / 2)));
    const auto n = i < kBlockValues / 2 ? hn::And(v, hn::Set(di, 15)) : hn::ShiftRight<4>(v);
    if constexpr (kHasMin<kType>) return hn::ConvertTo(df, n);
    else return hn::ConvertTo(df, hn::Sub(n, hn::Set(di, 8)));
  }
}

// Values [i, i + N) of one block, widened, scaled and offset: d · block_ints (+ m).
template <TensorType kType>
HWY_INLINE simd::Vf block_values(const uint8_t* blk, int64_t i) {
  const simd::Df df;
  const simd::Vf d = simd::hn::Set(df, block_scale(blk));
  if constexpr (kHasMin<kType>)
    return simd::hn::MulAdd(d, block_ints<kType>(blk, i), simd::hn::Set(df, block_min<kType>(blk)));
  else return simd::hn::Mul(d, block_ints<kType>(blk, i));
}

// Values [e, e + N) of a row of blocks (e a multiple of N), widened.
template <TensorType kType>
HWY_INLINE simd::Vf widen_vector(const uint8_t* row, int64_t e) {
  return block_values<kType>(row + e / kBlockValues * kBlockBytes<kType>, e % kBlockValues);
}

// Rows this far ahead are asked for into L1 as a row is widened, and kFarBlockRows ahead into
// L2 (a prefetch past the end of the storage is harmless: prefetches never fault).
inline constexpr int64_t kAheadBlockRows = 4, kFarBlockRows = 32;

// Rows [j, j + count) of head (b, h) as fp32 into out (count × dim, rows dim apart).
template <TensorType kType>
void widen_rows_of(const KvRows& r, int64_t b, int64_t h, int64_t j, int64_t count, float* out) {
  const simd::Df df;
  const int64_t N = static_cast<int64_t>(simd::hn::Lanes(df));
  const int64_t stride = r.stride_bytes(), bytes = r.row_bytes(), blocks = r.dim / kBlockValues;
  const uint8_t* row = r.row(b, h, j);
  for (int64_t t = 0; t < count; ++t, row += stride) {
    for (int64_t line = 0; line < bytes; line += 64) {
      __builtin_prefetch(row + kAheadBlockRows * stride + line);
      __builtin_prefetch(row + kFarBlockRows * stride + line, 0, 1);
    }
    float* y = out + t * r.dim;
    const uint8_t* blk = row;
    for (int64_t k = 0; k < blocks; ++k, blk += kBlockBytes<kType>, y += kBlockValues)
      for (int64_t i = 0; i < kBlockValues; i += N)
        simd::hn::StoreU(block_values<kType>(blk, i), df, y + i);
  }
}
inline void widen_rows(const KvRows& r, int64_t b, int64_t h, int64_t j, int64_t count,
                       float* out) {
  with_block_format(
      r.type, [&](auto format) { widen_rows_of<decltype(format)::value>(r, b, h, j, count, out); });
}

}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
