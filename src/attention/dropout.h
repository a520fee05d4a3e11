// Attention dropout's random mask (include/qkv/attention.h, struct Dropout): Philox4x32-10,
// a counter-based generator (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy
// as 1, 2, 3", SC 2011). Each counter gives four independent 32-bit words from the key alone,
// so any thread can draw any pair's word without a stream: the backward regenerates the
// forward's mask, and the bits do not depend on how the work is split. The SIMD form that the
// kernels use is attention/dropout-inl.h; this is the scalar one (the reference, the tests,
// dropout_mask).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "qkv/attention.h"

namespace qkv::detail {

// Philox's round multipliers and key increments (the golden ratio and √3 − 1 in 32 bits).
inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;
inline constexpr int kPhiloxRounds = 10;

// The four words of counter c under key k.
inline std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int r = 0; r < kPhiloxRounds; ++r) {
    const uint64_t p0 = uint64_t{kPhiloxM0} * c[0], p1 = uint64_t{kPhiloxM1} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k = {k[0] + kPhiloxW0, k[1] + kPhiloxW1};
  }
  return c;
}

// Pairs drawn per counter: each of its four 32-bit words gives two 16-bit halves, one per key.
// (16 bits put the keep rate within 2⁻¹⁷ of 1 − p, and halve the generator's cost against a
// word per key: a tenth of the forward at dim 64 with 32 bits, measured.)
inline constexpr int64_t kKeysPerCounter = 8;

// A call's dropout, ready for the kernels: which halves keep their pair, and the scale of a
// kept weight.
struct DropoutRule {
  bool on = false;
  uint32_t key0 = 0, key1 = 0, offset = 0;
  uint32_t threshold = 0;  // a half keeps its pair when it is >= this (2¹⁶: none does)
  float keep_scale = 1;    // 1 / (1 − p); 0 when p = 1
  int64_t batch_offset = 0, heads = 0;

  DropoutRule() = default;
  DropoutRule(const Dropout& d, int64_t Hq)
      : on(d.p > 0),
        key0(static_cast<uint32_t>(d.seed)),
        key1(static_cast<uint32_t>(d.seed >> 32)),
        offset(d.offset),
        threshold(static_cast<uint32_t>(std::lround(double(d.p) * 65536.0))),
        keep_scale(d.p < 1 ? static_cast<float>(1.0 / (1.0 - double(d.p))) : 0.0f),
        batch_offset(d.batch_offset),
        heads(Hq) {}

  // Counter word 2: the (batch, head) pair.
  uint32_t head_word(int64_t b, int64_t h) const {
    return static_cast<uint32_t>((b + batch_offset) * heads + h);
  }
  // The four words of query i and keys 8·group … 8·group + 7 of (b, h).
  std::array<uint32_t, 4> words(int64_t b, int64_t h, int64_t i, int64_t group) const {
    return philox4x32(
        {static_cast<uint32_t>(i), static_cast<uint32_t>(group), head_word(b, h), offset},
        {key0, key1});
  }
  // Key j's half: the low one of word (j mod 8) / 2 for even j, the high one for odd j.
  static uint32_t half(const std::array<uint32_t, 4>& w, int64_t j) {
    const uint32_t word = w[(j % kKeysPerCounter) / 2];
    return j % 2 ? word >> 16 : word & 0xFFFFu;
  }
  bool keeps(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return half(words(b, h, i, j / kKeysPerCounter), j) >= threshold;
  }
  // The factor weight (b, h, i, j) is multiplied by: 0 or 1 / (1 − p).
  float factor(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return !on ? 1.0f : keeps(b, h, i, j) ? keep_scale : 0.0f;
  }
};

// Throws qkv::Error unless `d` is a dropout these B, Hq, Tq and Tk can draw: 0 <= p <= 1, and
// every counter word in 32 bits.
void validate_dropout(const Dropout& d, int64_t B, int64_t Hq, int64_t Tq, int64_t Tk,
                      const char* where);

}  // namespace qkv::detail
