// Quantizers (see include/qkv/quant.h): llama.cpp's reference rules, so that a file qkv writes
// holds the bytes llama.cpp's own converter would.
#include <cmath>
#include <cstring>

#include "qkv/error.h"
#include "qkv/quant.h"

namespace qkv::quant {

using qkv::TensorType;

bool can_quantize(TensorType t) {
  return t == TensorType::f32 || t == TensorType::f16 || t == TensorType::q8_0 ||
         t == TensorType::q4_0;
}

std::vector<uint8_t> quantize(TensorType type, const float* x, int64_t n) {
  check(can_quantize(type), "quantize: qkv writes F32, F16, Q8_0 and Q4_0, not ", to_string(type));
  const BlockSize b = block_of(type);
  check(n >= 0 && n % b.elements == 0, "quantize: ", n, " values is not whole ", to_string(type),
        " blocks of ", b.elements);
  std::vector<uint8_t> out(n / b.elements * b.bytes);
  uint8_t* o = out.data();
  auto put_half = [](uint8_t* p, float v) {
    const uint16_t h = float_to_half(v);
    p[0] = static_cast<uint8_t>(h & 0xff), p[1] = static_cast<uint8_t>(h >> 8);
  };
  for (int64_t i = 0; i < n / b.elements; ++i, o += b.bytes) {
    const float* v = x + i * b.elements;
    switch (type) {
      case TensorType::f32:
        std::memcpy(o, v, 4);
        break;
      case TensorType::f16:
        put_half(o, *v);
        break;
      case TensorType::q8_0: {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
        const float d = amax / 127, id = d != 0 ? 1 / d : 0;
        put_half(o, d);
        for (int j = 0; j < 32; ++j)
          o[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(v[j] * id)));
        break;
      }
      case TensorType::q4_0: {
        float amax = 0, max = 0;  // the value of largest magnitude, with its sign
        for (int j = 0; j < 32; ++j)
          if (std::fabs(v[j]) > amax) amax = std::fabs(v[j]), max = v[j];
        const float d = max / -8, id = d != 0 ? 1 / d : 0;
        put_half(o, d);
        for (int j = 0; j < 16; ++j) {
          const auto q = [&](float y) {
            return static_cast<uint8_t>(std::min(15.0f, std::trunc(y * id + 8.5f)));
          };
          o[2 + j] = static_cast<uint8_t>(q(v[j]) | q(v[j + 16]) << 4);
        }
        break;
      }
      default:
        break;
    }
  }
  return out;
}

}  // namespace qkv::quant
