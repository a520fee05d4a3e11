// quant::repack_for_int8 (include/qkv/quant.h): weights laid out as the int8 unit in use
// reads them (quant/pair_layout.h).
#include <cstring>

#include "qkv/quant.h"
#include "qkv/threads.h"
#include "quant/pair_layout.h"
#include "quant/product_kernels.h"
#include "util/parallel.h"

namespace qkv::quant {

std::vector<uint8_t> repack_for_int8(const Matrix& m) {
  namespace layout = pair_layout;
  if (!layout::packs(m.type) ||
      product_kernel(m.type, Matmul::int8, 2) != ProductKernel::int8_vpdpbusd)
    return {};
  const int64_t groups = m.rows / layout::kRows, pairs = m.cols / kKvBlockValues / 2;
  const int64_t rb = row_bytes(m.type, m.cols), block = row_bytes(m.type, kKvBlockValues);
  const int64_t scales = layout::scale_bytes(m.type), values = layout::value_bytes(m.type);
  const int64_t step = layout::step_bytes(m.type);
  // A block in the file: its scale (Q4_1: and offset) in the first `head` bytes, then values.
  const int64_t head = m.type == TensorType::q4_1 ? 4 : 2;
  std::vector<uint8_t> out(groups * layout::group_bytes(m.type, m.cols));
  detail::parallel_for(groups, num_threads(), [&](int64_t g) {
    for (int64_t p = 0; p < pairs; ++p) {
      uint8_t* s = out.data() + (g * pairs + p) * step;
      for (int r = 0; r < layout::kRows; ++r) {
        const uint8_t* b0 = m.data + (g * layout::kRows + r) * rb + 2 * p * block;
        const uint8_t* b1 = b0 + block;
        std::memcpy(s + r * 2 * head, b0, head);
        std::memcpy(s + r * 2 * head + head, b1, head);
        uint8_t* v = s + scales + r * values;
        if (m.type == TensorType::q8_0) {
          for (int j = 0; j < kKvBlockValues; ++j)
            v[j] = b0[head + j] ^ 0x80, v[kKvBlockValues + j] = b1[head + j] ^ 0x80;
        } else {
          std::memcpy(v, b0 + head, kKvBlockValues / 2);
          std::memcpy(v + kKvBlockValues / 2, b1 + head, kKvBlockValues / 2);
        }
      }
    }
  });
  return out;
}

}  // namespace qkv::quant
