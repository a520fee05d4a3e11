// Shape checks shared by the ops: 2-d views whose rows are contiguous.
#pragma once

#include "qkv/error.h"
#include "qkv/tensor.h"

namespace qkv::detail {

// Throws unless v is [rows, cols] (either may be -1: any) with unit stride along cols.
inline void check_rows(const View& v, int64_t rows, int64_t cols, const char* where,
                       const char* name) {
  check_ndim(v, 2, where, name);
  if ((rows >= 0 && v.shape[0] != rows) || (cols >= 0 && v.shape[1] != cols))
    fail(where, ": ", name, " is ", shape_of(v), ", expected [",
         rows < 0 ? std::string("any") : std::to_string(rows), ", ",
         cols < 0 ? std::string("any") : std::to_string(cols), "]");
  check(v.stride[1] == 1 || v.shape[1] == 1, where, ": ", name,
        " must have contiguous rows (stride 1 along its last dim)");
}

inline float* row(const View& v, int64_t n) { return v.data + n * v.stride[0]; }

}  // namespace qkv::detail
