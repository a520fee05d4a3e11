// Written buffers that share memory with read ones: attention's outputs must not overlap its
// inputs (a kernel reads an input after it has begun writing an output, so the answer would be
// silently wrong). Two views are compared when each is dense — its elements fill its address
// range, as a contiguous tensor or a permuted view of one does: then they overlap exactly when
// their ranges meet. Interleaved views of one buffer (the q, k and v of a fused projection)
// are not dense and are not compared element by element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "qkv/tensor.h"

namespace qkv::detail {

// The bytes a tensor's elements lie in, and whether they fill them.
struct Extent {
  const char* name = nullptr;
  uintptr_t lo = 0, hi = 0;  // [lo, hi)
  bool dense = false;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
};
Extent extent_of(const char* name, const void* data, int ndim, const int64_t* shape,
                 const int64_t* stride, size_t element_bytes);
inline Extent extent_of(const char* name, const View& v) {
  return extent_of(name, v.address(), v.ndim, v.shape, v.stride,
                   static_cast<size_t>(v.element_bytes()));
}
// A contiguous array of n floats (lse).
Extent extent_of(const char* name, const float* data, int64_t n);

// Throws qkv::Error "<where>: <written> [..] overlaps <read> [..] in memory …" for the first
// written extent that overlaps a read one or another written one (empty extents are skipped).
void check_no_overlap(const char* where, std::initializer_list<Extent> written,
                      std::initializer_list<Extent> read);

}  // namespace qkv::detail
