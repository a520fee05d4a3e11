// Fuzz target: any text given to `qkv explain --input` ends in the worked steps or a qkv::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "qkv/explain.h"
#include "qkv/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    qkv::explain::explain_json(std::string(reinterpret_cast<const char*>(data), size), size % 2,
                               "input");
  } catch (const qkv::Error&) {
  }
  return 0;
}
