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
#pragma once

#include <cstdint>

#include "qkv/gguf.h"

namespace qkv::quant {

// Whether dequantize() reads this type.
bool supported(gguf::TensorType type);

// The first `n` values (a multiple of the type's block) of the blocks at `data` into `out`.
// Throws qkv::Error for a type it does not read or an n that is not whole blocks.
void dequantize(gguf::TensorType type, const uint8_t* data, int64_t n, float* out);

// IEEE half and bfloat16 bits as float.
float half_to_float(uint16_t h);
float bf16_to_float(uint16_t b);

}  // namespace qkv::quant
