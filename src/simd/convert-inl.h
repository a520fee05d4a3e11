// bf16 and fp16 elements in and out of fp32 vectors, per Highway target like simd-inl.h: the
// kernels read 16-bit q, k, v where they lie and widen them in registers (no converted copy in
// memory), and round their outputs to nearest even as they store them.
//
// Highway 1.0.3 rounds neither narrowing to nearest even everywhere (its f32 → bf16 truncates;
// its portable f32 → f16, the SSE4 path, truncates too) and its portable f16 → f32 reads
// infinities and NaNs as large numbers; those cases are written here. With F16C (qkv's AVX2
// and AVX-512 targets) and on AArch64 the hardware converts fp16 both ways.
#if defined(QKV_SIMD_CONVERT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_SIMD_CONVERT_INL_H_
#undef QKV_SIMD_CONVERT_INL_H_
#else
#define QKV_SIMD_CONVERT_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <hwy/highway.h>

#include "simd/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::simd {
namespace HWY_NAMESPACE {

using Bf16 = hwy::bfloat16_t;
using F16 = hwy::float16_t;
using Du32 = hn::RebindToUnsigned<Df>;
inline constexpr Du32 du32;

// fp16 conversions the hardware does not do on this target (x86 without F16C: SSE4).
#undef QKV_SOFTWARE_F16
#if HWY_ARCH_X86 && HWY_TARGET >= HWY_SSE4
#define QKV_SOFTWARE_F16 1
#else
#define QKV_SOFTWARE_F16 0
#endif

// Lanes of fp16 bits (in the low half of each u32 lane) widened exactly: normal numbers by
// rebiasing the exponent, subnormals through an fp32 subtraction, ±inf and NaN kept.
HWY_INLINE Vf widen_half_bits(hn::Vec<Du32> h) {
  const auto magnitude = hn::ShiftLeft<13>(hn::And(h, hn::Set(du32, 0x7fff)));
  const auto exponent = hn::And(magnitude, hn::Set(du32, 0x0f800000));
  auto bits = hn::Add(magnitude, hn::Set(du32, 112u << 23));  // 127 − 15
  // inf and NaN: exponent 31 becomes 255.
  bits = hn::IfThenElse(hn::Eq(exponent, hn::Set(du32, 0x0f800000)),
                        hn::Add(bits, hn::Set(du32, 112u << 23)), bits);
  // Zero and subnormals: m · 2^-24 = (2^-14 + m · 2^-24) − 2^-14, computed in fp32.
  const Vf subnormal = hn::Sub(hn::BitCast(df, hn::Add(bits, hn::Set(du32, 1u << 23))),
                               hn::BitCast(df, hn::Set(du32, 113u << 23)));
  bits = hn::IfThenElse(hn::Eq(exponent, hn::Zero(du32)), hn::BitCast(du32, subnormal), bits);
  const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du32, 0x8000)));
  return hn::BitCast(df, hn::Or(bits, sign));
}

// fp32 lanes rounded to fp16 bits, to nearest even (overflow to ±inf, NaN stays NaN), in the
// low half of each u32 lane.
HWY_INLINE hn::Vec<Du32> round_to_half_bits(Vf v) {
  const auto bits = hn::BitCast(du32, v);
  const auto sign = hn::And(hn::ShiftRight<16>(bits), hn::Set(du32, 0x8000));
  const auto magnitude = hn::And(bits, hn::Set(du32, 0x7fffffff));
  // Normal halves: rebias and round the 13 dropped bits to even (a carry moves on into the
  // exponent, and past the largest half into inf, as it should).
  const auto odd = hn::And(hn::ShiftRight<13>(magnitude), hn::Set(du32, 1));
  const auto normal = hn::ShiftRight<13>(
      hn::Add(hn::Sub(magnitude, hn::Set(du32, 112u << 23)), hn::Add(hn::Set(du32, 0xfff), odd)));
  // Below 2^-14: adding 0.5 (2^-1) to |v| puts |v| · 2^24 rounded to even in the low mantissa
  // bits (the fp32 add rounds), and subtracting 0.5's bits leaves them.
  const auto half_bits = hn::Set(du32, 126u << 23);
  const auto subnormal =
      hn::Sub(hn::BitCast(du32, hn::Add(hn::BitCast(df, magnitude), hn::BitCast(df, half_bits))),
              half_bits);
  const hn::RebindToSigned<Df> di;
  const auto as_int = hn::BitCast(di, magnitude);
  auto out = hn::IfThenElse(hn::RebindMask(du32, hn::Lt(as_int, hn::Set(di, 0x38800000))),
                            subnormal, normal);
  // ≥ 65520 rounds past the largest half: inf; NaN: a quiet NaN.
  out = hn::IfThenElse(hn::RebindMask(du32, hn::Gt(as_int, hn::Set(di, 0x477fefff))),
                       hn::Set(du32, 0x7c00), out);
  out = hn::IfThenElse(hn::RebindMask(du32, hn::Gt(as_int, hn::Set(di, 0x7f800000))),
                       hn::Set(du32, 0x7e00), out);
  return hn::Or(out, sign);
}

// fp32 lanes rounded to bf16 bits, to nearest even; a NaN keeps a mantissa bit.
HWY_INLINE hn::Vec<Du32> round_to_bf16_bits(Vf v) {
  const auto bits = hn::BitCast(du32, v);
  const auto odd = hn::And(hn::ShiftRight<16>(bits), hn::Set(du32, 1));
  const auto rounded = hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du32, 0x7fff), odd)));
  const auto nan = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du32, 0x40));
  return hn::IfThenElse(hn::RebindMask(du32, hn::Ne(v, v)), nan, rounded);
}

// ---- Whole vectors ------------------------------------------------------------------------

// N elements at p (unaligned) as fp32 lanes.
HWY_INLINE Vf load_widened(const float* p) { return hn::LoadU(df, p); }
HWY_INLINE Vf load_widened(const Bf16* p) {
  const hn::Rebind<Bf16, Df> d;
  return hn::PromoteTo(df, hn::LoadU(d, p));
}
HWY_INLINE Vf load_widened(const F16* p) {
#if QKV_SOFTWARE_F16
  const hn::Rebind<uint16_t, Df> du16;
  return widen_half_bits(hn::PromoteTo(du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p))));
#else
  const hn::Rebind<F16, Df> d;
  return hn::PromoteTo(df, hn::LoadU(d, p));
#endif
}

// 2N bf16 elements at p (unaligned) as two fp32 vectors without reordering lanes: `even`
// holds p[0], p[2], …, `odd` p[1], p[3], … (one load, a shift and a mask for 2N elements,
// where load_widened takes a widening load and a shift for N). For sums over the elements
// (dot products, P·V accumulated per column) whose other operand is laid out to match.
HWY_INLINE void load_pair_widened(const Bf16* p, Vf& even, Vf& odd) {
  const auto u = hn::LoadU(du32, reinterpret_cast<const uint32_t*>(p));
  even = hn::BitCast(df, hn::ShiftLeft<16>(u));
  odd = hn::BitCast(df, hn::And(u, hn::Set(du32, 0xffff0000u)));
}

// v rounded to nearest even into N elements at p (unaligned).
HWY_INLINE void store_rounded(Vf v, float* p) { hn::StoreU(v, df, p); }
HWY_INLINE void store_rounded(Vf v, Bf16* p) {
  const hn::Rebind<uint16_t, Df> du16;
  hn::StoreU(hn::DemoteTo(du16, hn::BitCast(hn::RebindToSigned<Df>(), round_to_bf16_bits(v))),
             du16, reinterpret_cast<uint16_t*>(p));
}
HWY_INLINE void store_rounded(Vf v, F16* p) {
#if QKV_SOFTWARE_F16
  const hn::Rebind<uint16_t, Df> du16;
  hn::StoreU(hn::DemoteTo(du16, hn::BitCast(hn::RebindToSigned<Df>(), round_to_half_bits(v))),
             du16, reinterpret_cast<uint16_t*>(p));
#else
  const hn::Rebind<F16, Df> d;
  hn::StoreU(hn::DemoteTo(d, v), d, p);
#endif
}

// The first `count` elements at p widened into the low lanes, 0 in the rest; reads nothing
// past them (like load_first of floats).
template <class T>
HWY_INLINE Vf load_first_widened(const T* p, size_t count) {
  if (count >= lanes()) return load_widened(p);
  T part[hn::MaxLanes(df)] = {};
  std::memcpy(part, p, count * sizeof(T));
  return load_widened(part);
}

// The low `count` lanes of v rounded into elements at p; writes nothing past them.
template <class T>
HWY_INLINE void store_first_rounded(Vf v, T* p, size_t count) {
  if (count >= lanes()) return store_rounded(v, p);
  T part[hn::MaxLanes(df)];
  store_rounded(v, part);
  std::memcpy(p, part, count * sizeof(T));
}

// ---- Single elements, broadcast -----------------------------------------------------------

// Every lane = the element at p, widened.
HWY_INLINE Vf broadcast_widened(const float* p) { return hn::Set(df, *p); }
HWY_INLINE Vf broadcast_widened(const Bf16* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return hn::BitCast(df, hn::Set(du32, uint32_t{bits} << 16));
}
HWY_INLINE Vf broadcast_widened(const F16* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#if QKV_SOFTWARE_F16
  return widen_half_bits(hn::Set(du32, bits));
#else
  const hn::Rebind<uint16_t, Df> du16;
  const hn::Rebind<F16, Df> d;
  return hn::PromoteTo(df, hn::BitCast(d, hn::Set(du16, bits)));
#endif
}

// One element as fp32.
HWY_INLINE float widen_one(float x) { return x; }
HWY_INLINE float widen_one(Bf16 x) { return hwy::F32FromBF16(x); }
HWY_INLINE float widen_one(F16 x) { return hn::GetLane(broadcast_widened(&x)); }

// Elements p[0] and p[1] broadcast into x0 and x1: for bf16 one 32-bit load serves both (a
// shift and a mask), as cheap as two fp32 broadcasts.
template <class T>
HWY_INLINE void broadcast_pair(const T* p, Vf& x0, Vf& x1) {
  if constexpr (std::is_same_v<T, Bf16>) {
    uint32_t pair;
    std::memcpy(&pair, p, 4);
    const auto u = hn::Set(du32, pair);
    x0 = hn::BitCast(df, hn::ShiftLeft<16>(u));
    x1 = hn::BitCast(df, hn::And(u, hn::Set(du32, 0xffff0000u)));
  } else {
    x0 = broadcast_widened(p);
    x1 = broadcast_widened(p + 1);
  }
}

// Elements p[0, 4) broadcast into x[0, 4). Where fp16 is widened in software (SSE4) one
// widening of a 4-lane vector and four lane broadcasts serve all four (the widening is ~15
// instructions: per element it made the fp16 tiled forward 2.4× slower than fp32); elsewhere
// as two broadcast_pair.
template <class T>
HWY_INLINE void broadcast_four(const T* p, VfSlot* x) {
#if QKV_SOFTWARE_F16
  if constexpr (std::is_same_v<T, F16>) {
    static_assert(hn::MaxLanes(df) == 4, "software fp16 is the SSE4 target's");
    const hn::Rebind<uint16_t, Df> du16;
    const Vf w = widen_half_bits(hn::PromoteTo(du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p))));
    x[0] = hn::Broadcast<0>(w), x[1] = hn::Broadcast<1>(w);
    x[2] = hn::Broadcast<2>(w), x[3] = hn::Broadcast<3>(w);
    return;
  }
#endif
  Vf x0, x1, x2, x3;
  broadcast_pair(p, x0, x1);
  broadcast_pair(p + 2, x2, x3);
  x[0] = x0, x[1] = x1, x[2] = x2, x[3] = x3;
}

// Whether broadcast_four is cheaper than two broadcast_pair for T on this target.
template <class T>
inline constexpr bool kBroadcastFours = QKV_SOFTWARE_F16 && std::is_same_v<T, F16>;

}  // namespace HWY_NAMESPACE
}  // namespace qkv::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
