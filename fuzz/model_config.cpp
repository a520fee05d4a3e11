// Fuzz target: any text given as a model config (a checkpoint's "config" metadata) ends in a
// valid ModelConfig or a qkv::Error; a config that parses also writes back the same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "qkv/error.h"
#include "qkv/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const qkv::ModelConfig c =
        qkv::config_from_json(std::string(reinterpret_cast<const char*>(data), size));
    const std::string again = qkv::config_to_json(c);
    if (qkv::config_to_json(qkv::config_from_json(again)) != again)
      std::abort();  // a round trip loses nothing
  } catch (const qkv::Error&) {
  }
  return 0;
}
