// quant::linear_forward (include/qkv/quant.h): products with weights in ggml's block formats,
// compiled once per SIMD target; the entry point dispatches (src/simd/dispatch.h).
//
// One row of input (decoding) is bound by how fast the weights stream from memory: each
// block is decoded in registers (its 4- or 8-bit values widened to fp32) and multiplied into
// a vector accumulator, the block's fp32 scale applied to the block's partial sum, 4 weight
// rows side by side for the prefetcher, as the fp32 gemv does: the exact units of the one
// product loop (quant/tile-inl.h), whose int8 units are in quant/int8-inl.h. Several rows
// (a prompt) decode 32 weight rows at a time into an fp32 tile in the thread's scratch and
// multiply it with all the rows by the GEMM. Output rows are split across threads; each output
// is one thread's sum in a fixed order, so the bits do not depend on the thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "quant/matmul.cpp"
#include <hwy/foreach_target.h>
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "ops/gemm.h"
#include "qkv/error.h"
#include "qkv/quant.h"
#include "qkv/targets.h"
#include "qkv/threads.h"
#include "simd/amx.h"
#include "simd/dispatch.h"
#include "simd/simd-inl.h"
#include "simd/kernel_namespace.h"
#include "util/parallel.h"
#include "util/scratch.h"
#include "util/type_switch.h"
#include "simd/blocks-inl.h"
#include "simd/half-inl.h"
#include "quant/int8-inl.h"
#include "quant/amx_int8-inl.h"
#include "quant/k_quants.h"
#include "quant/product_kernels.h"

QKV_KERNEL_BEGIN(qkv::quant)
namespace {

using qkv::TensorType;
using simd::half;
using simd::VfSlot;
const hn::RebindToSigned<simd::Df> di;
const hn::Rebind<uint8_t, simd::Df> du8;
const hn::Rebind<int8_t, simd::Df> di8;
const hn::Rebind<hwy::float16_t, simd::Df> dh;
const hn::Rebind<hwy::bfloat16_t, simd::Df> db;

constexpr int kRowsPerStep = 4;  // weight rows decoded side by side
// Values per block of the fused block formats (from the one table of block sizes).
constexpr int64_t kBlock = kKvBlockValues;  // q8_0's, q4_0's and q4_1's (number_format.h)
constexpr int64_t kChunk = 32;              // output rows per unit of work

// Σ q·x over one 32-value block (simd/blocks-inl.h's format) as a vector whose lanes are
// summed at the end (the caller applies the block's scale, and Q4_1's offset times Σ x): the
// values j … j + N, then (Q4) the ones 16 further on from the same bytes' high nibbles.
template <TensorType T>
HWY_INLINE Vf block_dot(const uint8_t* blk, const float* x) {
  const size_t N = hn::Lanes(df);
  Vf t = hn::Zero(df);
  if constexpr (T == TensorType::q8_0) {
    for (size_t j = 0; j < size_t(kBlock); j += N)
      t = hn::MulAdd(simd::block_ints<T>(blk, j), hn::LoadU(df, x + j), t);
  } else {
    for (size_t j = 0; j < size_t(kBlock / 2); j += N) {
      t = hn::MulAdd(simd::block_ints<T>(blk, j), hn::LoadU(df, x + j), t);
      t = hn::MulAdd(simd::block_ints<T>(blk, kBlock / 2 + j), hn::LoadU(df, x + kBlock / 2 + j),
                     t);
    }
  }
  return t;
}

// The K-quants' 32-value sub-block j of the super-block at sb (layouts in k_quants.h):
// Σ q·x, with Q4_K's nibbles as they are (the caller applies d · scale_j and − dmin · min_j
// times the block's Σ x).
// Q4_K's sub-blocks j and j + 1 (j even) are the low and high nibbles of the same 32 bytes:
// each byte widened once for both, lo = Σ q·x of j (x at x), hi of j + 1 (x at x + 32).
HWY_INLINE void block_q4_k_pair(const uint8_t* sb, int j, const float* x, Vf& lo, Vf& hi) {
  const size_t N = hn::Lanes(df);
  const uint8_t* q = sb + kQ4kValues + 16 * j;
  lo = hn::Zero(df), hi = hn::Zero(df);
  for (size_t i = 0; i < size_t(kBlock); i += N) {
    const auto v = hn::PromoteTo(di, hn::LoadU(du8, q + i));
    lo = hn::MulAdd(hn::ConvertTo(df, hn::And(v, hn::Set(di, 15))), hn::LoadU(df, x + i), lo);
    hi = hn::MulAdd(hn::ConvertTo(df, hn::ShiftRight<4>(v)), hn::LoadU(df, x + kBlock + i), hi);
  }
}
// Q6_K's: Σ (q − 32)·x of each 16-value group scaled by d · its own scale.
HWY_INLINE Vf block_q6_k(const uint8_t* sb, int j, const float* x) {
  const size_t N = hn::Lanes(df);
  const Q6kSubBlock s = q6_k_sub_block(sb, j);
  const float d = half(sb + kQ6kScale);
  Vf t = hn::Zero(df);
  for (size_t g = 0; g < 2; ++g) {
    Vf group = hn::Zero(df);
    for (size_t i = 16 * g; i < 16 * (g + 1); i += N) {
      const auto low =
          hn::And(hn::ShiftRightSame(hn::PromoteTo(di, hn::LoadU(du8, s.ql + i)), s.nibble_shift),
                  hn::Set(di, 15));
      const auto high =
          hn::And(hn::ShiftRightSame(hn::PromoteTo(di, hn::LoadU(du8, s.qh + i)), s.high_shift),
                  hn::Set(di, 3));
      const auto q = hn::Sub(hn::Or(low, hn::ShiftLeft<4>(high)), hn::Set(di, 32));
      group = hn::MulAdd(hn::ConvertTo(df, q), hn::LoadU(df, x + i), group);
    }
    t = hn::MulAdd(hn::Set(df, d * static_cast<float>(s.scales[g])), group, t);
  }
  return t;
}

// The exact units (quant/tile-inl.h): one row of fp32 activations, and xsum[b], its sum over
// block b (Q4_1's and Q4_K's offsets multiply it).
struct FloatRow {
  const float *x, *xsum;
};

// A block-format matrix (32-value blocks, or sub-blocks of the K-quants' 256; Q4_K's two a
// step) widened in registers: each block's Σ q·x scaled by its scale, the offsets apart.
template <TensorType T, int R>
struct WideBlockUnit {
  static constexpr int64_t kBlocks = T == TensorType::q4_k ? 2 : 1;
  static constexpr int64_t kBytes = block_size(static_cast<uint32_t>(T))->bytes;
  static constexpr bool kKQuant = T == TensorType::q4_k || T == TensorType::q6_k;
  struct Acc {
    VfSlot sums[R];
    float extra[R];
    Acc() {
      for (int r = 0; r < R; ++r) sums[r] = hn::Zero(df), extra[r] = 0;
    }
  };
  struct Weights {
    const uint8_t* blk;  // the step's block (a K-quant's super-block) of the first row
    int64_t rb;
  };
  // (The blocks are widened as they are multiplied, with one row of activations: each row's
  // block is asked for ahead just before its product, as the prefetcher likes it.)
  struct State {};
  static HWY_INLINE void decode(const uint8_t* w, int64_t rb, int64_t b, State&, Weights& wv) {
    wv.blk = w + (kKQuant ? b / 8 : b) * kBytes, wv.rb = rb;
  }
  static HWY_INLINE void accumulate(Acc& a, const Weights& wv, const FloatRow& x, int64_t b) {
    const float *xb = x.x + kBlock * b, *xsum = x.xsum;
    const int j = static_cast<int>(b % 8);  // a K-quant's sub-block
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = wv.blk + r * wv.rb;
      hwy::Prefetch(blk + 2 * R * wv.rb);     // the same block two steps of R rows ahead
      if constexpr (T == TensorType::q4_k) {  // sub-blocks j and j + 1
        int scale0, min0, scale1, min1;
        q4_k_scale_min(j, blk + kQ4kScales, scale0, min0);
        q4_k_scale_min(j + 1, blk + kQ4kScales, scale1, min1);
        Vf lo, hi;
        block_q4_k_pair(blk, j, xb, lo, hi);
        const float d = half(blk), dmin = half(blk + 2);
        a.sums[r] = hn::MulAdd(hn::Set(df, d * static_cast<float>(scale0)), lo, Vf(a.sums[r]));
        a.sums[r] = hn::MulAdd(hn::Set(df, d * static_cast<float>(scale1)), hi, Vf(a.sums[r]));
        a.extra[r] -=
            dmin * (static_cast<float>(min0) * xsum[b] + static_cast<float>(min1) * xsum[b + 1]);
      } else if constexpr (T == TensorType::q6_k) {
        a.sums[r] = hn::Add(block_q6_k(blk, j, xb), Vf(a.sums[r]));
      } else {
        a.sums[r] =
            hn::MulAdd(hn::Set(df, simd::block_scale(blk)), block_dot<T>(blk, xb), Vf(a.sums[r]));
        if constexpr (simd::kHasMin<T>) a.extra[r] += simd::block_min<T>(blk) * xsum[b];
      }
    }
  }
  static HWY_INLINE void finish(const Acc& a, float* y) {
    for (int r = 0; r < R; ++r) y[r] = hn::GetLane(hn::SumOfLanes(df, Vf(a.sums[r]))) + a.extra[r];
  }
};

// One value per element: F16, BF16 (widened) and F32, a vector of them a step (the values
// past the last whole vector are the caller's).
template <TensorType T>
HWY_INLINE Vf load_wide(const uint8_t* p) {
  if constexpr (T == TensorType::f16)
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
  else if constexpr (T == TensorType::bf16)
    return hn::PromoteTo(df, hn::LoadU(db, reinterpret_cast<const hwy::bfloat16_t*>(p)));
  else return hn::LoadU(df, reinterpret_cast<const float*>(p));
}

template <TensorType T>
float scalar_value(const uint8_t* p) {
  uint16_t u;
  std::memcpy(&u, p, 2);
  if constexpr (T == TensorType::f16) return half(p);
  else if constexpr (T == TensorType::bf16) return bf16_to_float(u);
  else {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
}

template <TensorType T>
constexpr int64_t kElementBytes = T == TensorType::f32 ? 4 : 2;

template <TensorType T, int R>
struct WideElementUnit {
  static constexpr int64_t kBlocks = 1;
  struct Weights {
    const uint8_t* row[R];  // the step's values of each row
  };
  struct Acc {
    VfSlot sums[R];
    Acc() {
      for (int r = 0; r < R; ++r) sums[r] = hn::Zero(df);
    }
  };
  struct State {};
  static HWY_INLINE void decode(const uint8_t* w, int64_t rb, int64_t b, State&, Weights& wv) {
    const int64_t k = b * static_cast<int64_t>(hn::Lanes(df));
    for (int r = 0; r < R; ++r) wv.row[r] = w + r * rb + k * kElementBytes<T>;
  }
  static HWY_INLINE void accumulate(Acc& a, const Weights& wv, const FloatRow& x, int64_t b) {
    const Vf xv = hn::LoadU(df, x.x + b * static_cast<int64_t>(hn::Lanes(df)));
    for (int r = 0; r < R; ++r) a.sums[r] = hn::MulAdd(load_wide<T>(wv.row[r]), xv, Vf(a.sums[r]));
  }
  static HWY_INLINE void finish(const Acc& a, float* y) {
    for (int r = 0; r < R; ++r) y[r] = hn::GetLane(hn::SumOfLanes(df, Vf(a.sums[r])));
  }
};

template <TensorType T, int R>
HWY_INLINE void dot_rows(const Matrix& m, int64_t row, const FloatRow& x, float* y) {
  const int64_t rb = row_bytes(m.type, m.cols), K = m.cols;
  const uint8_t* w = m.data + row * rb;
  if constexpr (T == TensorType::q8_0 || T == TensorType::q4_0 || T == TensorType::q4_1 ||
                T == TensorType::q4_k || T == TensorType::q6_k) {
    tile<WideBlockUnit<T, R>, 1>(w, rb, 0, K / kBlock, &x, &y);
  } else {
    const int64_t N = static_cast<int64_t>(hn::Lanes(df)), vectors = K / N;
    tile<WideElementUnit<T, R>, 1>(w, rb, 0, vectors, &x, &y);
    for (int r = 0; r < R; ++r)
      for (int64_t t = vectors * N; t < K; ++t)
        y[r] += scalar_value<T>(w + r * rb + t * kElementBytes<T>) * x.x[t];
  }
}

// y[begin, end) (rows of m) = m · x.
template <TensorType T>
void dot_range(const Matrix& m, int64_t begin, int64_t end, const FloatRow& x, float* y) {
  int64_t r = begin;
  for (; r + kRowsPerStep <= end; r += kRowsPerStep) dot_rows<T, kRowsPerStep>(m, r, x, y + r);
  for (; r < end; ++r) dot_rows<T, 1>(m, r, x, y + r);
}

void dot_range_of(const Matrix& m, int64_t begin, int64_t end, const float* x, const float* xsum,
                  float* y) {
  switch (m.type) {
    case TensorType::q8_0:
      return dot_range<TensorType::q8_0>(m, begin, end, {x, xsum}, y);
    case TensorType::q4_0:
      return dot_range<TensorType::q4_0>(m, begin, end, {x, xsum}, y);
    case TensorType::q4_1:
      return dot_range<TensorType::q4_1>(m, begin, end, {x, xsum}, y);
    case TensorType::q4_k:
      return dot_range<TensorType::q4_k>(m, begin, end, {x, xsum}, y);
    case TensorType::q6_k:
      return dot_range<TensorType::q6_k>(m, begin, end, {x, xsum}, y);
    case TensorType::f16:
      return dot_range<TensorType::f16>(m, begin, end, {x, xsum}, y);
    case TensorType::bf16:
      return dot_range<TensorType::bf16>(m, begin, end, {x, xsum}, y);
    case TensorType::f32:
      return dot_range<TensorType::f32>(m, begin, end, {x, xsum}, y);
    default:
      break;
  }
}

bool fused(TensorType t) {
  return t == TensorType::q8_0 || t == TensorType::q4_0 || t == TensorType::q4_1 ||
         t == TensorType::q4_k || t == TensorType::q6_k || t == TensorType::f16 ||
         t == TensorType::bf16 || t == TensorType::f32;
}

// Rows [row0, row0 + n) of m into out (n × cols floats): the fused types decoded by vectors,
// the others by the reference dequantizer.
void decode_rows(const Matrix& m, int64_t row0, int64_t n, float* out) {
  const int64_t rb = row_bytes(m.type, m.cols), K = m.cols;
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* w = m.data + (row0 + r) * rb;
    float* y = out + r * K;
    switch (m.type) {
      case TensorType::q8_0:
      case TensorType::q4_0:
      case TensorType::q4_1:
        simd::with_block_format(m.type, [&](auto format) {
          constexpr TensorType T = decltype(format)::value;
          for (int64_t b = 0; b < K / kBlock; ++b)
            simd::widen_block<T>(w + simd::kBlockBytes<T> * b, y + kBlock * b);
        });
        break;
      default:
        dequantize_rows(m, row0 + r, 1, y);
    }
  }
}

// Whether the int8 products take weights of type t (the others keep fp32 activations).
bool takes_int8(TensorType t) {
  return std::find(std::begin(::qkv::quant::int8::kWeightTypes), std::end(::qkv::quant::int8::kWeightTypes), t) !=
         std::end(::qkv::quant::int8::kWeightTypes);
}

// f(format) for the int8 weight format t.
template <typename F>
auto with_int8_weights(TensorType t, F&& f) {
  return ::qkv::detail::with_type_in<::qkv::quant::int8::kWeightTypes>(t, "a format of the int8 products",
                                                          std::forward<F>(f));
}

// The kernel of weights of type t in `mode` for `rows` activation rows (linear_forward's choice).
ProductKernel kernel_for(TensorType t, Matmul mode, int64_t rows) {
  if (mode == Matmul::int8 && takes_int8(t)) {
    if (amx_int8::runs(rows)) return ProductKernel::int8_amx;
    return with_int8_weights(t, [](auto f) { return int8::int8_kernel<decltype(f)::value>(); });
  }
  return rows == 1 && fused(t) ? ProductKernel::rows_widened : ProductKernel::tiles_widened;
}

// y[i, begin, end) = rows [begin, end) of m · row i of x, for the M rows of x quantized to int8
// (int8::quantize_row, each int8::floats_per_row(K) floats from `rows`), on `unit`.
void int8_range_of(const Matrix& m, ProductKernel unit, int64_t begin, int64_t end, int64_t M,
                   const float* rows, float* y, int64_t ldy) {
  const int64_t rb = row_bytes(m.type, m.cols);
  with_int8_weights(m.type, [&](auto f) {
    int8::dot_range_rows<decltype(f)::value>(m.data, rb, m.packed, m.cols, unit, begin, end, rows,
                                             M, y, ldy);
  });
}

}  // namespace

ProductKernel product_kernel(TensorType t, Matmul mode, int64_t rows) {
  return kernel_for(t, mode, rows);
}

void linear_forward(View y, View x, const std::vector<Matrix>& parts, const float* bias,
                    Matmul mode) {
  const int64_t M = x.shape[0], K = x.shape[1];
  const float* xd = x.data;
  const int64_t ldx = x.stride[0], ldy = y.stride[0];
  int64_t chunks = 0;
  for (const Matrix& p : parts) chunks += (p.rows + kChunk - 1) / kChunk;
  // Chunk c as (part, first row, rows, first output column).
  auto locate = [&](int64_t c, size_t& part, int64_t& row0, int64_t& n, int64_t& col0) {
    col0 = 0;
    for (part = 0; part < parts.size(); ++part) {
      const Matrix& p = parts[part];
      const int64_t here = (p.rows + kChunk - 1) / kChunk;
      if (c < here) {
        row0 = c * kChunk, n = std::min(kChunk, p.rows - row0);
        return;
      }
      c -= here, col0 += p.rows;
    }
  };
  // As the fp32 gemv: below ~256 KiB of weights (y.shape[1] rows of K) the threads cost more
  // than they save.
  const int threads = y.shape[1] * K < (1 << 16) ? 1 : num_threads();
  const auto int8_part = [](const Matrix& p) { return takes_int8(p.type); };
  const bool int8 = mode == Matmul::int8 && std::any_of(parts.begin(), parts.end(), int8_part);
  // Each part's kernel, chosen once (kernel_for); the chunks run it.
  ProductKernel plan[8];
  check(parts.size() <= std::size(plan), "linear_forward: at most 8 parts, got ", parts.size());
  for (size_t i = 0; i < parts.size(); ++i)
    reached(plan[i] = kernel_for(parts[i].type, int8 ? mode : Matmul::exact, M));
  const int64_t nb = K / kBlock;
  // The int8 products' activations (all M rows, once), or the sums of x over each block that
  // Q4_1's offsets multiply in the exact one-row product. In a team, every thread prepares one
  // row for itself (a few hundred values: less than the barriers that sharing them costs).
  const bool own_row = ::qkv::detail::in_team() && M == 1;
  const size_t scratch_floats = int8 ? M * int8::floats_per_row(K) : nb + 1;
  float* scratch =
      own_row ? ::qkv::detail::thread_scratch(::qkv::detail::QuantSlot::block_sums, scratch_floats)
              : ::qkv::detail::team_scratch(::qkv::detail::QuantSlot::block_sums, scratch_floats);
  float* xsum = scratch;
  // AMX-INT8 (a prompt, forced): the quantized rows again, 32 at a time as its tiles read them.
  const bool amx = int8 && amx_int8::runs(M);
  float* tokens = nullptr;
  (void)tokens, (void)amx;
#if QKV_AMX_INT8
  const int64_t groups = (M + amx_int8::kTokens - 1) / amx_int8::kTokens;
  if (amx) {
    amx_int8::check_tiles();
    tokens = ::qkv::detail::team_scratch(::qkv::detail::QuantSlot::amx_tokens,
                                         groups * amx_int8::group_floats(K));
  }
#endif
  if (int8) {
    // (A prompt's rows in parallel: one thread quantizing 478 rows took ~6% of a prefill.)
    if (own_row) int8::quantize_row(xd, K, scratch);
    else
      ::qkv::detail::parallel_for(M, M > 1 ? num_threads() : 1, [&](int64_t i) {
        int8::quantize_row(xd + i * ldx, K, scratch + i * int8::floats_per_row(K));
      });
#if QKV_AMX_INT8
    if (amx)
      ::qkv::detail::parallel_for(groups, num_threads(), [&](int64_t g) {
        amx_int8::pack_tokens(scratch, M, K, g, tokens + g * amx_int8::group_floats(K));
      });
#endif
  } else if (M == 1 && std::any_of(parts.begin(), parts.end(), [](const Matrix& p) {
               return p.type == TensorType::q4_1 || p.type == TensorType::q4_k;
             })) {
    const auto block_sums = [&] {
      for (int64_t b = 0; b < nb; ++b) {
        float sum = 0;
        for (int j = 0; j < kBlock; ++j) sum += xd[kBlock * b + j];
        xsum[b] = sum;
      }
    };
    if (own_row) block_sums();
    else ::qkv::detail::team_serial(block_sums);
  }
  ::qkv::detail::parallel_for(chunks, threads, [&](int64_t c) {
    size_t part = 0;
    int64_t row0 = 0, n = 0, col0 = 0;
    locate(c, part, row0, n, col0);
    const Matrix* m = &parts[part];
    float* out = y.data + col0;
    switch (plan[part]) {
      case ProductKernel::int8_amx:
#if QKV_AMX_INT8
        amx_int8::range_of(*m, row0, n, M, tokens, out + row0, ldy);
        break;
#endif
      case ProductKernel::int8_vpdpbusd:
      case ProductKernel::int8_avx_vnni:
      case ProductKernel::int8_vpmaddubsw:
      case ProductKernel::int8_sdot:
      case ProductKernel::int8_int16:
        int8_range_of(*m, plan[part], row0, row0 + n, M, scratch, out, ldy);
        break;
      case ProductKernel::rows_widened:
        dot_range_of(*m, row0, row0 + n, xd, xsum, out);
        break;
      case ProductKernel::tiles_widened: {
        float* tile = ::qkv::detail::thread_scratch(::qkv::detail::QuantSlot::tile, n * K);
        decode_rows(*m, row0, n, tile);
        ::qkv::detail::gemm(false, true, M, n, K, 1.0f, xd, ldx, tile, K, 0.0f, out + row0, ldy);
        break;
      }
    }
    if (bias)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t r = row0; r < row0 + n; ++r) out[i * ldy + r] += bias[col0 + r];
  });
}

QKV_KERNEL_END();  // qkv::quant::HWY_NAMESPACE

#if HWY_ONCE
namespace qkv::quant {

Matmul matmul_from_name(const std::string& name) {
  if (name == "exact") return Matmul::exact;
  if (name == "int8") return Matmul::int8;
  fail("unknown matmul mode '", name, "' (choose exact or int8)");
}

const char* matmul_name(Matmul mode) { return mode == Matmul::int8 ? "int8" : "exact"; }

namespace {

// Each kernel's unit (as qkv info and QKV_UNITS name it) and what it does.
struct KernelName {
  ProductKernel kernel;
  const char* unit;
  const char* why;
};
constexpr KernelName kKernelNames[] = {
    {ProductKernel::rows_widened, "fma", "widened to fp32 in registers, 4 weight rows at a time"},
    {ProductKernel::tiles_widened, "fma", "32 weight rows widened to fp32, then the fp32 GEMM"},
    {ProductKernel::int8_vpdpbusd, "vpdpbusd",
     "activations to int8 blocks; AVX512-VNNI on 512-bit vectors, two blocks a vector"},
    {ProductKernel::int8_avx_vnni, "avx_vnni",
     "activations to int8 blocks; AVX-VNNI on 256-bit vectors"},
    {ProductKernel::int8_vpmaddubsw, "vpmaddubsw",
     "activations to int8 blocks; vpmaddubsw + vpmaddwd"},
    {ProductKernel::int8_sdot, "sdot", "activations to int8 blocks; Arm's sdot"},
    {ProductKernel::int8_int16, "int16",
     "activations to int8 blocks; bytes widened to int16 pairs"},
    {ProductKernel::int8_amx, "amx",
     "activations to int8 blocks; AMX-INT8 tiles (TDPBUSD), 32 weight rows by 32 prompt rows, "
     "each block's sums scaled in fp32"},
};
const KernelName& named(ProductKernel k) {
  for (const KernelName& n : kKernelNames)
    if (n.kernel == k) return n;
  return kKernelNames[0];
}

}  // namespace

const char* unit_name(ProductKernel k) { return named(k).unit; }
const char* kernel_why(ProductKernel k) { return named(k).why; }

std::atomic<uint32_t>& kernels_reached() {
  static std::atomic<uint32_t> bits{0};
  return bits;
}

}  // namespace qkv::quant

namespace qkv {

std::vector<UnitInUse> weight_units() {
  using quant::Matmul, quant::ProductKernel;
  std::vector<UnitInUse> out;
  for (TensorType t : {TensorType::q8_0, TensorType::q4_0, TensorType::q4_1, TensorType::q4_k,
                       TensorType::q6_k, TensorType::f16, TensorType::bf16, TensorType::f32}) {
    const std::string name = lower_name(t) + " weights";
    out.push_back(
        {name, quant::unit_name(ProductKernel::rows_widened),
         t == TensorType::f32
             ? "one row in registers; more rows: 32 weight rows copied, then the fp32 GEMM"
             : "one row widened in registers; more rows: 32 weight rows widened, then "
               "the fp32 GEMM"});
    const ProductKernel int8 = quant::product_kernel(t, Matmul::int8, 1);
    if (int8 != ProductKernel::rows_widened)
      out.push_back({name + ", int8", quant::unit_name(int8), quant::kernel_why(int8)});
    const ProductKernel prompts = quant::product_kernel(t, Matmul::int8, quant::kAmxMinRows);
    if (prompts == ProductKernel::int8_amx)
      out.push_back({name + ", int8, " + std::to_string(quant::kAmxMinRows) + "+ rows",
                     quant::unit_name(prompts),
                     std::string(amx::stand_in() ? "forced, on the stand-in (QKV_AMX_STAND_IN): "
                                                 : "forced: ") +
                         quant::kernel_why(prompts)});
  }
  return out;
}

}  // namespace qkv

namespace qkv::quant {

HWY_EXPORT(product_kernel);
ProductKernel product_kernel(TensorType t, Matmul mode, int64_t rows) {
  return QKV_DISPATCH(product_kernel)(t, mode, rows);
}

HWY_EXPORT(linear_forward);
void linear_forward(View y, View x, const std::vector<Matrix>& parts, const float* b, Matmul mode) {
  check(x.ndim == 2 && y.ndim == 2 && !parts.empty(),
        "quant::linear_forward: need 2-D x, y and a weight");
  int64_t rows = 0;
  for (const Matrix& p : parts) {
    check(p.cols == x.shape[1], "quant::linear_forward: a weight of ", p.cols,
          " columns for inputs of ", x.shape[1]);
    rows += p.rows;
  }
  check(y.shape[0] == x.shape[0] && y.shape[1] == rows, "quant::linear_forward: output [",
        y.shape[0], ", ", y.shape[1], "] for ", x.shape[0], " rows of ", rows);
  check(x.stride[1] == 1 && y.stride[1] == 1, "quant::linear_forward: rows must be contiguous");
  QKV_DISPATCH(linear_forward)(y, x, parts, b, mode);
}

}  // namespace qkv::quant
#endif  // HWY_ONCE
