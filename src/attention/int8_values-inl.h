// Split-KV decoding's P·V with P rounded to int8, over value rows of 32-value blocks (q8_0,
// q4_0, q4_1 caches read with CacheScores::int8) on x86-64: AVX512-VNNI on the 512-bit
// targets, AVX-VNNI or vpmaddubsw on AVX2 (the second form, below the first): Int8Values,
// which RowsOnInt8 (decode_int8-inl.h) runs for each block of up to kValueBlock value rows.
//
// Widening every stored value to fp32 and multiplying it by an FMA per query row makes P·V the
// arithmetic limit of a quantized cache (an FMA per 16 values per row). Here the values stay
// integers: per block of 64 keys, each row's p_k times the key's block scale |d_k,b| is rounded
// to u8 over that row and block's largest (σ_b = max_k p_k |d_k,b| / 255), and one vpdpbusd
// adds 4 keys' products u8 · s8 to each of 16 columns. Four value rows are interleaved in
// registers (two rounds of byte and word unpacks) so that lane i holds 4 keys' bytes of one
// column; the query rows' 4 bytes of P are broadcast, one 32-bit word per block. After the 64
// keys each lane's integer sum is scaled by σ once. A key whose block scale is negative has its
// bytes negated first (saturating: −128 becomes 127), except Q4_0's, whose scales take either
// sign: there P̃ is s8 with d's sign (σ = largest |p d| / 127) against the unsigned nibbles, and
// 8 Σ P̃ is taken back. Q4_1's min adds Σ_k p_k m_k,b in fp32.
//
// The rounding is P's alone: |ΔP'_k,b| ≤ σ_b / 2, so the output's error is at most
// Σ_k σ_b(k) / 2 · |v_k[e] / d_k,b| / l per column (l the softmax's sum), and σ is largest in
// the blocks of keys that hold the row's largest weights. The columns come out in lane order
// (column()), put back once per unit.
// Per target, like src/simd/simd-inl.h.
#if defined(QKV_ATTENTION_INT8_VALUES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_INT8_VALUES_INL_H_
#undef QKV_ATTENTION_INT8_VALUES_INL_H_
#else
#define QKV_ATTENTION_INT8_VALUES_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include <hwy/highway.h>

#include "attention/decode_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace decoding {

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
inline constexpr int64_t kInt8ValuesMaxDim = 256;  // (stack arrays; larger dims: the FMAs)

// Every cache line of a row (a row of 136 bytes can touch 4).
HWY_INLINE void ask_row_lines(const uint8_t* row, int64_t bytes) {
  const auto first = reinterpret_cast<uintptr_t>(row) & ~uintptr_t{63};
  for (uintptr_t at = first; at < reinterpret_cast<uintptr_t>(row + bytes); at += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(at));
}

// Rows of P for one block of keys: each value block's bytes, σ, Q4_1's Σ_k p_k m_k,b and
// Q4_0's 8 Σ_k P̃_k,b.
struct RoundedP {
  static constexpr int64_t kBlocks = kInt8ValuesMaxDim / kBlockValues;
  alignas(64) uint8_t p[kTiledDecodeMinRows][kBlocks][kValueBlock];
  float sigma[kTiledDecodeMinRows][kBlocks];
  float min_sum[kTiledDecodeMinRows][kBlocks];
  int32_t offset[kTiledDecodeMinRows][kBlocks];
};
#endif

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// On 512 bits with AVX512-VNNI only (without it: the FMAs).
template <bool kVnni>
inline constexpr bool kInt8Values = kVnni;

// Panel: the 512-bit panel of decode_int8-inl.h (its vpdpbusd).
template <TensorType kType, class Panel, bool kVnni>
struct Int8Values {
  static_assert(simd::kLaidOut<kType>, "Int8Values: a block format it does not know");
  static constexpr int64_t kBytes = kBlockBytes<kType>, kKeys = kValueBlock;
  static constexpr int64_t kMaxBlocks = kInt8ValuesMaxDim / kBlockValues;
  static constexpr bool kNibbles = kType != TensorType::q8_0;
  // Which lanes of a half's vectors hold block 2h + 1 (the others hold block 2h), as 32-bit
  // lanes and as bytes: Q8_0's halves are the two blocks' 32 bytes in turn; the nibbles' 128-bit
  // lanes alternate (2h's low nibbles, 2h+1's low, 2h's high, 2h+1's high).
  static constexpr __mmask16 kOddLanes = kNibbles ? 0xF0F0 : 0xFF00;
  static constexpr __mmask64 kOddBytes = kNibbles ? 0xFFFF0000FFFF0000ull : 0xFFFFFFFF00000000ull;

  // Q4_0's scales take either sign (its quantizer's d = max / −8): P̃ is s8 with d's sign
  // against the unsigned nibbles there; else u8 with |d|, against signed bytes (Q8_0's values,
  // Q4_1's nibbles), a negative scale negating its block's bytes.
  static constexpr bool kSignedP = kType == TensorType::q4_0;
  static constexpr float kLevels = kSignedP ? 127 : 255;

  static bool fits(int64_t Dv) { return Dv % 64 == 0 && Dv <= kInt8ValuesMaxDim; }
  // Q8_0 from 2 rows per kv head: with one, the FMAs measured as fast (AMD Zen 4).
  static constexpr int64_t kMinRows = kType == TensorType::q8_0 ? 2 : 1;

  // The column that lane `lane` of vector i (0 … 3) of half h holds.
  static int64_t column(int64_t h, int i, int lane) {
    const int L = lane / 4, at = 16 * L + 4 * i + lane % 4;  // byte of the half's row vector
    return 64 * h + (kNibbles && L == 1 ? at + 16 : kNibbles && L == 2 ? at - 16 : at);
  }
  static void columns_from_lanes(float* o, int64_t Dv) {
    float tmp[kInt8ValuesMaxDim];
    for (int64_t h = 0; h < Dv / 64; ++h)
      for (int i = 0; i < 4; ++i)
        for (int lane = 0; lane < 16; ++lane) tmp[column(h, i, lane)] = o[64 * h + 16 * i + lane];
    std::copy(tmp, tmp + Dv, o);
  }

  // Half h (blocks 2h and 2h + 1) of a value row as 64 bytes.
  static HWY_INLINE __m512i half_row(const uint8_t* row, int64_t h) {
    const uint8_t* a = row + 2 * h * kBytes + kDataOffset<kType>;
    const uint8_t* b = a + kBytes;
    if constexpr (!kNibbles) {
      return _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
    } else {
      const __m256i nibbles = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
      const __m256i low = _mm256_set1_epi8(15);
      const __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(nibbles, low)),
                                           _mm256_and_si256(_mm256_srli_epi16(nibbles, 4), low), 1);
      return x;  // (unsigned: Q4_0's 8 is taken back as 8 Σ P̃)
    }
  }

  // o_r (columns in lane order) += Σ_k p_r[j + k] v_k over the nk ≤ kKeys value rows from v
  // (step bytes apart; j: the first's place in the unit). The next block's rows (up to `next`)
  // are asked for a few at a time during the first pass over this one: this block's scales are
  // read in a burst first, which waited on memory for half the block's time when the rows were
  // asked for 12 ahead as the FMAs' walk does, and asking for the whole next block at once
  // stalled on the line-fill buffers.
  static void add(const float* s, int64_t stride, int64_t j, int64_t nk, const uint8_t* v,
                  int64_t step, int64_t row_bytes, int64_t next, int64_t Dv, int64_t R,
                  float* const* o) {
    const int64_t blocks = Dv / kBlockValues;
    if (j == 0)  // the unit's first block (each later one is asked for during the one before)
      for (int64_t k = 0; k < nk; ++k) ask_row_lines(v + k * step, row_bytes);
    const int64_t ahead = std::min(next, kKeys);
    // Each key's block scales (and Q4_1's mins) gathered as 32-bit words, |d| as floats and the
    // signs as bits.
    alignas(64) float d[kMaxBlocks][kKeys], m[kMaxBlocks][kKeys];
    uint64_t negative[kMaxBlocks] = {};
    uint64_t any_negative = 0;
    const __m512i keys =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(static_cast<int32_t>(step)));
    for (int c = 0; c < 4; ++c) {
      const int64_t left = std::clamp<int64_t>(nk - 16 * c, 0, 16);
      const auto valid = static_cast<__mmask16>((uint32_t{1} << left) - 1);
      const uint8_t* at = v + 16 * c * step;
      for (int64_t b = 0; b < blocks; ++b, at += kBytes) {
        const __m512i words =
            _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, keys, at, 1);
        const __m256i w = _mm512_cvtepi32_epi16(words);
        if constexpr (kSignedP) {
          _mm512_store_ps(&d[b][16 * c], _mm512_cvtph_ps(w));
        } else {
          negative[b] |= uint64_t{_mm256_movepi16_mask(w)} << (16 * c);
          _mm512_store_ps(&d[b][16 * c],
                          _mm512_cvtph_ps(_mm256_and_si256(w, _mm256_set1_epi16(0x7FFF))));
        }
        if constexpr (kHasMin<kType>)
          _mm512_store_ps(&m[b][16 * c],
                          _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(words, 16))));
      }
    }
    for (int64_t b = 0; b < blocks; ++b) any_negative |= negative[b];

    RoundedP P;
    for (int64_t r = 0; r < R; ++r) round_row(s + r * stride + j, nk, blocks, d, m, r, P);
    for (int64_t h = 0; h < blocks / 2; ++h)
      for (int64_t r = 0; r < R; r += kGroupRows)
        simd::with_count<kGroupRows>(
            static_cast<int>(std::min<int64_t>(kGroupRows, R - r)), [&](auto rows) {
              pass<decltype(rows)::value>(P, r, h, v, step, nk, negative, any_negative != 0, o,
                                          h == 0 && r == 0 ? ahead : 0, row_bytes);
            });
  }

  // Row r's p_k |d_k,b| rounded to u8 per block b, σ_b and (Q4_1) Σ_k p_k m_k,b. A block whose
  // products are not all finite gets σ = NaN (its columns come out NaN, as the FMAs' would).
  static HWY_INLINE void round_row(const float* p, int64_t nk, int64_t blocks,
                                   const float (*d)[kKeys], const float (*m)[kKeys], int64_t r,
                                   RoundedP& P) {
    __m512 pv[4];
    for (int c = 0; c < 4; ++c) {
      const int64_t left = std::clamp<int64_t>(nk - 16 * c, 0, 16);
      pv[c] = _mm512_maskz_loadu_ps(static_cast<__mmask16>((uint32_t{1} << left) - 1), p + 16 * c);
    }
    for (int64_t b = 0; b < blocks; ++b) {
      __m512 pd[4], top = _mm512_setzero_ps();
      __mmask16 bad = 0;
      for (int c = 0; c < 4; ++c) {
        pd[c] = _mm512_mul_ps(pv[c], _mm512_load_ps(&d[b][16 * c]));
        bad |= _mm512_fpclass_ps_mask(pd[c], 0x99);  // NaN or ±inf
        top = _mm512_max_ps(top, kSignedP ? _mm512_abs_ps(pd[c]) : pd[c]);
      }
      if constexpr (kHasMin<kType>) {
        __m512 sum = _mm512_setzero_ps();
        for (int c = 0; c < 4; ++c)
          sum = _mm512_fmadd_ps(pv[c], _mm512_load_ps(&m[b][16 * c]), sum);
        P.min_sum[r][b] = _mm512_reduce_add_ps(sum);
      }
      const float most = _mm512_reduce_max_ps(top);
      P.offset[r][b] = 0;
      if (bad != 0 || !(most > 0)) {
        P.sigma[r][b] = bad != 0 ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
        std::memset(P.p[r][b], 0, kKeys);
        continue;
      }
      P.sigma[r][b] = most * (1.0f / kLevels);
      const __m512 to_bytes = _mm512_set1_ps(kLevels / most);
      __m512i sum = _mm512_setzero_si512();
      for (int c = 0; c < 4; ++c) {
        const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(pd[c], to_bytes));
        if constexpr (kType == TensorType::q4_0) sum = _mm512_add_epi32(sum, q);
        _mm_store_si128(reinterpret_cast<__m128i*>(&P.p[r][b][16 * c]),
                        kSignedP ? _mm512_cvtsepi32_epi8(q) : _mm512_cvtusepi32_epi8(q));
      }
      if constexpr (kType == TensorType::q4_0) P.offset[r][b] = 8 * _mm512_reduce_add_epi32(sum);
    }
  }

  // RG rows from row r0 over half h of the columns: 4 keys a step, 4 vectors of 16 columns.
  template <int RG>
  static HWY_INLINE void pass(const RoundedP& P, int64_t r0, int64_t h, const uint8_t* v,
                              int64_t step, int64_t nk, const uint64_t* negative, bool negatives,
                              float* const* o, int64_t ahead, int64_t row_bytes) {
    __m512i acc[RG][4];
    for (int r = 0; r < RG; ++r)
      for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_setzero_si512();
    for (int64_t k0 = 0; k0 < nk; k0 += 4) {
      for (int64_t k = k0; k < std::min(k0 + 4, ahead); ++k)  // the next block's rows
        ask_row_lines(v + (nk + k) * step, row_bytes);
      __m512i x[4];
      for (int t = 0; t < 4; ++t) {
        const int64_t k = k0 + t;
        x[t] = k < nk ? half_row(v + k * step, h) : _mm512_setzero_si512();
        if (!kSignedP && negatives) {
          const __mmask64 flip = ((negative[2 * h] >> k & 1) ? ~kOddBytes : 0) |
                                 ((negative[2 * h + 1] >> k & 1) ? kOddBytes : 0);
          x[t] = _mm512_mask_subs_epi8(x[t], flip, _mm512_setzero_si512(), x[t]);
        }
      }
      const __m512i lo01 = _mm512_unpacklo_epi8(x[0], x[1]),
                    hi01 = _mm512_unpackhi_epi8(x[0], x[1]);
      const __m512i lo23 = _mm512_unpacklo_epi8(x[2], x[3]),
                    hi23 = _mm512_unpackhi_epi8(x[2], x[3]);
      const __m512i cols[4] = {_mm512_unpacklo_epi16(lo01, lo23), _mm512_unpackhi_epi16(lo01, lo23),
                               _mm512_unpacklo_epi16(hi01, hi23),
                               _mm512_unpackhi_epi16(hi01, hi23)};
      for (int r = 0; r < RG; ++r) {
        int32_t even, odd;
        std::memcpy(&even, &P.p[r0 + r][2 * h][k0], 4);
        std::memcpy(&odd, &P.p[r0 + r][2 * h + 1][k0], 4);
        const __m512i quads = _mm512_mask_set1_epi32(_mm512_set1_epi32(even), kOddLanes, odd);
        for (int i = 0; i < 4; ++i)
          acc[r][i] = kSignedP ? Panel::dpbusd(acc[r][i], cols[i], quads)
                               : Panel::dpbusd(acc[r][i], quads, cols[i]);
      }
    }
    for (int r = 0; r < RG; ++r) {
      const __m512 sigma = _mm512_mask_mov_ps(_mm512_set1_ps(P.sigma[r0 + r][2 * h]), kOddLanes,
                                              _mm512_set1_ps(P.sigma[r0 + r][2 * h + 1]));
      [[maybe_unused]] __m512 mins;
      if constexpr (kHasMin<kType>)
        mins = _mm512_mask_mov_ps(_mm512_set1_ps(P.min_sum[r0 + r][2 * h]), kOddLanes,
                                  _mm512_set1_ps(P.min_sum[r0 + r][2 * h + 1]));
      if constexpr (kType == TensorType::q4_0) {
        const __m512i offset = _mm512_mask_set1_epi32(_mm512_set1_epi32(P.offset[r0 + r][2 * h]),
                                                      kOddLanes, P.offset[r0 + r][2 * h + 1]);
        for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_sub_epi32(acc[r][i], offset);
      }
      for (int i = 0; i < 4; ++i) {
        float* to = o[r0 + r] + 64 * h + 16 * i;
        __m512 sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][i]), sigma, _mm512_loadu_ps(to));
        if constexpr (kHasMin<kType>) sum = _mm512_add_ps(sum, mins);
        _mm512_storeu_ps(to, sum);
      }
    }
  }
};
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// On 256 bits: one value block (32 columns) a vector, 4 keys a vpdpbusd where the CPU has
// AVX-VNNI, else vpmaddubsw + vpmaddwd. Those saturate each pair of u8 · s8 products at
// 2^15 − 1, which 2 · 255 · 128 passes: against Q8_0's bytes P is rounded to 127 levels (7 bits)
// there; the nibbles (at most 15) take 255. The same rounding and bound as the 512-bit form,
// per value block.
template <bool kVnni>
inline constexpr bool kInt8Values = true;

template <TensorType kType, class Panel, bool kVnni>
struct Int8Values {
  static_assert(simd::kLaidOut<kType>, "Int8Values: a block format it does not know");
  static constexpr int64_t kBytes = kBlockBytes<kType>, kKeys = kValueBlock;
  static constexpr int64_t kMaxBlocks = RoundedP::kBlocks;
  static constexpr bool kNibbles = kType != TensorType::q8_0;
  static constexpr bool kSignedP = kType == TensorType::q4_0;  // (as in the 512-bit form)
  static constexpr float kLevels = kSignedP || (!kVnni && !kNibbles) ? 127 : 255;
  static constexpr int kRows = 2;  // rows a register block: 8 sums, 4 column vectors, 4 rows

  static bool fits(int64_t Dv) { return Dv % kBlockValues == 0 && Dv <= kInt8ValuesMaxDim; }
  // Q8_0 and Q4_1 from 2 rows per kv head: with one, the FMAs measured as fast or faster (the
  // AVX2 target on AMD Zen 4, vpmaddubsw).
  static constexpr int64_t kMinRows = kType == TensorType::q4_0 ? 1 : 2;
  static void columns_from_lanes(float*, int64_t) {}  // (pass stores the columns in order)

  // Value block b of a row as 32 bytes: Q8_0's as stored, the nibbles' low half (values 0 …
  // 15) then high (16 … 31), unsigned.
  static HWY_INLINE __m256i block_row(const uint8_t* row, int64_t b) {
    const uint8_t* a = row + b * kBytes + kDataOffset<kType>;
    if constexpr (!kNibbles) {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
    } else {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
      return _mm256_and_si256(
          _mm256_inserti128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1),
          _mm256_set1_epi8(15));
    }
  }

  static HWY_INLINE __m256i dot(__m256i acc, __m256i u, __m256i s) {
    return kVnni ? Panel::dpbusd(acc, u, s) : Panel::pair_dot(acc, u, s);
  }

  // As the 512-bit form's add: o_r += Σ_k p_r[j + k] v_k over nk ≤ kKeys value rows, the next
  // block's rows asked for during the first pass.
  static void add(const float* s, int64_t stride, int64_t j, int64_t nk, const uint8_t* v,
                  int64_t step, int64_t row_bytes, int64_t next, int64_t Dv, int64_t R,
                  float* const* o) {
    const int64_t blocks = Dv / kBlockValues;
    if (j == 0)
      for (int64_t k = 0; k < nk; ++k) ask_row_lines(v + k * step, row_bytes);
    const int64_t ahead = std::min(next, kKeys);
    // Each key's block scales (and Q4_1's mins) as fp16, then as floats; the signs as bits.
    alignas(32) uint16_t dh[kMaxBlocks][kKeys] = {}, mh[kMaxBlocks][kKeys] = {};
    alignas(32) float d[kMaxBlocks][kKeys], m[kMaxBlocks][kKeys];
    uint64_t negative[kMaxBlocks] = {}, any_negative = 0;
    for (int64_t k = 0; k < nk; ++k)
      for (int64_t b = 0; b < blocks; ++b) {
        uint32_t w;
        std::memcpy(&w, v + k * step + b * kBytes, 4);
        dh[b][k] = static_cast<uint16_t>(kSignedP ? w : w & 0x7FFF);
        if constexpr (!kSignedP) negative[b] |= uint64_t{w >> 15 & 1} << k;
        mh[b][k] = static_cast<uint16_t>(w >> 16);
      }
    for (int64_t b = 0; b < blocks; ++b) {
      any_negative |= negative[b];
      for (int64_t c = 0; c < kKeys; c += 8) {
        _mm256_store_ps(
            &d[b][c], _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(&dh[b][c]))));
        if constexpr (kHasMin<kType>)
          _mm256_store_ps(
              &m[b][c],
              _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(&mh[b][c]))));
      }
    }
    RoundedP P;
    for (int64_t r = 0; r < R; ++r) round_row(s + r * stride + j, nk, blocks, d, m, r, P);
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t r = 0; r < R; r += kRows)
        simd::with_count<kRows>(static_cast<int>(std::min<int64_t>(kRows, R - r)), [&](auto rows) {
          pass<decltype(rows)::value>(P, r, b, v, step, nk, negative[b], any_negative != 0, o,
                                      b == 0 && r == 0 ? ahead : 0, row_bytes);
        });
  }

  static HWY_INLINE float sum_of(__m256 x) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
  }
  static HWY_INLINE float max_of(__m256 x) {
    const __m128 h = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    const __m128 q = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(q, _mm_movehdup_ps(q)));
  }

  // Row r's p_k |d_k,b| rounded per block b, as the 512-bit form's round_row.
  static HWY_INLINE void round_row(const float* p, int64_t nk, int64_t blocks,
                                   const float (*d)[kKeys], const float (*m)[kKeys], int64_t r,
                                   RoundedP& P) {
    alignas(32) float pz[kKeys];
    std::copy(p, p + nk, pz);
    std::fill(pz + nk, pz + kKeys, 0.0f);
    constexpr int kVectors = kKeys / 8;
    __m256 pv[kVectors];
    for (int c = 0; c < kVectors; ++c) pv[c] = _mm256_load_ps(pz + 8 * c);
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int64_t b = 0; b < blocks; ++b) {
      __m256 pd[kVectors], top = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
      for (int c = 0; c < kVectors; ++c) {
        pd[c] = _mm256_mul_ps(pv[c], _mm256_load_ps(&d[b][8 * c]));
        // x − x is NaN where x is NaN or ±inf.
        bad = _mm256_or_ps(
            bad, _mm256_cmp_ps(_mm256_sub_ps(pd[c], pd[c]), _mm256_setzero_ps(), _CMP_UNORD_Q));
        top = _mm256_max_ps(top, kSignedP ? _mm256_and_ps(pd[c], magnitude) : pd[c]);
      }
      if constexpr (kHasMin<kType>) {
        __m256 sum = _mm256_setzero_ps();
        for (int c = 0; c < kVectors; ++c)
          sum = _mm256_fmadd_ps(pv[c], _mm256_load_ps(&m[b][8 * c]), sum);
        P.min_sum[r][b] = sum_of(sum);
      }
      const float most = max_of(top);
      P.offset[r][b] = 0;
      if (_mm256_movemask_ps(bad) != 0 || !(most > 0)) {
        P.sigma[r][b] =
            _mm256_movemask_ps(bad) != 0 ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
        std::memset(P.p[r][b], 0, kKeys);
        continue;
      }
      P.sigma[r][b] = most * (1.0f / kLevels);
      const __m256 to_bytes = _mm256_set1_ps(kLevels / most);
      __m256i q[kVectors], sum = _mm256_setzero_si256();
      for (int c = 0; c < kVectors; ++c) {
        q[c] = _mm256_cvtps_epi32(_mm256_mul_ps(pd[c], to_bytes));
        sum = _mm256_add_epi32(sum, q[c]);
      }
      // Packs work within 128-bit lanes: 4 vectors packed leave their keys' dwords in the
      // order 0, 2, 4, 6, 1, 3, 5, 7 (of 4 keys each), put back by one permute.
      const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
      for (int g = 0; g < kVectors / 4; ++g) {
        const __m256i a = _mm256_packs_epi32(q[4 * g], q[4 * g + 1]),
                      c = _mm256_packs_epi32(q[4 * g + 2], q[4 * g + 3]);
        const __m256i bytes = kSignedP ? _mm256_packs_epi16(a, c) : _mm256_packus_epi16(a, c);
        _mm256_store_si256(reinterpret_cast<__m256i*>(&P.p[r][b][32 * g]),
                           _mm256_permutevar8x32_epi32(bytes, order));
      }
      if constexpr (kType == TensorType::q4_0) {
        const __m128i h =
            _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        const __m128i t = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
        P.offset[r][b] = 8 * _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 1)));
      }
    }
  }

  // RG rows from row r0 over value block b: 4 keys a step. Lane i of column vector c holds
  // 4 keys' bytes of column 16 (i / 4) + 4c + i % 4 (two rounds of unpacks within 128-bit
  // lanes); the stores put the columns back in order.
  template <int RG>
  static HWY_INLINE void pass(const RoundedP& P, int64_t r0, int64_t b, const uint8_t* v,
                              int64_t step, int64_t nk, uint64_t negative, bool negatives,
                              float* const* o, int64_t ahead, int64_t row_bytes) {
    __m256i acc[RG][4];
    for (int r = 0; r < RG; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_si256();
    for (int64_t k0 = 0; k0 < nk; k0 += 4) {
      for (int64_t k = k0; k < std::min(k0 + 4, ahead); ++k)  // the next block's rows
        ask_row_lines(v + (nk + k) * step, row_bytes);
      __m256i x[4];
      for (int t = 0; t < 4; ++t) {
        const int64_t k = k0 + t;
        x[t] = k < nk ? block_row(v + k * step, b) : _mm256_setzero_si256();
        if (!kSignedP && negatives && (negative >> k & 1))
          x[t] = _mm256_subs_epi8(_mm256_setzero_si256(), x[t]);
      }
      const __m256i lo01 = _mm256_unpacklo_epi8(x[0], x[1]),
                    hi01 = _mm256_unpackhi_epi8(x[0], x[1]);
      const __m256i lo23 = _mm256_unpacklo_epi8(x[2], x[3]),
                    hi23 = _mm256_unpackhi_epi8(x[2], x[3]);
      const __m256i cols[4] = {_mm256_unpacklo_epi16(lo01, lo23), _mm256_unpackhi_epi16(lo01, lo23),
                               _mm256_unpacklo_epi16(hi01, hi23),
                               _mm256_unpackhi_epi16(hi01, hi23)};
      for (int r = 0; r < RG; ++r) {
        int32_t word;
        std::memcpy(&word, &P.p[r0 + r][b][k0], 4);
        const __m256i quads = _mm256_set1_epi32(word);
        for (int c = 0; c < 4; ++c)
          acc[r][c] = kSignedP ? dot(acc[r][c], cols[c], quads) : dot(acc[r][c], quads, cols[c]);
      }
    }
    for (int r = 0; r < RG; ++r) {
      const __m256 sigma = _mm256_set1_ps(P.sigma[r0 + r][b]);
      if constexpr (kType == TensorType::q4_0)
        for (int c = 0; c < 4; ++c)
          acc[r][c] = _mm256_sub_epi32(acc[r][c], _mm256_set1_epi32(P.offset[r0 + r][b]));
      // Columns 8g … 8g + 7: the low 128-bit lanes of vectors 2 (g % 2), 2 (g % 2) + 1 for g < 2,
      // their high lanes for g ≥ 2.
      const __m256i in_order[4] = {_mm256_permute2x128_si256(acc[r][0], acc[r][1], 0x20),
                                   _mm256_permute2x128_si256(acc[r][2], acc[r][3], 0x20),
                                   _mm256_permute2x128_si256(acc[r][0], acc[r][1], 0x31),
                                   _mm256_permute2x128_si256(acc[r][2], acc[r][3], 0x31)};
      for (int g = 0; g < 4; ++g) {
        float* to = o[r0 + r] + kBlockValues * b + 8 * g;
        __m256 sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(in_order[g]), sigma, _mm256_loadu_ps(to));
        if constexpr (kHasMin<kType>)
          sum = _mm256_add_ps(sum, _mm256_set1_ps(P.min_sum[r0 + r][b]));
        _mm256_storeu_ps(to, sum);
      }
    }
  }
};
#else
template <bool kVnni>
inline constexpr bool kInt8Values = false;
template <TensorType kType, class Panel, bool kVnni>
struct Int8Values;  // (x86 from AVX2)
#endif

}  // namespace decoding
}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
