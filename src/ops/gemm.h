// The one matrix product behind every linear layer (row-major, BLAS conventions):
//   C[M, N] = alpha · op(A) · op(B) + beta · C,  op(X) = X or Xᵀ.
// Backed by OpenBLAS's sgemm (docs/kernels.md, "Weight products", says why).
#pragma once

#include <cstdint>

namespace qkv::detail {

void gemm(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc);

}  // namespace qkv::detail
