// The 32-value block formats (Q8_0, Q4_0, Q4_1: ggml's, include/qkv/number_format.h) as the
// kernels widen them to fp32, one place per format: its layout (kDataOffset, kHasMin), its
// scale and offset (block_scale, block_min) and its values (block_ints, block_values). The
// attention kernels (attention/block_rows-inl.h, attention/decode_rows-inl.h) and the exact
// weight products (quant/matmul.cpp) read blocks through these; the reference dequantizer
// (src/quant/dequantize.cpp) is their oracle. Per Highway target, like simd-inl.h.
#if defined(QKV_SIMD_BLOCKS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_SIMD_BLOCKS_INL_H_
#undef QKV_SIMD_BLOCKS_INL_H_
#else
#define QKV_SIMD_BLOCKS_INL_H_
#endif

#include <cstdint>
#include <iterator>
#include <type_traits>
#include <utility>

#include <hwy/highway.h>

#include "qkv/error.h"
#include "qkv/number_format.h"
#include "simd/half-inl.h"
#include "util/type_switch.h"
#include "simd/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::simd {
namespace HWY_NAMESPACE {

inline constexpr int64_t kBlockValues = kKvBlockValues;

// Calls f(std::integral_constant<TensorType, T>{}) for the 32-value block format `type`, one of
// kKvBlockTypes (qkv/number_format.h, the one list): a format added there is instantiated
// here, and a kernel that does not know it fails to compile. Anything else: a qkv::Error.
template <typename F>
auto with_block_format(TensorType type, F&& f) {
  return ::qkv::detail::with_type_in<kKvBlockTypes>(type, "a 32-value block format",
                                                    std::forward<F>(f));
}

using ::qkv::kBlockBytes;  // (qkv/number_format.h)

// Each format's block: an fp16 scale d first, then (Q4_1) an fp16 offset m, then the values:
//   Q8_0  x = d · q            q: 32 int8
//   Q4_0  x = d · (q − 8)      q: 16 bytes of nibbles, value i < 16 byte i's low, 16 + i its high
//   Q4_1  x = d · q + m        the same nibbles
template <TensorType kType>
inline constexpr bool kHasMin = kType == TensorType::q4_1;
// The formats this file writes out; kernels that branch on a format assert it is one, so a new
// entry of kKvBlockTypes stops the build until each of them knows it.
template <TensorType kType>
inline constexpr bool kLaidOut =
    kType == TensorType::q8_0 || kType == TensorType::q4_0 || kType == TensorType::q4_1;
using ::qkv::kDataOffset;

// A block's scale d, and its offset m (0 for formats without one).
HWY_INLINE float block_scale(const uint8_t* blk) { return half_in_block(blk); }
template <TensorType kType>
HWY_INLINE float block_min(const uint8_t* blk) {
  if constexpr (kHasMin<kType>) return half_in_block(blk + 2);
  else return 0.0f;
}

// Values [i, i + N) of one block (N divides 32, i a multiple of N) as fp32 before the scale
// and offset: q, q − 8 or q as the format says. Kernels multiply by d (and add m) once per
// block, not once per vector.
template <TensorType kType>
HWY_INLINE Vf block_ints(const uint8_t* blk, int64_t i) {
  static_assert(kLaidOut<kType>, "block_ints: a block format without its layout here");
  const Df df;
  const hn::RebindToSigned<Df> di;
  const uint8_t* q = blk + kDataOffset<kType>;
  if constexpr (kType == TensorType::q8_0) {
    const hn::Rebind<int8_t, Df> di8;
    return hn::ConvertTo(df,
                         hn::PromoteTo(di, hn::LoadU(di8, reinterpret_cast<const int8_t*>(q) + i)));
  } else {
    const hn::Rebind<uint8_t, Df> du8;
    const auto v = hn::PromoteTo(di, hn::LoadU(du8, q + i % (kBlockValues / 2)));
    const auto n = i < kBlockValues / 2 ? hn::And(v, hn::Set(di, 15)) : hn::ShiftRight<4>(v);
    if constexpr (kHasMin<kType>) return hn::ConvertTo(df, n);
    else return hn::ConvertTo(df, hn::Sub(n, hn::Set(di, 8)));
  }
}

// Values [i, i + N) of one block, widened, scaled and offset: d · block_ints (+ m).
template <TensorType kType>
HWY_INLINE Vf block_values(const uint8_t* blk, int64_t i) {
  const Df df;
  const Vf d = hn::Set(df, block_scale(blk));
  if constexpr (kHasMin<kType>)
    return hn::MulAdd(d, block_ints<kType>(blk, i), hn::Set(df, block_min<kType>(blk)));
  else return hn::Mul(d, block_ints<kType>(blk, i));
}

// A whole block's values, widened, scaled and offset, into out[0, 32): d (and m) read once.
template <TensorType kType>
HWY_INLINE void widen_block(const uint8_t* blk, float* out) {
  const Df df;
  const Vf d = hn::Set(df, block_scale(blk));
  [[maybe_unused]] const Vf m = hn::Set(df, block_min<kType>(blk));
  for (int64_t i = 0; i < kBlockValues; i += static_cast<int64_t>(hn::Lanes(df))) {
    const Vf x = block_ints<kType>(blk, i);
    if constexpr (kHasMin<kType>) hn::StoreU(hn::MulAdd(d, x, m), df, out + i);
    else hn::StoreU(hn::Mul(d, x), df, out + i);
  }
}

// Values [e, e + N) of a row of blocks (e a multiple of N), widened.
template <TensorType kType>
HWY_INLINE Vf widen_vector(const uint8_t* row, int64_t e) {
  return block_values<kType>(row + e / kBlockValues * kBlockBytes<kType>, e % kBlockValues);
}

}  // namespace HWY_NAMESPACE
}  // namespace qkv::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
