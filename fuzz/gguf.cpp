// Fuzz target: any bytes given to the GGUF reader end in a file whose every metadata value
// and every tensor byte can be read, or in a qkv::Error; so do the readers built on it: the
// tokenizer from its metadata (which then encodes and decodes text), the model config and a
// model over its tensors in place (which, when small, then runs two tokens).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "qkv/error.h"
#include "qkv/gguf.h"
#include "qkv/io.h"
#include "qkv/kv_cache.h"
#include "qkv/tokenizer.h"

namespace {

size_t visit(const qkv::gguf::Value& v) {
  if (const auto* a = std::get_if<std::vector<qkv::gguf::Value>>(&v.data)) {
    size_t n = a->size();
    for (const auto& x : *a) n += visit(x);
    return n;
  }
  if (const auto* s = std::get_if<std::string>(&v.data)) return s->size();
  return 1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto f = qkv::gguf::File::from_bytes(data, size);
    size_t seen = 0;
    for (const auto& [key, v] : f.metadata()) seen += key.size() + visit(v);
    for (const auto& t : f.tensors()) {
      uint8_t x = 0;
      for (uint64_t i = 0; i < t.bytes; ++i) x ^= t.data[i];  // out of bounds = an ASan report
      seen += x;
    }
    if (seen == size_t(-1)) std::abort();  // keeps the reads
    try {
      const qkv::Tokenizer t = qkv::Tokenizer::from_gguf(f);
      for (const char* text : {"Hello, world! 42", " <|im_start|>x\xff\n\n  y", ""}) {
        const std::vector<int32_t> ids = t.encode(text, true, true);
        int32_t prev = -1;
        for (int32_t id : ids) seen += t.decode(prev, id).size(), prev = id;
      }
    } catch (const qkv::Error&) {
    }
    const qkv::ModelConfig c = qkv::gguf_model_config(f);
    if (c.n_layers * c.d_model * (c.d_model + c.d_ff) + c.vocab_size * c.d_model > (1 << 22))
      return 0;
    const auto model = qkv::load_gguf(f);
    qkv::KVCache cache(c, {.max_seq = 2});
    const int32_t tokens[2] = {0, static_cast<int32_t>(c.vocab_size - 1)};
    model->forward_cached(cache, tokens, 1, 2);
  } catch (const qkv::Error&) {
  }
  return 0;
}
