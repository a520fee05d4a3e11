// Number formats (see include/qkv/number_format.h).
#include "qkv/number_format.h"

#include <cctype>
#include <cmath>
#include <cstring>
#include <iterator>

#include "qkv/error.h"

namespace qkv {

const std::vector<TensorType>& kv_row_types() {
  static const std::vector<TensorType> types = [] {
    std::vector<TensorType> all(std::begin(kKvElementTypes), std::end(kKvElementTypes));
    all.insert(all.end(), std::begin(kKvBlockTypes), std::end(kKvBlockTypes));
    return all;
  }();
  return types;
}

bool is_kv_row_type(TensorType t) {
  for (TensorType k : kv_row_types())
    if (k == t) return true;
  return false;
}

bool is_kv_block_type(TensorType t) {
  for (TensorType k : kKvBlockTypes)
    if (k == t) return true;
  return false;
}

std::string to_string(TensorType t) {
  switch (t) {
    case TensorType::f32:
      return "F32";
    case TensorType::f16:
      return "F16";
    case TensorType::q4_0:
      return "Q4_0";
    case TensorType::q4_1:
      return "Q4_1";
    case TensorType::q5_0:
      return "Q5_0";
    case TensorType::q5_1:
      return "Q5_1";
    case TensorType::q8_0:
      return "Q8_0";
    case TensorType::q8_1:
      return "Q8_1";
    case TensorType::q2_k:
      return "Q2_K";
    case TensorType::q3_k:
      return "Q3_K";
    case TensorType::q4_k:
      return "Q4_K";
    case TensorType::q5_k:
      return "Q5_K";
    case TensorType::q6_k:
      return "Q6_K";
    case TensorType::q8_k:
      return "Q8_K";
    case TensorType::i8:
      return "I8";
    case TensorType::i16:
      return "I16";
    case TensorType::i32:
      return "I32";
    case TensorType::i64:
      return "I64";
    case TensorType::f64:
      return "F64";
    case TensorType::bf16:
      return "BF16";
  }
  return "type " + std::to_string(static_cast<uint32_t>(t));
}

std::string lower_name(TensorType t) {
  std::string name = to_string(t);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

BlockSize block_of(TensorType type) {
  const std::optional<BlockSize> b = block_size(static_cast<uint32_t>(type));
  check(b.has_value(), "number format: ", to_string(type), " has no known block size");
  return *b;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exponent = (h >> 10) & 31, mantissa = h & 1023;
  float magnitude;
  if (exponent == 0) magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero, subnormal
  else if (exponent == 31) magnitude = mantissa ? NAN : INFINITY;
  else magnitude = std::ldexp(static_cast<float>(mantissa | 1024), static_cast<int>(exponent) - 25);
  return sign ? -magnitude : magnitude;
}

float bf16_to_float(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return sign | (abs > 0x7f800000u ? 0x7e00 : 0x7c00);  // NaN, ±inf
  if (abs >= 0x477ff000u) return sign | 0x7c00;  // ≥ 65520 rounds past the largest half
  if (abs < 0x38800000u) {  // below 2^-14: a subnormal half, m · 2^-24 (m = 1024 is 2^-14)
    float a;
    std::memcpy(&a, &abs, 4);
    return sign | static_cast<uint16_t>(std::nearbyint(a * 0x1.0p24f));  // ties to even
  }
  // Normal: rebias the exponent (127 → 15) and round the mantissa's 13 dropped bits to even;
  // a carry moves into the exponent, as it should.
  return sign | static_cast<uint16_t>((abs - (112u << 23) + 0xfffu + ((abs >> 13) & 1)) >> 13);
}

// Round to nearest even on the 16 dropped bits; a NaN keeps a mantissa bit (stays NaN).
uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace qkv
