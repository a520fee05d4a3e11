#include "arrays.h"

#include <optional>

#include "qkv/error.h"

namespace qkv::python {

std::string dtype_name(const nb::dlpack::dtype& t) {
  using code = nb::dlpack::dtype_code;
  std::string kind;
  switch (static_cast<code>(t.code)) {
    case code::Int:
      kind = "int";
      break;
    case code::UInt:
      kind = "uint";
      break;
    case code::Float:
      kind = "float";
      break;
    case code::Bfloat:
      kind = "bfloat";
      break;
    case code::Complex:
      kind = "complex";
      break;
    case code::Bool:
      return "bool";
    default:
      kind = "unknown";
      break;
  }
  return kind + std::to_string(t.bits);
}

namespace {

// The element type of an array attention may read: float32, float16, bfloat16 (or its bits
// as uint16); nullopt for anything else.
std::optional<TensorType> element_type(const nb::dlpack::dtype& t) {
  using code = nb::dlpack::dtype_code;
  if (t == nb::dtype<float>()) return TensorType::f32;
  if (t.bits == 16 && t.lanes == 1) {
    if (t.code == static_cast<uint8_t>(code::Float)) return TensorType::f16;
    if (t.code == static_cast<uint8_t>(code::Bfloat)) return TensorType::bf16;
    if (t.code == static_cast<uint8_t>(code::UInt)) return TensorType::bf16;
  }
  return std::nullopt;
}

template <typename Array>
View to_view(const Array& a, const char* what, bool any_element_type) {
  const auto t = a.dtype();
  const std::optional<TensorType> type = element_type(t);
  if (!type || (!any_element_type && *type != TensorType::f32))
    throw nb::type_error((std::string(what) + " must be " +
                          (any_element_type ? "float32, bfloat16 or float16" : "float32") +
                          ", got " + dtype_name(t))
                             .c_str());
  check(a.ndim() >= 1 && a.ndim() <= kMaxDims, what, " must have 1 to ", kMaxDims, " dims, got ",
        a.ndim());
  View v;
  v.type = *type;
  void* address = const_cast<void*>(static_cast<const void*>(a.data()));
  if (v.type == TensorType::f32) v.data = static_cast<float*>(address);
  else v.elements = address;
  v.ndim = static_cast<int>(a.ndim());
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = static_cast<int64_t>(a.shape(d));
    v.stride[d] = a.stride(d);
  }
  return v;
}

// Two elements at one address would be written by two threads at once.
View checked_output(View v, const char* what) {
  for (int d = 0; d < v.ndim && v.numel() > 0; ++d)  // (an empty array has zero strides)
    check(v.stride[d] != 0 || v.shape[d] <= 1, what, " has a zero stride in dim ", d,
          " (a broadcast view); outputs need their own memory");
  return v;
}

}  // namespace

View float_view(const InArray& a, const char* what) { return to_view(a, what, false); }
View float_view(const OutArray& a, const char* what) {
  return checked_output(to_view(a, what, false), what);
}
View element_view(const InArray& a, const char* what) { return to_view(a, what, true); }
View element_view(const OutArray& a, const char* what) {
  return checked_output(to_view(a, what, true), what);
}

const int32_t* int32_data(const InArray& a, const char* what) {
  if (a.dtype() != nb::dtype<int32_t>())
    throw nb::type_error(
        (std::string(what) + " must be int32, got " + dtype_name(a.dtype())).c_str());
  check(a.ndim() == 1 && (a.shape(0) <= 1 || a.stride(0) == 1), what,
        " must be a contiguous 1-D array");
  return static_cast<const int32_t*>(a.data());
}

}  // namespace qkv::python
