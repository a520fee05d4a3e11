// The GEMM behind qkv's linear layers, on the shapes of the models it trains and runs:
// OpenBLAS (as qkv calls it: src/ops/gemm.cpp), BLIS, oneDNN and a Highway kernel written
// here (bench/gemm_highway.h), each checked against OpenBLAS's result and timed on 1 and
// 2 threads, as GFLOP/s and a fraction of the FMA peak measured in the same run.
//
//   build/release/bench/gemm_compare            (built when libblis-dev and libdnnl-dev are
//                                                installed; see bench/CMakeLists.txt)
#include <dlfcn.h>

#include <algorithm>
#include <cblas.h>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/gemm_highway.h"
#include "ops/gemm.h"
#include "qkv/threads.h"
#include "yardsticks.h"

#include <blis.h>
#include <dnnl.h>

namespace {

struct Shape {
  const char* what;
  bool ta, tb;  // C[M, N] = op(A) · op(B)
  int64_t M, N, K;
};

// GPT-2 small (d_model 768, 1024 tokens) and the 768-wide llama2.c model's prefill (512 tokens).
const Shape kShapes[] = {
    {"gpt2 qkv fwd", false, true, 1024, 2304, 768},
    {"gpt2 attn out fwd", false, true, 1024, 768, 768},
    {"gpt2 mlp fc fwd", false, true, 1024, 3072, 768},
    {"gpt2 mlp proj fwd", false, true, 1024, 768, 3072},
    {"gpt2 lm head fwd", false, true, 1024, 50257, 768},
    {"gpt2 fc dx (bwd)", false, false, 1024, 768, 3072},
    {"gpt2 fc dW (bwd)", true, false, 3072, 768, 1024},
    {"llama 768 w1 prefill", false, true, 512, 2048, 768},
};

using Gemm = std::function<void(const Shape&, const float*, const float*, float*, int)>;

void openblas(const Shape& s, const float* A, const float* B, float* C, int threads) {
  qkv::set_num_threads(threads);
  const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
  qkv::detail::gemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A, lda, B, ldb, 0.0f, C, s.N);
}

void blis(const Shape& s, const float* A, const float* B, float* C, int threads) {
  bli_thread_set_num_threads(threads);
  float one = 1, zero = 0;
  // Stored A is [M, K] (or [K, M] when transposed), B is [K, N] (or [N, K]); row-major strides.
  const int64_t a_rows = s.ta ? s.K : s.M, a_cols = s.ta ? s.M : s.K;
  const int64_t b_cols = s.tb ? s.K : s.N;
  (void)a_rows;
  bli_sgemm(s.ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, s.tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE,
            s.M, s.N, s.K, &one, const_cast<float*>(A), a_cols, 1, const_cast<float*>(B), b_cols, 1,
            &zero, C, s.N, 1);
}

void onednn(const Shape& s, const float* A, const float* B, float* C, int threads) {
  omp_set_num_threads(threads);
  const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
  dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K, 1.0f, A, lda, B, ldb, 0.0f, C, s.N);
}

void highway(const Shape& s, const float* A, const float* B, float* C, int threads) {
  qkv::bench::gemm_highway(s.M, s.N, s.K, A, s.K, B, s.K, C, s.N, false, threads);
}

double seconds_of(const Gemm& g, const Shape& s, const float* A, const float* B, float* C,
                  int threads) {
  g(s, A, B, C, threads);  // warm-up: packing buffers, thread pools
  double best = 1e30;
  for (int r = 0; r < 4; ++r) {
    const double t0 = qkv::detail::now_seconds();
    g(s, A, B, C, threads);
    best = std::min(best, qkv::detail::now_seconds() - t0);
  }
  return best;
}

std::string library_of(void* symbol) {
  Dl_info info;
  return dladdr(symbol, &info) && info.dli_fname ? info.dli_fname : "?";
}

}  // namespace

int main() {
  std::printf("cblas_sgemm comes from %s\n",
              library_of(reinterpret_cast<void*>(&cblas_sgemm)).c_str());
  const struct {
    const char* name;
    Gemm run;
    bool nt_only;
  } libs[] = {{"OpenBLAS", openblas, false},
              {"BLIS", blis, false},
              {"oneDNN", onednn, false},
              {"Highway (qkv)", highway, true}};
  std::printf(
      "| shape | M×N×K | threads | OpenBLAS | BLIS | oneDNN | Highway (qkv) |\n"
      "|---|---|---|---|---|---|---|\n");
  for (int threads : {1, 2}) {
    const double peak = qkv::detail::measure_fma_peak_gflops(threads);
    for (const Shape& s : kShapes) {
      std::mt19937 rng(1);
      std::uniform_real_distribution<float> u(-1, 1);
      std::vector<float> A(s.M * s.K), B(s.K * s.N), C(s.M * s.N), R(s.M * s.N);
      for (auto& x : A) x = u(rng);
      for (auto& x : B) x = u(rng);
      openblas(s, A.data(), B.data(), R.data(), threads);
      std::printf("| %s | %ld×%ld×%ld | %d |", s.what, long(s.M), long(s.N), long(s.K), threads);
      for (const auto& lib : libs) {
        if (lib.nt_only && (s.ta || !s.tb)) {
          std::printf(" – |");
          continue;
        }
        const double t = seconds_of(lib.run, s, A.data(), B.data(), C.data(), threads);
        double err = 0;
        for (size_t i = 0; i < C.size(); ++i) err = std::max(err, double(std::abs(C[i] - R[i])));
        const double gflops = 2.0 * s.M * s.N * s.K / t * 1e-9;
        std::printf(" %.0f (%.0f%%)%s |", gflops, 100 * gflops / peak, err > 1e-2 ? " WRONG" : "");
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    std::printf("| FMA peak, %d thread(s) | | | %.0f GFLOP/s | | | |\n", threads, peak);
  }
  return 0;
}
