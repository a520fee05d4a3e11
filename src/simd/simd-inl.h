// The SIMD ground floor every kernel builds on, compiled once per Highway target: the vector
// types, the lane count, the register file, the exp of the softmax, and a way to turn a
// runtime count into a template argument.
//
// A kernel file includes this after <hwy/foreach_target.h> (see src/simd/dispatch.h): each
// target gets its own copy in qkv::simd::HWY_NAMESPACE (N_AVX2, N_AVX3, …), and the include
// guard below flips with HWY_TARGET_TOGGLE so the file is read once per target.
//
// The tiled kernels put one *query* per vector lane: a vector holds the same key's score for
// N consecutive queries (N = 16 on AVX-512, 8 on AVX2, 4 on SSE4 and NEON). Row max and row
// sum of the softmax are then lane-wise max and add, with no horizontal reductions, and K and
// V are read as scalar broadcasts.
#if defined(QKV_SIMD_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_SIMD_SIMD_INL_H_
#undef QKV_SIMD_SIMD_INL_H_
#else
#define QKV_SIMD_SIMD_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace qkv::simd {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using Df = hn::ScalableTag<float>;
using Vf = hn::Vec<Df>;
inline constexpr Df df;
HWY_INLINE size_t lanes() { return hn::Lanes(df); }

// A vector kept in an array (accumulator blocks, transposes): Vf itself, except on SVE, whose
// vectors are sizeless types that C++ allows in no array or member. qkv compiles SVE for
// 256-bit vectors (HWY_SVE_256, with -msve-vector-bits=256), whose fixed-length type GCC
// converts to and from Vf implicitly.
#if HWY_TARGET == HWY_SVE_256
typedef svfloat32_t VfSlot __attribute__((arm_sve_vector_bits(256)));
#else
using VfSlot = Vf;
#endif

inline constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// Vector registers of this target: 16 on SSE4 and AVX2 (xmm/ymm0–15), 32 on AVX-512
// (zmm0–31) and on AArch64. Micro-kernels size their accumulator blocks from it, so that
// no inner loop spills (AVX-512's 4 × 6 blocks hold 24 accumulators and would spill on 16).
#if HWY_ARCH_X86
inline constexpr int kVectorRegisters =
    (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL) ? 32 : 16;
#else
inline constexpr int kVectorRegisters = 32;
#endif

// e^x for x <= 0 (softmax arguments after the max is subtracted), within 1.7e-7 relative.
// x = n ln2 + r with |r| <= ln2/2; e^r by a degree-5 polynomial; 2^n from the bits of
// t = x log2(e) + (1.5 · 2^23 + 127): adding 1.5 · 2^23 rounds x log2(e) to the integer n in
// t's low mantissa bits, already biased by 127, so shifting t left by 23 gives 2^n's bits
// (no round or convert instruction: this exp is ~30% cheaper, and the softmax of the tiled
// kernels is mostly exp). x is clamped at -88, where n = -127 and those bits are 0: -inf and
// every x below ~-87.7 give exactly 0, so a masked score gets exactly zero weight.
HWY_INLINE Vf exp_nonpositive(Vf x) {
  const hn::RebindToSigned<Df> di;
  // Clamped from below (e^-88 is near FLT_MIN) by a compare, not Max: a NaN score must stay
  // NaN, and Max drops NaN on some targets (NEON's maxnm, x86's max with NaN first).
  const Vf lowest = hn::Set(df, -88.0f);
  x = hn::IfThenElse(hn::Lt(x, lowest), lowest, x);
  const Vf shifter = hn::Set(df, 12582912.0f + 127.0f);
  const Vf t = hn::MulAdd(x, hn::Set(df, 1.44269504088896341f), shifter);
  const Vf n = hn::Sub(t, shifter);                       // round(x log2 e)
  Vf r = hn::NegMulAdd(n, hn::Set(df, 0.693359375f), x);  // ln2 split in two parts
  r = hn::NegMulAdd(n, hn::Set(df, -2.12194440e-4f), r);  // for an exact reduction
  // e^r on [-ln2/2, ln2/2]: degree-5 minimax for the relative error (1.7e-7 in fp32).
  Vf p = hn::Set(df, 8.290262892842293e-3f);
  p = hn::MulAdd(p, r, hn::Set(df, 4.1897937655448914e-2f));
  p = hn::MulAdd(p, r, hn::Set(df, 1.666763722896576e-1f));
  p = hn::MulAdd(p, r, hn::Set(df, 4.999915063381195e-1f));
  p = hn::MulAdd(p, r, hn::Set(df, 9.999997019767761e-1f));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f));
  return hn::Mul(p, hn::BitCast(df, hn::ShiftLeft<23>(hn::BitCast(di, t))));
}

// The first `count` floats at p in the low lanes, 0 in the rest; reads nothing past them.
// (Highway 1.0's MaskedLoad needs an aligned p on SSE4, and its BlendedStore there rewrites
// the whole vector, racing with whoever owns the floats past the end.)
HWY_INLINE Vf load_first(const float* p, size_t count) {
  if (count >= lanes()) return hn::LoadU(df, p);
  alignas(64) float part[hn::MaxLanes(df)] = {};
  std::copy_n(p, count, part);
  return hn::Load(df, part);
}

// Stores the low `count` lanes of v at p; writes nothing past them.
HWY_INLINE void store_first(Vf v, float* p, size_t count) {
  if (count >= lanes()) return hn::StoreU(v, df, p);
  alignas(64) float part[hn::MaxLanes(df)];
  hn::Store(v, df, part);
  std::copy_n(part, count, p);
}

// Calls f(std::integral_constant<int, k>) for the runtime k in [1, Max]: turns a tile's
// remainder size into a template argument so the micro-kernels keep their registers.
template <int Max, typename F>
HWY_INLINE void with_count(int k, F&& f) {
  if constexpr (Max >= 1) {
    if (k == Max) return f(std::integral_constant<int, Max>{});
    with_count<Max - 1>(k, std::forward<F>(f));
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace qkv::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
