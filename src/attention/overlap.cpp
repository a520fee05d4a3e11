// Outputs that share memory with inputs (see overlap.h).
#include "attention/overlap.h"

#include <sstream>
#include <utility>

#include "qkv/error.h"

namespace qkv::detail {

Extent extent_of(const char* name, const void* data, int ndim, const int64_t* shape,
                 const int64_t* stride, size_t element_bytes) {
  Extent e;
  e.name = name;
  if (data == nullptr || ndim <= 0 || ndim > kMaxDims) return e;
  int64_t lo = 0, hi = 0;
  e.ndim = ndim;
  std::pair<int64_t, int64_t> dims[kMaxDims];  // (|stride|, size) of the dims longer than 1
  int count = 0;
  for (int d = 0; d < ndim; ++d) {
    e.shape[d] = shape[d];
    if (shape[d] <= 0) return Extent{name};
    const int64_t reach = (shape[d] - 1) * stride[d];
    (reach < 0 ? lo : hi) += reach;
    if (shape[d] > 1) dims[count++] = {stride[d] < 0 ? -stride[d] : stride[d], shape[d]};
  }
  const auto base = reinterpret_cast<uintptr_t>(data);
  e.lo = base + static_cast<uintptr_t>(lo * static_cast<int64_t>(element_bytes));
  e.hi = base + static_cast<uintptr_t>((hi + 1) * static_cast<int64_t>(element_bytes));
  // Dense: in the order of their strides, each dim steps over the ones inside it exactly.
  // (No allocation: this runs on every attention call, decoding included.)
  for (int i = 1; i < count; ++i)  // insertion sort of at most 4 (std::sort: GCC warns falsely)
    for (int j = i; j > 0 && dims[j] < dims[j - 1]; --j) std::swap(dims[j], dims[j - 1]);
  int64_t step = 1;
  e.dense = true;
  for (int i = 0; i < count; ++i) {
    if (dims[i].first != step) e.dense = false;
    step *= dims[i].second;
  }
  return e;
}

Extent extent_of(const char* name, const float* data, int64_t n) {
  const int64_t shape[1] = {n}, stride[1] = {1};
  return extent_of(name, data, 1, shape, stride, sizeof(float));
}

namespace {

std::string shape_text(const Extent& e) {
  std::ostringstream s;
  s << "[";
  for (int d = 0; d < e.ndim; ++d) s << (d ? ", " : "") << e.shape[d];
  s << "]";
  return s.str();
}

bool meet(const Extent& a, const Extent& b) {
  return a.hi > a.lo && b.hi > b.lo && a.dense && b.dense && a.lo < b.hi && b.lo < a.hi;
}

}  // namespace

void check_no_overlap(const char* where, std::initializer_list<Extent> written,
                      std::initializer_list<Extent> read) {
  for (auto w = written.begin(); w != written.end(); ++w) {
    for (const Extent& r : read)
      if (meet(*w, r))
        fail(where, ": ", w->name, " ", shape_text(*w), " overlaps ", r.name, " ", shape_text(r),
             " in memory: an output must not share memory with an input (it would be read after "
             "it was overwritten); give ",
             w->name, " a buffer of its own");
    for (auto o = w + 1; o != written.end(); ++o)
      if (meet(*w, *o))
        fail(where, ": ", w->name, " ", shape_text(*w), " overlaps ", o->name, " ", shape_text(*o),
             " in memory: two outputs must not share memory");
  }
}

}  // namespace qkv::detail
