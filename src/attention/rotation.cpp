// The rotation a quantized key/value cache applies to its rows (StoredKV::rotation): the fast
// Walsh–Hadamard transform, log2(block) passes of butterflies (a, b) → (a + b, a − b) over
// each block, then the normalisation 1/√block that makes it orthonormal.
#include <cmath>

#include "qkv/attention.h"
#include "qkv/error.h"

namespace qkv {

int64_t rotation_block(int64_t dim) {
  check(dim >= 1, "rotation_block: the head dim must be >= 1, got ", dim);
  return dim & -dim;
}

void hadamard_rotate(float* x, int64_t dim, int64_t block) {
  check(block >= 1 && (block & (block - 1)) == 0 && dim % block == 0, "hadamard_rotate: block ",
        block, " must be a power of two that divides the dim ", dim);
  const float norm = 1.0f / std::sqrt(static_cast<float>(block));
  for (float* y = x; y < x + dim; y += block) {
    for (int64_t h = 1; h < block; h *= 2)
      for (int64_t i = 0; i < block; i += 2 * h)
        for (int64_t j = i; j < i + h; ++j) {
          const float a = y[j], b = y[j + h];
          y[j] = a + b;
          y[j + h] = a - b;
        }
    for (int64_t i = 0; i < block; ++i) y[i] *= norm;
  }
}

}  // namespace qkv
