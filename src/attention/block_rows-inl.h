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
#include "simd/blocks-inl.h"
#include "simd/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace simd = ::qkv::simd::HWY_NAMESPACE;

using simd::block_ints;
using simd::block_min;
using simd::block_scale;
using simd::block_values;
using simd::kBlockBytes;
using simd::kBlockValues;
using simd::kDataOffset;
using simd::kHasMin;
using simd::widen_block;
using simd::widen_vector;
using simd::with_block_format;

// Rows this far ahead are asked for into L1 as a row is widened, and kFarBlockRows ahead into
// L2 (a prefetch past the end of the storage is harmless: prefetches never fault).
inline constexpr int64_t kAheadBlockRows = 4, kFarBlockRows = 32;

// Rows [j, j + count) of head (b, h) as fp32 into out (count × dim, rows dim apart).
template <TensorType kType>
void widen_rows_of(const KvRows& r, int64_t b, int64_t h, int64_t j, int64_t count, float* out) {
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
      widen_block<kType>(blk, y);
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
