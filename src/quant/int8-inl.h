// Integer products with block-format weights (quant::Matmul::int8), as llama.cpp computes them:
// the activations of a matmul are rounded once to int8 per 32-block (Q8: d = max|x| / 127,
// q = x / d to nearest, ties to even), and each weight block's products with them are summed
// as integers, exactly; the two scales then multiply that sum in fp32:
//   Q8_0  dw · dx · Σ qw qx
//   Q4_0  dw · dx · Σ (qw − 8) qx
//   Q4_1  dw · dx · Σ qw qx  +  mw · dx · Σ qx     (dx · Σ qx is kept per block: `sums`)
// One loop does every product (quant/tile-inl.h); what differs is the unit a step runs on:
// a block at a time in an instruction set's bytes (simd/byte_products-inl.h; the activations'
// rows are rounded by simd/int8_rows-inl.h) (on x86 from AVX2 one 256-bit vector of 32
// bytes, multiplied by vpmaddubsw + vpmaddwd or, where the CPU has AVX-VNNI, one vpdpbusd:
// unsigned × signed bytes, a signed weight's sign moved onto the activation, |qw| · sign(qw) qx;
// SSE4 the same in two 128-bit halves; AArch64 with the dot product extension two sdot;
// elsewhere plain loops the compiler widens to int16), or on the AVX-512 DL target two blocks
// at a time in one 512-bit vpdpbusd (PairUnit, Q4kPairUnit). The format is the block decoder's
// (decode_block): the same loop for Q8_0, Q4_0, Q4_1, Q4_K and Q6_K.
// Included by src/quant/matmul.cpp, once per target.
#if defined(QKV_QUANT_INT8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_QUANT_INT8_INL_H_
#undef QKV_QUANT_INT8_INL_H_
#else
#define QKV_QUANT_INT8_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "qkv/number_format.h"
#include "simd/byte_products-inl.h"
#include "simd/half-inl.h"
#include "simd/int8_rows-inl.h"
#include "quant/int8.h"
#include "quant/k_quants.h"
#include "quant/pair_layout.h"
#include "quant/product_kernels.h"
#include "quant/tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::quant {
namespace HWY_NAMESPACE {
namespace int8 {

namespace hn = hwy::HWY_NAMESPACE;
using ::qkv::simd::HWY_NAMESPACE::half;
// The rows rounded to int8 (Row, quantize_row, kBlock) and the byte products of each
// instruction set (Avx2, Sse4, Sdot, Widened): the integer layer under every int8 product.
using namespace ::qkv::simd::HWY_NAMESPACE::int8;  // NOLINT
template <TensorType T>
inline constexpr bool kKQuant = T == TensorType::q4_k || T == TensorType::q6_k;
using ::qkv::kBlockBytes;  // a block's bytes (a K-quant's super-block's)
using ::qkv::kDataOffset;

// The kernel the products with weights of type T run on this target and CPU (tile_rows's
// choice of unit, below).
template <TensorType T>
HWY_INLINE ProductKernel int8_kernel() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
#if HWY_TARGET == HWY_AVX3_DL
  if constexpr (T != TensorType::q6_k)
    if (::qkv::quant::int8::vnni_wide()) return ProductKernel::int8_vpdpbusd;
#endif
#if HWY_TARGET == HWY_AVX2
  if (::qkv::quant::int8::avx_vnni()) return ProductKernel::int8_avx_vnni;
#endif
  return ProductKernel::int8_vpmaddubsw;
#else
#if HWY_ARCH_ARM_A64
  if (::qkv::quant::int8::dot_product_extension()) return ProductKernel::int8_sdot;
#endif
  return ProductKernel::int8_int16;
#endif
}

// ---- Formats: a weight block as bytes for the integer products -----------------------------
// Block b (32 values) of a weight row in instruction set S: its values as bytes, signed for
// Q8_0 and Q6_K, unsigned for the others (Q4's nibbles as they are); the scales of its halves
// (values 0–15 and 16–31: the same but for Q6_K, whose 16-value groups have their own); and
// m, what multiplies the activations' d · Σ q (Row::sums) apart: Q4_0's −8 d, Q4_1's m, Q4_K's
// −dmin · min_j.
template <class S>
struct Decoded {
  typename S::Bytes v;
  float d0, d1, m;
};
template <TensorType T>
inline constexpr bool kSignedValues = T == TensorType::q8_0 || T == TensorType::q6_k;

// Where block b's bytes begin, about (a K-quant's block is an eighth of its super-block).
template <TensorType T>
HWY_INLINE const uint8_t* block_at(const uint8_t* row, int64_t b) {
  if constexpr (kKQuant<T>) return row + b * kBlockBytes<T> / 8;
  else return row + b * kBlockBytes<T>;
}

// A K-quant super-block's scales in fp32, unpacked once for its 8 sub-blocks: Q4_K's
// d · scale_j and −dmin · min_j; Q6_K's d · scale of its 16 groups.
struct SuperScales {
  float d[16], m[8];
};
template <class S, TensorType T>
HWY_INLINE void unpack_scales(const uint8_t* sb, SuperScales& s) {
  if constexpr (T == TensorType::q4_k) {
    const float d = S::scale_at(sb), dmin = S::scale_at(sb + 2);
    uint8_t scales[8], mins[8];
    q4_k_scales_mins(sb + kQ4kScales, scales, mins);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2  // (GCC vectorized the loop below a byte at a time)
    const auto widened = [](const uint8_t* b) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b));
      return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    };
    _mm256_storeu_ps(s.d, _mm256_mul_ps(widened(scales), _mm256_set1_ps(d)));
    _mm256_storeu_ps(s.m, _mm256_mul_ps(widened(mins), _mm256_set1_ps(-dmin)));
#else
    for (int j = 0; j < 8; ++j)
      s.d[j] = d * static_cast<float>(scales[j]), s.m[j] = -dmin * static_cast<float>(mins[j]);
#endif
  } else if constexpr (T == TensorType::q6_k) {
    const float d = S::scale_at(sb + kQ6kScale);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    for (int half = 0; half < 2; ++half) {
      const __m128i bytes =
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sb + kQ6kScales + 8 * half));
      _mm256_storeu_ps(
          s.d + 8 * half,
          _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), _mm256_set1_ps(d)));
    }
#else
    const auto* scales = reinterpret_cast<const int8_t*>(sb + kQ6kScales);
    for (int g = 0; g < 16; ++g) s.d[g] = d * static_cast<float>(scales[g]);
#endif
  }
}

// (For the K-quants, `k` holds the super-block's scales, unpack_scales's.)
template <class S, TensorType T>
HWY_INLINE Decoded<S> decode_block(const uint8_t* row, int64_t b, const SuperScales& k) {
  if constexpr (kKQuant<T>) {
    const uint8_t* sb = row + b / 8 * kBlockBytes<T>;
    const int j = static_cast<int>(b % 8);
    if constexpr (T == TensorType::q4_k) {
      return {S::bit_field(S::load(sb + kQ4kValues + 32 * (j / 2)), 4 * (j % 2), 15), k.d[j],
              k.d[j], k.m[j]};
    } else {
      const Q6kSubBlock s = q6_k_sub_block(sb, j);
      const int g = 8 * (j / 4) + 2 * (j % 4);  // its first 16-value group
      return {S::q6_values(S::bit_field(S::load(s.ql), s.nibble_shift, 15),
                           S::bit_field(S::load(s.qh), s.high_shift, 3)),
              k.d[g], k.d[g + 1], 0};
    }
  } else {
    const uint8_t* blk = row + b * kBlockBytes<T>;
    const float d = S::scale_at(blk);
    const uint8_t* values = blk + kDataOffset<T>;
    if constexpr (T == TensorType::q8_0) return {S::load(values), d, d, 0};
    if constexpr (T == TensorType::q4_0) return {S::q4_values(values), d, d, -8 * d};
    return {S::q4_values(values), d, d, S::scale_at(blk + 2)};  // (m after d)
  }
}

// ---- Units (quant/tile-inl.h) ----------------------------------------------------------------
// A block a step in any instruction set: each block's products summed in integers, scaled by
// the two blocks' d in fp32; the unsigned formats' m · d·Σq apart.
template <class S, TensorType T, int R>
struct BlockUnit {
  static constexpr int64_t kBlocks = 1;
  struct State {
    SuperScales k[R];  // (the K-quants')
  };
  struct Weights {
    Decoded<S> v[R];
  };
  struct Acc {
    typename S::Sums sums[R];
    float offsets[R];
    Acc() {
      for (int r = 0; r < R; ++r) sums[r] = S::zero(), offsets[r] = 0;
    }
  };
  static HWY_INLINE void decode(const uint8_t* w, int64_t rb, int64_t b, State& st, Weights& wv) {
    if (kKQuant<T> && b % 8 == 0)
      for (int r = 0; r < R; ++r) unpack_scales<S, T>(w + r * rb + b / 8 * kBlockBytes<T>, st.k[r]);
#pragma GCC unroll 4  // (rolled, the decoded blocks went through the stack)
    for (int r = 0; r < R; ++r) {
      hwy::Prefetch(block_at<T>(w + r * rb, b) + 2 * R * rb);  // two steps of R rows ahead
      wv.v[r] = decode_block<S, T>(w + r * rb, b, st.k[r]);
    }
  }
  static HWY_INLINE void accumulate(Acc& a, const Weights& wv, const Row& x, int64_t b) {
    const auto xv = S::load(x.q + b * kBlock);
    const float xd = x.d[b], xs = x.sums[b];
    for (int r = 0; r < R; ++r) {
      const Decoded<S>& v = wv.v[r];
      if constexpr (T == TensorType::q6_k) {
        a.sums[r] = S::add_scaled2(a.sums[r], S::dot_s8_s8(v.v, xv), v.d0 * xd, v.d1 * xd);
      } else if constexpr (kSignedValues<T>) {
        a.sums[r] = S::add_scaled(a.sums[r], S::dot_s8_s8(v.v, xv), v.d0 * xd);
      } else {
        a.sums[r] = S::add_scaled(a.sums[r], S::dot_u8_s8(v.v, xv), v.d0 * xd);
        a.offsets[r] += v.m * xs;
      }
    }
  }
  static HWY_INLINE void finish(const Acc& a, float* y) {
    for (int r = 0; r < R; ++r) y[r] = S::sum_of(a.sums[r]) + a.offsets[r];
  }
};

#if HWY_TARGET == HWY_AVX3_DL
// vpdpbusd on 512-bit vectors from zero (AVX512-VNNI, which a CPU with Highway's AVX3_DL
// features has; simd/dpbusd-inl.h).
HWY_INLINE __m512i dpbusd(__m512i u, __m512i s) {
  return ::qkv::simd::HWY_NAMESPACE::dpbusd(_mm512_setzero_si512(), u, s);
}

// 32 bytes of nibbles in both halves of a vector, its low nibbles kept in the first half and
// its high nibbles in place (16 times their value) in the second: one AND after a broadcast,
// where shifting the high ones down took three instructions. The products of the second half
// are scaled by 1/16 (kHighNibble) with their block's scale: exact, a power of two.
HWY_INLINE __m512i nibbles_in_place(__m512i both_halves) {
  return _mm512_and_si512(both_halves,
                          _mm512_inserti64x4(_mm512_set1_epi8(0x0F), _mm256_set1_epi8(-16), 1));
}
inline constexpr float kHighNibble = 1.0f / 16;

// Two blocks a step on AVX-512 DL, one 512-bit vpdpbusd: a pair of weight blocks fills the
// vector, its bytes unsigned (Q8_0's offset by 128, Q4's nibbles in place) against the row's
// values in the matching order (Row::q, Row::q4). Each weight row's pair (d, m, d', m') loads
// as one vector, converted once: its d spread to the lanes of its block (by a permute, the
// high nibbles' d by 16) scales the products with the activation row's (Row::scales); the R
// rows' (d, m, d', m') side by side in one vector (dm4) times Row::terms give what the unsigned
// sums leave out. Per row and pair: vpdpbusd, a convert, a multiply and an FMA, and the
// permute shared by a tile's activation rows.
template <TensorType T, int R>
struct PairUnit {
  static_assert(R <= 4, "the rows' (d, m) pairs share one vector");
  static constexpr int64_t kBlocks = 2;
  static constexpr int64_t kBytes = kBlockBytes<T>;  // a block's
  static constexpr int kTerms = T == TensorType::q8_0   ? kTermsQ8_0
                                : T == TensorType::q4_0 ? kTermsQ4_0
                                                        : kTermsQ4_1;  // (Q4_K's m as Q4_1's)
  // The activations' bytes in the order of the weights': Q8_0's and Q4_K's as they lie.
  static constexpr bool kBlocksInOrder = T == TensorType::q8_0 || T == TensorType::q4_k;
  // Row r's products' scales, as lanes of dm4 and, for nibbles, of dm4 / 16: Q8_0 block b in
  // lanes 0–7, b + 1 in 8–15; Q4 (b, b + 1, b, b + 1) by 4s, the second two the high nibbles;
  // Q4_K b in 0–7, b + 1 (the high nibbles) in 8–15 (lanes 16 and up of permutex2var name its
  // second vector). The activations' (d, 1, d', 1) take the same lanes of 0–3.
  static HWY_INLINE __m512i lanes(int r) {
    const __m512i first =
        T == TensorType::q8_0 ? _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0)
        : T == TensorType::q4_k
            ? _mm512_set_epi32(18, 18, 18, 18, 18, 18, 18, 18, 0, 0, 0, 0, 0, 0, 0, 0)
            : _mm512_set_epi32(18, 18, 18, 18, 16, 16, 16, 16, 2, 2, 2, 2, 0, 0, 0, 0);
    return _mm512_add_epi32(first, _mm512_set1_epi32(4 * r));
  }
  // (d, m, d', m') of the pair at b0 (m = 0 for Q8_0 and Q4_0, whose second half is data).
  static HWY_INLINE __m128 scales(const uint8_t* b0) {
    int32_t h0, h1;
    std::memcpy(&h0, b0, 4);
    std::memcpy(&h1, b0 + kBytes, 4);
    __m128i halves = _mm_insert_epi32(_mm_cvtsi32_si128(h0), h1, 1);
    if constexpr (T != TensorType::q4_1) halves = _mm_and_si128(halves, _mm_set1_epi32(0xFFFF));
    return _mm_cvtph_ps(halves);
  }
  // The pair's 64 weights as unsigned bytes.
  static HWY_INLINE __m512i weights(const uint8_t* b0) {
    if constexpr (T == TensorType::q8_0) {
      constexpr int64_t at = kDataOffset<T>;
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + at));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + kBytes + at));
      return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
                              _mm512_set1_epi8(static_cast<char>(0x80)));
    } else {
      constexpr int64_t at = kDataOffset<T>;
      const __m256i both = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + at))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + kBytes + at)), 1);
      return nibbles_in_place(_mm512_broadcast_i64x4(both));
    }
  }
  struct Weights {
    __m512i v[R];
    __m512 scale[R];  // row r's d spread to its products' lanes
    __m512 dm4;       // row r's (d, m, d', m') in lanes 4r … 4r + 3
  };
  // Weights::scale from dm4. (The high nibbles' d / 16 is exact: their products in place are
  // 16 times theirs, so a step gives the same bits as with the nibbles shifted down.)
  static HWY_INLINE void spread(Weights& wv) {
    if constexpr (T == TensorType::q8_0) {
      for (int r = 0; r < R; ++r) wv.scale[r] = _mm512_permutexvar_ps(lanes(r), wv.dm4);
    } else {
      const __m512 high = _mm512_mul_ps(wv.dm4, _mm512_set1_ps(kHighNibble));
      for (int r = 0; r < R; ++r) wv.scale[r] = _mm512_permutex2var_ps(wv.dm4, lanes(r), high);
    }
  }
  struct Acc {
    __m512 sums[R], rest;
    Acc() {
      for (int r = 0; r < R; ++r) sums[r] = _mm512_setzero_ps();
      rest = _mm512_setzero_ps();
    }
  };
  struct State {};
  static HWY_INLINE void decode(const uint8_t* w, int64_t rb, int64_t b, State&, Weights& wv) {
    wv.dm4 = _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      const uint8_t* b0 = w + r * rb + b * kBytes;
      hwy::Prefetch(b0 + 2 * R * rb);
      wv.dm4 =
          _mm512_mask_broadcast_f32x4(wv.dm4, static_cast<__mmask16>(0xF << (4 * r)), scales(b0));
      wv.v[r] = weights(b0);
    }
    spread(wv);
  }
  static HWY_INLINE void accumulate(Acc& a, const Weights& wv, const Row& x, int64_t b) {
    const int64_t p = b / 2;
    const __m512i xv = _mm512_loadu_si512(kBlocksInOrder ? x.q + 64 * p : x.q4 + 64 * p);
    const __m512 xscale =
        _mm512_permutexvar_ps(_mm512_and_si512(lanes(0), _mm512_set1_epi32(3)),
                              _mm512_castps128_ps512(_mm_loadu_ps(x.scales + 4 * p)));
    const __m512 terms = _mm512_broadcast_f32x4(_mm_loadu_ps(x.terms + 12 * p + kTerms));
    a.rest = _mm512_fmadd_ps(wv.dm4, terms, a.rest);
    for (int r = 0; r < R; ++r) {
      const __m512 products = _mm512_mul_ps(_mm512_cvtepi32_ps(dpbusd(wv.v[r], xv)), xscale);
      a.sums[r] = _mm512_fmadd_ps(products, wv.scale[r], a.sums[r]);
    }
  }
  static HWY_INLINE void finish(const Acc& a, float* y) {
    alignas(64) float part[16];
    _mm512_store_ps(part, a.rest);
    for (int r = 0; r < R; ++r)
      y[r] = _mm512_reduce_add_ps(a.sums[r]) +
             ((part[4 * r] + part[4 * r + 1]) + (part[4 * r + 2] + part[4 * r + 3]));
  }
};

// PairUnit over weights repacked for it (quant/pair_layout.h): a step's 4 rows lie together,
// their scales in one load (converted at once), Q8_0's values already unsigned, each row's Q4
// nibbles one broadcast load: the same products, fewer instructions to decode them.
template <TensorType T>
struct PackedPairUnit : PairUnit<T, pair_layout::kRows> {
  using Base = PairUnit<T, pair_layout::kRows>;
  static constexpr int64_t kStep = pair_layout::step_bytes(T);
  // Each step asks for the bytes 8 KB ahead: decoding streams the weights once, group after
  // group, and a shorter reach (4 steps, 640 bytes) left the products at 0.76 of a read loop's
  // pace from memory on Ice Lake, against 0.86 from 5 to 10 KB ahead.
  static constexpr int64_t kPrefetchSteps = pair_layout::kPrefetchBytes / kStep;
  static HWY_INLINE void decode(const uint8_t* w, int64_t, int64_t b, typename Base::State&,
                                typename Base::Weights& wv) {
    const uint8_t* s = w + b / 2 * kStep;
    hwy::Prefetch(s + kPrefetchSteps * kStep);
    if constexpr (T == TensorType::q4_1) {
      wv.dm4 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
    } else {  // (d, d') of each row into lanes 4r and 4r + 2, the m lanes zero
      const __m256 dd = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
      const __m512i to = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
      wv.dm4 = _mm512_maskz_permutexvar_ps(0x5555, to, _mm512_castps256_ps512(dd));
    }
    const uint8_t* values = s + pair_layout::scale_bytes(T);
    for (int r = 0; r < pair_layout::kRows; ++r) {
      const uint8_t* v = values + r * pair_layout::value_bytes(T);
      if constexpr (T == TensorType::q8_0) {
        wv.v[r] = _mm512_loadu_si512(v);
      } else {
        wv.v[r] = nibbles_in_place(
            _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v))));
      }
    }
    Base::spread(wv);
  }
};

// Q4_K's sub-blocks j and j + 1 share 32 bytes (low nibbles, high nibbles): both in one
// 512-bit vpdpbusd against the activations' blocks b, b + 1 as they lie (lanes 0–7 the low
// nibbles, 8–15 the high ones in place), as PairUnit multiplies them. At each super-block the
// rows' d · scale_j and −dmin · min_j are laid out as PairUnit's (d, m, d', m') of each pair of
// sub-blocks, so that a step loads them in one vector.
template <int R>
struct Q4kPairUnit : PairUnit<TensorType::q4_k, R> {
  using Base = PairUnit<TensorType::q4_k, R>;
  struct State {
    alignas(64) float dm[4][16];  // pair j / 2: row r's (d_j, m_j, d_j+1, m_j+1) in lanes 4r…
    State() { std::fill(&dm[0][0], &dm[0][0] + 4 * 16, 0.0f); }  // (lanes of rows past R)
  };
  static HWY_INLINE void decode(const uint8_t* w, int64_t rb, int64_t b, State& st,
                                typename Base::Weights& wv) {
    const int j = static_cast<int>(b % 8);  // the pair's first sub-block
    if (j == 0)
      for (int r = 0; r < R; ++r) {
        SuperScales k;
        unpack_scales<Avx2<false>, TensorType::q4_k>(w + r * rb + b / 8 * Base::kBytes, k);
        const __m256 d = _mm256_loadu_ps(k.d), m = _mm256_loadu_ps(k.m);
        const __m256 lo = _mm256_unpacklo_ps(d, m);  // (d0 m0 d1 m1 | d4 m4 d5 m5)
        const __m256 hi = _mm256_unpackhi_ps(d, m);  // (d2 m2 d3 m3 | d6 m6 d7 m7)
        _mm_store_ps(&st.dm[0][4 * r], _mm256_castps256_ps128(lo));
        _mm_store_ps(&st.dm[1][4 * r], _mm256_castps256_ps128(hi));
        _mm_store_ps(&st.dm[2][4 * r], _mm256_extractf128_ps(lo, 1));
        _mm_store_ps(&st.dm[3][4 * r], _mm256_extractf128_ps(hi, 1));
      }
    wv.dm4 = _mm512_load_ps(st.dm[j / 2]);
    for (int r = 0; r < R; ++r) {
      const uint8_t* q = w + r * rb + b / 8 * Base::kBytes + kQ4kValues + 32 * (j / 2);
      hwy::Prefetch(q + 2 * R * rb);
      wv.v[r] = nibbles_in_place(
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))));
    }
    Base::spread(wv);
  }
};
#endif

// ---- The unit of each format on this target and CPU (int8_kernel's choice) -----------------
#if HWY_TARGET == HWY_AVX3_DL
constexpr int kXRows = 3;  // activation rows a tile: × 4 weight rows, 12 zmm accumulators
#elif HWY_ARCH_X86
constexpr int kXRows = 2;  // × 4 weight rows: 8 accumulators (16 halves on SSE4)
#else
constexpr int kXRows = 1;  // (no tiles)
#endif

// y[i][0, R) = R weight rows (rb bytes apart) · activation row x[i], for i < XR, on `unit`
// (the call's plan, int8_kernel's choice); `packed`, the same 4 rows repacked for the pair
// unit (quant/pair_layout.h), or null.
template <TensorType T, int R, int XR>
HWY_INLINE void tile_rows(const uint8_t* w, int64_t rb, const uint8_t* packed, int64_t blocks,
                          ProductKernel unit, const Row* x, float* const* y) {
#if HWY_TARGET == HWY_AVX3_DL
  if (unit != ProductKernel::int8_vpdpbusd) {  // (int8=vpmaddubsw forced)
  } else if constexpr (T == TensorType::q4_k) {
    return tile<Q4kPairUnit<R>, XR>(w, rb, 0, blocks, x, y);
  } else if constexpr (!kKQuant<T>) {
    const int64_t paired = blocks / 2 * 2;
    if (R == pair_layout::kRows && packed) tile<PackedPairUnit<T>, XR>(packed, 0, 0, paired, x, y);
    else tile<PairUnit<T, R>, XR>(w, rb, 0, paired, x, y);
    if (paired == blocks) return;
    float last[XR][R], *out[XR];  // an odd last block, one at a time
    for (int i = 0; i < XR; ++i) out[i] = last[i];
    tile<BlockUnit<Avx2<false>, T, R>, XR>(w, rb, paired, blocks, x, out);
    for (int i = 0; i < XR; ++i)
      for (int r = 0; r < R; ++r) y[i][r] += last[i][r];
    return;
  }
#endif
  (void)packed;  // (read by the pair unit alone)
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#if HWY_TARGET == HWY_AVX2
  if (unit == ProductKernel::int8_avx_vnni)
    return tile<BlockUnit<Avx2<true>, T, R>, XR>(w, rb, 0, blocks, x, y);
#endif
  tile<BlockUnit<Avx2<false>, T, R>, XR>(w, rb, 0, blocks, x, y);
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
  tile<BlockUnit<Sse4, T, R>, XR>(w, rb, 0, blocks, x, y);
#else
#if HWY_ARCH_ARM_A64
  if (unit == ProductKernel::int8_sdot)
    return tile<BlockUnit<Sdot, T, R>, XR>(w, rb, 0, blocks, x, y);
#endif
  tile<BlockUnit<Widened, T, R>, XR>(w, rb, 0, blocks, x, y);
#endif
}

// The repacked group of 4 rows that begins at row r (a multiple of 4), or null.
template <TensorType T>
HWY_INLINE const uint8_t* packed_group(const uint8_t* packed, int64_t blocks, int64_t r) {
  if (!packed) return nullptr;
  return packed + r / pair_layout::kRows * pair_layout::group_bytes(T, blocks * kBlock);
}

// y[begin, end) (rows of the matrix at w, rb bytes a row; begin a multiple of 4) = its rows · x.
template <TensorType T>
HWY_NOINLINE void dot_range(const uint8_t* w, int64_t rb, const uint8_t* packed, int64_t blocks,
                            ProductKernel unit, int64_t begin, int64_t end, const Row& x,
                            float* y) {
  constexpr int kRows = 4;  // weight rows side by side
  int64_t r = begin;
  for (float* out = y + r; r + kRows <= end; r += kRows, out += kRows)
    tile_rows<T, kRows, 1>(w + r * rb, rb, packed_group<T>(packed, blocks, r), blocks, unit, &x,
                           &out);
  for (float* out = y + r; r < end; ++r, ++out)
    tile_rows<T, 1, 1>(w + r * rb, rb, nullptr, blocks, unit, &x, &out);
}

// y[i · ldy + begin, end) = rows [begin, end) of the matrix · activation row i, for the M rows
// quantized at `rows` (floats_per_row(K) floats apart). On x86, kXRows activation rows at a
// time share each decoded weight block (tile_rows).
template <TensorType T>
HWY_NOINLINE void dot_range_rows(const uint8_t* w, int64_t rb, const uint8_t* packed, int64_t K,
                                 ProductKernel unit, int64_t begin, int64_t end, const float* rows,
                                 int64_t M, float* y, int64_t ldy) {
  const int64_t blocks = K / kBlock, stride = floats_per_row(K);
  int64_t untiled = 0;  // the first activation row left to dot_range
  if constexpr (kXRows > 1) {
    // Whole tiles of kXRows activation rows × 4 weight rows; the rest (activation rows past a
    // whole kXRows, weight rows past a whole 4: a chunk's rows are 32 unless a matrix ends)
    // one row at a time.
    constexpr int kRows = 4;
    untiled = M > 1 ? M / kXRows * kXRows : 0;
    const int64_t tiled_end = begin + (end - begin) / kRows * kRows;
    for (int64_t i0 = 0; i0 < untiled; i0 += kXRows) {
      Row x[kXRows];
      for (int i = 0; i < kXRows; ++i) x[i] = row_at(rows + (i0 + i) * stride, K);
      for (int64_t r = begin; r < tiled_end; r += kRows) {
        float* out[kXRows];
        for (int i = 0; i < kXRows; ++i) out[i] = y + (i0 + i) * ldy + r;
        tile_rows<T, kRows, kXRows>(w + r * rb, rb, packed_group<T>(packed, blocks, r), blocks,
                                    unit, x, out);
      }
      if (tiled_end < end)
        for (int i = 0; i < kXRows; ++i)
          dot_range<T>(w, rb, packed, blocks, unit, tiled_end, end, x[i], y + (i0 + i) * ldy);
    }
  }
  for (int64_t i = untiled; i < M; ++i)
    dot_range<T>(w, rb, packed, blocks, unit, begin, end, row_at(rows + i * stride, K),
                 y + i * ldy);
}

}  // namespace int8
}  // namespace HWY_NAMESPACE
}  // namespace qkv::quant
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
