#include "ops/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "ops/gemv.h"
#include "qkv/threads.h"

namespace qkv::detail {

namespace {

void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
              static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

}  // namespace

// OpenBLAS runs single-threaded here and qkv splits the rows of C over its own OpenMP
// threads: OpenBLAS's pthread pool and OpenMP's spinning workers fought over the two cores
// (a tiny model trained 10× slower, most time in sched_yield). Splitting by rows of C also
// keeps each element's sum in one call, so results do not depend on the thread count.
void gemm(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc) {
  // The pthread build gets one thread; the OpenMP build needs no telling (it runs on one
  // thread inside a parallel region, and setting it would change omp_set_num_threads for the
  // whole program).
  static const bool single = [] {
    if (openblas_get_parallel() == 1) openblas_set_num_threads(1);
    return true;
  }();
  (void)single;
  // A few rows times a weight matrix (decoding): a memory-bound product of its own.
  if (!transpose_a && transpose_b && M <= kGemvMaxRows)
    return gemv_rows(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  // Blocks of whole 16-row panels; small products stay on one thread.
  const int64_t work = M * N * K;
  const int threads = work < (1 << 18) ? 1 : num_threads();
  const int64_t block = std::max<int64_t>(16, (M + threads - 1) / threads + 15) / 16 * 16;
  const int64_t blocks = (M + block - 1) / block;
#pragma omp parallel num_threads(threads) if (blocks > 1)
  {
    // OpenBLAS's OpenMP build runs one thread inside an active team, but outside one it
    // would take omp_get_max_threads() threads: this region's own thread count (a setting
    // local to the region, not the caller's) keeps it to qkv's.
    if (!omp_in_parallel()) omp_set_num_threads(1);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t m0 = b * block, m = std::min(block, M - m0);
      const float* a = transpose_a ? A + m0 : A + m0 * lda;  // rows m0.. of op(A)
      sgemm(transpose_a, transpose_b, m, N, K, alpha, a, lda, B, ldb, beta, C + m0 * ldc, ldc);
    }
  }
}

}  // namespace qkv::detail
