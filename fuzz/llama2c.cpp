// Fuzz target: any bytes given to the llama2.c model reader end in a model that runs one token,
// or in a qkv::Error — never a crash, a hang, an out-of-bounds read or a huge allocation.
#include <cstddef>
#include <cstdint>

#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/kv_cache.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto model = qkv::load_llama2c_bytes(data, size);
    qkv::KVCache cache(model->config(), {.max_seq = 1});  // a model that loads must also run
    const int32_t token = 0;
    model->forward_cached(cache, &token, 1, 1);
  } catch (const qkv::Error&) {
    // A clear error is the right answer to a bad file.
  }
  return 0;
}
