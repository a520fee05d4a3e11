// Compiled once per SIMD target; the entry points below dispatch (see src/simd/dispatch.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/gemv.cpp"
#include <hwy/foreach_target.h>
#include <hwy/highway.h>

#include "ops/gemv.h"

#include <algorithm>

#include "simd/simd-inl.h"
#include "simd/kernel_namespace.h"
#include "qkv/threads.h"
#include "simd/dispatch.h"
#include "util/parallel.h"

QKV_KERNEL_BEGIN(qkv::detail)
namespace {

// Weight rows read side by side: 4 streams for the prefetcher, on every target. With 16
// registers the 4 × 4 block spills a few vectors in its loop and is still faster than 2 rows
// (AVX2 and SSE4 alike, measured on AMD Zen 5): the loop waits on the weights, not on the
// stack.
constexpr int kRowsPerStep = 4;

// C[m, n0 .. n0 + R) for all M rows of A, R weight rows at a time.
template <int M, int R>
HWY_INLINE void block(const float* A, int64_t lda, const float* B, int64_t ldb, int64_t K,
                      float alpha, float beta, float* C, int64_t ldc, int64_t n0) {
  const int64_t N = static_cast<int64_t>(simd::lanes());
  simd::VfSlot acc[M][R];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = hn::Zero(df);
  int64_t k = 0;
  for (; k + N <= K; k += N) {
    simd::VfSlot a[M];
    for (int m = 0; m < M; ++m) a[m] = hn::LoadU(df, A + m * lda + k);
    for (int r = 0; r < R; ++r) {
      const Vf b = hn::LoadU(df, B + (n0 + r) * ldb + k);
      for (int m = 0; m < M; ++m) acc[m][r] = hn::MulAdd(a[m], b, acc[m][r]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) {
      float sum = hn::GetLane(hn::SumOfLanes(df, Vf(acc[m][r])));
      for (int64_t t = k; t < K; ++t) sum += A[m * lda + t] * B[(n0 + r) * ldb + t];
      float& c = C[m * ldc + n0 + r];
      c = alpha * sum + (beta == 0 ? 0.0f : beta * c);
    }
}

template <int M>
void columns(const float* A, int64_t lda, const float* B, int64_t ldb, int64_t K, float alpha,
             float beta, float* C, int64_t ldc, int64_t begin, int64_t end) {
  int64_t n = begin;
  for (; n + kRowsPerStep <= end; n += kRowsPerStep)
    block<M, kRowsPerStep>(A, lda, B, ldb, K, alpha, beta, C, ldc, n);
  for (; n < end; ++n) block<M, 1>(A, lda, B, ldb, K, alpha, beta, C, ldc, n);
}

}  // namespace

void gemv_rows(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  // Below ~256 KiB of weights the threads cost more than they save.
  const int threads = N * K < (1 << 16) ? 1 : num_threads();
  constexpr int64_t kChunk = 64;  // output columns per unit of work
  const int64_t chunks = (N + kChunk - 1) / kChunk;
  ::qkv::detail::parallel_for(chunks, threads, [&](int64_t c) {
    const int64_t begin = c * kChunk, end = std::min(N, begin + kChunk);
    switch (M) {
      case 1:
        columns<1>(A, lda, B, ldb, K, alpha, beta, C, ldc, begin, end);
        break;
      case 2:
        columns<2>(A, lda, B, ldb, K, alpha, beta, C, ldc, begin, end);
        break;
      case 3:
        columns<3>(A, lda, B, ldb, K, alpha, beta, C, ldc, begin, end);
        break;
      default:
        columns<4>(A, lda, B, ldb, K, alpha, beta, C, ldc, begin, end);
        break;
    }
  });
}

QKV_KERNEL_END();  // qkv::detail::HWY_NAMESPACE

#if HWY_ONCE
namespace qkv::detail {

HWY_EXPORT(gemv_rows);
void gemv_rows(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  QKV_DISPATCH(gemv_rows)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace qkv::detail
#endif  // HWY_ONCE
