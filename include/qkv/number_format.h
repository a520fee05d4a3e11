// Number formats: how the elements of a tensor are stored, from fp32 to ggml's block formats.
// One table of block sizes (elements and bytes per block) for every reader and writer: GGUF
// files, the quantized products, the key/value cache.
//
//   F32, F16, BF16   one value per element (4, 2, 2 bytes)
//   Q8_0  32 values: f16 scale d, 32 int8           x = d · q
//   Q4_0  32 values: f16 d, 16 bytes of 4-bit q     x = d · (q − 8)
//   Q4_1  32 values: f16 d, f16 m, 16 bytes         x = d · q + m
//   Q4_K  256 values: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of 4-bit q
//   Q6_K  256 values: 128 bytes of low 4 bits, 64 of high 2, 16 int8 scales, f16 d
// (include/qkv/quant.h computes with them; the other ggml types are known by size only.)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace qkv {

// ggml's type numbers, as GGUF files write them.
enum class TensorType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  bf16 = 30,
};
std::string to_string(TensorType t);  // "Q4_K"; "type 99" for a number qkv does not know
std::string lower_name(TensorType t);  // "q4_k": as the CLI and `qkv info` name formats

// Elements per block and bytes per block.
struct BlockSize {
  int64_t elements, bytes;
};
// The block of a type number read from outside; nullopt for a number qkv does not know.
constexpr std::optional<BlockSize> block_size(uint32_t type) {
  switch (static_cast<TensorType>(type)) {
    case TensorType::f32:
    case TensorType::i32:
      return BlockSize{1, 4};
    case TensorType::f16:
    case TensorType::bf16:
    case TensorType::i16:
      return BlockSize{1, 2};
    case TensorType::i8:
      return BlockSize{1, 1};
    case TensorType::i64:
    case TensorType::f64:
      return BlockSize{1, 8};
    case TensorType::q4_0:
      return BlockSize{32, 18};
    case TensorType::q4_1:
      return BlockSize{32, 20};
    case TensorType::q5_0:
      return BlockSize{32, 22};
    case TensorType::q5_1:
      return BlockSize{32, 24};
    case TensorType::q8_0:
      return BlockSize{32, 34};
    case TensorType::q8_1:
      return BlockSize{32, 40};
    case TensorType::q2_k:
      return BlockSize{256, 84};
    case TensorType::q3_k:
      return BlockSize{256, 110};
    case TensorType::q4_k:
      return BlockSize{256, 144};
    case TensorType::q5_k:
      return BlockSize{256, 176};
    case TensorType::q6_k:
      return BlockSize{256, 210};
    case TensorType::q8_k:
      return BlockSize{256, 292};
  }
  return std::nullopt;
}
// The block of a known type (a qkv::Error for one qkv does not know).
BlockSize block_of(TensorType type);
// Bytes of n elements (n whole blocks).
inline int64_t bytes_of(TensorType type, int64_t n) {
  const BlockSize b = block_of(type);
  return n / b.elements * b.bytes;
}

// The types of key and value rows that attention reads in place, and so those a key/value
// cache stores (the one list): elements f32, bf16, f16, and the 32-value block formats q8_0,
// q4_0, q4_1 (src/simd/blocks-inl.h holds each block format's widening; a switch over these
// lists is checked against them at compile time, so a format added here cannot fall into
// another's case).
inline constexpr TensorType kKvElementTypes[] = {TensorType::f32, TensorType::bf16,
                                                 TensorType::f16};
inline constexpr TensorType kKvBlockTypes[] = {TensorType::q8_0, TensorType::q4_0,
                                               TensorType::q4_1};
const std::vector<TensorType>& kv_row_types();
bool is_kv_row_type(TensorType t);
// Whether a key/value row type is stored in blocks (of kKvBlockValues values).
bool is_kv_block_type(TensorType t);
inline constexpr int64_t kKvBlockValues =
    block_size(static_cast<uint32_t>(TensorType::q8_0))->elements;
static_assert(block_size(static_cast<uint32_t>(TensorType::q4_0))->elements == kKvBlockValues &&
              block_size(static_cast<uint32_t>(TensorType::q4_1))->elements == kKvBlockValues);

// A block's bytes (a K-quant's super-block's) at compile time, and where a 32-value block's
// values begin: after its fp16 scale d and (q4_1) its fp16 offset m.
template <TensorType T>
inline constexpr int64_t kBlockBytes = block_size(static_cast<uint32_t>(T))->bytes;
template <TensorType T>
inline constexpr int64_t kDataOffset = T == TensorType::q4_1 ? 4 : 2;

// IEEE half and bfloat16 bits to float and back (round to nearest even; NaN stays NaN).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);

}  // namespace qkv
