// quant::linear_forward, on every SIMD target, against the reference dequantizer and a
// float64 product: every block type, one row (the fused kernels) and many (the tile path),
// weights in parts, a bias, strided rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "qkv/error.h"
#include "qkv/quant.h"
#include "qkv/threads.h"
#include "qkv/number_format.h"
#include "qkv/targets.h"
#include "quant/int8.h"
#include "simd/amx.h"
#include "simd/cpu.h"
#include "quant/product_kernels.h"

namespace qkv {
namespace {

using qkv::TensorType;

// Random blocks of `type` with sane half-precision scales (values up to ~±10).
std::vector<uint8_t> random_blocks(TensorType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const int64_t rb = quant::row_bytes(type, cols);
  std::vector<uint8_t> data(rows * rb);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : data) b = static_cast<uint8_t>(byte(rng));
  // Half scales up to 2^-4, subnormal ones among them, either sign where the format allows it.
  std::uniform_int_distribution<int> mant(0, 0x3ff), expo(0, 10);
  auto half = [&](uint8_t* p, bool negative) {
    const uint16_t h = static_cast<uint16_t>((negative ? 0x8000 : 0) | expo(rng) << 10 | mant(rng));
    p[0] = h & 0xff, p[1] = h >> 8;
  };
  const BlockSize bs = block_of(type);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / bs.elements; ++b) {
      uint8_t* blk = data.data() + r * rb + b * bs.bytes;
      switch (type) {
        case TensorType::q8_0:
        case TensorType::q4_0:
          half(blk, byte(rng) & 1);
          break;
        case TensorType::q4_1:
          half(blk, false), half(blk + 2, true);
          break;
        case TensorType::q4_k:
          half(blk, false), half(blk + 2, false);
          break;
        case TensorType::q6_k:
          half(blk + 208, false);
          break;
        case TensorType::f16:
          half(blk, byte(rng) & 1), blk[1] += 0x14;
          break;  // ~±1
        case TensorType::bf16:
          blk[1] = static_cast<uint8_t>((blk[1] & 0x80) | 0x3f);
          break;
        case TensorType::f32: {
          const float f = std::uniform_real_distribution<float>(-1, 1)(rng);
          std::memcpy(blk, &f, 4);
          break;
        }
        default:
          break;
      }
    }
  return data;
}

class QuantLinear : public ::testing::TestWithParam<TensorType> {};

TEST_P(QuantLinear, MatchesTheReferenceDequantizer) {
  const TensorType type = GetParam();
  std::mt19937 rng(static_cast<unsigned>(type) + 7);
  const int64_t K = 512;  // whole blocks of every type (256 for the K-quants)
  const std::vector<int64_t> part_rows = {37, 64, 5};  // ragged: rows left over per chunk and step
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<quant::Matrix> parts;
  for (int64_t rows : part_rows) {
    bytes.push_back(random_blocks(type, rows, K, rng));
    parts.push_back(quant::matrix("w", type, bytes.back().data(), rows, K));
  }
  int64_t N = 0;
  for (int64_t r : part_rows) N += r;
  std::vector<float> w(N * K);
  for (size_t p = 0, row = 0; p < parts.size(); row += parts[p].rows, ++p)
    quant::dequantize_rows(parts[p], 0, parts[p].rows, w.data() + row * K);
  std::vector<float> bias(N);
  std::normal_distribution<float> normal;
  for (float& b : bias) b = normal(rng);
  for (int64_t M : {1, 2, 5, 33}) {
    for (bool with_bias : {false, true}) {
      const int64_t ldx = K + 3, ldy = N + 5;  // strided rows
      std::vector<float> x(M * ldx), y(M * ldy, NAN);
      for (float& v : x) v = normal(rng);
      quant::linear_forward(View(y.data(), {M, N}, {ldy, 1}), View(x.data(), {M, K}, {ldx, 1}),
                            parts, with_bias ? bias.data() : nullptr);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t n = 0; n < N; ++n) {
          double want = with_bias ? bias[n] : 0, size = 0;
          for (int64_t k = 0; k < K; ++k) {
            want += static_cast<double>(w[n * K + k]) * x[i * ldx + k];
            size += std::abs(static_cast<double>(w[n * K + k]) * x[i * ldx + k]);
          }
          ASSERT_NEAR(y[i * ldy + n], want, 1e-6 * size + 1e-6)
              << to_string(type) << " M " << M << " row " << i << " output " << n;
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, QuantLinear,
                         ::testing::Values(TensorType::f32, TensorType::f16, TensorType::bf16,
                                           TensorType::q8_0, TensorType::q4_0, TensorType::q4_1,
                                           TensorType::q4_k, TensorType::q6_k),
                         [](const auto& info) { return to_string(info.param); });

TEST(QuantLinear, BadShapesAreClearErrors) {
  std::vector<uint8_t> blocks(34 * 4);
  EXPECT_THROW(quant::matrix("w", TensorType::q8_0, blocks.data(), 2, 48),
               Error);  // not whole blocks
  EXPECT_THROW(quant::matrix("w", TensorType::q5_0, blocks.data(), 1, 32), Error);  // unsupported
  const quant::Matrix m = quant::matrix("w", TensorType::q8_0, blocks.data(), 2, 64);
  std::vector<float> x(64), y(3);
  EXPECT_THROW(quant::linear_forward(View(y.data(), {1, 3}), View(x.data(), {1, 64}), {m}), Error);
  EXPECT_THROW(quant::linear_forward(View(y.data(), {1, 2}), View(x.data(), {2, 32}), {m}), Error);
}

// ---- The int8 products (Matmul::int8) ------------------------------------------------------

// llama.cpp's rounding of one 32-block of activations to int8 (written here from its
// definition): d = max|x| / 127, q = x / d to nearest, ties to even.
void q8_block(const float* x, int8_t* q, float& d) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::abs(x[j]));
  d = amax / 127;
  for (int j = 0; j < 32; ++j) q[j] = static_cast<int8_t>(std::nearbyint(d != 0 ? x[j] / d : 0));
}

// The float64 product of activation row x with weight row w (K values), the sum of the
// terms' magnitudes, and how far rounding x to int8 blocks may move it: Σ_j |w_j| · d_b / 2.
struct Float64Product {
  double value = 0, size = 0, bound = 0;
};
Float64Product float64_product(const float* x, const float* w, int64_t K) {
  Float64Product p;
  for (int64_t b = 0; b < K / 32; ++b) {
    int8_t q[32];
    float d;
    q8_block(&x[b * 32], q, d);
    for (int j = 0; j < 32; ++j) {
      const double wj = w[b * 32 + j], xj = x[b * 32 + j];
      p.value += wj * xj, p.size += std::abs(wj * xj), p.bound += std::abs(wj) * d / 2;
    }
  }
  return p;
}

// Block b of a weight row as integers and scales: w_j = dw · qw_j + mw.
void weight_block(TensorType type, const uint8_t* row, int64_t b, int32_t* qw, float& dw,
                  float& mw) {
  const BlockSize bs = block_of(type);
  const uint8_t* blk = row + b * bs.bytes;
  auto half_at = [](const uint8_t* p) {
    return half_to_float(static_cast<uint16_t>(p[0] | p[1] << 8));
  };
  dw = half_at(blk), mw = 0;
  if (type == TensorType::q8_0) {
    for (int j = 0; j < 32; ++j) qw[j] = static_cast<int8_t>(blk[2 + j]);
    return;
  }
  const uint8_t* q = blk + (type == TensorType::q4_1 ? 4 : 2);
  if (type == TensorType::q4_1) mw = half_at(blk + 2);
  for (int j = 0; j < 16; ++j) {
    qw[j] = q[j] & 15, qw[j + 16] = q[j] >> 4;
    if (type == TensorType::q4_0) qw[j] -= 8, qw[j + 16] -= 8;
  }
}

// Unit scales and integer activations (each block's largest ±127, so d = 1 and q = x): every
// sum the kernels form is an integer below 2^24, so the output is the integer product itself,
// bit for bit, whatever the order of the additions: the block sums of the integer kernels
// against this scalar one.
// (Ms: the activation rows; 16 or more reach a forced AMX unit.)
static void integer_products_are_exact(std::initializer_list<int64_t> Ms = {1, 3}) {
  std::mt19937 rng(21);
  std::uniform_int_distribution<int> value(-127, 127), byte(0, 255);
  for (TensorType type : {TensorType::q8_0, TensorType::q4_0, TensorType::q4_1})
    for (int64_t K : {32, 96, 1024})
      for (int64_t M : Ms) {
        const int64_t N = 41;  // a chunk, then 4-row steps and single rows
        const int64_t rb = quant::row_bytes(type, K);
        std::vector<uint8_t> w(N * rb);
        for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
        const BlockSize bs = block_of(type);
        for (int64_t r = 0; r < N; ++r)
          for (int64_t b = 0; b < K / 32; ++b) {
            uint8_t* blk = w.data() + r * rb + b * bs.bytes;
            blk[0] = 0x00, blk[1] = 0x3c;                                // d = 1
            if (type == TensorType::q4_1) blk[2] = 0x00, blk[3] = 0xc2;  // m = −3
            if (type == TensorType::q8_0)
              for (int j = 0; j < 32; ++j) blk[2 + j] = static_cast<uint8_t>(value(rng));
          }
        std::vector<float> x(M * K), y(M * N);
        for (int64_t i = 0; i < M * K; ++i) x[i] = static_cast<float>(value(rng));
        for (int64_t b = 0; b < M * K / 32; ++b) x[b * 32 + b % 32] = b % 2 ? 127.0f : -127.0f;
        const quant::Matrix m = quant::matrix("w", type, w.data(), N, K);
        quant::linear_forward(View(y.data(), {M, N}), View(x.data(), {M, K}), {m}, nullptr,
                              quant::Matmul::int8);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t n = 0; n < N; ++n) {
            int64_t want = 0;
            for (int64_t b = 0; b < K / 32; ++b) {
              int32_t qw[32];
              float dw, mw;
              weight_block(type, w.data() + n * rb, b, qw, dw, mw);
              for (int j = 0; j < 32; ++j)
                want += static_cast<int64_t>(qw[j] + static_cast<int>(mw)) *
                        static_cast<int64_t>(x[i * K + b * 32 + j]);
            }
            ASSERT_EQ(y[i * N + n], static_cast<float>(want))
                << to_string(type) << " K " << K << " row " << i << " output " << n;
          }
      }
}

// The same for the K-quants (Q4_K, Q6_K) with d = dmin = 1 and small integer scales, the
// weights read by the reference dequantizer. The activations are small but for each block's
// ±127, so that every sum stays below 2^24.
static void k_quant_products_are_exact(std::initializer_list<int64_t> Ms = {1, 3}) {
  std::mt19937 rng(24);
  std::uniform_int_distribution<int> value(-7, 7), byte(0, 255);
  for (TensorType type : {TensorType::q4_k, TensorType::q6_k})
    for (int64_t K : {256, 512})
      for (int64_t M : Ms) {
        const int64_t N = 41;
        const int64_t rb = quant::row_bytes(type, K);
        std::vector<uint8_t> w(N * rb);
        for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
        for (int64_t r = 0; r < N; ++r)
          for (int64_t s = 0; s < K / 256; ++s) {
            uint8_t* sb = w.data() + r * rb + s * block_of(type).bytes;
            if (type == TensorType::q4_k) {
              sb[0] = 0x00, sb[1] = 0x3c, sb[2] = 0x00, sb[3] = 0x3c;  // d = dmin = 1
              for (int j = 0; j < 8; ++j) sb[4 + j] &= 0x3f;           // scales and mins up to 63
            } else {
              for (int j = 0; j < 16; ++j) sb[192 + j] = static_cast<uint8_t>(value(rng) * 9);
              sb[208] = 0x00, sb[209] = 0x3c;  // d = 1
            }
          }
        std::vector<float> x(M * K), y(M * N), wf(N * K);
        for (int64_t i = 0; i < M * K; ++i) x[i] = static_cast<float>(value(rng));
        for (int64_t b = 0; b < M * K / 32; ++b) x[b * 32 + b % 32] = b % 2 ? 127.0f : -127.0f;
        const quant::Matrix m = quant::matrix("w", type, w.data(), N, K);
        quant::dequantize_rows(m, 0, N, wf.data());
        quant::linear_forward(View(y.data(), {M, N}), View(x.data(), {M, K}), {m}, nullptr,
                              quant::Matmul::int8);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t n = 0; n < N; ++n) {
            int64_t want = 0;
            for (int64_t k = 0; k < K; ++k)
              want += static_cast<int64_t>(wf[n * K + k]) * static_cast<int64_t>(x[i * K + k]);
            ASSERT_EQ(y[i * N + n], static_cast<float>(want))
                << to_string(type) << " K " << K << " row " << i << " output " << n;
          }
      }
}

// f(unit) with each int8 unit this CPU has forced: on x86 AVX512-VNNI's vpdpbusd, AVX-VNNI and
// vpmaddubsw + vpmaddwd, on AArch64 sdot and int16 pairs; the table chooses again after.
template <class F>
void for_each_int8_unit(F&& f) {
  for (simd::Unit unit : {simd::Unit::vpdpbusd, simd::Unit::avx_vnni, simd::Unit::vpmaddubsw,
                          simd::Unit::sdot, simd::Unit::int16}) {
    try {
      simd::force_unit(simd::Work::int8, unit);
    } catch (const Error&) {
      continue;  // not on this CPU
    }
    SCOPED_TRACE(simd::name_of(unit));
    f(unit);
  }
  simd::force_unit(simd::Work::int8, std::nullopt);
}

TEST(QuantInt8, IntegerProductsAreExact) {
  for_each_int8_unit([](simd::Unit) {
    integer_products_are_exact();
    k_quant_products_are_exact();
  });
}

// Real scales: the int8 output against the exact one, within what rounding the activations
// moves it (each x_j by at most d/2: Σ_j |w_j| · d_b / 2) plus fp32 slack; and the same bits
// for one and two threads.
TEST(QuantInt8, WithinTheActivationRoundingOfTheExactProduct) {
  std::mt19937 rng(22);
  std::normal_distribution<float> normal;
  const int64_t K = 512, N = 133;
  for (TensorType type :
       {TensorType::q8_0, TensorType::q4_0, TensorType::q4_1, TensorType::q4_k, TensorType::q6_k})
    for (int64_t M : {1, 4}) {
      const std::vector<uint8_t> bytes = random_blocks(type, N, K, rng);
      const quant::Matrix m = quant::matrix("w", type, bytes.data(), N, K);
      std::vector<float> w(N * K), bias(N);
      quant::dequantize_rows(m, 0, N, w.data());
      for (float& b : bias) b = normal(rng);
      std::vector<float> x(M * K), exact(M * N), int8(M * N), int8_one(M * N);
      for (float& v : x) v = normal(rng);
      const View xv(x.data(), {M, K});
      quant::linear_forward(View(exact.data(), {M, N}), xv, {m}, bias.data());
      quant::linear_forward(View(int8.data(), {M, N}), xv, {m}, bias.data(), quant::Matmul::int8);
      const int threads = num_threads();
      set_num_threads(1);
      quant::linear_forward(View(int8_one.data(), {M, N}), xv, {m}, bias.data(),
                            quant::Matmul::int8);
      set_num_threads(threads);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t n = 0; n < N; ++n) {
          double bound = 0, size = 0;
          for (int64_t b = 0; b < K / 32; ++b) {
            int8_t q[32];
            float d;
            q8_block(&x[i * K + b * 32], q, d);
            for (int j = 0; j < 32; ++j) {
              const double wj = std::abs(w[n * K + b * 32 + j]);
              bound += wj * d / 2;
              size += wj * std::abs(x[i * K + b * 32 + j]);
            }
          }
          const float got = int8[i * N + n];
          ASSERT_NEAR(got, exact[i * N + n], bound + 1e-5 * size + 1e-5)
              << to_string(type) << " M " << M << " row " << i << " output " << n;
          ASSERT_EQ(std::memcmp(&got, &int8_one[i * N + n], 4), 0) << "threads change the bits";
        }
    }
}

// ---- The product grid: format × mode × rows × unit --------------------------------------------

// The kernel a combination must reach, from the target's name and the int8 unit the registry
// chose (or a test forced): written here from the targets' instruction sets, not from the code
// that dispatches.
quant::ProductKernel expected_kernel(TensorType t, quant::Matmul mode, int64_t M) {
  using K = quant::ProductKernel;
  const bool int8_format = t == TensorType::q8_0 || t == TensorType::q4_0 ||
                           t == TensorType::q4_1 || t == TensorType::q4_k || t == TensorType::q6_k;
  if (mode == quant::Matmul::exact || !int8_format)
    return M == 1 ? K::rows_widened : K::tiles_widened;
  const std::string target = current_target();
  const simd::Unit unit = simd::unit_of(simd::Work::int8);
  // AVX512-VNNI where the unit is it (or AMX's, beneath); Q6_K's 16-value groups not.
  const bool vnni512 = unit == simd::Unit::vpdpbusd || unit == simd::Unit::amx;
  if (target == "avx512_dl" || target == "avx512_bf16")
    return t == TensorType::q6_k || !vnni512 ? K::int8_vpmaddubsw : K::int8_vpdpbusd;
  // AVX-VNNI where the unit is it, or a 512-bit one on a CPU that has it too.
  const bool avx_vnni =
      unit == simd::Unit::avx_vnni || (vnni512 && simd::cpu_features().avx_vnni);
  if (target == "avx2") return avx_vnni ? K::int8_avx_vnni : K::int8_vpmaddubsw;
  if (target == "avx512" || target == "sse4") return K::int8_vpmaddubsw;
  if (target == "emu128" || target == "scalar") return K::int8_int16;
  return unit == simd::Unit::sdot ? K::int8_sdot : K::int8_int16;  // AArch64's targets
}

// Every weight format, both modes, one activation row (the row form) and five (the tile form),
// on every int8 unit this CPU has: the kernel it reaches, named in the output, and its products
// against a float64 one over the reference dequantizer's weights (int8: within the rounding of
// the activations).
TEST(QuantKernels, EveryFormatModeRowsAndUnitReachItsKernel) {
  std::mt19937 rng(31);
  std::normal_distribution<float> normal;
  const int64_t K = 512, N = 70;
  int ran = 0;
  for_each_int8_unit([&](simd::Unit unit) {
    for (TensorType type : {TensorType::q8_0, TensorType::q4_0, TensorType::q4_1, TensorType::q4_k,
                            TensorType::q6_k, TensorType::f16, TensorType::bf16, TensorType::f32}) {
      const std::vector<uint8_t> bytes = random_blocks(type, N, K, rng);
      const quant::Matrix m = quant::matrix("w", type, bytes.data(), N, K);
      std::vector<float> w(N * K);
      quant::dequantize_rows(m, 0, N, w.data());
      for (quant::Matmul mode : {quant::Matmul::exact, quant::Matmul::int8})
        for (int64_t M : {1, 5}) {
          const quant::ProductKernel want = expected_kernel(type, mode, M);
          const std::string name = to_string(type) + " " + quant::matmul_name(mode) + " M " +
                                   std::to_string(M) + " unit " + simd::name_of(unit) + ": " +
                                   quant::unit_name(want) + ", " + quant::kernel_why(want);
          SCOPED_TRACE(name);
          std::vector<float> x(M * K), y(M * N, NAN);
          for (float& v : x) v = normal(rng);
          quant::kernels_reached() = 0;
          quant::linear_forward(View(y.data(), {M, N}), View(x.data(), {M, K}), {m}, nullptr, mode);
          EXPECT_EQ(quant::kernels_reached().load(), static_cast<uint32_t>(want));
          EXPECT_EQ(quant::product_kernel(type, mode, M), want);
          const bool int8 = static_cast<uint32_t>(want) >=
                            static_cast<uint32_t>(quant::ProductKernel::int8_vpdpbusd);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t n = 0; n < N; ++n) {
              const Float64Product p = float64_product(&x[i * K], &w[n * K], K);
              ASSERT_NEAR(y[i * N + n], p.value, (int8 ? p.bound : 0) + 1e-5 * p.size + 1e-5)
                  << "row " << i << " output " << n;
            }
          ++ran;
        }
    }
  });
  EXPECT_GE(ran, 32);  // at least one unit's whole grid
  std::printf("product grid: %d combinations on target %s\n", ran, current_target().c_str());
}

// Weights repacked for the int8 unit in use give the same bits as the file's layout: rows
// past whole groups of 4 and an odd last block (read from the file), one activation row and a
// prompt's tiles. Where the unit reads the file's layout, there is nothing to repack.
TEST(QuantInt8, RepackedWeightsGiveTheSameBits) {
  std::mt19937 rng(31);
  std::normal_distribution<float> normal;
  for (TensorType type : {TensorType::q8_0, TensorType::q4_0, TensorType::q4_1, TensorType::q4_k})
    for (int64_t K : {96, 256}) {
      if (type == TensorType::q4_k && K % 256 != 0) continue;
      const int64_t N = 70;
      SCOPED_TRACE(testing::Message() << dtype_name(type) << " K=" << K);
      const std::vector<uint8_t> bytes = random_blocks(type, N, K, rng);
      quant::Matrix m = quant::matrix("w", type, bytes.data(), N, K);
      const std::vector<uint8_t> packed = quant::repack_for_int8(m);
      const bool repacks =
          type != TensorType::q4_k && quant::product_kernel(type, quant::Matmul::int8, 2) ==
                                          quant::ProductKernel::int8_vpdpbusd;
      if (!repacks) {
        EXPECT_TRUE(packed.empty());
        continue;
      }
      ASSERT_EQ(packed.size(),
                static_cast<size_t>(N / 4 * 4 * quant::row_bytes(type, K / 64 * 64)));
      for (int64_t M : {1, 5}) {
        std::vector<float> x(M * K), plain(M * N), repacked(M * N);
        for (float& v : x) v = normal(rng);
        const View xv(x.data(), {M, K});
        m.packed = nullptr;
        quant::linear_forward(View(plain.data(), {M, N}), xv, {m}, nullptr, quant::Matmul::int8);
        m.packed = packed.data();
        quant::linear_forward(View(repacked.data(), {M, N}), xv, {m}, nullptr, quant::Matmul::int8);
        EXPECT_EQ(std::memcmp(plain.data(), repacked.data(), plain.size() * sizeof(float)), 0)
            << "M=" << M;
      }
    }
}

// ---- The AMX-INT8 unit (forced), on the stand-in -------------------------------------------

// Whether this target compiles the AMX-INT8 unit (x86-64's AVX2 and AVX-512 targets).
bool target_has_amx_int8() {
  const std::string target = current_target();
  return target == "avx2" || target.rfind("avx512", 0) == 0;
}

// f() with int8=amx forced on the stand-in; the table and the instructions again after.
template <class F>
void on_amx_int8(F&& f) {
  amx::set_stand_in(true);
  simd::force_unit(simd::Work::int8, simd::Unit::amx);
  try {
    f();
  } catch (...) {
    simd::force_unit(simd::Work::int8, std::nullopt);
    amx::set_stand_in(false);
    throw;
  }
  simd::force_unit(simd::Work::int8, std::nullopt);
  amx::set_stand_in(false);
}

// Scale-1 weights and integer activations: the tiles' block sums, offsets taken back and mins
// added, are the integer products themselves.
TEST(QuantAmxInt8, IntegerProductsAreExact) {
  if (!target_has_amx_int8()) GTEST_SKIP() << "AMX-INT8 is compiled for AVX2 and AVX-512 only";
  on_amx_int8([] {
    integer_products_are_exact({16, 33});
    k_quant_products_are_exact({16, 33});
  });
}

// Real scales, every int8 format, a prompt of 16 rows and one of 45 (a partial group of 32),
// 70 weight rows (a partial chunk of 32): the unit reached, the float64 product within the
// activations' rounding, the vector unit's output within fp32 rounding (the same integer
// block sums, added in another order), the same bits for 1 and 3 threads; 15 rows stay on
// the vector unit.
TEST(QuantAmxInt8, StandInMatchesTheVectorUnitAndTheReference) {
  if (!target_has_amx_int8()) GTEST_SKIP() << "AMX-INT8 is compiled for AVX2 and AVX-512 only";
  std::mt19937 rng(41);
  std::normal_distribution<float> normal;
  const int64_t K = 512, N = 70;
  for (TensorType type :
       {TensorType::q8_0, TensorType::q4_0, TensorType::q4_1, TensorType::q4_k, TensorType::q6_k}) {
    const std::vector<uint8_t> bytes = random_blocks(type, N, K, rng);
    const quant::Matrix m = quant::matrix("w", type, bytes.data(), N, K);
    std::vector<float> w(N * K);
    quant::dequantize_rows(m, 0, N, w.data());
    for (int64_t M : {15, 16, 45}) {
      SCOPED_TRACE(testing::Message() << to_string(type) << " M " << M);
      std::vector<float> x(M * K), vector(M * N), tiles(M * N), one(M * N);
      for (float& v : x) v = normal(rng);
      const View xv(x.data(), {M, K});
      quant::linear_forward(View(vector.data(), {M, N}), xv, {m}, nullptr, quant::Matmul::int8);
      const quant::ProductKernel beneath = quant::product_kernel(type, quant::Matmul::int8, M);
      on_amx_int8([&] {
        quant::kernels_reached() = 0;
        quant::linear_forward(View(tiles.data(), {M, N}), xv, {m}, nullptr, quant::Matmul::int8);
        const auto want = M >= quant::kAmxMinRows ? quant::ProductKernel::int8_amx : beneath;
        EXPECT_EQ(quant::kernels_reached().load(), static_cast<uint32_t>(want));
        const int threads = num_threads();
        set_num_threads(threads == 1 ? 3 : 1);
        quant::linear_forward(View(one.data(), {M, N}), xv, {m}, nullptr, quant::Matmul::int8);
        set_num_threads(threads);
      });
      EXPECT_EQ(std::memcmp(tiles.data(), one.data(), 4 * tiles.size()), 0) << "threads";
      for (int64_t i = 0; i < M; ++i)
        for (int64_t n = 0; n < N; ++n) {
          const Float64Product p = float64_product(&x[i * K], &w[n * K], K);
          ASSERT_NEAR(tiles[i * N + n], p.value, p.bound + 1e-5 * p.size + 1e-5)
              << "row " << i << " output " << n;
          ASSERT_NEAR(tiles[i * N + n], vector[i * N + n], 2e-6 * p.size + 1e-6)
              << "row " << i << " output " << n;
        }
    }
  }
}

// `qkv info`'s list names the tiles for the five int8 formats' prompts where they are forced,
// and nowhere else.
TEST(QuantAmxInt8, InfoNamesTheTilesOnlyWhereForced) {
  if (!target_has_amx_int8()) GTEST_SKIP() << "AMX-INT8 is compiled for AVX2 and AVX-512 only";
  const auto amx_lines = [] {
    std::vector<std::string> lines;
    for (const UnitInUse& u : weight_units())
      if (u.unit == std::string("amx")) lines.push_back(u.data);
    return lines;
  };
  EXPECT_TRUE(amx_lines().empty());
  std::vector<std::string> forced;
  on_amx_int8([&] { forced = amx_lines(); });
  ASSERT_EQ(forced.size(), 5u);
  for (const std::string& line : forced)
    EXPECT_NE(line.find(", int8, 16+ rows"), std::string::npos);
}

// A block with an inf or NaN makes its row's outputs NaN on the tiles too.
TEST(QuantAmxInt8, NonFiniteActivationsGiveNaN) {
  if (!target_has_amx_int8()) GTEST_SKIP() << "AMX-INT8 is compiled for AVX2 and AVX-512 only";
  std::mt19937 rng(42);
  const std::vector<uint8_t> bytes = random_blocks(TensorType::q4_0, 8, 64, rng);
  const quant::Matrix m = quant::matrix("w", TensorType::q4_0, bytes.data(), 8, 64);
  const int64_t M = 20;
  std::vector<float> x(M * 64, 0.5f), y(M * 8);
  x[3 * 64 + 40] = NAN, x[17 * 64 + 2] = INFINITY;
  on_amx_int8([&] {
    quant::linear_forward(View(y.data(), {M, 8}), View(x.data(), {M, 64}), {m}, nullptr,
                          quant::Matmul::int8);
  });
  for (int64_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < 8; ++n)
      EXPECT_EQ(std::isnan(y[i * 8 + n]), i == 3 || i == 17) << "row " << i << " output " << n;
}

// The instructions give the stand-in's bits (on a CPU with AMX-INT8 only).
TEST(QuantAmxInt8, InstructionsGiveTheStandInsBits) {
  if (!target_has_amx_int8()) GTEST_SKIP() << "AMX-INT8 is compiled for AVX2 and AVX-512 only";
  if (const char* why = amx::unavailable()) GTEST_SKIP() << "no AMX here: " << why;
  std::mt19937 rng(43);
  std::normal_distribution<float> normal;
  const int64_t K = 256, N = 45, M = 37;
  for (TensorType type :
       {TensorType::q8_0, TensorType::q4_0, TensorType::q4_1, TensorType::q4_k, TensorType::q6_k}) {
    const std::vector<uint8_t> bytes = random_blocks(type, N, K, rng);
    const quant::Matrix m = quant::matrix("w", type, bytes.data(), N, K);
    std::vector<float> x(M * K), emulated(M * N), hardware(M * N);
    for (float& v : x) v = normal(rng);
    const View xv(x.data(), {M, K});
    on_amx_int8([&] {
      quant::linear_forward(View(emulated.data(), {M, N}), xv, {m}, nullptr, quant::Matmul::int8);
      amx::set_stand_in(false);
      quant::linear_forward(View(hardware.data(), {M, N}), xv, {m}, nullptr, quant::Matmul::int8);
    });
    EXPECT_EQ(std::memcmp(emulated.data(), hardware.data(), 4 * M * N), 0) << to_string(type);
  }
}

TEST(QuantInt8, ModesByNameAndNonFiniteActivations) {
  EXPECT_EQ(quant::matmul_from_name("int8"), quant::Matmul::int8);
  EXPECT_EQ(quant::matmul_from_name("exact"), quant::Matmul::exact);
  EXPECT_STREQ(quant::matmul_name(quant::Matmul::int8), "int8");
  try {
    quant::matmul_from_name("fp8");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exact or int8"), std::string::npos) << e.what();
  }
  // An inf or NaN in a block makes the outputs NaN (as the exact product's), never a crash.
  std::mt19937 rng(23);
  const std::vector<uint8_t> bytes = random_blocks(TensorType::q4_1, 8, 64, rng);
  const quant::Matrix m = quant::matrix("w", TensorType::q4_1, bytes.data(), 8, 64);
  for (float bad : {INFINITY, NAN}) {
    std::vector<float> x(64, 0.5f), y(8);
    x[40] = bad;
    quant::linear_forward(View(y.data(), {1, 8}), View(x.data(), {1, 64}), {m}, nullptr,
                          quant::Matmul::int8);
    for (float v : y) EXPECT_TRUE(std::isnan(v)) << v << " from " << bad;
  }
}

// The quantizers against llama.cpp's (tests/golden/make_quantize.py): the same bytes.
TEST(Quantize, MatchesLlamaCppsQuantizers) {
  std::ifstream in(std::string(QKV_GOLDEN_DIR) + "/../data/quantize_blocks.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  auto hex = [](const std::vector<uint8_t>& b) {
    std::string s;
    char buf[3];
    for (uint8_t x : b) std::snprintf(buf, sizeof buf, "%02x", x), s += buf;
    return s;
  };
  const std::vector<float> x = golden["values"], k = golden["k_values"];
  for (TensorType t :
       {TensorType::q8_0, TensorType::q4_0, TensorType::q4_1, TensorType::q4_k, TensorType::q6_k}) {
    const std::vector<float>& v = block_of(t).elements == 256 ? k : x;
    const std::string want = golden[to_string(t)];
    const std::string got = hex(quant::quantize(t, v.data(), static_cast<int64_t>(v.size())));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); i += 2)
      ASSERT_EQ(got.substr(i, 2), want.substr(i, 2)) << to_string(t) << " byte " << i / 2;
  }
  const std::vector<float> h = golden["f16_values"];
  const std::string want = golden["F16"];
  const std::string got =
      hex(quant::quantize(TensorType::f16, h.data(), static_cast<int64_t>(h.size())));
  for (size_t i = 0; i < h.size(); ++i)
    EXPECT_EQ(got.substr(4 * i, 4), want.substr(4 * i, 4)) << "half of " << h[i];
  EXPECT_THROW(quant::quantize(TensorType::q5_0, x.data(), 32), Error);
  EXPECT_THROW(quant::quantize(TensorType::q4_k, x.data(), 32), Error);
  EXPECT_THROW(quant::quantize(TensorType::q8_0, x.data(), 31), Error);
}

}  // namespace
}  // namespace qkv
