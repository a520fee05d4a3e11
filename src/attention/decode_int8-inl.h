// Split-KV decoding's rows kernel with integer Q·K over 32-value blocks (q8_0, q4_0, q4_1
// caches read with CacheScores::int8): RowsOnInt8, the unit decode_unit_rows (decode.cpp)
// runs for fewer than 16 rows per key/value head on x86-64 from AVX2, with vpdpbusd where the
// CPU has it (AVX512-VNNI on the 512-bit targets, AVX-VNNI on AVX2), else vpmaddubsw +
// vpmaddwd; and on AArch64, 4 keys a panel, with sdot where the CPU has the dot product
// extension, else int16 products.
//
// Each query row is rounded to int8 per 32-block as the weight products round activations
// (simd/int8_rows-inl.h: d = max|q| / 127, q to nearest), once per unit. The keys' integers then
// meet it 16 keys at a time (8 on AVX2): a block of 16 key rows is transposed in registers
// into 8 vectors whose lane i holds 4 bytes of key i, so one vpdpbusd adds 4 products of each
// of 16 keys with the same 4 query bytes (broadcast), and a block's 8 instructions leave each
// key's integer block sum in its own lane: no sum across lanes. Each block's scales are
// applied once per row and 16 keys: (sum − offset · Σq) · d_k · d_q, plus Q4_1's m_k · d_q Σq.
// The offset makes the keys unsigned for vpdpbusd (Q8_0's bytes +128, Q4_0's nibbles are
// their value + 8; sdot takes Q8_0's bytes as they are) and is taken back in integers. The error is
// the query's rounding alone: |Δs| ≤ Σ_b d_q,b / 2 · Σ |k| over the block. P·V: in integers on
// x86-64 (int8_values-inl.h), else the FMA one (BlockSource). Per target, like
// src/simd/simd-inl.h.
#if defined(QKV_ATTENTION_DECODE_INT8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_DECODE_INT8_INL_H_
#undef QKV_ATTENTION_DECODE_INT8_INL_H_
#else
#define QKV_ATTENTION_DECODE_INT8_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <hwy/highway.h>

#include "attention/decode_rows-inl.h"
#include "attention/int8_values-inl.h"
#include "attention/kernels.h"
#include "simd/byte_products-inl.h"
#include "simd/cpu.h"
#include "simd/int8_rows-inl.h"
#include "util/scratch.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace decoding {

#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2) || HWY_ARCH_ARM_A64
inline constexpr bool kInt8Scores = true;
namespace int8 = ::qkv::simd::HWY_NAMESPACE::int8;

#if HWY_ARCH_ARM_A64
// 128 bits: 4 keys a panel, signed bytes against signed bytes: sdot where the CPU has the dot
// product extension (int8::Sdot), else the same sums from int16 products (smull, saddlp, addp).
// Every pass (NEON, SVE) uses these NEON registers.
struct Panel4 {
  using I = int32x4_t;
  using F = float32x4_t;
  static constexpr int kKeys = 4;
  static constexpr bool kSignedDot = true;  // keys' bytes as they are stored, no offset
  static bool vnni() { return ::qkv::simd::sdot_in_use(); }
  static HWY_INLINE int8x16_t bytes(I x) { return vreinterpretq_s8_s32(x); }
  static HWY_INLINE I dpbusd(I acc, I u, I s) {
    return vaddq_s32(acc, int8::Sdot::sdot(bytes(u), bytes(s)));
  }
  static HWY_INLINE I pair_dot(I acc, I u, I s) {
    const int16x8_t lo = vmull_s8(vget_low_s8(bytes(u)), vget_low_s8(bytes(s)));
    const int16x8_t hi = vmull_high_s8(bytes(u), bytes(s));
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
  }
  static HWY_INLINE I broadcast(const int8_t* q) {
    int32_t v;
    std::memcpy(&v, q, 4);
    return vdupq_n_s32(v);
  }
  static constexpr int kLanes[4] = {0, 1, 2, 3};
  static constexpr bool kPermutesQ8 = false;
  // P[c] ← dword c of each of the 4 rows in a (a 4 × 4 transpose of 32-bit words).
  static HWY_INLINE void transpose(const I* a, I* P) {
    const I t0 = vtrn1q_s32(a[0], a[1]), t1 = vtrn2q_s32(a[0], a[1]);
    const I t2 = vtrn1q_s32(a[2], a[3]), t3 = vtrn2q_s32(a[2], a[3]);
    const auto wide = [](I x) { return vreinterpretq_s64_s32(x); };
    P[0] = vreinterpretq_s32_s64(vtrn1q_s64(wide(t0), wide(t2)));
    P[1] = vreinterpretq_s32_s64(vtrn1q_s64(wide(t1), wide(t3)));
    P[2] = vreinterpretq_s32_s64(vtrn2q_s64(wide(t0), wide(t2)));
    P[3] = vreinterpretq_s32_s64(vtrn2q_s64(wide(t1), wide(t3)));
  }
  static HWY_INLINE I load(const uint8_t* p) {
    return vld1q_s32(reinterpret_cast<const int32_t*>(p));
  }
  static HWY_INLINE void panel32(const uint8_t* const* rows, I* P) {
    const I lo[4] = {load(rows[0]), load(rows[1]), load(rows[2]), load(rows[3])};
    const I hi[4] = {load(rows[0] + 16), load(rows[1] + 16), load(rows[2] + 16),
                     load(rows[3] + 16)};
    transpose(lo, P);
    transpose(hi, P + 4);
  }
  static HWY_INLINE void panel16(const uint8_t* const* rows, I* P) {
    const I z[4] = {load(rows[0]), load(rows[1]), load(rows[2]), load(rows[3])};
    I w[4];
    transpose(z, w);
    const uint8x16_t low = vdupq_n_u8(15);
    for (int c = 0; c < 4; ++c) {
      const uint8x16_t b = vreinterpretq_u8_s32(w[c]);
      P[c] = vreinterpretq_s32_u8(vandq_u8(b, low));
      P[4 + c] = vreinterpretq_s32_u8(vshrq_n_u8(b, 4));
    }
  }
  static HWY_INLINE I sub(I x, int32_t v) { return vsubq_s32(x, vdupq_n_s32(v)); }
  static HWY_INLINE I zero() { return vdupq_n_s32(0); }
  static HWY_INLINE F fzero() { return vdupq_n_f32(0.0f); }
  static HWY_INLINE F fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }
  static HWY_INLINE F mul(F a, float b) { return vmulq_n_f32(a, b); }
  static HWY_INLINE F to_float(I x) { return vcvtq_f32_s32(x); }
  static HWY_INLINE F set(float x) { return vdupq_n_f32(x); }
  static HWY_INLINE F halves(const uint8_t* const* rows, int shift) {
    uint32_t w[4];
    for (int j = 0; j < 4; ++j) std::memcpy(&w[j], rows[j], 4);
    const uint32x4_t words = vshlq_u32(vld1q_u32(w), vdupq_n_s32(-shift));
    return vcvt_f32_f16(vreinterpret_f16_u16(vmovn_u32(words)));
  }
  static HWY_INLINE void store(F x, float* to, bool) { vst1q_f32(to, x); }
};
using Panel = Panel4;
#elif HWY_TARGET <= HWY_AVX3
// 512 bits: 16 keys a panel, AVX512-VNNI's vpdpbusd (written out: Highway 1.0.3's options name
// no AVX512-VNNI target, and the bf16 units' pass is AVX3 with AVX512-BF16 added).
struct Panel16 {
  using I = __m512i;
  using F = __m512;
  static constexpr int kKeys = 16;
  static constexpr bool kSignedDot = false;  // vpdpbusd: unsigned (keys) by signed (query)
  static bool vnni() { return ::qkv::simd::vnni_in_use(true); }
  static HWY_INLINE I dpbusd(I acc, I u, I s) { return simd::dpbusd(acc, u, s); }
  // The same sums without VNNI: vpmaddubsw + vpmaddwd (|u| ≤ 128 for no int16 saturation).
  static HWY_INLINE I pair_dot(I acc, I u, I s) {
    return _mm512_add_epi32(acc,
                            _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
  }
  static HWY_INLINE I abs(I x) { return _mm512_abs_epi8(x); }
  // s negated where w is negative (where w is 0 the product is 0 either way).
  static HWY_INLINE I sign(I s, I w) {
    return _mm512_mask_sub_epi8(s, _mm512_movepi8_mask(w), _mm512_setzero_si512(), s);
  }
  static HWY_INLINE I broadcast(const int8_t* q) {
    int32_t v;
    std::memcpy(&v, q, 4);
    return _mm512_set1_epi32(v);
  }
  // Q8_0: 32 data bytes of each key (rows[j] + 2) as P[t] (dword t of each key), keys in lanes
  // in the order kLanes says (two 8 × 8 transposes in the 256-bit halves, then 128-bit lanes
  // gathered from both: one shuffle per vector fewer than the natural order).
  static constexpr int kLanes[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};
  static constexpr bool kPermutesQ8 = true;
  static HWY_INLINE void panel32(const uint8_t* const* rows, I* P) {
    I z[8], t[8], u[8];
    for (int a = 0; a < 8; ++a)
      z[a] = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[a]))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[a + 8])), 1);
    for (int a = 0; a < 8; a += 2)
      t[a] = _mm512_unpacklo_epi32(z[a], z[a + 1]),
      t[a + 1] = _mm512_unpackhi_epi32(z[a], z[a + 1]);
    for (int g = 0; g < 8; g += 4) {
      u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]),
      u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
      u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
      u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    for (int m = 0; m < 4; ++m) {
      P[m] = _mm512_shuffle_i32x4(u[m], u[4 + m], _MM_SHUFFLE(2, 0, 2, 0));
      P[4 + m] = _mm512_shuffle_i32x4(u[m], u[4 + m], _MM_SHUFFLE(3, 1, 3, 1));
    }
  }
  // Q4: 16 bytes of nibbles of each key as P[t] (values 4t … 4t + 3), keys in natural order.
  static HWY_INLINE void panel16(const uint8_t* const* rows, I* P) {
    const auto row = [&](int i) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i]));
    };
    I z[4];
    for (int a = 0; a < 4; ++a)  // (immediates written out: unoptimized builds need them so)
      z[a] = _mm512_inserti32x4(
          _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(row(a)), row(4 + a), 1),
                             row(8 + a), 2),
          row(12 + a), 3);
    const I t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const I t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    const I w[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                    _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
    const I low = _mm512_set1_epi8(15);
    for (int c = 0; c < 4; ++c)
      P[c] = _mm512_and_si512(w[c], low),
      P[4 + c] = _mm512_and_si512(_mm512_srli_epi16(w[c], 4), low);
  }
  static HWY_INLINE I flip(I x) { return _mm512_xor_si512(x, _mm512_set1_epi8(char(0x80))); }
  static HWY_INLINE I sub(I x, int32_t v) { return _mm512_sub_epi32(x, _mm512_set1_epi32(v)); }
  static HWY_INLINE I zero() { return _mm512_setzero_si512(); }
  static HWY_INLINE F fzero() { return _mm512_setzero_ps(); }
  static HWY_INLINE F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static HWY_INLINE F mul(F a, float b) { return _mm512_mul_ps(a, _mm512_set1_ps(b)); }
  static HWY_INLINE F to_float(I x) { return _mm512_cvtepi32_ps(x); }
  static HWY_INLINE F set(float x) { return _mm512_set1_ps(x); }
  // The fp16 at byte `shift` / 8 of the 32-bit words at each key's rows[j] (the block's d, or
  // Q4_1's m with shift 16), as floats.
  static HWY_INLINE F halves(const uint8_t* const* rows, int shift) {
    alignas(64) int32_t w[16];
    for (int j = 0; j < 16; ++j) std::memcpy(&w[j], rows[j], 4);
    const I words = _mm512_srli_epi32(_mm512_load_si512(w), shift);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
  }
  static HWY_INLINE void store(F x, float* to, bool natural) {
    if (!natural) {
      const I back = _mm512_loadu_si512(kLanes);  // (the order is its own inverse)
      x = _mm512_permutexvar_ps(back, x);
    }
    _mm512_storeu_ps(to, x);
  }
};
using Panel = Panel16;
#else
// 256 bits: 8 keys a panel, AVX-VNNI's VEX vpdpbusd.
struct Panel8 {
  using I = __m256i;
  using F = __m256;
  static constexpr int kKeys = 8;
  static constexpr bool kSignedDot = false;
  static bool vnni() { return ::qkv::simd::vnni_in_use(false); }
  static HWY_INLINE I dpbusd(I acc, I u, I s) { return simd::dpbusd(acc, u, s); }
  static HWY_INLINE I pair_dot(I acc, I u, I s) {  // (the weight products' AVX2 bytes)
    return _mm256_add_epi32(acc, int8::Avx2<false>::dot_u8_s8(u, s));
  }
  static HWY_INLINE I abs(I x) { return _mm256_abs_epi8(x); }
  static HWY_INLINE I sign(I s, I w) { return _mm256_sign_epi8(s, w); }
  static HWY_INLINE I broadcast(const int8_t* q) {
    int32_t v;
    std::memcpy(&v, q, 4);
    return _mm256_set1_epi32(v);
  }
  static constexpr int kLanes[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  static constexpr bool kPermutesQ8 = false;
  static HWY_INLINE void panel32(const uint8_t* const* rows, I* P) {
    I z[8], t[8], u[8];
    for (int a = 0; a < 8; ++a)
      z[a] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[a]));
    for (int a = 0; a < 8; a += 2)
      t[a] = _mm256_unpacklo_epi32(z[a], z[a + 1]),
      t[a + 1] = _mm256_unpackhi_epi32(z[a], z[a + 1]);
    for (int g = 0; g < 8; g += 4) {
      u[g] = _mm256_unpacklo_epi64(t[g], t[g + 2]),
      u[g + 1] = _mm256_unpackhi_epi64(t[g], t[g + 2]);
      u[g + 2] = _mm256_unpacklo_epi64(t[g + 1], t[g + 3]);
      u[g + 3] = _mm256_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    for (int m = 0; m < 4; ++m) {
      P[m] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x20);
      P[4 + m] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x31);
    }
  }
  static HWY_INLINE void panel16(const uint8_t* const* rows, I* P) {
    I z[4];
    for (int a = 0; a < 4; ++a)
      z[a] = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[a]))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[4 + a])), 1);
    const I t0 = _mm256_unpacklo_epi32(z[0], z[1]), t1 = _mm256_unpackhi_epi32(z[0], z[1]);
    const I t2 = _mm256_unpacklo_epi32(z[2], z[3]), t3 = _mm256_unpackhi_epi32(z[2], z[3]);
    const I w[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                    _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
    const I low = _mm256_set1_epi8(15);
    for (int c = 0; c < 4; ++c)
      P[c] = _mm256_and_si256(w[c], low),
      P[4 + c] = _mm256_and_si256(_mm256_srli_epi16(w[c], 4), low);
  }
  static HWY_INLINE I flip(I x) { return _mm256_xor_si256(x, _mm256_set1_epi8(char(0x80))); }
  static HWY_INLINE I sub(I x, int32_t v) { return _mm256_sub_epi32(x, _mm256_set1_epi32(v)); }
  static HWY_INLINE I zero() { return _mm256_setzero_si256(); }
  static HWY_INLINE F fzero() { return _mm256_setzero_ps(); }
  static HWY_INLINE F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static HWY_INLINE F mul(F a, float b) { return _mm256_mul_ps(a, _mm256_set1_ps(b)); }
  static HWY_INLINE F to_float(I x) { return _mm256_cvtepi32_ps(x); }
  static HWY_INLINE F set(float x) { return _mm256_set1_ps(x); }
  static HWY_INLINE F halves(const uint8_t* const* rows, int shift) {
    alignas(32) int32_t w[8];
    for (int j = 0; j < 8; ++j) std::memcpy(&w[j], rows[j], 4);
    const I words = _mm256_and_si256(
        _mm256_srli_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(w)), shift),
        _mm256_set1_epi32(0xFFFF));
    const __m128i h =
        _mm_packus_epi32(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
    return _mm256_cvtph_ps(h);
  }
  static HWY_INLINE void store(F x, float* to, bool) { _mm256_storeu_ps(to, x); }
};
using Panel = Panel8;
#endif

// Integer Q·K runs on every x86 target from AVX2 and on AArch64: vpdpbusd or sdot where the
// CPU has it (kVnni), else vpmaddubsw + vpmaddwd or int16 products.
inline bool int8_scores_vnni() { return Panel::vnni(); }

// The rows unit with integer Q·K over blocks of kType on the panel Lanes, P·V on the FMAs or
// in integers (Int8Values). Without VNNI on x86, Q8_0's keys stay signed: their magnitudes
// times the query bytes with the keys' signs (at most 128 · 127 a product, which vpmaddubsw's
// int16 pairs hold). (Lanes is a parameter so that x86's unsigned-key steps, which the signed
// Arm panel lacks, are compiled only where they run.)
template <TensorType kType, bool kVnni, class Lanes = Panel>
struct RowsOnInt8 {
  static_assert(simd::kLaidOut<kType>, "RowsOnInt8: a block format it does not know");
  static constexpr bool kScalesScores = false;  // the queries arrive scaled
  static constexpr int64_t kBytes = kBlockBytes<kType>;
  // What the unsigned key bytes are above their values (taken back as offset · Σq).
  static constexpr int32_t kOffset = kType == TensorType::q8_0
                                         ? (kVnni && !Lanes::kSignedDot ? 128 : 0)
                                     : kType == TensorType::q4_0 ? 8
                                                                 : 0;
  static int64_t paired(const BlockSource<kType>&) { return 0; }
  const float* rows = nullptr;    // the query rows rounded to int8 (int8::Row), per_row apart
  const int32_t* sums = nullptr;  // [R][blocks]: each block's Σ q
  int64_t per_row = 0, D = 0, keys = 0;  // keys: the unit's

  void prepare(const BlockSource<kType>&, const float* q, int64_t R, int64_t dim, bool,
               int64_t count) {
    D = dim, keys = count, per_row = int8::floats_per_row(D);
    const int64_t blocks = D / kBlockValues;
    float* buf = thread_scratch(ForwardSlot::q_tiles, R * (per_row + blocks));
    auto* isum = reinterpret_cast<int32_t*>(buf + R * per_row);
    for (int64_t r = 0; r < R; ++r) {
      int8::quantize_row(q + r * D, D, buf + r * per_row);
      const int8::Row x = int8::row_at(buf + r * per_row, D);
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t sum = 0;
        for (int64_t i = 0; i < kBlockValues; ++i) sum += x.q[b * kBlockValues + i];
        isum[r * blocks + b] = sum;
      }
    }
    rows = buf, sums = isum;
  }

  // s[r · stride + jj] ← q_r · k_jj for the R rows and nk ≤ lanes keys from k, a panel at a
  // time (SVE's float lanes may hold more keys than the NEON panel).
  void scores(const BlockSource<kType>& K, const float*, int64_t R, const uint8_t* k, int64_t nk,
              int64_t ahead_rows, float, float* s, int64_t stride) {
    for (int64_t j = 0; j < ahead_rows; ++j)
      BlockSource<kType>::ask(k + (kPrefetchRows + j) * K.step, K.step, K.bytes);
    for (int64_t j = 0; j < nk; j += Lanes::kKeys)
      panel_scores(R, k + j * K.step, K.step, std::min<int64_t>(Lanes::kKeys, nk - j), s + j,
                   stride);
  }
  void panel_scores(int64_t R, const uint8_t* k, int64_t ks, int64_t nk, float* s, int64_t stride) {
    constexpr int L = Lanes::kKeys;
    static const uint8_t kZeros[kBytes] = {};
    const int64_t blocks = D / kBlockValues;
    // Keys past nk read a zero block (d = 0). The Q8_0 panel of Panel16 puts key kLanes[i] in
    // lane i, so its scales are read in that order and its scores put back at the end.
    constexpr bool kPermuted = kType == TensorType::q8_0 && Lanes::kPermutesQ8;
    const uint8_t* key[L];
    for (int j = 0; j < L; ++j) key[j] = j < nk ? k + j * ks : nullptr;
    typename Lanes::F out[kTiledDecodeMinRows];
    for (int64_t r = 0; r < R; ++r) out[r] = Lanes::fzero();
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t *at[L], *data[L], *lane_at[L];
      for (int j = 0; j < L; ++j) {
        at[j] = key[j] ? key[j] + b * kBytes : kZeros;
        data[j] = at[j] + kDataOffset<kType>;
      }
      for (int i = 0; i < L; ++i) lane_at[i] = at[kPermuted ? Lanes::kLanes[i] : i];
      typename Lanes::I P[8];
      [[maybe_unused]] typename Lanes::I signs[8];
      if constexpr (kType == TensorType::q8_0) {
        Lanes::panel32(data, P);
        if constexpr (!Lanes::kSignedDot)
          for (int t = 0; t < 8; ++t) {
            if constexpr (kVnni) P[t] = Lanes::flip(P[t]);
            else signs[t] = P[t], P[t] = Lanes::abs(P[t]);
          }
      } else {
        Lanes::panel16(data, P);
      }
      const typename Lanes::F dk = Lanes::halves(lane_at, 0);
      [[maybe_unused]] typename Lanes::F mk;
      if constexpr (kHasMin<kType>) mk = Lanes::halves(lane_at, 16);
      for (int64_t r = 0; r < R; ++r) {
        const int8::Row x = int8::row_at(rows + r * per_row, D);
        const int8_t* qb = x.q + b * kBlockValues;
        typename Lanes::I sum = Lanes::zero();
        for (int t = 0; t < 8; ++t) {
          const typename Lanes::I quad = Lanes::broadcast(qb + 4 * t);
          if constexpr (kVnni) sum = Lanes::dpbusd(sum, P[t], quad);
          else if constexpr (kType == TensorType::q8_0 && !Lanes::kSignedDot)
            sum = Lanes::pair_dot(sum, P[t], Lanes::sign(quad, signs[t]));
          else sum = Lanes::pair_dot(sum, P[t], quad);
        }
        if constexpr (kOffset != 0) sum = Lanes::sub(sum, kOffset * sums[r * blocks + b]);
        out[r] = Lanes::fma(Lanes::to_float(sum), Lanes::mul(dk, x.d[b]), out[r]);
        if constexpr (kHasMin<kType>) out[r] = Lanes::fma(mk, Lanes::set(x.sums[b]), out[r]);
      }
    }
    for (int64_t r = 0; r < R; ++r) Lanes::store(out[r], s + r * stride, !kPermuted);
  }

  void probabilities(const float*, int64_t, int64_t) {}
  // P·V: with P rounded to 8 bits (int8_values-inl.h) where the target has it, the value dim
  // fits and there are Values::kMinRows rows per kv head, else on the FMAs.
  static bool on_bytes(int64_t Dv, int64_t R) {
    if constexpr (kValuesOnBytes) return Values::fits(Dv) && R >= Values::kMinRows;
    return false;
  }
  // (Values in a format of their own, VSrc another source: on the FMAs.)
  template <class VSrc>
  void values(const VSrc& V, const float* s, int64_t stride, int64_t j, int64_t nk,
              typename VSrc::Ptr v, int64_t ahead_rows, int64_t R, float* const* o) {
    if constexpr (kValuesOnBytes && std::is_same_v<VSrc, BlockSource<kType>>) {
      if (on_bytes(V.dim, R)) {
        Values::add(s, stride, j, nk, v, V.step, V.bytes, keys - (j + nk), V.dim, R, o);
        return;
      }
    }
    V.value_rows(s, stride, j, nk, v, ahead_rows, R, o);
  }
  template <class VSrc>
  void finish(const VSrc& V, float* const* o, int64_t R) {
    if constexpr (kValuesOnBytes && std::is_same_v<VSrc, BlockSource<kType>>)
      if (on_bytes(V.dim, R)) {
        for (int64_t r = 0; r < R; ++r) Values::columns_from_lanes(o[r], V.dim);
        reached(Variant::decode_values_int8);
      }
  }

 private:
  static constexpr bool kValuesOnBytes = kInt8Values<kVnni>;
  using Values = Int8Values<kType, Lanes, kVnni>;
};
#else
inline constexpr bool kInt8Scores = false;
inline bool int8_scores_vnni() { return false; }
template <TensorType kType, bool kVnni, class Lanes = void>
struct RowsOnInt8;  // (x86 from AVX2, AArch64)
#endif

}  // namespace decoding
}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
