// Fuzz target: any bytes given to the safetensors checkpoint reader end in a model (and
// optimizer) that run a training step's forward, or in a qkv::Error.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "qkv/error.h"
#include "qkv/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const qkv::Checkpoint ck = qkv::load_checkpoint_bytes(data, size);
    const std::vector<int32_t> tokens(2, 0);
    ck.model->forward(tokens.data(), tokens.data(), 1, 2);
  } catch (const qkv::Error&) {
  }
  return 0;
}
