// A GEMM written with Highway, for the comparison of bench/gemm_compare.cpp:
//   C[M, N] = A[M, K] · B[N, K]ᵀ (+ C when accumulate), row-major — a linear layer's forward.
// The textbook structure (Goto/BLIS): B is packed in blocks of kKc × kNc into panels of 64
// columns laid out [k][64], so a 6 × 64 register tile (24 accumulators) takes 4 vector loads
// and 6 broadcasts of A per k; threads share each packed block and split the rows of C.
// Not used by the library: OpenBLAS was measured faster (docs/kernels.md, "Weight products").
// Static dispatch, and sized for 32 registers (AVX-512): since the default build's baseline is
// SSE4, measure it with the native preset (`cmake --preset native`), as it was measured.
#pragma once

#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "qkv/tensor.h"

namespace qkv::bench {

namespace hn = hwy::HWY_NAMESPACE;

inline constexpr int64_t kMr = 6, kNr = 64, kKc = 128, kNc = 512;

template <int MR>
inline void tile(const float* a, int64_t lda, const float* bp, int64_t kc, float* c, int64_t ldc,
                 bool load_c, int64_t n_valid) {
  const hn::ScalableTag<float> d;
  const int64_t L = hn::Lanes(d);  // 16 on AVX-512: 64 columns = 4 vectors
  constexpr int V = 4;
  hn::Vec<decltype(d)> acc[MR][V];
  float edge[MR * kNr];  // a partial panel goes through a full-width copy
  float* out = n_valid == kNr ? c : edge;
  const int64_t ld = n_valid == kNr ? ldc : kNr;
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < V; ++v) {
      if (n_valid != kNr)
        for (int64_t j = 0; j < L; ++j) {
          const int64_t col = v * L + j;
          edge[r * kNr + col] = load_c && col < n_valid ? c[r * ldc + col] : 0.0f;
        }
      acc[r][v] = load_c || n_valid != kNr ? hn::LoadU(d, out + r * ld + v * L) : hn::Zero(d);
    }
  for (int64_t k = 0; k < kc; ++k) {
    hn::Vec<decltype(d)> b[V];
    for (int v = 0; v < V; ++v) b[v] = hn::Load(d, bp + k * kNr + v * L);
    for (int r = 0; r < MR; ++r) {
      const auto x = hn::Set(d, a[r * lda + k]);
      for (int v = 0; v < V; ++v) acc[r][v] = hn::MulAdd(x, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < V; ++v) hn::StoreU(acc[r][v], d, out + r * ld + v * L);
  if (n_valid != kNr)
    for (int r = 0; r < MR; ++r)
      for (int64_t col = 0; col < n_valid; ++col) c[r * ldc + col] = edge[r * kNr + col];
}

// Whether this build's static target has the 16-lane vectors the tile is written for (4 of
// them span a 64-column panel); on narrower ones it would compute only part of each panel.
inline bool gemm_highway_fits() { return hn::Lanes(hn::ScalableTag<float>()) * 4 == kNr; }

inline void gemm_highway(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                         const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate,
                         int threads) {
  static const Tensor packed({kNc * kKc});  // 64-byte aligned, shared by the threads
  float* bp = packed.data();
  const int64_t row_blocks = (M + kMr - 1) / kMr;
#pragma omp parallel num_threads(threads)
  for (int64_t n0 = 0; n0 < N; n0 += kNc) {
    const int64_t nc = std::min(kNc, N - n0), panels = (nc + kNr - 1) / kNr;
    for (int64_t k0 = 0; k0 < K; k0 += kKc) {
      const int64_t kc = std::min(kKc, K - k0);
      // Pack B[n0 .. n0 + nc, k0 .. k0 + kc] as panels [k][64], zero-padded.
#pragma omp for schedule(static)
      for (int64_t p = 0; p < panels; ++p)
        for (int64_t col = 0; col < kNr; ++col) {
          const int64_t n = n0 + p * kNr + col;
          for (int64_t k = 0; k < kc; ++k)
            bp[p * kKc * kNr + k * kNr + col] = n < N ? B[n * ldb + k0 + k] : 0.0f;
        }
        // (the implicit barrier of `omp for`: the block is packed)
#pragma omp for schedule(static)
      for (int64_t rb = 0; rb < row_blocks; ++rb) {
        const int64_t m0 = rb * kMr, mr = std::min(kMr, M - m0);
        for (int64_t p = 0; p < panels; ++p) {
          const int64_t nv = std::min(kNr, nc - p * kNr);
          const float* a = A + m0 * lda + k0;
          float* c = C + m0 * ldc + n0 + p * kNr;
          const float* panel = bp + p * kKc * kNr;
          const bool load = accumulate || k0 > 0;
          switch (mr) {
            case 6:
              tile<6>(a, lda, panel, kc, c, ldc, load, nv);
              break;
            case 5:
              tile<5>(a, lda, panel, kc, c, ldc, load, nv);
              break;
            case 4:
              tile<4>(a, lda, panel, kc, c, ldc, load, nv);
              break;
            case 3:
              tile<3>(a, lda, panel, kc, c, ldc, load, nv);
              break;
            case 2:
              tile<2>(a, lda, panel, kc, c, ldc, load, nv);
              break;
            default:
              tile<1>(a, lda, panel, kc, c, ldc, load, nv);
              break;
          }
        }
      }
    }
  }
}

}  // namespace qkv::bench
