// qkv::Error: every failure the library reports. The message names the function, the argument
// and the shapes, e.g. "attention: k has head dim 80 but q has 64".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace qkv {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Builds a message from any streamable parts: fail("attention: q is ", shape_str(q)).
template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw Error(message.str());
}

template <typename... Parts>
void check(bool ok, const Parts&... parts) {
  if (!ok) fail(parts...);
}

}  // namespace qkv
