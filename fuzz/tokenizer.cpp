// Fuzz target: any bytes given to the llama2.c tokenizer reader end in a tokenizer that
// encodes and decodes, or in a qkv::Error.
#include <cstddef>
#include <cstdint>

#include "qkv/error.h"
#include "qkv/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The vocabulary size comes from the model in real use; here from the file's length.
  const int64_t vocab = 3 + static_cast<int64_t>(size % 61);
  try {
    const auto t = qkv::Tokenizer::from_llama2c_bytes(data, size, vocab);
    const auto ids = t.encode("Once upon a time, \xc3\xa9 \xff");
    for (size_t i = 1; i < ids.size(); ++i) t.decode(ids[i - 1], ids[i]);
  } catch (const qkv::Error&) {
  }
  return 0;
}
