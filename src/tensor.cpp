#include "qkv/tensor.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "qkv/error.h"

namespace qkv {

View::View(float* data, std::initializer_list<int64_t> shape) : data(data) {
  check(shape.size() >= 1 && shape.size() <= kMaxDims, "View: ", shape.size(),
        " dims given, a view has 1 to ", kMaxDims);
  ndim = static_cast<int>(shape.size());
  int d = 0;
  for (int64_t s : shape) this->shape[d++] = s;
  int64_t step = 1;
  for (d = ndim - 1; d >= 0; --d) {
    check(this->shape[d] >= 0, "View: negative size in dim ", d);
    stride[d] = step;
    step *= this->shape[d];
  }
}

View::View(float* data, std::initializer_list<int64_t> shape,
           std::initializer_list<int64_t> strides)
    : View(data, shape) {
  check(strides.size() == shape.size(), "View: ", shape.size(), " dims but ", strides.size(),
        " strides");
  int d = 0;
  for (int64_t s : strides) stride[d++] = s;
}

int64_t View::numel() const {
  if (ndim == 0) return 0;
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool View::is_contiguous() const {
  int64_t step = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != step) return false;
    step *= shape[d];
  }
  return true;
}

View View::transpose(int a, int b) const {
  check(a >= 0 && a < ndim && b >= 0 && b < ndim, "View::transpose: dims ", a, " and ", b,
        " of a view with ", ndim, " dims");
  View t = *this;
  std::swap(t.shape[a], t.shape[b]);
  std::swap(t.stride[a], t.stride[b]);
  return t;
}

View View::slice(int dim, int64_t begin, int64_t end) const {
  check(dim >= 0 && dim < ndim, "View::slice: dim ", dim, " of a view with ", ndim, " dims");
  if (!(0 <= begin && begin <= end &&
        end <= shape[dim]))  // (not check(): shape_str would run every call)
    fail("View::slice: [", begin, ", ", end, ") is outside dim ", dim, " of ", shape_str(*this));
  View s = *this;
  s.data = data + begin * stride[dim];
  s.shape[dim] = end - begin;
  return s;
}

std::ostream& operator<<(std::ostream& out, const ShapeOf& s) {
  if (s.view.ndim == 0) return out << "(none)";
  out << '[';
  for (int d = 0; d < s.view.ndim; ++d) out << (d ? ", " : "") << s.view.shape[d];
  return out << ']';
}

std::string shape_str(const View& v) {
  std::ostringstream s;
  s << shape_of(v);
  return s.str();
}

void check_ndim(const View& v, int ndim, const char* where, const char* name) {
  check(!v.empty(), where, ": ", name, " is missing");
  check(v.ndim == ndim, where, ": ", name, " must have ", ndim, " dims, got ", shape_of(v));
}

void Tensor::FreeAligned::operator()(float* p) const { std::free(p); }

Tensor::Tensor(std::initializer_list<int64_t> shape) {
  for (int64_t s : shape) check(s > 0, "Tensor: every dim must be > 0, got a dim of ", s);
  view_ = View(nullptr, shape);
  numel_ = view_.numel();
  // aligned_alloc wants a size that is a multiple of the alignment.
  const size_t bytes = (static_cast<size_t>(numel_) * sizeof(float) + 63) / 64 * 64;
  // Large tensors are aligned to 2 MiB and ask for transparent huge pages: touching fresh
  // 4 KiB pages is slow here (~11 µs each) and huge pages also spare TLB misses.
  const bool huge = bytes >= (4u << 20);
  const size_t alignment = huge ? (2u << 20) : 64;
  float* p = static_cast<float*>(
      std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment));
  check(p != nullptr, "Tensor: cannot allocate ", bytes, " bytes for ", shape_str(view_));
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);
  std::memset(p, 0, bytes);
  storage_.reset(p);
  view_.data = p;
}

void Tensor::fill(float value) {
  for (int64_t i = 0; i < numel_; ++i) storage_[i] = value;
}

}  // namespace qkv
