// A switch over a list of formats, checked at compile time: with_type_in<kList>(type, what, f)
// calls f(std::integral_constant<TensorType, T>{}) for the member T of kList equal to `type`, so
// each listed format is instantiated wherever a kernel switches over the list, and a format
// added to the list reaches every one of them (a kernel that cannot take it fails to compile).
// Anything not listed: a qkv::Error that `type` is not `what`.
#pragma once

#include <cstddef>
#include <iterator>
#include <type_traits>
#include <utility>

#include "qkv/error.h"
#include "qkv/number_format.h"

namespace qkv::detail {

template <const auto& kList, size_t kAt = 0, typename F>
auto with_type_in(TensorType type, const char* what, F&& f)
    -> decltype(f(std::integral_constant<TensorType, kList[0]>{})) {
  if constexpr (kAt < std::size(kList)) {
    constexpr TensorType kType = kList[kAt];
    if (type == kType) return f(std::integral_constant<TensorType, kType>{});
    return with_type_in<kList, kAt + 1>(type, what, std::forward<F>(f));
  } else {
    fail("kernels: ", to_string(type), " is not ", what);
  }
}

}  // namespace qkv::detail
