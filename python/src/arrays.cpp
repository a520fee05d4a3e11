#include "arrays.h"

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

template <typename Array>
View to_view(const Array& a, const char* what) {
  const auto t = a.dtype();
  if (t != nb::dtype<float>())
    throw nb::type_error((std::string(what) + " must be float32, got " + dtype_name(t)).c_str());
  check(a.ndim() >= 1 && a.ndim() <= kMaxDims, what, " must have 1 to ", kMaxDims, " dims, got ",
        a.ndim());
  View v;
  v.data = static_cast<float*>(const_cast<void*>(static_cast<const void*>(a.data())));
  v.ndim = static_cast<int>(a.ndim());
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = static_cast<int64_t>(a.shape(d));
    v.stride[d] = a.stride(d);
  }
  return v;
}

}  // namespace

View float_view(const InArray& a, const char* what) { return to_view(a, what); }

View float_view(const OutArray& a, const char* what) {
  View v = to_view(a, what);
  // Two elements at one address would be written by two threads at once.
  for (int d = 0; d < v.ndim && v.numel() > 0; ++d)  // (an empty array has zero strides)
    check(v.stride[d] != 0 || v.shape[d] <= 1, what, " has a zero stride in dim ", d,
          " (a broadcast view); outputs need their own memory");
  return v;
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
