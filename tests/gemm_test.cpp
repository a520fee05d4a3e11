// The dense GEMM behind linear layers (src/ops/gemm.h): bf16 products against the products of
// independently rounded operands summed in double, the same bits for any thread count, the
// table that picks a library per CPU, and QKV_GEMM's errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "ops/gemm.h"
#include "qkv/error.h"
#include "qkv/number_format.h"
#include "qkv/ops.h"
#include "qkv/targets.h"
#include "qkv/threads.h"
#include "simd/cpu.h"

namespace qkv {
namespace {

std::vector<float> random_values(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// x as bf16 rounds it, by number_format.cpp's scalar rounding (not the GEMM's own).
double rounded(float x) { return bf16_to_float(float_to_bf16(x)); }

struct Shape {
  int64_t rows, in, out;
};
// A GEMV-sized product (≤ 4 rows), one under the grid's threshold, and two cut into blocks
// (edges not multiples of the block or the vector length).
const Shape kShapes[] = {{3, 40, 24}, {20, 30, 50}, {130, 96, 300}, {300, 72, 520}};

// y = x Wᵀ + b, dx = dy W, dW = dyᵀ x with every operand of a product rounded to bf16: the
// products of bf16 values are exact in fp32, so the only difference allowed is the order of
// fp32 sums, bounded by a few ulps of Σ|terms|.
TEST(Gemm, Bf16ProductsAreThoseOfTheRoundedOperands) {
  for (const Shape& s : kShapes) {
    const int64_t N = s.rows, I = s.in, O = s.out;
    auto x = random_values(N * I, 1), W = random_values(O * I, 2), b = random_values(O, 3);
    auto dy = random_values(N * O, 4);
    std::vector<float> y(N * O), y32(N * O), dx(N * I, 0.0f), dW(O * I, 0.0f), db(O, 0.0f);
    const View xv(x.data(), {N, I}), Wv(W.data(), {O, I}), dyv(dy.data(), {N, O});
    linear_forward(View(y.data(), {N, O}), xv, Wv, b.data(), TensorType::bf16);
    linear_forward(View(y32.data(), {N, O}), xv, Wv, b.data());
    linear_backward(View(dx.data(), {N, I}), View(dW.data(), {O, I}), db.data(), dyv, xv, Wv,
                    TensorType::bf16);
    const std::string where = std::to_string(N) + "×" + std::to_string(I) + "×" +
                              std::to_string(O);
    double moved = 0;  // how far bf16 moved y from fp32: the rounding must show
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o) {
        double sum = b[o], size = std::abs(b[o]);
        for (int64_t i = 0; i < I; ++i) {
          const double t = rounded(x[n * I + i]) * rounded(W[o * I + i]);
          sum += t, size += std::abs(t);
        }
        ASSERT_NEAR(y[n * O + o], sum, 1e-6 * size) << "y " << where;
        moved = std::max(moved, std::abs(double(y[n * O + o]) - y32[n * O + o]));
      }
    EXPECT_GT(moved, 1e-4) << "bf16 products equal fp32's: no rounding happened, " << where;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < I; ++i) {
        double sum = 0, size = 0;
        for (int64_t o = 0; o < O; ++o) {
          const double t = rounded(dy[n * O + o]) * rounded(W[o * I + i]);
          sum += t, size += std::abs(t);
        }
        ASSERT_NEAR(dx[n * I + i], sum, 1e-6 * size) << "dx " << where;
      }
    for (int64_t o = 0; o < O; ++o) {
      double bias = 0;
      for (int64_t i = 0; i < I; ++i) {
        double sum = 0, size = 0;
        for (int64_t n = 0; n < N; ++n) {
          const double t = rounded(dy[n * O + o]) * rounded(x[n * I + i]);
          sum += t, size += std::abs(t);
        }
        ASSERT_NEAR(dW[o * I + i], sum, 1e-6 * size) << "dW " << where;
      }
      for (int64_t n = 0; n < N; ++n) bias += dy[n * O + o];  // db sums dy itself, in fp32
      ASSERT_NEAR(db[o], bias, 1e-5 * N) << "db " << where;
    }
  }
}

// Every block of C is one call whatever the thread count: 1, 2 and 3 threads give the same
// bits, in fp32 and bf16, for each transpose.
TEST(Gemm, SameBitsForAnyThreadCount) {
  const int before = num_threads();
  const int64_t M = 300, N = 520, K = 72;
  const auto A = random_values(M * K, 5), B = random_values(K * N, 6);
  for (auto products : {detail::Products::fp32, detail::Products::bf16})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        std::vector<std::vector<float>> C;
        for (int threads : {1, 2, 3}) {
          set_num_threads(threads);
          C.emplace_back(M * N, 0.5f);
          detail::gemm(ta, tb, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), tb ? K : N, 1.0f,
                       C.back().data(), N, products);
        }
        EXPECT_EQ(C[0], C[1]) << "transposes " << ta << tb;
        EXPECT_EQ(C[0], C[2]) << "transposes " << ta << tb;
      }
  set_num_threads(before);
}

TEST(Gemm, TheTableChoosesByCpu) {
  using detail::choose_gemm;
  using detail::GemmLibrary;
  simd::CpuFeatures zen4{.vendor = "AuthenticAMD", .family = 25, .model = 17, .avx512 = true,
                         .avx512_bf16 = true};
  simd::CpuFeatures zen3{.vendor = "AuthenticAMD", .family = 25, .model = 1};
  simd::CpuFeatures xeon{.vendor = "GenuineIntel", .family = 6, .model = 207, .avx512 = true,
                         .avx512_bf16 = true, .amx_bf16 = true, .amx_int8 = true};
  simd::CpuFeatures arm{.vendor = "arm", .arm_bf16 = true};
  // OpenBLAS knows the CPU: its fp32 kernels; oneDNN's bf16 matmul where it has bf16 units.
  auto c = choose_gemm(zen4, "Cooperlake", "avx512_core_bf16");
  EXPECT_EQ(c.fp32, GemmLibrary::openblas);
  EXPECT_EQ(c.bf16, GemmLibrary::onednn);
  c = choose_gemm(zen3, "Zen", "avx2");
  EXPECT_EQ(c.fp32, GemmLibrary::openblas);
  EXPECT_EQ(c.bf16, GemmLibrary::openblas);  // widened
  // OpenBLAS 0.3.21 on an Emerald Rapids Xeon: generic Prescott kernels, so oneDNN's, and AMX.
  c = choose_gemm(xeon, "Prescott", "avx512_core_amx");
  EXPECT_EQ(c.fp32, GemmLibrary::onednn);
  EXPECT_EQ(c.bf16, GemmLibrary::onednn);
  EXPECT_NE(c.why_bf16.find("AMX"), std::string::npos) << c.why_bf16;
  // AVX2 kernels on an AVX-512 CPU (OPENBLAS_CORETYPE=Haswell): as fast on Zen 4, kept.
  EXPECT_EQ(choose_gemm(zen4, "Haswell", "avx512_core_bf16").fp32, GemmLibrary::openblas);
  // Without oneDNN everything stays on OpenBLAS; on Arm fp32 always does.
  c = choose_gemm(xeon, "Prescott", "none");
  EXPECT_EQ(c.fp32, GemmLibrary::openblas);
  EXPECT_EQ(c.bf16, GemmLibrary::openblas);
  c = choose_gemm(arm, "NEOVERSEN1", "other");
  EXPECT_EQ(c.fp32, GemmLibrary::openblas);
  EXPECT_EQ(c.bf16, GemmLibrary::openblas);
}

TEST(Gemm, QkvInfoNamesTheLibraries) {
  const auto libs = gemm_libraries();
  ASSERT_EQ(libs.size(), 2u);
  EXPECT_EQ(libs[0].products, "fp32");
  EXPECT_EQ(libs[1].products, "bf16");
  for (const auto& l : libs) {
    EXPECT_TRUE(l.library == "OpenBLAS" || l.library == "oneDNN") << l.library;
    EXPECT_FALSE(l.version.empty());
    EXPECT_FALSE(l.kernels.empty());
    EXPECT_FALSE(l.why.empty());
  }
}

TEST(Gemm, ProductsAreFp32OrBf16) {
  float x[4] = {}, W[4] = {}, y[4] = {};
  try {
    linear_forward(View(y, {2, 2}), View(x, {2, 2}), View(W, {2, 2}), nullptr, TensorType::f16);
    FAIL() << "fp16 products accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_forward: products are fp32 or bf16"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace qkv
