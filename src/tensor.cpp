#include "qkv/tensor.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "qkv/error.h"

namespace qkv {

namespace {

// Shape and contiguous strides of a view (the address is the caller's).
void set_shape(View& v, std::initializer_list<int64_t> shape) {
  check(shape.size() >= 1 && shape.size() <= kMaxDims, "View: ", shape.size(),
        " dims given, a view has 1 to ", kMaxDims);
  v.ndim = static_cast<int>(shape.size());
  int d = 0;
  for (int64_t s : shape) v.shape[d++] = s;
  int64_t step = 1;
  for (d = v.ndim - 1; d >= 0; --d) {
    check(v.shape[d] >= 0, "View: negative size in dim ", d);
    v.stride[d] = step;
    step *= v.shape[d];
  }
}

void set_strides(View& v, std::initializer_list<int64_t> strides) {
  check(static_cast<int>(strides.size()) == v.ndim, "View: ", v.ndim, " dims but ",
        strides.size(), " strides");
  int d = 0;
  for (int64_t s : strides) v.stride[d++] = s;
}

template <class T>
View typed_view(T* data, std::initializer_list<int64_t> shape) {
  View v;
  v.type = type_of<T>();
  v.elements = data;
  set_shape(v, shape);
  return v;
}

}  // namespace

const char* dtype_name(TensorType type) {
  switch (type) {
    case TensorType::f32:
      return "fp32";
    case TensorType::bf16:
      return "bf16";
    case TensorType::f16:
      return "fp16";
    default:
      return "not an attention element type";
  }
}

View::View(float* data, std::initializer_list<int64_t> shape) : data(data) {
  set_shape(*this, shape);
}

View::View(float* data, std::initializer_list<int64_t> shape,
           std::initializer_list<int64_t> strides)
    : View(data, shape) {
  set_strides(*this, strides);
}

View::View(bf16* data, std::initializer_list<int64_t> shape) : View(typed_view(data, shape)) {}
View::View(bf16* data, std::initializer_list<int64_t> shape,
           std::initializer_list<int64_t> strides)
    : View(data, shape) {
  set_strides(*this, strides);
}
View::View(f16* data, std::initializer_list<int64_t> shape) : View(typed_view(data, shape)) {}
View::View(f16* data, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides)
    : View(data, shape) {
  set_strides(*this, strides);
}

void View::check_type(TensorType expected) const {
  if (type != expected)
    fail("View: holds ", dtype_name(type), " elements, read as ", dtype_name(expected));
}

float View::get(int64_t i, int64_t j, int64_t k, int64_t l) const {
  const int64_t at = i * stride[0] + j * stride[1] + k * stride[2] + l * stride[3];
  switch (type) {
    case TensorType::bf16:
      return to_float(static_cast<const bf16*>(elements)[at]);
    case TensorType::f16:
      return to_float(static_cast<const f16*>(elements)[at]);
    default:
      return data[at];
  }
}

void View::set(int64_t i, int64_t j, int64_t k, int64_t l, float value) const {
  const int64_t at = i * stride[0] + j * stride[1] + k * stride[2] + l * stride[3];
  switch (type) {
    case TensorType::bf16:
      static_cast<bf16*>(elements)[at] = bf16{float_to_bf16(value)};
      break;
    case TensorType::f16:
      static_cast<f16*>(elements)[at] = f16{float_to_half(value)};
      break;
    default:
      data[at] = value;
  }
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
  if (type == TensorType::f32) s.data = data + begin * stride[dim];
  else s.elements = static_cast<char*>(elements) + begin * stride[dim] * element_bytes();
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
  view_ = View(static_cast<float*>(nullptr), shape);
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
