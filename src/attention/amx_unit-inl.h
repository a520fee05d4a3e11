// The tile unit of the tiled forward and of decoding's tiles (tile_units-inl.h) on Intel's
// AMX-BF16 tiles, over bf16 keys and values, written once over the tile layer of
// src/simd/amx.h: Tiles is amx::Hardware (the instructions) or amx::Emulated (the stand-in,
// any CPU). The layouts are the tiled kernels' own (one query per lane: S [Kt][Mq],
// Ot [Dv][Mq]), so the softmax, the mask and every score option stay the vector code they are.
//   S = K Qt:   C [16 keys][N queries] += A [16 keys][32 dims] · B [16 dim pairs][N queries]:
//               A is 16 key rows loaded in place (a row's stride in bytes), B the queries packed
//               as bf16 pairs along the head dim (Qt2, bf16_packing-inl.h; hi + lo, two
//               products, unless q is bf16), C stored into S and scaled there.
//   Oᵀ += Vᵀ P: C [16 dims][N queries] (Ot loaded after alpha scaled it, stored back) +=
//               A [16 dims][32 keys] · B [16 key pairs][N queries]: A is V transposed per key
//               tile (Vt16 [Dv][kVtKeys] bf16, zero past the tile's keys), B is P rounded to
//               bf16 pairs of key rows in place in S (zero pairs up to whole 16s).
// Tiles: 0–3 the accumulators (2 × 2 blocks), 4–5 A, 6–7 B; one configuration for both
// products (C and B: 16 rows of N lanes, A: 16 rows of 64 bytes), set by begin() on the thread
// that runs a unit of work and released by end(). A head dim that is not whole 32s or a value
// dim not whole 16s does not fit (the caller keeps the other units for it): a tile row is 32
// bf16 values, and a tile row read past a key row's end would read the next row's values.
// Per target, like src/simd/simd-inl.h: the stand-in runs under every target.
#if defined(QKV_ATTENTION_AMX_UNIT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_AMX_UNIT_INL_H_
#undef QKV_ATTENTION_AMX_UNIT_INL_H_
#else
#define QKV_ATTENTION_AMX_UNIT_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <hwy/highway.h>

#include "attention/bf16_packing-inl.h"
#include "attention/plan.h"
#include "attention/tiles-inl.h"
#include "qkv/error.h"
#include "qkv/tensor.h"
#include "simd/amx.h"
#include "simd/cpu.h"
#include "simd/transpose-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace tiles {

// The unit is compiled for x86-64's AVX2 and AVX-512 targets only: a CPU with AMX runs the
// AVX-512 ones, and the stand-in's tests run under both vector widths. Elsewhere (SSE4, Arm)
// the plan never chooses it (run_on_amx says no).
#undef QKV_AMX_UNIT
#if QKV_KERNEL_PASS && HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define QKV_AMX_UNIT 1
#else
#define QKV_AMX_UNIT 0
#endif
inline constexpr bool kAmxUnit = QKV_AMX_UNIT;

#if QKV_AMX_UNIT
// The bf16 bits of x rounded to nearest even, in the low half of each 32-bit lane (NaN stays
// NaN: its quiet bit is set before rounding can carry it into the exponent).
HWY_INLINE auto bf16_bits(simd::Vf x) {
  namespace hn = simd::hn;
  const hn::RebindToUnsigned<simd::Df> du;
  const auto u = hn::BitCast(du, x);
  const auto odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), odd)));
  const auto quiet = hn::ShiftRight<16>(hn::Or(u, hn::Set(du, 0x00400000u)));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(x)), quiet, rounded);
}

template <class Tiles>
struct AmxUnit {
  using TileSet = Tiles;
  static constexpr bool kBf16Dot = true;       // queries as bf16 pairs (hi + lo unless bf16)
  static constexpr bool kScalesScores = true;  // queries packed unscaled, scores scaled after
  static constexpr int64_t kDepth = kAmxDepth;  // bf16 values a tile row (64 bytes)
  static constexpr int64_t kBlock = kAmxBlock;  // tile rows: keys of S, dims of Ot, pairs of B
  // Vt16's row: the key tile and the zeros a depth-32 step may read past its last key.
  static constexpr int64_t kVtKeys = kKeyTile + kDepth;
  static constexpr int64_t kMostHeadDim = kAmxMostHeadDim;  // (plan.h: amx_fits)

  // The tiles' shapes for this target's N lanes, on this thread; end() releases them.
  static void begin() {
    const int lane_bytes = static_cast<int>(4 * simd::lanes());
    amx::Config config;
    for (int t = 0; t < 4; ++t) config.tile(t, kBlock, lane_bytes);
    config.tile(4, kBlock, 2 * kDepth).tile(5, kBlock, 2 * kDepth);
    config.tile(6, kBlock, lane_bytes).tile(7, kBlock, lane_bytes);
    Tiles::configure(config);
  }
  static void end() { Tiles::release(); }

  // Qt2 [D/2][Mq] words of bf16 pairs of q, unscaled (hi; with `two`, lo after it).
  static void pack_queries(const View& q, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t D,
                           int64_t Mq, float /*scale*/, bool two, float* Qt) {
    pack_pairs_transposed(q, b, h, i0, rows, D, Mq, reinterpret_cast<uint32_t*>(Qt), two);
  }

  // Vt16 [Dv][kVtKeys] ← the nk value rows transposed, zero past them (fits in the Dv ×
  // kKeyTile floats of the caller's Vt). N × N blocks widened to fp32 (exactly), transposed
  // in registers and narrowed back.
  template <class T>
  static void pack_values(const T* v, int64_t vs, int64_t nk, int64_t Dv, float* Vt) {
    static_assert(std::is_same_v<T, simd::Bf16>, "the AMX unit multiplies bf16 values");
    namespace hn = simd::hn;
    const hn::RebindToSigned<simd::Df> di;
    const hn::Rebind<uint16_t, decltype(di)> du16;
    constexpr int64_t N = hn::MaxLanes(simd::df);
    auto* vt = reinterpret_cast<uint16_t*>(Vt);
    simd::VfSlot block[N];
    for (int64_t r0 = 0; r0 < nk; r0 += N)
      for (int64_t c0 = 0; c0 < Dv; c0 += N) {
        const size_t in_row = static_cast<size_t>(std::min(N, Dv - c0));
        for (int64_t k = 0; k < N; ++k)
          block[k] = r0 + k < nk ? simd::load_first_widened(v + (r0 + k) * vs + c0, in_row)
                                 : hn::Zero(simd::df);
        simd::transpose_square(block);
        for (int64_t k = 0; k < static_cast<int64_t>(in_row); ++k) {
          const auto bits = hn::ShiftRight<16>(hn::BitCast(di, block[k]));
          hn::StoreU(hn::DemoteTo(du16, hn::And(bits, hn::Set(di, 0xffff))), du16,
                     vt + (c0 + k) * kVtKeys + r0);
        }
      }
    const int64_t written = (nk + N - 1) / N * N;
    for (int64_t d = 0; d < Dv; ++d)
      std::fill(vt + d * kVtKeys + written, vt + (d + 1) * kVtKeys, uint16_t{0});
  }
  // From key row jj on.
  static const float* values_from(const float* Vt, int64_t jj, int64_t /*Dv*/) {
    return reinterpret_cast<const float*>(reinterpret_cast<const uint16_t*>(Vt) + jj);
  }

  // S [nk][Mq] ← scale · K Qt for nk key rows (ks apart), NQV query vectors. Rows of S up to
  // the next 16 past nk are written too (the tile's rows; S has kKeyTile rows).
  template <int NQV, class T>
  static void scores(const T* k, int64_t ks, int64_t nk, const float* Qt, int64_t D, int64_t Mq,
                     bool two, float scale, float* S, products::PrefetchQueue* /*prefetch*/) {
    static_assert(std::is_same_v<T, simd::Bf16>, "the AMX unit multiplies bf16 keys");
    const auto* k16 = reinterpret_cast<const uint16_t*>(k);
    const auto* q2 = reinterpret_cast<const uint32_t*>(Qt);
    const int64_t N = static_cast<int64_t>(simd::lanes()), whole = nk / kBlock * kBlock;
    // A last block of fewer than 16 keys is copied out, zero-padded: a tile reads 16 rows.
    alignas(64) uint16_t staged[kBlock * kMostHeadDim];
    if (whole < nk) {
      std::memset(staged, 0, sizeof(uint16_t) * kBlock * D);
      for (int64_t r = 0; r < nk - whole; ++r)
        std::memcpy(staged + r * D, k16 + (whole + r) * ks, 2 * D);
    }
    const auto key_block = [&](int64_t j, int64_t& stride) {
      stride = j < whole ? 2 * ks : 2 * D;
      return j < whole ? k16 + j * ks : staged;
    };
    for (int64_t j = 0; j < nk; j += 2 * kBlock)
      for (int v = 0; v < NQV; v += 2) {
        int64_t as0 = 0, as1 = 0;
        const uint16_t* a0 = key_block(j, as0);
        const uint16_t* a1 = j + kBlock < nk ? key_block(j + kBlock, as1) : nullptr;
        const auto product = [&](auto keys2, auto vectors2) {
          constexpr bool kKeys2 = decltype(keys2)::value, kVectors2 = decltype(vectors2)::value;
          zero_accumulators<kKeys2, kVectors2>();
          for (int half = 0; half < (two ? 2 : 1); ++half)
            for (int64_t c = 0; c < D; c += kDepth) {
              const uint32_t* b0 = q2 + half * D / 2 * Mq + c / 2 * Mq + v * N;
              multiply<kKeys2, kVectors2>(a0 + c, as0, a1 ? a1 + c : nullptr, as1, b0, b0 + N,
                                          4 * Mq);
            }
          store_accumulators<kKeys2, kVectors2>(S + j * Mq + v * N, S + (j + kBlock) * Mq + v * N,
                                                N, 4 * Mq);
        };
        with_blocks(a1 != nullptr, v + 1 < NQV, product);
      }
    namespace hn = simd::hn;
    for (int64_t jj = 0; jj < nk; ++jj)
      for (int v = 0; v < NQV; ++v) {
        float* s = S + jj * Mq + v * N;
        hn::Store(hn::Mul(hn::Load(simd::df, s), hn::Set(simd::df, scale)), simd::df, s);
      }
  }

  // P rounded into bf16 pairs of key rows in place (zero pairs up to a whole 16), then
  // Ot [Dv][Mq] ← alpha Ot + Vt16ᵀ P, NQV query vectors.
  template <int NQV>
  static void accumulate(float* S, int64_t nk, int64_t Mq, const float* Vt, int64_t Dv,
                         const float* alpha, float* Ot, products::PrefetchQueue* /*prefetch*/) {
    namespace hn = simd::hn;
    const int64_t N = static_cast<int64_t>(simd::lanes());
    pairs_in_place<NQV>(S, nk, Mq);
    for (int64_t d = 0; d < Dv; ++d)
      for (int v = 0; v < NQV; ++v) {
        float* o = Ot + d * Mq + v * N;
        hn::Store(hn::Mul(hn::Load(simd::df, o), hn::Load(simd::df, alpha + v * N)), simd::df, o);
      }
    columns_product<NQV>(reinterpret_cast<const uint16_t*>(Vt), reinterpret_cast<uint32_t*>(S), nk,
                         Mq, Dv, Ot, true);
  }

  // The steps the backward's products share with these (flash_backward.cpp).

  // Rows [0, nk) of S [·][Mq] (NQV query vectors) rounded to bf16 and interleaved in pairs of
  // rows in place: word (p, q) = (S[2p][q], S[2p + 1][q]), zero past nk and in the pairs up to
  // a whole 16. Returns those pairs' count.
  template <int NQV>
  static int64_t pairs_in_place(float* S, int64_t nk, int64_t Mq) {
    namespace hn = simd::hn;
    const hn::RebindToUnsigned<simd::Df> du;
    const int64_t N = static_cast<int64_t>(simd::lanes());
    const int64_t pairs = (nk + 1) / 2, padded = (pairs + kBlock - 1) / kBlock * kBlock;
    auto* words = reinterpret_cast<uint32_t*>(S);
    for (int64_t p = 0; p < padded; ++p)
      for (int v = 0; v < NQV; ++v) {
        auto word = hn::Zero(du);
        if (p < pairs) {
          const auto lo = bf16_bits(hn::Load(simd::df, S + 2 * p * Mq + v * N));
          const auto hi = 2 * p + 1 < nk
                              ? bf16_bits(hn::Load(simd::df, S + (2 * p + 1) * Mq + v * N))
                              : hn::Zero(du);
          word = hn::Or(lo, hn::ShiftLeft<16>(hi));
        }
        hn::Store(word, du, words + p * Mq + v * N);
      }
    return padded;
  }

  // C [rows][Mq] (+)= A B over `keys` keys for NQV query vectors: A [rows][kVtKeys] bf16 (a
  // transposed tile as pack_values leaves it, rows whole 16s), B the keys' pair rows of words
  // (Mq apart, zero up to a whole 16 pairs: pairs_in_place). C is loaded first when `add`, else
  // the sum starts from zero. A last step reaching past the keys reads A through a copy that is
  // zero past them: the columns there may be keys hidden from these queries, and 0 · Inf is
  // NaN.
  template <int NQV>
  static void columns_product(const uint16_t* a, const uint32_t* b, int64_t keys, int64_t Mq,
                              int64_t rows, float* c, bool add) {
    const int64_t N = static_cast<int64_t>(simd::lanes());
    const int64_t pairs = ((keys + 1) / 2 + kBlock - 1) / kBlock * kBlock;
    alignas(64) uint16_t staged[2 * kBlock * kDepth];
    for (int64_t d = 0; d < rows; d += 2 * kBlock)
      for (int v = 0; v < NQV; v += 2) {
        const bool rows2 = d + kBlock < rows;
        const auto product = [&](auto rows2_, auto vectors2) {
          constexpr bool kRows2 = decltype(rows2_)::value, kVectors2 = decltype(vectors2)::value;
          float* c0 = c + d * Mq + v * N;
          float* c1 = c + (d + kBlock) * Mq + v * N;
          if (add) load_accumulators<kRows2, kVectors2>(c0, c1, N, 4 * Mq);
          else zero_accumulators<kRows2, kVectors2>();
          for (int64_t p = 0; p < pairs; p += kBlock) {
            const uint16_t* a0 = a + d * kVtKeys + 2 * p;
            int64_t a_stride = 2 * kVtKeys;
            if (2 * p + kDepth > keys) {
              std::fill_n(staged, 2 * kBlock * kDepth, uint16_t{0});
              for (int64_t r = 0; r < (rows2 ? 2 : 1) * kBlock; ++r)
                std::copy_n(a0 + r * kVtKeys, keys - 2 * p, staged + r * kDepth);
              a0 = staged, a_stride = 2 * kDepth;
            }
            const uint32_t* b0 = b + p * Mq + v * N;
            multiply<kRows2, kVectors2>(a0, a_stride, a0 + kBlock * (a_stride / 2), a_stride, b0,
                                        b0 + N, 4 * Mq);
          }
          store_accumulators<kRows2, kVectors2>(c0, c1, N, 4 * Mq);
        };
        with_blocks(rows2, v + 1 < NQV, product);
      }
  }

  // f(rows2, columns2) with each a std::integral_constant<bool>: whether the 2 × 2 block of
  // accumulators has its second row of tiles (A 5) and its second column (B 7).
  template <class F>
  static void with_blocks(bool rows2, bool columns2, F&& f) {
    using Yes = std::true_type;
    using No = std::false_type;
    if (rows2 && columns2) f(Yes{}, Yes{});
    else if (rows2) f(Yes{}, No{});
    else if (columns2) f(No{}, Yes{});
    else f(No{}, No{});
  }
  template <bool kRows2, bool kColumns2>
  static void zero_accumulators() {
    Tiles::template zero<0>();
    if constexpr (kColumns2) Tiles::template zero<1>();
    if constexpr (kRows2) Tiles::template zero<2>();
    if constexpr (kRows2 && kColumns2) Tiles::template zero<3>();
  }
  // Accumulator (r, c) at base_r + c · column, rows `stride` bytes apart (base_0 = c0).
  template <bool kRows2, bool kColumns2>
  static void load_accumulators(float* c0, float* c1, int64_t column, int64_t stride) {
    Tiles::template load<0>(c0, stride);
    if constexpr (kColumns2) Tiles::template load<1>(c0 + column, stride);
    if constexpr (kRows2) Tiles::template load<2>(c1, stride);
    if constexpr (kRows2 && kColumns2) Tiles::template load<3>(c1 + column, stride);
  }
  template <bool kRows2, bool kColumns2>
  static void store_accumulators(float* c0, float* c1, int64_t column, int64_t stride) {
    Tiles::template store<0>(c0, stride);
    if constexpr (kColumns2) Tiles::template store<1>(c0 + column, stride);
    if constexpr (kRows2) Tiles::template store<2>(c1, stride);
    if constexpr (kRows2 && kColumns2) Tiles::template store<3>(c1 + column, stride);
  }
  // One depth-32 step of the 2 × 2 block: A rows a0, a1 (strides in bytes), B b0, b1 (rows
  // b_stride bytes apart).
  template <bool kRows2, bool kColumns2>
  static void multiply(const uint16_t* a0, int64_t a0_stride, const uint16_t* a1, int64_t a1_stride,
                       const uint32_t* b0, const uint32_t* b1, int64_t b_stride) {
    Tiles::template load<4>(a0, a0_stride);
    Tiles::template load<6>(b0, b_stride);
    Tiles::template dpbf16ps<0, 4, 6>();
    if constexpr (kColumns2) {
      Tiles::template load<7>(b1, b_stride);
      Tiles::template dpbf16ps<1, 4, 7>();
    }
    if constexpr (kRows2) {
      Tiles::template load<5>(a1, a1_stride);
      Tiles::template dpbf16ps<2, 5, 6>();
      if constexpr (kColumns2) Tiles::template dpbf16ps<3, 5, 7>();
    }
  }
};

#endif  // QKV_AMX_UNIT

// f(AmxUnit<Tiles>{}) for a call whose plan runs on AMX tiles (plan.h: forced, and the dims
// fit): on the stand-in where amx::stand_in() says so, else on the instructions; true. False
// where this target does not compile the unit.
template <class F>
bool run_on_amx(F&& f) {
#if !QKV_AMX_UNIT
  (void)f;
  return false;
#else
  if (!amx::stand_in()) {
    // (Forced on the stand-in, then the stand-in switched off: never a fault.)
    if (const char* why = amx::unavailable()) fail("attention on AMX tiles: ", why);
#if defined(__x86_64__)
    f(AmxUnit<amx::Hardware>{});
    return true;
#endif
  }
  f(AmxUnit<amx::Emulated>{});
  return true;
#endif
}

}  // namespace tiles
}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
