// The GEMM behind qkv's linear layers, on the shapes of the models it trains and runs: every
// candidate library, each checked against qkv's result and timed on 1 and 2 threads (or those
// given), as GFLOP/s and a fraction of the peak measured in the same run.
//
//   fp32: qkv's gemm (whatever src/ops/gemm.cpp picked on this CPU), Debian's OpenBLAS 0.3.21,
//         BLIS 0.9, oneDNN 2.6 (dnnl_sgemm), a Highway kernel written here
//         (bench/gemm_highway.h), and when given, PyPI's OpenBLAS (the scipy-openblas32 wheel)
//         and oneMKL (the mkl wheel), loaded with dlopen so that their cblas symbols stay apart.
//   bf16: products of bf16-rounded operands summed in fp32 — qkv's gemm in bf16, oneDNN's
//         bf16 matmul, oneMKL's cblas_gemm_bf16bf16f32 — against the bf16 dot peak.
//
//   build/release/bench/gemm_compare [--threads 1,2] [--pypi-openblas LIB] [--mkl LIB]
//     (built when libblis-dev and libdnnl-dev are installed; see bench/CMakeLists.txt;
//      bench/report.py passes the wheels' libraries from build/peer)
#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/gemm_highway.h"
#include "ops/gemm.h"
#include "qkv/clock.h"
#include "qkv/number_format.h"
#include "qkv/targets.h"
#include "qkv/threads.h"
#include "yardsticks.h"

#include <blis.h>
#include <oneapi/dnnl/dnnl.hpp>

namespace {

struct Shape {
  const char* what;
  bool ta, tb;  // C[M, N] = op(A) · op(B)
  int64_t M, N, K;
  int64_t lda() const { return ta ? M : K; }
  int64_t ldb() const { return tb ? K : N; }
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

// A candidate: runs C = op(A) op(B) on `threads` threads. The bf16 ones get the operands
// already rounded to bf16, both as fp32 and as bf16 bits.
struct Operands {
  const float* A;
  const float* B;
  const qkv::bf16* A16;
  const qkv::bf16* B16;
};
using Gemm = std::function<void(const Shape&, const Operands&, float*, int)>;

struct Candidate {
  std::string name;
  Gemm run;
  bool nt_only = false;  // only C = A Bᵀ
};

void qkv_gemm(const Shape& s, const Operands& o, float* C, int threads,
              qkv::detail::Products products) {
  qkv::set_num_threads(threads);
  qkv::detail::gemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, o.A, s.lda(), o.B, s.ldb(), 0.0f, C, s.N,
                    products);
}

void debian_openblas(const Shape& s, const Operands& o, float* C, int threads) {
  openblas_set_num_threads(threads);
  cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
              s.M, s.N, s.K, 1.0f, o.A, s.lda(), o.B, s.ldb(), 0.0f, C, s.N);
}

void blis(const Shape& s, const Operands& o, float* C, int threads) {
  bli_thread_set_num_threads(threads);
  float one = 1, zero = 0;
  bli_sgemm(s.ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, s.tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE,
            s.M, s.N, s.K, &one, const_cast<float*>(o.A), s.lda(), 1, const_cast<float*>(o.B),
            s.ldb(), 1, &zero, C, s.N, 1);
}

void onednn_sgemm(const Shape& s, const Operands& o, float* C, int threads) {
  omp_set_num_threads(threads);
  dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K, 1.0f, o.A, s.lda(), o.B, s.ldb(),
             0.0f, C, s.N);
}

// oneDNN's matmul primitive on bf16 operands (strides express the transposes).
void onednn_bf16(const Shape& s, const Operands& o, float* C, int threads) {
  using namespace dnnl;
  using dt = memory::data_type;
  omp_set_num_threads(threads);
  static engine eng(engine::kind::cpu, 0);
  static stream strm(eng);
  const memory::desc a({s.M, s.K}, dt::bf16, s.ta ? memory::dims{1, s.M} : memory::dims{s.K, 1});
  const memory::desc b({s.K, s.N}, dt::bf16, s.tb ? memory::dims{1, s.K} : memory::dims{s.N, 1});
  const memory::desc c({s.M, s.N}, dt::f32, memory::dims{s.N, 1});
  const matmul::primitive_desc pd(matmul::desc(a, b, c), eng);
  memory am(a, eng, const_cast<qkv::bf16*>(o.A16)), bm(b, eng, const_cast<qkv::bf16*>(o.B16)),
      cm(c, eng, C);
  matmul(pd).execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  strm.wait();
}

// A library loaded on its own (RTLD_LOCAL | RTLD_DEEPBIND: its cblas_sgemm does not replace
// OpenBLAS's, and it binds to its own symbols first).
void* load(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (!h) std::fprintf(stderr, "gemm_compare: %s\n", dlerror());
  return h;
}

template <typename F>
F symbol(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (!p) std::fprintf(stderr, "gemm_compare: no %s\n", name), std::exit(1);
  return reinterpret_cast<F>(p);
}

using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                       float, float*, int);
using Bf16gemm = void (*)(int, int, int, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t,
                          const uint16_t*, int64_t, float, float*, int64_t);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;  // the CBLAS enum values

std::vector<Candidate> pypi_openblas(const char* path, std::string& version) {
  void* lib = load(path);
  if (!lib) return {};
  const auto corename = symbol<char* (*)()>(lib, "scipy_openblas_get_corename");
  const auto config = symbol<char* (*)()>(lib, "scipy_openblas_get_config");
  version = std::string(config()) + ", " + corename() + " kernels";
  const auto sgemm = symbol<Sgemm>(lib, "scipy_cblas_sgemm");
  const auto threads_of = symbol<void (*)(int)>(lib, "scipy_openblas_set_num_threads");
  return {{"OpenBLAS 0.3.34 (PyPI)", [=](const Shape& s, const Operands& o, float* C, int t) {
             threads_of(t);
             sgemm(kRowMajor, s.ta ? kTrans : kNoTrans, s.tb ? kTrans : kNoTrans, s.M, s.N, s.K,
                   1.0f, o.A, s.lda(), o.B, s.ldb(), 0.0f, C, s.N);
           }}};
}

// oneMKL on GNU OpenMP (MKL_THREADING_LAYER=GNU, set before it loads): the runtime qkv uses.
std::vector<Candidate> mkl(const char* path, std::string& version, std::vector<Candidate>& bf16) {
  setenv("MKL_THREADING_LAYER", "GNU", 1);
  void* lib = load(path);
  if (!lib) return {};
  char buf[256] = {};
  symbol<void (*)(char*, int)>(lib, "mkl_get_version_string")(buf, sizeof buf - 1);
  version = buf;
  while (!version.empty() && version.back() == ' ') version.pop_back();
  const auto sgemm = symbol<Sgemm>(lib, "cblas_sgemm");
  const auto gemm16 = symbol<Bf16gemm>(lib, "cblas_gemm_bf16bf16f32");
  const auto threads_of = symbol<void (*)(int)>(lib, "MKL_Set_Num_Threads");
  bf16.push_back({"oneMKL bf16", [=](const Shape& s, const Operands& o, float* C, int t) {
                    threads_of(t);
                    gemm16(kRowMajor, s.ta ? kTrans : kNoTrans, s.tb ? kTrans : kNoTrans, s.M, s.N,
                           s.K, 1.0f, reinterpret_cast<const uint16_t*>(o.A16), s.lda(),
                           reinterpret_cast<const uint16_t*>(o.B16), s.ldb(), 0.0f, C, s.N);
                  }});
  return {{"oneMKL", [=](const Shape& s, const Operands& o, float* C, int t) {
             threads_of(t);
             sgemm(kRowMajor, s.ta ? kTrans : kNoTrans, s.tb ? kTrans : kNoTrans, s.M, s.N, s.K,
                   1.0f, o.A, s.lda(), o.B, s.ldb(), 0.0f, C, s.N);
           }}};
}

double seconds_of(const Candidate& c, const Shape& s, const Operands& o, float* C, int threads) {
  c.run(s, o, C, threads);  // warm-up: packing buffers, thread pools, primitive creation
  double best = 1e30;
  for (int r = 0; r < 4; ++r) {
    const double t0 = qkv::now_seconds();
    c.run(s, o, C, threads);
    best = std::min(best, qkv::now_seconds() - t0);
  }
  return best;
}

// One table: every shape × thread count, each candidate's GFLOP/s (fraction of `peak_of`),
// "WRONG" when it differs from the exact product of its operands by more than fp32 rounding.
void table(const char* title, const std::vector<Candidate>& libs, const std::vector<int>& threads,
           double (*peak_of)(int, double), bool bf16) {
  std::printf("%s\n\n| shape | M×N×K | threads |", title);
  for (const auto& l : libs) std::printf(" %s |", l.name.c_str());
  std::printf("\n|---|---|---|");
  for (size_t i = 0; i < libs.size(); ++i) std::printf("---|");
  std::printf("\n");
  for (int t : threads) {
    const double peak = peak_of(t, 0.2);
    for (const Shape& s : kShapes) {
      std::mt19937 rng(1);
      std::uniform_real_distribution<float> u(-1, 1);
      std::vector<float> A(s.M * s.K), B(s.K * s.N), C(s.M * s.N);
      std::vector<qkv::bf16> A16(A.size()), B16(B.size());
      for (size_t i = 0; i < A.size(); ++i) {
        A16[i].bits = qkv::float_to_bf16(u(rng));
        A[i] = bf16 ? qkv::to_float(A16[i]) : u(rng);
      }
      for (size_t i = 0; i < B.size(); ++i) {
        B16[i].bits = qkv::float_to_bf16(u(rng));
        B[i] = bf16 ? qkv::to_float(B16[i]) : u(rng);
      }
      // The exact product at 64 sampled outputs, in double.
      std::vector<std::pair<int64_t, double>> check;
      for (int i = 0; i < 64; ++i) {
        const int64_t m = rng() % s.M, n = rng() % s.N;
        double sum = 0;
        for (int64_t k = 0; k < s.K; ++k)
          sum += double(s.ta ? A[k * s.lda() + m] : A[m * s.lda() + k]) *
                 (s.tb ? B[n * s.ldb() + k] : B[k * s.ldb() + n]);
        check.push_back({m * s.N + n, sum});
      }
      const Operands o{A.data(), B.data(), A16.data(), B16.data()};
      std::printf("| %s | %ld×%ld×%ld | %d |", s.what, long(s.M), long(s.N), long(s.K), t);
      for (const auto& lib : libs) {
        if (lib.nt_only && (s.ta || !s.tb)) {
          std::printf(" – |");
          continue;
        }
        // NaN first: an output a candidate leaves unwritten cannot pass for the last one's.
        std::fill(C.begin(), C.end(), std::nanf(""));
        const double sec = seconds_of(lib, s, o, C.data(), t);
        double err = 0;
        for (auto [i, want] : check) err = std::max(err, std::abs(C[i] - want));
        if (std::any_of(C.begin(), C.end(), [](float x) { return std::isnan(x); })) err = 1e30;
        const double gflops = 2.0 * s.M * s.N * s.K / sec * 1e-9;
        std::printf(" %.0f (%.0f%%)%s |", gflops, 100 * gflops / peak,
                    err > 1e-5 * s.K ? " WRONG" : "");
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    std::printf("| peak, %d thread(s) | | | %.0f GFLOP/s |", t, peak);
    for (size_t i = 1; i < libs.size(); ++i) std::printf(" |");
    std::printf("\n");
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads = {1, 2};
  const char *pypi = nullptr, *mkl_path = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 < argc && a == "--threads") {
      threads.clear();
      for (char* p = argv[++i]; *p;) threads.push_back(std::strtol(p, &p, 10)), p += *p == ',';
    } else if (i + 1 < argc && a == "--pypi-openblas") {
      pypi = argv[++i];
    } else if (i + 1 < argc && a == "--mkl") {
      mkl_path = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: gemm_compare [--threads 1,2] [--pypi-openblas LIB] [--mkl LIB]\n");
      return 2;
    }
  }
  using qkv::detail::Products;
  std::vector<Candidate> fp32 = {
      {"qkv", [](auto& s, auto& o, float* C, int t) { qkv_gemm(s, o, C, t, Products::fp32); }},
      {"OpenBLAS 0.3.21 (Debian)", debian_openblas},
      {"BLIS 0.9", blis},
      {"oneDNN 2.6", onednn_sgemm}};
  // The Highway kernel is sized for 512-bit vectors: measured where the build's static target
  // has them (`cmake --preset native` on an AVX-512 CPU), else left out.
  if (qkv::bench::gemm_highway_fits())
    fp32.push_back({"Highway (qkv)",
                    [](auto& s, auto& o, float* C, int t) {
                      qkv::bench::gemm_highway(s.M, s.N, s.K, o.A, s.K, o.B, s.K, C, s.N, false, t);
                    },
                    true});
  else
    std::printf(
        "(The Highway kernel is left out: this build's static target lacks the 512-bit "
        "vectors it is written for; `cmake --preset native` on an AVX-512 CPU has them.)\n");
  std::vector<Candidate> bf16 = {
      {"qkv bf16", [](auto& s, auto& o, float* C, int t) { qkv_gemm(s, o, C, t, Products::bf16); }},
      {"oneDNN bf16", onednn_bf16}};
  std::string pypi_version, mkl_version;
  if (pypi)
    for (auto& c : pypi_openblas(pypi, pypi_version)) fp32.push_back(c);
  if (mkl_path)
    for (auto& c : mkl(mkl_path, mkl_version, bf16)) fp32.push_back(c);

  for (const auto& g : qkv::gemm_libraries())
    std::printf("qkv's %s products on this CPU: %s %s (%s): %s\n", g.products.c_str(),
                g.library.c_str(), g.version.c_str(), g.kernels.c_str(), g.why.c_str());
  std::printf("Debian's OpenBLAS: %s, %s kernels\n", openblas_get_config(),
              openblas_get_corename());
  const dnnl_version_t* v = dnnl_version();
  std::printf("oneDNN: %d.%d.%d, highest ISA on this CPU %s\n", v->major, v->minor, v->patch,
              qkv::detail::onednn_isa().c_str());
  if (pypi) std::printf("PyPI OpenBLAS: %s\n", pypi_version.c_str());
  if (mkl_path) std::printf("oneMKL: %s (GNU OpenMP threading)\n", mkl_version.c_str());
  std::printf("\n");
  table("### fp32 products (GFLOP/s, % of the FMA peak)", fp32, threads,
        qkv::detail::measure_fma_peak_gflops, false);
  table("### bf16 products, fp32 sums (GFLOP/s, % of the bf16 dot peak)", bf16, threads,
        qkv::detail::measure_bf16_peak_gflops, true);
  return 0;
}
