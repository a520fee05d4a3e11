// Matrix times a few vectors, for decoding: C[M, N] = alpha · A[M, K] · B[N, K]ᵀ + beta · C
// with M <= kGemvMaxRows. Each weight row of B is read from memory once for all M rows of A,
// and the output columns are split across threads: the product is bound by how fast B
// streams from memory, and BLAS's sgemm (built for large M) reads it at about half that speed
// with M = 1 on one thread. Each output is one thread's sum in a fixed order: the same bits
// for any thread count.
#pragma once

#include <cstdint>

namespace qkv::detail {

inline constexpr int64_t kGemvMaxRows = 4;

void gemv_rows(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace qkv::detail
