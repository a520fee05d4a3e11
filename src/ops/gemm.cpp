#include "ops/gemm.h"

#include <cblas.h>

#include "qkv/threads.h"

namespace qkv::detail {

void gemm(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc) {
  // OpenBLAS keeps its own thread pool; give it qkv's thread count.
  openblas_set_num_threads(num_threads());
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(M), static_cast<int>(N),
              static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb),
              beta, C, static_cast<int>(ldc));
}

}  // namespace qkv::detail
