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
#include <iterator>
#include <type_traits>

#include <hwy/highway.h>

#include "attention/kv_rows.h"
#include "qkv/number_format.h"
#include "qkv/tensor.h"
#include "simd/blocks-inl.h"
#include "simd/convert-inl.h"
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

// `count` rows of kType blocks, `stride` bytes apart from `row`, as fp32 into out (rows `dim`
// apart).
template <TensorType kType>
void widen_block_rows(const uint8_t* row, int64_t stride, int64_t count, int64_t dim, float* out) {
  const int64_t bytes = dim / kBlockValues * kBlockBytes<kType>, blocks = dim / kBlockValues;
  for (int64_t t = 0; t < count; ++t, row += stride) {
    for (int64_t line = 0; line < bytes; line += 64) {
      __builtin_prefetch(row + kAheadBlockRows * stride + line);
      __builtin_prefetch(row + kFarBlockRows * stride + line, 0, 1);
    }
    float* y = out + t * dim;
    const uint8_t* blk = row;
    for (int64_t k = 0; k < blocks; ++k, blk += kBlockBytes<kType>, y += kBlockValues)
      widen_block<kType>(blk, y);
  }
}
template <TensorType kType>
void widen_rows_of(const KvRows& r, int64_t b, int64_t h, int64_t j, int64_t count, float* out) {
  widen_block_rows<kType>(r.row(b, h, j), r.stride_bytes(), count, r.dim, out);
}

// The same for rows of T elements (fp32, bf16, fp16).
template <typename T>
void widen_element_rows(const uint8_t* row, int64_t stride, int64_t count, int64_t dim,
                        float* out) {
  const auto N = static_cast<int64_t>(simd::lanes());
  for (int64_t t = 0; t < count; ++t, row += stride) {
    for (int64_t line = 0; line < dim * static_cast<int64_t>(sizeof(T)); line += 64)
      __builtin_prefetch(row + kAheadBlockRows * stride + line);
    const T* x = reinterpret_cast<const T*>(row);
    float* y = out + t * dim;
    int64_t e = 0;
    for (; e + N <= dim; e += N) simd::hn::StoreU(simd::load_widened(x + e), simd::df, y + e);
    if (e < dim)
      simd::store_first_rounded(simd::load_first_widened(x + e, static_cast<size_t>(dim - e)),
                                y + e, static_cast<size_t>(dim - e));
  }
}

// Rows of any key/value row type (kv_row_types()) as fp32: what reads keys and values stored
// in two different formats multiplies (a cache with its own key and value formats).
inline void widen_rows_at(TensorType type, const uint8_t* row, int64_t stride, int64_t count,
                          int64_t dim, float* out) {
  static_assert(std::size(kKvElementTypes) == 3, "widen_rows_at: a case per element type");
  switch (type) {
    case TensorType::f32:
      return widen_element_rows<float>(row, stride, count, dim, out);
    case TensorType::bf16:
      return widen_element_rows<simd::Bf16>(row, stride, count, dim, out);
    case TensorType::f16:
      return widen_element_rows<simd::F16>(row, stride, count, dim, out);
    default:
      with_block_format(type, [&](auto format) {
        widen_block_rows<decltype(format)::value>(row, stride, count, dim, out);
      });
  }
}
// Rows [j, j + count) of head (b, h) of any row source as fp32 into out (count × dim, rows
// dim apart), run by run.
inline void widen_rows(const KvRows& r, int64_t b, int64_t h, int64_t j, int64_t count,
                       float* out) {
  r.each_run(j, count, [&](int64_t first, int64_t n) {
    widen_rows_at(r.type, r.row(b, h, first), r.stride_bytes(), n, r.dim,
                  out + (first - j) * r.dim);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
