// Fuzz target: any bytes given to the GGUF reader end in a file whose every metadata value
// and every tensor byte can be read, or in a qkv::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "qkv/error.h"
#include "qkv/gguf.h"

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
  } catch (const qkv::Error&) {
  }
  return 0;
}
