// Attention dropout on a tile of softmax weights: Philox4x32-10 (attention/dropout.h) over the
// query lanes of a vector, eight key rows per counter (a 16-bit half of a word each). Per Highway
// target. The words are those of DropoutRule::words, bit for bit: integer arithmetic only, the same
// on every target.
#if defined(QKV_ATTENTION_DROPOUT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_DROPOUT_INL_H_
#undef QKV_ATTENTION_DROPOUT_INL_H_
#else
#define QKV_ATTENTION_DROPOUT_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include <hwy/highway.h>

#include "attention/dropout.h"
#include "simd/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace simd = ::qkv::simd::HWY_NAMESPACE;
namespace dropout {

namespace hn = simd::hn;
using Du = hn::RebindToUnsigned<simd::Df>;
using Vu = hn::Vec<Du>;

// hi:lo ← a · m, each lane's full 64-bit product (from the even and the odd lanes' products).
HWY_INLINE void multiply_wide(Vu a, Vu m, Vu& hi, Vu& lo) {
  const Du du;
  const hn::Repartition<uint64_t, Du> dw;
  const auto even = hn::MulEven(a, m);
  const auto odd = hn::MulEven(hn::BitCast(du, hn::ShiftRight<32>(hn::BitCast(dw, a))), m);
  lo = hn::OddEven(hn::BitCast(du, hn::ShiftLeft<32>(odd)), hn::BitCast(du, even));
  hi = hn::OddEven(hn::BitCast(du, odd), hn::BitCast(du, hn::ShiftRight<32>(even)));
}

// The four words of counters (c0, c1, c2, c3) under the rule's key, lane by lane, in place.
// (Four vectors, not an array: SVE's vectors may not be array elements.)
HWY_INLINE void philox(const DropoutRule& rule, Vu& c0, Vu& c1, Vu& c2, Vu& c3) {
  const Du du;
  const Vu m0 = hn::Set(du, kPhiloxM0), m1 = hn::Set(du, kPhiloxM1);
  uint32_t k0 = rule.key0, k1 = rule.key1;
  for (int r = 0; r < kPhiloxRounds; ++r) {
    Vu hi0, lo0, hi1, lo1;
    multiply_wide(c0, m0, hi0, lo0);
    multiply_wide(c2, m1, hi1, lo1);
    c0 = hn::Xor(hn::Xor(hi1, c1), hn::Set(du, k0));
    c1 = lo1;
    c2 = hn::Xor(hn::Xor(hi0, c3), hn::Set(du, k1));
    c3 = lo0;
    k0 += kPhiloxW0, k1 += kPhiloxW1;
  }
}

// to ← from · (0 or 1 / (1 − p)) on the score tile layout [Kt][Mq] of (b, h), query rows from
// i0 and key rows from j0 (a multiple of 8), over key rows [jj0, jj0 + keys) (jj0 a multiple of
// 8) and query vectors [v0, v0 + count). `to` may be `from`.
inline void drop_weights(const DropoutRule& rule, int64_t b, int64_t h, int64_t i0, int64_t j0,
                         int64_t jj0, int64_t keys, int64_t v0, int64_t count, int64_t Mq,
                         const float* from, float* to) {
  const Du du;
  const hn::RebindToSigned<Du> di;
  const int64_t N = static_cast<int64_t>(simd::lanes());
  // (Halves are below 2¹⁶: compared as signed integers.)
  const auto threshold = hn::Set(di, static_cast<int32_t>(rule.threshold));
  const Vu low = hn::Set(du, 0xFFFFu);
  const simd::Vf scale = hn::Set(simd::df, rule.keep_scale);
  const Vu head = hn::Set(du, rule.head_word(b, h)), offset = hn::Set(du, rule.offset);
  for (int64_t v = v0; v < v0 + count; ++v) {
    const Vu queries = hn::Add(hn::Iota(du, 0), hn::Set(du, static_cast<uint32_t>(i0 + v * N)));
    for (int64_t jj = jj0; jj < jj0 + keys; jj += kKeysPerCounter) {
      Vu c0 = queries, c1 = hn::Set(du, static_cast<uint32_t>((j0 + jj) / kKeysPerCounter));
      Vu c2 = head, c3 = offset;
      philox(rule, c0, c1, c2, c3);
      for (int64_t r = 0; r < kKeysPerCounter && jj + r < jj0 + keys; ++r) {
        const Vu word = r < 2 ? c0 : r < 4 ? c1 : r < 6 ? c2 : c3;
        const Vu half = r % 2 ? hn::ShiftRight<16>(word) : hn::And(word, low);
        const auto keep = hn::Not(hn::Lt(hn::BitCast(di, half), threshold));
        const int64_t at = (jj + r) * Mq + v * N;
        hn::Store(hn::IfThenElseZero(hn::RebindMask(simd::df, keep),
                                     hn::Mul(hn::Load(simd::df, from + at), scale)),
                  simd::df, to + at);
      }
    }
  }
}

}  // namespace dropout
}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
