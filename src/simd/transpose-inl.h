// Moving tiles between row-major rows (Q, out) and the transposed, query-per-lane layout of
// the tiled kernels (Qt, Ot; see simd-inl.h), a whole N × N block at a time in registers instead
// of element by element (for a 64-query tile of dim 128, ~8 times fewer instructions; the
// element loops cost ~2% of a causal forward at seq 2048).
// Per target, like simd-inl.h.
#if defined(QKV_SIMD_TRANSPOSE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_SIMD_TRANSPOSE_INL_H_
#undef QKV_SIMD_TRANSPOSE_INL_H_
#else
#define QKV_SIMD_TRANSPOSE_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "simd/convert-inl.h"
#include "simd/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::simd {
namespace HWY_NAMESPACE {

// Transposes the N × N block held in rows[0..N) (N = lanes): afterwards rows[c] holds what
// was column c. log2(N) rounds: round k pairs vectors and keeps the even lanes of each pair
// in the first half and the odd lanes in the second (vpermt2ps on AVX-512).
HWY_INLINE void transpose_square(VfSlot* rows) {
  constexpr size_t N = hn::MaxLanes(df);
  VfSlot paired[N];
  for (size_t width = 1; width < N; width *= 2) {
    for (size_t i = 0; i < N / 2; ++i) {
      paired[i] = hn::ConcatEven(df, rows[2 * i + 1], rows[2 * i]);
      paired[i + N / 2] = hn::ConcatOdd(df, rows[2 * i + 1], rows[2 * i]);
    }
    for (size_t i = 0; i < N; ++i) rows[i] = paired[i];
  }
}

// dst[c · dst_stride + r] = scale · src[r · src_stride + c] for r < rows, c < cols, and 0 in
// the lanes r in [rows, next multiple of N): packs a tile of rows into query-per-lane columns.
// Elements of a src row are contiguous, fp32, bf16 or fp16 (widened as they are loaded); dst is
// aligned, dst_stride a multiple of N.
template <class T>
HWY_INLINE void pack_transposed(const T* src, int64_t src_stride, int64_t rows, int64_t cols,
                                float scale, float* dst, int64_t dst_stride) {
  constexpr int64_t N = hn::MaxLanes(df);
  VfSlot block[N];
  for (int64_t r0 = 0; r0 < rows; r0 += N)
    for (int64_t c0 = 0; c0 < cols; c0 += N) {
      const size_t in_row = static_cast<size_t>(std::min(N, cols - c0));
      for (int64_t k = 0; k < N; ++k)
        block[k] =
            r0 + k < rows ? load_first_widened(src + (r0 + k) * src_stride + c0, in_row)
                           : hn::Zero(df);
      transpose_square(block);
      for (int64_t k = 0; k < std::min(N, cols - c0); ++k)
        hn::Store(hn::Mul(block[k], hn::Set(df, scale)), df, dst + (c0 + k) * dst_stride + r0);
    }
}

// dst[r · dst_stride + c] = src[c · src_stride + r] · row_scale[r] for r < rows, c < cols:
// the inverse of pack_transposed, with a scale per row. src and row_scale are aligned and
// hold whole vectors past `rows`. With `stream`, whole vectors landing on aligned addresses
// go out as non-temporal stores, around the caches (for outputs too large to stay there);
// the caller fences (hwy::FlushStream) before other threads read them. A bf16 or fp16 dst
// gets each element rounded to nearest even (and no streaming stores).
template <class T>
HWY_INLINE void unpack_transposed(const float* src, int64_t src_stride, int64_t rows, int64_t cols,
                                  const float* row_scale, T* dst, int64_t dst_stride,
                                  bool stream = false) {
  constexpr int64_t N = hn::MaxLanes(df);
  VfSlot block[N];
  for (int64_t r0 = 0; r0 < rows; r0 += N) {
    const Vf scale = hn::Load(df, row_scale + r0);
    for (int64_t c0 = 0; c0 < cols; c0 += N) {
      for (int64_t k = 0; k < N; ++k)
        block[k] = c0 + k < cols ? hn::Mul(hn::Load(df, src + (c0 + k) * src_stride + r0), scale)
                                 : hn::Zero(df);
      transpose_square(block);
      const size_t in_row = static_cast<size_t>(std::min(N, cols - c0));
      for (int64_t k = 0; k < std::min(N, rows - r0); ++k) {
        T* d = dst + (r0 + k) * dst_stride + c0;
        if constexpr (std::is_same_v<T, float>) {
          if (stream && c0 + N <= cols && reinterpret_cast<uintptr_t>(d) % 64 == 0) {
            hn::Stream(block[k], df, d);
            continue;
          }
        }
        store_first_rounded(block[k], d, in_row);
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace qkv::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
