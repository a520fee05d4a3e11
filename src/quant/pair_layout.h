// The layout AVX-512 DL's int8 unit reads repacked weights in (quant::repack_for_int8, the
// unit PackedPairUnit in quant/int8-inl.h): each group of 4 rows, pair of blocks (b, b + 1) by
// pair, as one step of the unit: the 4 rows' fp16 scales, row after row (Q8_0 and Q4_0: d, d';
// Q4_1: d, m, d', m'), then each row's values as the unit multiplies them (Q8_0: b's 32 then
// b + 1's, offset by 128 to unsigned; Q4: b's 16 bytes of nibbles, then b + 1's). The same
// bytes as the 4 rows' pairs in the file.
#pragma once

#include <cstdint>

#include "qkv/number_format.h"

namespace qkv::quant::pair_layout {

inline constexpr int kRows = 4;  // rows in a group

constexpr bool packs(TensorType t) {
  return t == TensorType::q8_0 || t == TensorType::q4_0 || t == TensorType::q4_1;
}
// The 4 rows' scales of one pair, then one row's values of it.
constexpr int64_t scale_bytes(TensorType t) { return t == TensorType::q4_1 ? 32 : 16; }
constexpr int64_t value_bytes(TensorType t) { return t == TensorType::q8_0 ? 64 : 32; }
constexpr int64_t step_bytes(TensorType t) { return scale_bytes(t) + kRows * value_bytes(t); }
// How far ahead of a step the unit asks for bytes (PackedPairUnit).
inline constexpr int64_t kPrefetchBytes = 8192;
// A group of 4 rows of `cols` values (its whole pairs).
inline int64_t group_bytes(TensorType t, int64_t cols) {
  return cols / kKvBlockValues / 2 * step_bytes(t);
}

}  // namespace qkv::quant::pair_layout
