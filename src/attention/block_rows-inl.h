// Keys and values stored in 32-value blocks (a key/value cache in Q8_0 or Q4_0), as the
// attention kernels read them: split-KV decoding widens a block's values in registers
// (block_ints, block_scale) as it multiplies them; the tiled kernels widen a tile of rows at
// a time to fp32 in the thread's scratch (widen_rows), where the fp32 micro-kernels multiply
// them. Each stored byte is read once per pass and the cache is never copied whole. Per
// Highway target, like src/simd/simd-inl.h.
//
// Strides count values, as for every view (include/qkv/attention.h, StoredKV): position j of
// head h, sequence b begins at value b · batch_stride + h · head_stride + j · row_stride, whose
// block is that offset / 32.
#if defined(QKV_ATTENTION_BLOCK_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_BLOCK_ROWS_INL_H_
#undef QKV_ATTENTION_BLOCK_ROWS_INL_H_
#else
#define QKV_ATTENTION_BLOCK_ROWS_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include <hwy/highway.h>

#include "qkv/number_format.h"
#include "qkv/tensor.h"
#include "quant/half-inl.h"
#include "simd/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace simd = ::qkv::simd::HWY_NAMESPACE;

inline constexpr int64_t kBlockValues = 32;

// Whether attention reads this key/value type as blocks.
inline bool is_block_type(TensorType t) { return t == TensorType::q8_0 || t == TensorType::q4_0; }

struct BlockRows {
  TensorType type = TensorType::q8_0;
  const uint8_t* data = nullptr;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;  // in values
  int64_t dim = 0;                                            // values per row
  int64_t block_bytes = 0;

  const uint8_t* row(int64_t b, int64_t h, int64_t j) const {
    return data + (b * batch_stride + h * head_stride + j * row_stride) / kBlockValues * block_bytes;
  }
  int64_t row_bytes() const { return dim / kBlockValues * block_bytes; }
  int64_t stride_bytes() const { return row_stride / kBlockValues * block_bytes; }
};

// The rows of a Q8_0 or Q4_0 view [B, H, T, dim].
inline BlockRows block_rows(const View& v) {
  BlockRows r;
  r.type = v.type;
  r.data = static_cast<const uint8_t*>(v.elements);
  r.batch_stride = v.stride[0], r.head_stride = v.stride[1], r.row_stride = v.stride[2];
  r.dim = v.shape[3];
  r.block_bytes = block_size(static_cast<uint32_t>(v.type))->bytes;
  return r;
}

template <TensorType kType>
inline constexpr int64_t kBlockBytes = block_size(static_cast<uint32_t>(kType))->bytes;

// A block's fp16 scale d. On x86 the conversion reads its operand from memory: 8 bytes (the
// scale and the block's first values), one instruction instead of an insert and a convert.
HWY_INLINE float block_scale(const uint8_t* blk) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk))));
#else
  return quant::HWY_NAMESPACE::half(blk);
#endif
}

// Values [i, i + N) of one block (N divides 32, i a multiple of N) as fp32, before the scale:
// q (Q8_0), or q − 8 (Q4_0, whose value i < 16 is byte i's low nibble, value 16 + i its high).
// Kernels multiply by d once per block, not once per vector.
template <TensorType kType>
HWY_INLINE simd::Vf block_ints(const uint8_t* blk, int64_t i) {
  namespace hn = simd::hn;
  const simd::Df df;
  const hn::RebindToSigned<simd::Df> di;
  if constexpr (kType == TensorType::q8_0) {
    const hn::Rebind<int8_t, simd::Df> di8;
    return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(di8, reinterpret_cast<const int8_t*>(blk + 2) + i)));
  } else {
    const hn::Rebind<uint8_t, simd::Df> du8;
    const auto v = hn::PromoteTo(di, hn::LoadU(du8, blk + 2 + i % (kBlockValues / 2)));
    const auto q = i < kBlockValues / 2 ? hn::And(v, hn::Set(di, 15)) : hn::ShiftRight<4>(v);
    return hn::ConvertTo(df, hn::Sub(q, hn::Set(di, 8)));
  }
}

// Values [e, e + N) of a row of blocks (e a multiple of N), widened and scaled: d · block_ints.
template <TensorType kType>
HWY_INLINE simd::Vf widen_vector(const uint8_t* row, int64_t e) {
  const uint8_t* blk = row + e / kBlockValues * kBlockBytes<kType>;
  return simd::hn::Mul(simd::hn::Set(simd::Df(), block_scale(blk)),
                       block_ints<kType>(blk, e % kBlockValues));
}

// Rows this far ahead are asked for into L1 as a row is widened, and kFarBlockRows ahead into
// L2 (a prefetch past the end of the storage is harmless: prefetches never fault).
inline constexpr int64_t kAheadBlockRows = 4, kFarBlockRows = 32;

// Rows [j, j + count) of head (b, h) as fp32 into out (count × dim, rows dim apart).
inline void widen_rows(const BlockRows& r, int64_t b, int64_t h, int64_t j, int64_t count,
                       float* out) {
  namespace hn = simd::hn;
  const simd::Df df;
  const hn::RebindToSigned<simd::Df> di;
  const hn::Rebind<int8_t, simd::Df> di8;
  const hn::Rebind<uint8_t, simd::Df> du8;
  const size_t N = hn::Lanes(df);
  const int64_t stride = r.stride_bytes(), bytes = r.row_bytes(), blocks = r.dim / kBlockValues;
  const uint8_t* row = r.row(b, h, j);
  for (int64_t t = 0; t < count; ++t, row += stride) {
    for (int64_t line = 0; line < bytes; line += 64) {
      __builtin_prefetch(row + kAheadBlockRows * stride + line);
      __builtin_prefetch(row + kFarBlockRows * stride + line, 0, 1);
    }
    float* y = out + t * r.dim;
    const uint8_t* blk = row;
    if (r.type == TensorType::q8_0) {
      for (int64_t k = 0; k < blocks; ++k, blk += r.block_bytes, y += kBlockValues) {
        const auto d = hn::Set(df, quant::HWY_NAMESPACE::half(blk));
        const auto* q = reinterpret_cast<const int8_t*>(blk + 2);
        for (size_t i = 0; i < size_t{kBlockValues}; i += N)
          hn::StoreU(hn::Mul(d, hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(di8, q + i)))), df,
                     y + i);
      }
    } else {  // Q4_0: x = d · (q − 8); low nibbles are values 0–15, high nibbles 16–31
      for (int64_t k = 0; k < blocks; ++k, blk += r.block_bytes, y += kBlockValues) {
        const float dv = quant::HWY_NAMESPACE::half(blk);
        const auto d = hn::Set(df, dv), offset = hn::Set(df, -8.0f * dv);
        for (size_t i = 0; i < size_t{kBlockValues / 2}; i += N) {
          const auto v = hn::PromoteTo(di, hn::LoadU(du8, blk + 2 + i));
          hn::StoreU(hn::MulAdd(d, hn::ConvertTo(df, hn::And(v, hn::Set(di, 15))), offset), df,
                     y + i);
          hn::StoreU(hn::MulAdd(d, hn::ConvertTo(df, hn::ShiftRight<4>(v)), offset), df,
                     y + kBlockValues / 2 + i);
        }
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
