// Query tiles packed as bf16 pairs for the tiled kernels on the bf16 units (AVX512-BF16, Arm
// BF16; src/attention/bf16_products-inl.h), forward and backward, and on AMX tiles
// (src/attention/amx_unit-inl.h, flash_backward.cpp; in every pass). A tile of rows [i0, i0 + rows)
// of a view x (Q or dO) is packed one of two ways, as the product that reads it reduces:
//   over the head dim — Xt2[E/2][Mq]: word (p, r) = (x[r][2p], x[r][2p + 1]), a query a lane;
//   over the queries  — X2[Mq/2][E_pad]: word (p, e) = (x[2p][e], x[2p + 1][e]).
// Lanes and words past the tile's rows or past E are zero. An x that is not bf16 is packed as
// hi + lo, each rounded to nearest even (16 of its 24 bits kept), lo right after hi.
#if defined(QKV_ATTENTION_BF16_PACKING_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_BF16_PACKING_INL_H_
#undef QKV_ATTENTION_BF16_PACKING_INL_H_
#else
#define QKV_ATTENTION_BF16_PACKING_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <hwy/highway.h>

#include "attention/bf16_products-inl.h"
#include "attention/tiles-inl.h"
#include "qkv/number_format.h"
#include "simd/convert-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace tiles {

#if QKV_KERNEL_PASS
// Whether x is packed as hi + lo (it is not bf16).
inline bool packs_two(const View& x) { return x.type != TensorType::bf16; }

// f(r, e, hi, lo) for every element (i0 + r, e) of x, r < rows, e < E, with its bf16 hi and
// lo (lo 0 when x is bf16).
template <class F>
void for_each_split(const View& x, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t E,
                    F&& f) {
  with_element_type(x.type, [&](auto element) {
    using T = decltype(element);
    const T* x0 =
        static_cast<const T*>(x.address()) + b * x.stride[0] + h * x.stride[1] + i0 * x.stride[2];
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t e = 0; e < E; ++e) {
        const float v = simd::widen_one(x0[r * x.stride[2] + e * x.stride[3]]);
        const uint16_t hi = float_to_bf16(v);
        f(r, e, hi, packs_two(x) ? float_to_bf16(v - bf16_to_float(hi)) : uint16_t{0});
      }
  });
}

// Xt2 (pairs along the head dim, E even), hi at `to`, with `two` lo at to + E/2 · Mq (an x
// that holds bf16 values in fp32 needs no lo).
inline void pack_pairs_transposed(const View& x, int64_t b, int64_t h, int64_t i0, int64_t rows,
                                  int64_t E, int64_t Mq, uint32_t* to, bool two) {
  const int64_t pairs = E / 2;
  std::fill(to, to + (two ? 2 : 1) * pairs * Mq, 0u);
  if (x.type == TensorType::bf16 && x.stride[3] == 1) {  // pairs as they lie: words transposed
    const auto* x0 = static_cast<const uint16_t*>(x.address()) + b * x.stride[0] + h * x.stride[1] +
                     i0 * x.stride[2];
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t p = 0; p < pairs; ++p)
        std::memcpy(to + p * Mq + r, x0 + r * x.stride[2] + 2 * p, 4);
    return;
  }
  auto* half = reinterpret_cast<uint16_t*>(to);  // word w's halves are 2w, 2w + 1
  for_each_split(x, b, h, i0, rows, E, [&](int64_t r, int64_t e, uint16_t hi, uint16_t lo) {
    const int64_t word = e / 2 * Mq + r;
    half[2 * word + e % 2] = hi;
    if (two) half[2 * (pairs * Mq + word) + e % 2] = lo;
  });
}

// X2 (pairs along the queries, rows E_pad words apart), hi at `to`, lo at to + Mq/2 · E_pad.
inline void pack_row_pairs(const View& x, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t E,
                           int64_t E_pad, int64_t Mq, uint32_t* to) {
  const int64_t words = Mq / 2 * E_pad;
  const bool two = packs_two(x);
  std::fill(to, to + (two ? 2 : 1) * words, 0u);
#if defined(QKV_BF16_UNITS)
  if (!two && x.stride[3] == 1)  // bf16 rows interleaved in place
    return products::interleave_row_pairs(static_cast<const uint16_t*>(x.address()) +
                                              b * x.stride[0] + h * x.stride[1] + i0 * x.stride[2],
                                          x.stride[2], rows, E, to, E_pad);
#endif
  auto* half = reinterpret_cast<uint16_t*>(to);
  for_each_split(x, b, h, i0, rows, E, [&](int64_t r, int64_t e, uint16_t hi, uint16_t lo) {
    const int64_t word = r / 2 * E_pad + e;
    half[2 * word + r % 2] = hi;
    if (two) half[2 * (words + word) + r % 2] = lo;
  });
}
#endif  // QKV_KERNEL_PASS

}  // namespace tiles
}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
