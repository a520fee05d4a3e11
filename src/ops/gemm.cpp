#include "ops/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "ops/gemv.h"
#include "qkv/error.h"
#include "qkv/targets.h"
#include "qkv/threads.h"
#include "simd/cpu.h"
#include "util/parallel.h"
#include "util/scratch.h"

#if QKV_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace qkv::detail {

namespace {

// The grid of C's blocks depends on the shape alone, so every output is the same call's sum
// whatever the thread count. Blocks of 256 × 256 run at the libraries' whole-matrix speed on
// one thread (bench/gemm_compare.cpp's "qkv" column against theirs); a product with fewer than
// kMinBlocks of them has them halved (down to 64) so that 16 threads all have work.
constexpr int64_t kBlock = 256, kMinBlock = 64, kMinBlocks = 24;
// Below this many multiply-adds a product is one call on one thread.
constexpr int64_t kSmallWork = 1 << 18;

void openblas_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
              static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

#if QKV_HAVE_ONEDNN
// oneDNN's bf16 matmul on one block. A primitive is made once per block shape, strides,
// transposes, alpha and beta (a product has at most four block shapes), and runs with a
// scratchpad of the calling thread's, so blocks run concurrently.
class Bf16Matmul {
 public:
  void run(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
           int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    using namespace dnnl;
    const Key key{ta, tb, M, N, K, lda, ldb, ldc, alpha, beta};
    const matmul::primitive_desc* pd;
    const matmul* prim;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = made_.find(key);
      if (it == made_.end()) it = made_.emplace(key, make(key)).first;
      pd = &it->second.first;
      prim = &it->second.second;
    }
    thread_local stream strm(engine_);
    thread_local std::vector<char> scratch;
    const size_t need = pd->scratchpad_desc().get_size();
    if (scratch.size() < need) scratch.resize(need);
    memory a(pd->src_desc(), engine_, const_cast<uint16_t*>(A));
    memory b(pd->weights_desc(), engine_, const_cast<uint16_t*>(B));
    memory c(pd->dst_desc(), engine_, C);
    memory s(pd->scratchpad_desc(), engine_, scratch.data());
    prim->execute(
        strm,
        {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_SCRATCHPAD, s}});
    strm.wait();
  }

 private:
  using Key =
      std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float>;
  std::pair<dnnl::matmul::primitive_desc, dnnl::matmul> make(const Key& key) {
    using namespace dnnl;
    using dt = memory::data_type;
    const auto [ta, tb, M, N, K, lda, ldb, ldc, alpha, beta] = key;
    const memory::desc a({M, K}, dt::bf16, ta ? memory::dims{1, lda} : memory::dims{lda, 1});
    const memory::desc b({K, N}, dt::bf16, tb ? memory::dims{1, ldb} : memory::dims{ldb, 1});
    const memory::desc c({M, N}, dt::f32, memory::dims{ldc, 1});
    primitive_attr attr;
    attr.set_scratchpad_mode(scratchpad_mode::user);
    if (alpha != 1) attr.set_output_scales(0, {alpha});
    if (beta != 0) {
      post_ops ops;
      ops.append_sum(beta);
      attr.set_post_ops(ops);
    }
    matmul::primitive_desc pd(matmul::desc(a, b, c), attr, engine_);
    return {pd, matmul(pd)};
  }

  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  std::mutex mutex_;
  std::map<Key, std::pair<dnnl::matmul::primitive_desc, dnnl::matmul>> made_;
};

Bf16Matmul& bf16_matmul() {
  static Bf16Matmul m;
  return m;
}
#endif

// fp32 → bf16 bits, to nearest even (a NaN stays a NaN). Written to vectorize: the conversion
// runs over whole operands.
inline uint16_t rounded_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7fffffffu) > 0x7f800000u ? static_cast<uint16_t>((u >> 16) | 0x40u)
                                         : static_cast<uint16_t>(rounded);
}

// The stored rows × cols of X (leading dimension ld) rounded to bf16, packed densely: as bf16
// bits (`bits`) or widened back to fp32 (`widened`), whichever is non-null.
void round_operand(const float* X, int64_t rows, int64_t cols, int64_t ld, uint16_t* bits,
                   float* widened) {
  parallel_for(rows, rows * cols > (1 << 16) ? num_threads() : 1, [&](int64_t r) {
    const float* x = X + r * ld;
    if (bits) {
      uint16_t* o = bits + r * cols;
      for (int64_t c = 0; c < cols; ++c) o[c] = rounded_bf16(x[c]);
    } else {
      float* o = widened + r * cols;
      for (int64_t c = 0; c < cols; ++c)
        o[c] = std::bit_cast<float>(static_cast<uint32_t>(rounded_bf16(x[c])) << 16);
    }
  });
}

// Runs `block(m0, m, n0, n)` over the grid of C's blocks on qkv's threads.
template <typename Block>
void over_blocks(int64_t M, int64_t N, int64_t K, const Block& block) {
  if (M * N * K < kSmallWork) return team_serial([&] { block(0, M, 0, N); });
  int64_t block_rows = kBlock, block_cols = kBlock;
  auto count = [&](int64_t n, int64_t b) { return (n + b - 1) / b; };
  while (count(M, block_rows) * count(N, block_cols) < kMinBlocks &&
         std::max(block_rows, block_cols) > kMinBlock)
    (block_rows >= block_cols ? block_rows : block_cols) /= 2;
  const int64_t rows = count(M, block_rows), cols = count(N, block_cols), blocks = rows * cols;
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), blocks));
  const auto run_block = [&](int64_t i) {
    const int64_t m0 = i / cols * block_rows, n0 = i % cols * block_cols;
    block(m0, std::min(block_rows, M - m0), n0, std::min(block_cols, N - n0));
  };
  if (in_team()) return parallel_for(blocks, threads, run_block);  // (one thread in the libraries)
  if (threads > 1) count_region();
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    // OpenBLAS's OpenMP build and oneDNN run one thread inside an active team, but outside one
    // they would take omp_get_max_threads(): this region's own setting keeps them to one.
    if (!omp_in_parallel()) omp_set_num_threads(1);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < blocks; ++i) run_block(i);
  }
}

void gemm_fp32(GemmLibrary library, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc) {
  // A few rows times a weight matrix (decoding): a memory-bound product of its own.
  if (!ta && tb && M <= kGemvMaxRows)
    return gemv_rows(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  over_blocks(M, N, K, [&](int64_t m0, int64_t m, int64_t n0, int64_t n) {
    const float* a = ta ? A + m0 : A + m0 * lda;  // rows m0.. of op(A)
    const float* b = tb ? B + n0 * ldb : B + n0;  // columns n0.. of op(B)
    float* c = C + m0 * ldc + n0;
#if QKV_HAVE_ONEDNN
    if (library == GemmLibrary::onednn) {
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, K, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
#endif
    (void)library;
    openblas_sgemm(ta, tb, m, n, K, alpha, a, lda, b, ldb, beta, c, ldc);
  });
}

void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const GemmChoice& choice = gemm_choice();
  const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K;
  const int64_t b_rows = tb ? N : K, b_cols = tb ? K : N;
#if QKV_HAVE_ONEDNN
  if (choice.bf16 == GemmLibrary::onednn) {
    uint16_t* a16 = team_scratch_for<uint16_t>(GemmSlot::a, a_rows * a_cols);
    uint16_t* b16 = team_scratch_for<uint16_t>(GemmSlot::b, b_rows * b_cols);
    round_operand(A, a_rows, a_cols, lda, a16, nullptr);
    round_operand(B, b_rows, b_cols, ldb, b16, nullptr);
    over_blocks(M, N, K, [&](int64_t m0, int64_t m, int64_t n0, int64_t n) {
      const uint16_t* a = ta ? a16 + m0 : a16 + m0 * a_cols;
      const uint16_t* b = tb ? b16 + n0 * b_cols : b16 + n0;
      bf16_matmul().run(ta, tb, m, n, K, alpha, a, a_cols, b, b_cols, beta, C + m0 * ldc + n0, ldc);
    });
    return;
  }
#endif
  // The products of bf16 values are exact in fp32 (8 + 8 significant bits), so the fp32 GEMM
  // on the rounded operands computes what bf16 units would, summed in another order.
  float* a = team_scratch(GemmSlot::a, a_rows * a_cols);
  float* b = team_scratch(GemmSlot::b, b_rows * b_cols);
  round_operand(A, a_rows, a_cols, lda, nullptr, a);
  round_operand(B, b_rows, b_cols, ldb, nullptr, b);
  gemm_fp32(choice.fp32, ta, tb, M, N, K, alpha, a, a_cols, b, b_cols, beta, C, ldc);
}

// OpenBLAS's core names whose sgemm kernels use AVX2 or AVX-512 FMAs. Any other on an x86-64
// CPU is a fallback to older kernels (Prescott, Core2, Nehalem, Sandybridge) for a CPU this
// OpenBLAS does not know. (Haswell's AVX2 kernels on Zen 4 run as fast as its AVX-512 ones:
// Zen 4 executes 512-bit FMAs as two 256-bit halves.)
bool openblas_core_fits(const std::string& core) {
  static const char* fma[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"};
  return std::any_of(std::begin(fma), std::end(fma), [&](const char* n) { return core == n; });
}

}  // namespace

void round_to_bf16(const float* x, uint16_t* out, int64_t n) {
  constexpr int64_t kChunk = 4096;  // rows of 4096 for round_operand's threads, then the rest
  const int64_t whole = n / kChunk * kChunk;
  round_operand(x, whole / kChunk, kChunk, kChunk, out, nullptr);
  round_operand(x + whole, 1, n - whole, n - whole, out + whole, nullptr);
}

GemmChoice choose_gemm(const simd::CpuFeatures& f, const std::string& openblas_core,
                       const std::string& onednn_isa) {
  GemmChoice c;
  const bool x86 = f.vendor != "arm";
  const bool onednn = onednn_isa != "none";
  if (x86 && onednn && !openblas_core_fits(openblas_core)) {
    c.fp32 = GemmLibrary::onednn;
    c.why_fp32 = "OpenBLAS does not know this CPU and runs its " + openblas_core +
                 " kernels; oneDNN's use its FMAs";
  } else {
    c.fp32 = GemmLibrary::openblas;
    c.why_fp32 = x86 ? "OpenBLAS runs its " + openblas_core + " kernels, written for this CPU"
                     : "OpenBLAS's kernels for this CPU (oneDNN's Arm sgemm is not tuned)";
  }
  if (onednn && (onednn_isa == "avx512_core_bf16" || onednn_isa == "avx512_core_amx")) {
    c.bf16 = GemmLibrary::onednn;
    c.why_bf16 = onednn_isa == "avx512_core_amx" ? "oneDNN's bf16 matmul on AMX tiles"
                                                 : "oneDNN's bf16 matmul on vdpbf16ps";
  } else {
    c.bf16 = c.fp32;
    c.why_bf16 = "no bf16 units oneDNN uses here: bf16-rounded operands widened to fp32";
  }
  return c;
}

std::string onednn_isa() {
#if QKV_HAVE_ONEDNN
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
#else
  return "none";
#endif
}

const GemmChoice& gemm_choice() {
  static const GemmChoice choice = [] {
    GemmChoice c = choose_gemm(simd::cpu_features(), openblas_get_corename(), onednn_isa());
    if (const char* forced = std::getenv("QKV_GEMM"); forced && *forced) {
      const std::string f = forced;
      check(f == "openblas" || (f == "onednn" && onednn_isa() != "none"), "QKV_GEMM=", f,
            ": the choices are openblas",
            onednn_isa() != "none" ? " and onednn" : " (this build has no oneDNN)");
      c.fp32 = f == "onednn" ? GemmLibrary::onednn : GemmLibrary::openblas;
      c.why_fp32 = "forced by QKV_GEMM";
      if (c.bf16 != GemmLibrary::onednn) c.bf16 = c.fp32;
    }
    // The pthread build of OpenBLAS gets one thread; the OpenMP build needs no telling (it runs
    // one thread inside a parallel region, and setting it would change the whole program's).
    if (openblas_get_parallel() == 1) openblas_set_num_threads(1);
    return c;
  }();
  return choice;
}

std::string openblas_version() {
  // openblas_get_config() begins "OpenBLAS 0.3.21 …".
  std::string config = openblas_get_config();
  const size_t start = config.find(' ') + 1, end = config.find(' ', start);
  return config.substr(start, end == std::string::npos ? end : end - start);
}

void gemm(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc, Products products) {
  if (M == 0 || N == 0) return;
  if (products == Products::bf16 && K > 0)
    return gemm_bf16(transpose_a, transpose_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  gemm_fp32(gemm_choice().fp32, transpose_a, transpose_b, M, N, K, alpha, A, lda, B, ldb, beta, C,
            ldc);
}

}  // namespace qkv::detail

namespace qkv {

std::vector<GemmLibraryInUse> gemm_libraries() {
  using detail::GemmLibrary;
  const detail::GemmChoice& c = detail::gemm_choice();
  auto entry = [](const char* products, GemmLibrary l, const std::string& why) {
    GemmLibraryInUse u{products, "OpenBLAS", detail::openblas_version(), openblas_get_corename(),
                       why};
#if QKV_HAVE_ONEDNN
    if (l == GemmLibrary::onednn) {
      const dnnl_version_t* v = dnnl_version();
      u.library = "oneDNN";
      u.version = std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                  std::to_string(v->patch);
      u.kernels = detail::onednn_isa();
    }
#else
    (void)l;
#endif
    return u;
  };
  return {entry("fp32", c.fp32, c.why_fp32), entry("bf16", c.bf16, c.why_bf16)};
}

}  // namespace qkv
