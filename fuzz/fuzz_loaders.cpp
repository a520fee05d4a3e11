// Fuzz target for the file loaders: any bytes given to the llama2.c checkpoint reader and the
// tokenizer reader must end in a model / tokenizer or a qkv::Error — never a crash, a hang,
// an out-of-bounds read or a huge allocation.
//
// Built two ways (fuzz/CMakeLists.txt): with clang's libFuzzer (`make fuzz`, a short run),
// and with any compiler as `fuzz_replay`, a test that feeds it every file of fuzz/corpus/.
#include <cstddef>
#include <cstdint>
#include <string>

#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/kv_cache.h"
#include "qkv/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first byte picks the loader, the rest is the file.
  if (size == 0) return 0;
  const bool tokenizer = data[0] & 1;
  ++data, --size;
  try {
    if (!tokenizer) {
      auto model = qkv::load_llama2c_bytes(data, size);
      // A model that loads must also run: one token through the cache.
      qkv::KVCache cache(model->config(), {.max_seq = 1});
      const int32_t token = 0;
      model->forward_cached(cache, &token, 1, 1);
    } else {
      // The vocabulary size comes from the model in real use; here from the file's length.
      const int64_t vocab = 3 + static_cast<int64_t>(size % 61);
      const auto t = qkv::Tokenizer::from_llama2c_bytes(data, size, vocab);
      const auto ids = t.encode("Once upon a time, \xc3\xa9 \xff");
      for (size_t i = 1; i < ids.size(); ++i) t.decode(ids[i - 1], ids[i]);
    }
  } catch (const qkv::Error&) {
    // A clear error is the right answer to a bad file.
  }
  return 0;
}
