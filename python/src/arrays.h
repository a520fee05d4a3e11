// NumPy arrays and torch tensors (anything with the buffer protocol or DLPack) as qkv Views:
// the caller's memory with its own strides, never a copy. A dtype the function does not take
// is a TypeError that names what was passed.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>

#include "qkv/tensor.h"

namespace qkv::python {

namespace nb = nanobind;

using InArray = nb::ndarray<nb::ro, nb::device::cpu>;  // inputs: read-only arrays welcome
using OutArray = nb::ndarray<nb::device::cpu>;         // outputs: must be writable

// "float64", "int32", "bfloat16", …
std::string dtype_name(const nb::dlpack::dtype& t);

// `a` as a View of its ndim (1 to 4) dims, after checking it is float32. `what` names the
// argument in errors.
View float_view(const nb::ndarray<nb::ro, nb::device::cpu>& a, const char* what);
View float_view(const OutArray& a, const char* what);
// The same for attention's tensors, of any element type attention takes: float32, float16, or
// bfloat16 (torch's, through DLPack; NumPy's ml_dtypes.bfloat16 arrives as a uint16 view of
// its bits, made by qkv/_attention.py, since NumPy's buffer protocol and DLPack export have no
// code for it: uint16 here always means bf16 bits).
View element_view(const InArray& a, const char* what);
View element_view(const OutArray& a, const char* what);

// Checks `a` is int32 and contiguous (index arrays: kv_len, cu_seqlens).
const int32_t* int32_data(const InArray& a, const char* what);

}  // namespace qkv::python
