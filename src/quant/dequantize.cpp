// The reference dequantizer (see include/qkv/quant.h): plain loops over each block, in the
// order the format defines its fields.
#include <cmath>
#include <cstring>

#include "qkv/error.h"
#include "qkv/quant.h"
#include "quant/k_quants.h"

namespace qkv::quant {

using qkv::TensorType;

namespace {

uint16_t u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
float f16(const uint8_t* p) { return half_to_float(u16(p)); }

void q8_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<int8_t>(b[2 + i]);
}

void q4_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  for (int i = 0; i < 16; ++i) {
    y[i] = d * ((b[2 + i] & 15) - 8);
    y[i + 16] = d * ((b[2 + i] >> 4) - 8);
  }
}

void q4_1(const uint8_t* b, float* y) {
  const float d = f16(b), m = f16(b + 2);
  for (int i = 0; i < 16; ++i) {
    y[i] = d * (b[4 + i] & 15) + m;
    y[i + 16] = d * (b[4 + i] >> 4) + m;
  }
}

void q4_k(const uint8_t* b, float* y) {
  const float d = f16(b), dmin = f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  // Each 32 bytes of q hold two sub-blocks: the low nibbles, then the high nibbles.
  for (int pair = 0; pair < 4; ++pair, q += 32, y += 64) {
    int sc0, m0, sc1, m1;
    q4_k_scale_min(2 * pair, scales, sc0, m0);
    q4_k_scale_min(2 * pair + 1, scales, sc1, m1);
    for (int l = 0; l < 32; ++l) y[l] = d * sc0 * (q[l] & 15) - dmin * m0;
    for (int l = 0; l < 32; ++l) y[32 + l] = d * sc1 * (q[l] >> 4) - dmin * m1;
  }
}

void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16(b + 208);
  // Each half (128 values) takes 64 bytes of ql, 32 of qh and 8 scales; value l + 32k of the
  // half has its low 4 bits in ql (nibble k / 2 of byte l + 32 (k % 2)) and its high 2 bits
  // in bits 2k, 2k+1 of qh[l].
  for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128) {
    for (int l = 0; l < 32; ++l) {
      const int s = l / 16;
      const int q1 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[s] * q1;
      y[l + 32] = d * sc[s + 2] * q2;
      y[l + 64] = d * sc[s + 4] * q3;
      y[l + 96] = d * sc[s + 6] * q4;
    }
  }
}

}  // namespace

bool supported(TensorType t) {
  switch (t) {
    case TensorType::f32:
    case TensorType::f16:
    case TensorType::bf16:
    case TensorType::q8_0:
    case TensorType::q4_0:
    case TensorType::q4_1:
    case TensorType::q4_k:
    case TensorType::q6_k:
      return true;
    default:
      return false;
  }
}

void dequantize(TensorType type, const uint8_t* data, int64_t n, float* out) {
  // (Not check(): its message's to_string would run on every call, once per token per row.)
  if (!supported(type)) fail("dequantize: tensor type ", to_string(type), " is not supported");
  const BlockSize block = block_of(type);
  if (n < 0 || n % block.elements != 0)
    fail("dequantize: ", n, " values is not a whole number of ", to_string(type), " blocks of ",
         block.elements);
  for (int64_t i = 0; i < n / block.elements; ++i) {
    const uint8_t* b = data + i * block.bytes;
    float* y = out + i * block.elements;
    switch (type) {
      case TensorType::f32:
        std::memcpy(y, b, 4);
        break;
      case TensorType::f16:
        *y = half_to_float(u16(b));
        break;
      case TensorType::bf16:
        *y = bf16_to_float(u16(b));
        break;
      case TensorType::q8_0:
        q8_0(b, y);
        break;
      case TensorType::q4_0:
        q4_0(b, y);
        break;
      case TensorType::q4_1:
        q4_1(b, y);
        break;
      case TensorType::q4_k:
        q4_k(b, y);
        break;
      case TensorType::q6_k:
        q6_k(b, y);
        break;
      default:
        break;
    }
  }
}

}  // namespace qkv::quant

namespace qkv::quant {

int64_t row_bytes(TensorType type, int64_t cols) { return bytes_of(type, cols); }

Matrix matrix(const std::string& name, TensorType type, const uint8_t* data, int64_t rows,
              int64_t cols) {
  check(supported(type), name, ": tensor type ", to_string(type), " is not supported");
  const BlockSize b = block_of(type);
  check(rows >= 1 && cols >= 1 && cols % b.elements == 0, name, ": ", rows, " × ", cols,
        " is not rows of whole ", to_string(type), " blocks of ", b.elements);
  return Matrix{type, data, rows, cols};
}

void dequantize_rows(const Matrix& m, int64_t row0, int64_t n, float* out) {
  check(row0 >= 0 && n >= 0 && row0 + n <= m.rows, "dequantize_rows: rows [", row0, ", ", row0 + n,
        ") outside the matrix's ", m.rows);
  dequantize(m.type, m.data + row0 * row_bytes(m.type, m.cols), n * m.cols, out);
}

}  // namespace qkv::quant
