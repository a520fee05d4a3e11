// The AMX-INT8 unit of the int8 weight products (quant::Matmul::int8 where QKV_UNITS forces
// int8=amx): a prompt's rows (kAmxMinRows or more) against 32 weight rows at a time on
// Intel's tiles (src/simd/amx.h), one TDPBUSD per block, its integer sums scaled in fp32 after.
//   C  2 × 2 tiles of 16 weight rows × 16 tokens (int32), zeroed before each block: the block
//      scales differ from block to block, so each block's sums leave the tiles and are scaled
//      by d_w · d_x on vectors, the sums of all blocks in fp32 (as the vector units do)
//   A  16 weight rows × one block, as unsigned bytes (Q8_0 offset by 128, Q4's nibbles as they
//      are, Q6_K's 6-bit values): the offset times the activations' Σ q taken back from the
//      integer sums, exactly; Q4_1's and Q4_K's mins times d_x · Σ q added in fp32
//   B  16 tokens × one block of signed activations (int8::quantize_row), as the instruction
//      wants them: row k holds values 4k … 4k + 3 of each token
// A block is 32 values (a K-quant's sub-block), Q6_K's 16-value groups each their own (their
// scales differ within a sub-block). Each chunk of 32 weight rows is decoded once per product
// into the thread's scratch and then multiplied with every group of 32 tokens: no copy of the
// weights is kept (a 256-token prompt decodes each weight once for 8 groups).
// The same kernel runs on the tiles (amx::Hardware) or on the stand-in (amx::Emulated), which
// gives the same bits on any CPU. Included by src/quant/matmul.cpp, once per target; compiled
// on x86-64's AVX2 and AVX-512 targets (elsewhere runs() says no).
#if defined(QKV_QUANT_AMX_INT8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_QUANT_AMX_INT8_INL_H_
#undef QKV_QUANT_AMX_INT8_INL_H_
#else
#define QKV_QUANT_AMX_INT8_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <hwy/highway.h>

#include "qkv/error.h"
#include "qkv/quant.h"
#include "simd/amx.h"
#include "simd/half-inl.h"
#include "util/scratch.h"
#include "quant/int8-inl.h"
#include "quant/int8.h"
#include "quant/k_quants.h"
#include "quant/product_kernels.h"

#undef QKV_AMX_INT8
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define QKV_AMX_INT8 1
#else
#define QKV_AMX_INT8 0
#endif

HWY_BEFORE_NAMESPACE();
namespace qkv::quant {
namespace HWY_NAMESPACE {
namespace amx_int8 {

// Whether products with `rows` activation rows run here (forced, and compiled on this target).
inline bool runs(int64_t rows) {
#if QKV_AMX_INT8
  return rows >= kAmxMinRows && ::qkv::quant::int8::amx_prompts();
#else
  (void)rows;
  return false;
#endif
}

#if QKV_AMX_INT8
namespace hn = hwy::HWY_NAMESPACE;
using ::qkv::simd::HWY_NAMESPACE::half;

constexpr int64_t kRows = 32;    // weight rows a chunk: two A tiles (matmul.cpp's chunk)
constexpr int64_t kTokens = 32;  // activation rows a group: two B tiles
constexpr int64_t kTile = 16;    // a tile's rows

// Values a TDPBUSD multiplies (one scale): 32, Q6_K's 16-value groups 16.
template <TensorType T>
constexpr int64_t kDepth = T == TensorType::q6_k ? 16 : 32;
// log2 of what the unsigned values are offset by (Q8_0 128, Q4_0 8, Q6_K 32), −1 for none.
template <TensorType T>
constexpr int kOffsetShift = T == TensorType::q8_0   ? 7
                             : T == TensorType::q4_0 ? 3
                             : T == TensorType::q6_k ? 5
                                                     : -1;
template <TensorType T>
constexpr bool kHasMin = T == TensorType::q4_1 || T == TensorType::q4_k;

// ---- A group of 32 tokens, laid out for the B tiles ------------------------------------------
//   quads   two halves (tokens 0–15, 16–31), each K/4 rows of 64 bytes: row k holds values
//           4k … 4k + 3 of each of the half's 16 tokens (a block of depth S: S/4 rows)
//   d, sums per 32-block b, [b][32 tokens]: int8::Row's d and d · Σ q
//   isum    per 16 values g, [g][32 tokens]: Σ q, as an integer
// Tokens past the prompt's last are zeros.
struct Tokens {
  const uint8_t* quads;
  const float *d, *sums;
  const int32_t* isum;
};
inline int64_t group_floats(int64_t K) { return 8 * K + 2 * K + 2 * K; }
inline Tokens tokens_at(const float* base, int64_t K) {
  const float* d = base + 8 * K;
  return {reinterpret_cast<const uint8_t*>(base), d, d + K,
          reinterpret_cast<const int32_t*>(d + 2 * K)};
}

// Group g of the M rows quantized at `rows` (int8::floats_per_row(K) floats apart) into `out`.
inline void pack_tokens(const float* rows, int64_t M, int64_t K, int64_t g, float* out) {
  const Tokens x = tokens_at(out, K);
  auto* quads = const_cast<uint8_t*>(x.quads);
  auto* d = const_cast<float*>(x.d);
  auto* sums = const_cast<float*>(x.sums);
  auto* isum = const_cast<int32_t*>(x.isum);
  const int64_t nb = K / int8::kBlock;
  for (int64_t t = 0; t < kTokens; ++t) {
    const int64_t i = g * kTokens + t;
    uint8_t* column = quads + t / kTile * kTile * K + 4 * (t % kTile);
    if (i >= M) {
      for (int64_t k = 0; k < K / 4; ++k) std::memset(column + 64 * k, 0, 4);
      for (int64_t b = 0; b < nb; ++b) d[b * kTokens + t] = sums[b * kTokens + t] = 0;
      for (int64_t s = 0; s < 2 * nb; ++s) isum[s * kTokens + t] = 0;
      continue;
    }
    const int8::Row r = int8::row_at(rows + i * int8::floats_per_row(K), K);
    for (int64_t k = 0; k < K / 4; ++k) std::memcpy(column + 64 * k, r.q + 4 * k, 4);
    for (int64_t b = 0; b < nb; ++b) d[b * kTokens + t] = r.d[b], sums[b * kTokens + t] = r.sums[b];
    for (int64_t s = 0; s < 2 * nb; ++s) {
      int32_t sum = 0;
      for (int j = 0; j < 16; ++j) sum += r.q[16 * s + j];
      isum[s * kTokens + t] = sum;
    }
  }
}

// ---- A chunk of 32 weight rows, laid out for the A tiles -------------------------------------
//   u     per block s (depth S), [s][32 rows][S] unsigned bytes
//   a, m  per block s, [s][32 rows]: the scale of the block's integer sums and the min (Q4_1,
//         Q4_K) that multiplies d_x · Σ q apart
// Rows past the matrix's last are zeros.
struct Chunk {
  uint8_t* u;
  float *a, *m;
};
inline int64_t chunk_floats(int64_t K) { return 8 * K + 2 * (K / 16) * kRows; }
template <TensorType T>
inline Chunk chunk_at(float* base, int64_t K) {
  float* a = base + 8 * K;
  return {reinterpret_cast<uint8_t*>(base), a, a + K / kDepth<T> * kRows};
}

// Row r of the chunk from the weight row at `row` (K values).
template <TensorType T>
inline void decode_row(const uint8_t* row, int64_t K, int64_t r, const Chunk& c) {
  constexpr int64_t S = kDepth<T>;
  constexpr int64_t bytes = block_size(static_cast<uint32_t>(T))->bytes;  // a (super-)block's
  for (int64_t s = 0; s < K / S; ++s) {
    uint8_t* u = c.u + (s * kRows + r) * S;
    float &a = c.a[s * kRows + r], &m = c.m[s * kRows + r];
    m = 0;
    if constexpr (T == TensorType::q8_0) {
      const uint8_t* blk = row + s * bytes;
      a = half(blk);
      for (int j = 0; j < 32; ++j) u[j] = blk[2 + j] ^ 0x80;
    } else if constexpr (T == TensorType::q4_0 || T == TensorType::q4_1) {
      const uint8_t* blk = row + s * bytes;
      const uint8_t* q = blk + kDataOffset<T>;
      a = half(blk);
      if constexpr (T == TensorType::q4_1) m = half(blk + 2);
      for (int j = 0; j < 16; ++j) u[j] = q[j] & 15, u[16 + j] = q[j] >> 4;
    } else if constexpr (T == TensorType::q4_k) {
      const uint8_t* sb = row + s / 8 * bytes;
      const int j = static_cast<int>(s % 8);
      int scale, min;
      q4_k_scale_min(j, sb + kQ4kScales, scale, min);
      a = half(sb) * static_cast<float>(scale);
      m = static_cast<float>(min) * -half(sb + 2);  // (as int8-inl.h's unpack_scales)
      const uint8_t* q = sb + kQ4kValues + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int i = 0; i < 32; ++i) u[i] = (q[i] >> shift) & 15;
    } else {  // Q6_K: group s % 16 of super-block s / 16, half s % 2 of sub-block (s % 16) / 2
      const uint8_t* sb = row + s / 16 * bytes;
      const Q6kSubBlock q = q6_k_sub_block(sb, static_cast<int>(s % 16 / 2));
      const int h = static_cast<int>(s % 2);
      a = half(sb + kQ6kScale) * static_cast<float>(q.scales[h]);
      for (int i = 16 * h; i < 16 * (h + 1); ++i)
        u[i - 16 * h] = static_cast<uint8_t>(((q.ql[i] >> q.nibble_shift) & 15) |
                                             ((q.qh[i] >> q.high_shift) & 3) << 4);
    }
  }
}

// Rows [row0, row0 + n) of m (n ≤ 32) into the chunk at `base`.
template <TensorType T>
inline void decode_chunk(const Matrix& m, int64_t row0, int64_t n, float* base) {
  const int64_t K = m.cols, rb = row_bytes(m.type, K);
  const Chunk c = chunk_at<T>(base, K);
  for (int64_t r = 0; r < n; ++r) decode_row<T>(m.data + (row0 + r) * rb, K, r, c);
  if (n == kRows) return;
  constexpr int64_t S = kDepth<T>;
  for (int64_t s = 0; s < K / S; ++s) {
    std::memset(c.u + (s * kRows + n) * S, 0, (kRows - n) * S);
    std::fill(c.a + s * kRows + n, c.a + (s + 1) * kRows, 0.0f);
    std::fill(c.m + s * kRows + n, c.m + (s + 1) * kRows, 0.0f);
  }
}

// ---- The product ---------------------------------------------------------------------------
// y[i · ldy + r] = chunk row r · token i, for r < n and the M tokens packed at `tokens`
// (group_floats(K) floats a group). Each output is one sum over the blocks in order: the same
// bits for any thread count.
template <class Tiles, TensorType T>
void chunk_product(const float* chunk, int64_t K, const float* tokens, int64_t M, int64_t n,
                   float* y, int64_t ldy) {
  constexpr int64_t S = kDepth<T>;
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const Chunk w = chunk_at<T>(const_cast<float*>(chunk), K);
  amx::Config config;
  for (int t = 0; t < 4; ++t) config.tile(t, kTile, 64);  // C: 16 rows × 16 int32
  config.tile(4, kTile, S).tile(5, kTile, S);             // A: 16 rows × S bytes
  config.tile(6, S / 4, 64).tile(7, S / 4, 64);           // B: S/4 quads × 16 tokens
  Tiles::configure(config);
  alignas(64) int32_t c[kRows * kTokens];
  alignas(64) float acc[kRows * kTokens];
  for (int64_t g = 0; g * kTokens < M; ++g) {
    const Tokens x = tokens_at(tokens + g * group_floats(K), K);
    std::fill(acc, acc + kRows * kTokens, 0.0f);
    for (int64_t s = 0; s < K / S; ++s) {
      Tiles::template zero<0>(), Tiles::template zero<1>();
      Tiles::template zero<2>(), Tiles::template zero<3>();
      Tiles::template load<4>(w.u + s * kRows * S, S);
      Tiles::template load<5>(w.u + (s * kRows + kTile) * S, S);
      Tiles::template load<6>(x.quads + s * S / 4 * 64, 64);
      Tiles::template load<7>(x.quads + kTile * K + s * S / 4 * 64, 64);
      Tiles::template dpbusd<0, 4, 6>(), Tiles::template dpbusd<1, 4, 7>();
      Tiles::template dpbusd<2, 5, 6>(), Tiles::template dpbusd<3, 5, 7>();
      Tiles::template store<0>(c, 4 * kTokens);
      Tiles::template store<1>(c + kTile, 4 * kTokens);
      Tiles::template store<2>(c + kTile * kTokens, 4 * kTokens);
      Tiles::template store<3>(c + kTile * kTokens + kTile, 4 * kTokens);
      // acc += (C − offset · Σ q) · a · d_x (+ m · d_x Σ q), a vector of tokens at a time.
      const int64_t b = s * S / int8::kBlock;  // the activations' 32-block
      for (int64_t v = 0; v < kTokens; v += N) {
        const auto dx = hn::Load(df, x.d + b * kTokens + v);
        auto offset = hn::Zero(di);
        if constexpr (kOffsetShift<T> >= 0) {
          const int64_t g16 = s * S / 16;
          auto sum = hn::Load(di, x.isum + g16 * kTokens + v);
          if constexpr (S == 32) sum = hn::Add(sum, hn::Load(di, x.isum + (g16 + 1) * kTokens + v));
          offset = hn::ShiftLeft<(kOffsetShift<T> < 0 ? 0 : kOffsetShift<T>)>(sum);
        }
        const auto sx = hn::Load(df, x.sums + b * kTokens + v);
        for (int64_t r = 0; r < kRows; ++r) {
          const auto sums = hn::ConvertTo(df, hn::Sub(hn::Load(di, c + r * kTokens + v), offset));
          auto out = hn::Load(df, acc + r * kTokens + v);
          out = hn::MulAdd(sums, hn::Mul(hn::Set(df, w.a[s * kRows + r]), dx), out);
          if constexpr (kHasMin<T>) out = hn::MulAdd(hn::Set(df, w.m[s * kRows + r]), sx, out);
          hn::Store(out, df, acc + r * kTokens + v);
        }
      }
    }
    for (int64_t t = 0; t < std::min(kTokens, M - g * kTokens); ++t)
      for (int64_t r = 0; r < n; ++r) y[(g * kTokens + t) * ldy + r] = acc[r * kTokens + t];
  }
  Tiles::release();
}

// Whether this process runs the tiles or the stand-in (amx::stand_in()); throws where the
// tiles were forced but cannot run (checked once per product, before its threads).
inline void check_tiles() {
  if (amx::stand_in()) return;
  if (const char* why = amx::unavailable()) fail("int8 products on AMX tiles: ", why);
}

// y[i · ldy + r] = (row row0 + r of m) · token i, for r < n ≤ 32 and the M packed tokens.
template <TensorType T>
void range(const Matrix& m, int64_t row0, int64_t n, int64_t M, const float* tokens, float* y,
           int64_t ldy) {
  float* chunk =
      ::qkv::detail::thread_scratch(::qkv::detail::QuantSlot::amx_chunk, chunk_floats(m.cols));
  decode_chunk<T>(m, row0, n, chunk);
#if defined(__x86_64__)
  if (!amx::stand_in()) return chunk_product<amx::Hardware, T>(chunk, m.cols, tokens, M, n, y, ldy);
#endif
  chunk_product<amx::Emulated, T>(chunk, m.cols, tokens, M, n, y, ldy);
}

inline void range_of(const Matrix& m, int64_t row0, int64_t n, int64_t M, const float* tokens,
                     float* y, int64_t ldy) {
  switch (m.type) {
    case TensorType::q8_0:
      return range<TensorType::q8_0>(m, row0, n, M, tokens, y, ldy);
    case TensorType::q4_0:
      return range<TensorType::q4_0>(m, row0, n, M, tokens, y, ldy);
    case TensorType::q4_1:
      return range<TensorType::q4_1>(m, row0, n, M, tokens, y, ldy);
    case TensorType::q4_k:
      return range<TensorType::q4_k>(m, row0, n, M, tokens, y, ldy);
    case TensorType::q6_k:
      return range<TensorType::q6_k>(m, row0, n, M, tokens, y, ldy);
    default:
      fail("AMX int8 products: no kernel for ", to_string(m.type), " weights");
  }
}
#endif  // QKV_AMX_INT8

}  // namespace amx_int8
}  // namespace HWY_NAMESPACE
}  // namespace qkv::quant
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
