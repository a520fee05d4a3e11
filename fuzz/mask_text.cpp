// Fuzz target: any text given to parse_mask ends in a mask function or a qkv::Error. A mask
// that reads back must print to a text that reads back to the same function, and its
// BlockMask, when one can be made, must count the pairs that evaluate() shows one by one.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "qkv/error.h"
#include "qkv/mask_function.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::vector<qkv::MaskTensor> tensors = {
      qkv::MaskTensor("doc", {24},
                      {0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 3, 4, 4, 4, 4, 4, 5, 5, 5, 5}),
      qkv::MaskTensor("grid", {2, 3}, {-1, 7, 0, 2147483647, 5, -2147483647 - 1})};
  qkv::MaskExpr mask(false);
  try {
    mask = qkv::parse_mask(text, tensors);
  } catch (const qkv::Error&) {
    return 0;
  }
  const qkv::MaskExpr again = qkv::parse_mask(qkv::to_string(mask), tensors);
  if (qkv::to_string(again) != qkv::to_string(mask)) std::abort();
  if (!mask.is_bool()) return 0;
  constexpr int64_t kB = 2, kH = 2, kTq = 19, kTk = 23;
  qkv::BlockMask blocks;
  try {
    blocks = qkv::create_block_mask(mask, kB, kH, kTq, kTk, 8);
  } catch (const qkv::Error&) {
    return 0;  // an index outside a tensor, or values beyond 32 bits
  }
  int64_t visible = 0;
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t h = 0; h < kH; ++h)
      for (int64_t i = 0; i < kTq; ++i)
        for (int64_t j = 0; j < kTk; ++j) {
          const int64_t x = qkv::evaluate(mask, b, h, i, j);  // must not throw now
          if (x != qkv::evaluate(again, b, h, i, j)) std::abort();
          visible += x != 0;
        }
  if (visible != blocks.visible_pairs()) std::abort();
  return 0;
}
