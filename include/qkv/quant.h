// ggml's block formats (the weights of GGUF files) turned back into floats: the reference
// dequantizer, written from the formats' definitions, the oracle of any fast path.
//
//   F32, F16, BF16   one value per element
//   Q8_0  32 values: f16 scale d, 32 int8           x = d · q
//   Q4_0  32 values: f16 d, 16 bytes of 4-bit q     x = d · (q − 8); low nibbles are values
//                                                   0–15, high nibbles 16–31
//   Q4_1  32 values: f16 d, f16 m, 16 bytes         x = d · q + m
//   Q4_K  256 values in 8 sub-blocks of 32: f16 d, f16 dmin, 12 bytes of 6-bit sub-block
//         scales and mins, 128 bytes of 4-bit q     x = d · sc_j · q − dmin · m_j
//   Q6_K  256 values in 16 sub-blocks of 16: 128 bytes of low 4 bits, 64 bytes of high 2
//         bits, 16 int8 scales, f16 d               x = d · sc_j · (q − 32)
//
// Matrices in these formats are computed with in place (quant::linear_forward), no fp32 copy
// of the weights. Exactly (Matmul::exact): one token's product decodes each block in registers
// and multiplies it with the fp32 activations, the block's scale applied in fp32; longer inputs
// decode a few rows at a time into a small fp32 tile for the GEMM. Or as llama.cpp does
// (Matmul::int8): activations rounded to int8 blocks once, integer dot products per block.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qkv/number_format.h"
#include "qkv/tensor.h"

namespace qkv::quant {

// A [rows, cols] matrix in one of ggml's block formats, row-major: row r's blocks begin at
// data + r · row_bytes(type, cols). cols is whole blocks.
struct Matrix {
  TensorType type = TensorType::f32;
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0;
  // Optional: the same weights repacked for the int8 unit in use (repack_for_int8), read in
  // place of `data` where that unit runs; everything else reads `data`.
  const uint8_t* packed = nullptr;
};
int64_t row_bytes(TensorType type, int64_t cols);
// Checks that `type` is supported and cols whole blocks (a qkv::Error naming `name`).
Matrix matrix(const std::string& name, TensorType type, const uint8_t* data, int64_t rows,
              int64_t cols);

// Rows [row0, row0 + n) of m as floats, by the reference dequantizer.
void dequantize_rows(const Matrix& m, int64_t row0, int64_t n, float* out);

// How products with Q8_0, Q4_0, Q4_1, Q4_K and Q6_K weights take their activations:
//   exact  in fp32, each weight block decoded in registers (within ~2e-6 of the fp32 product
//          of the dequantized weights)
//   int8   rounded once per product to int8 per 32-block (d = max|x| / 127, q = x / d to
//          nearest), the block products summed as integers and scaled in fp32: llama.cpp's
//          arithmetic (an output moves by up to Σ |w| · d / 2 from the exact one)
// Other weight types (F32, F16, BF16) take fp32 activations either way. (The K-quants round
// the activations per 32 values too, where llama.cpp rounds them per 256.)
enum class Matmul { exact, int8 };
// "exact" or "int8"; a qkv::Error naming the choices for anything else.
Matmul matmul_from_name(const std::string& name);
const char* matmul_name(Matmul mode);

// y[N, Σ rows] = x[N, K] · [parts stacked by rows]ᵀ (+ b): a linear layer whose weight is the
// parts one under the other (a fused q/k/v from three tensors), each of K = cols columns.
// Rows of y and x may be strided (unit stride within a row).
void linear_forward(View y, View x, const std::vector<Matrix>& parts, const float* b = nullptr,
                    Matmul mode = Matmul::exact);

// m's weights laid out as the int8 unit in use reads them, where it has a layout of its own;
// empty where it reads the file's. One pair today: AVX-512 DL's vpdpbusd (avx512_dl,
// avx512_bf16 targets) on Q8_0, Q4_0 and Q4_1, which multiplies 4 rows by two blocks at a
// time: each group of 4 rows becomes, pair of blocks by pair, the 4 rows' fp16 scales (Q4_1's
// offsets beside them) and then their values (Q8_0's offset by 128 to unsigned bytes). The
// same bytes as m's whole groups of 4 rows (a copy: the rows past them and an odd last block
// are still read from `data`). Point m.packed at the result for as long as m is used; the
// products give the same bits either way.
std::vector<uint8_t> repack_for_int8(const Matrix& m);

// Whether dequantize() reads this type.
bool supported(TensorType type);

// The first `n` values (a multiple of the type's block) of the blocks at `data` into `out`.
// Throws qkv::Error for a type it does not read or an n that is not whole blocks.
void dequantize(TensorType type, const uint8_t* data, int64_t n, float* out);

// n floats (whole blocks) in a block format, as llama.cpp's quantizers write them:
//   F32, F16  the values (F16 rounded to nearest)
//   Q8_0      d = max |x| / 127, q = round(x / d)
//   Q4_0      d = (the x of largest magnitude) / −8, q = min(15, ⌊x / d + 8.5⌋)
//   Q4_1      d = (max − min) / 15, m = min, q = min(15, ⌊(x − m) / d + 0.5⌋)
//   Q4_K      per 32 values a scale and a min by weighted least squares over 21 trial grids,
//             both then rounded to 6 bits of the super-block's d and dmin
//   Q6_K      per 16 values a symmetric scale, the best of 19 trial grids, rounded to 8 bits
//             of the super-block's d
// Throws qkv::Error for another type or an n that is not whole blocks.
bool can_quantize(TensorType type);
std::vector<uint8_t> quantize(TensorType type, const float* x, int64_t n);
// The same into `out` (n / block elements · block bytes), unchecked: for callers that checked
// the type and n once (a key/value cache quantizing each row it stores).
void quantize_into(TensorType type, const float* x, int64_t n, uint8_t* out);

}  // namespace qkv::quant
