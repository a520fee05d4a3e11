// The one matrix product behind every linear layer (row-major, BLAS conventions):
//   C[M, N] = alpha · op(A) · op(B) + beta · C,  op(X) = X or Xᵀ.
// The library behind it is chosen per CPU by measurement (docs/kernels.md, "Weight products"):
// OpenBLAS's sgemm where OpenBLAS knows the CPU, oneDNN's where it does not. QKV_GEMM=openblas
// or onednn forces one.
//
// Products::bf16 rounds both operands to bf16 (nearest even) and sums their products in fp32,
// as mixed-precision training does: on oneDNN's bf16 matmul where the CPU has bf16 dot-product
// units or AMX tiles, otherwise widened to fp32 on the fp32 GEMM (the same products; only the
// order of the sums differs).
//
// C is cut into a grid of blocks that depends only on M, N and K, each block one library call
// on one thread: the bits do not depend on the thread count.
#pragma once

#include <cstdint>
#include <string>

namespace qkv::simd {
struct CpuFeatures;
}

namespace qkv::detail {

enum class Products { fp32, bf16 };

void gemm(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc, Products products = Products::fp32);

enum class GemmLibrary { openblas, onednn };

struct GemmChoice {
  GemmLibrary fp32 = GemmLibrary::openblas, bf16 = GemmLibrary::openblas;
  std::string why_fp32, why_bf16;
};

// The table: OpenBLAS for fp32 where it knows the CPU (its core name for it, `openblas_core`,
// is one whose kernels use AVX2 or AVX-512 FMAs) or on Arm, oneDNN where OpenBLAS fell back to
// older x86 kernels; oneDNN's bf16 matmul where its ISA (`onednn_isa`, as
// onednn_isa() names it; "none" without oneDNN) has bf16 dot products or AMX.
GemmChoice choose_gemm(const simd::CpuFeatures& features, const std::string& openblas_core,
                       const std::string& onednn_isa);
// The table's choice on this CPU, or QKV_GEMM's (openblas, onednn: the fp32 library), read once
// (qkv::gemm_libraries(), include/qkv/targets.h, describes it).
const GemmChoice& gemm_choice();
// The version of the OpenBLAS qkv runs, e.g. "0.3.21".
std::string openblas_version();

// x[0, n) rounded to bf16 bits (nearest even; a NaN stays a NaN), as Products::bf16 rounds
// operands: for callers that keep rounded operands of their own (attention's q, k, v).
void round_to_bf16(const float* x, uint16_t* out, int64_t n);

// oneDNN's highest instruction set on this CPU ("avx512_core_bf16", "avx512_core_amx", …), or
// "none" in a build without oneDNN.
std::string onednn_isa();

}  // namespace qkv::detail
