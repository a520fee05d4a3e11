// The K-quants' layouts (ggml's Q4_K and Q6_K: 256 values a super-block), what the reference
// dequantizer (src/quant/dequantize.cpp) and the int8 products (src/quant/int8-inl.h) share.
//   Q4_K  d, dmin (fp16), 12 bytes of 6-bit scales and mins, 128 bytes of nibbles: sub-block
//         j (32 values) is d · scale_j · q − dmin · min_j; each 32 bytes of nibbles hold two
//         sub-blocks, the low nibbles then the high ones.
//   Q6_K  128 bytes of low 4 bits (ql), 64 of high 2 bits (qh), 16 int8 scales, d (fp16):
//         value i is d · scale_(i / 16) · (q − 32).
#pragma once

#include <cstdint>
#include <cstring>

namespace qkv::quant {

// Q4_K's 12 scale bytes hold 8 six-bit scales and 8 six-bit mins: sub-blocks 0–3 in the low
// 6 bits of bytes 0–3 (scales) and 4–7 (mins); sub-blocks 4–7 in the nibbles of bytes 8–11,
// with their top 2 bits in the top bits of bytes 0–7.
inline void q4_k_scale_min(int j, const uint8_t* s, int& scale, int& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}
// All 8 at once, four to a 32-bit word (w0, w1, w2 the 12 bytes): scales 0–3 = w0's low 6
// bits a byte, mins 0–3 = w1's; scales 4–7 = w2's low nibbles with w0's top 2 bits a byte
// above them, mins 4–7 = w2's high nibbles with w1's.
inline void q4_k_scales_mins(const uint8_t* s, uint8_t* scales, uint8_t* mins) {
  uint32_t w[3];
  std::memcpy(w, s, 12);
  const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, top2 = 0x03030303;
  const uint32_t out[4] = {w[0] & low6, (w[2] & low4) | ((w[0] >> 6) & top2) << 4, w[1] & low6,
                           ((w[2] >> 4) & low4) | ((w[1] >> 6) & top2) << 4};
  std::memcpy(scales, out, 8);
  std::memcpy(mins, out + 2, 8);
}
inline constexpr int kQ4kScales = 4, kQ4kValues = 16;  // byte offsets in a Q4_K super-block

// Where Q6_K's 32-value sub-block j (0–7) lies: each half of the super-block (128 values, 64
// bytes of ql, 32 of qh, 8 scales) holds sub-blocks k = 0–3, whose value l has its low 4 bits
// in nibble k / 2 of ql[32 (k % 2) + l] and its high 2 bits in bits 2k, 2k + 1 of qh[l];
// values l < 16 take scale 2k, the others 2k + 1 (of the half's 8).
struct Q6kSubBlock {
  const uint8_t *ql, *qh;
  const int8_t* scales;  // the sub-block's two
  int nibble_shift, high_shift;
};
inline constexpr int kQ6kHigh = 128, kQ6kScales = 192, kQ6kScale = 208;  // byte offsets
inline Q6kSubBlock q6_k_sub_block(const uint8_t* b, int j) {
  const int half = j / 4, k = j % 4;
  return {b + 64 * half + 32 * (k % 2), b + kQ6kHigh + 32 * half,
          reinterpret_cast<const int8_t*>(b + kQ6kScales) + 8 * half + 2 * k, 4 * (k / 2), 2 * k};
}

}  // namespace qkv::quant
