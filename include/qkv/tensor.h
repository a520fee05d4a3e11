// Tensor (owning, 64-byte aligned fp32 storage) and View (pointer + element type + shape +
// strides).
//
// Kernels take Views, so the same data can be seen as [B, H, T, D] (PyTorch's layout) or as
// [B, T, H, D] (FlashAttention's, and what a fused QKV projection writes) without a copy:
// a View is a pointer, up to 4 dims and a stride per dim, counted in elements.
//
// Element types: fp32 (the default), bf16 and fp16. An fp32 view keeps its elements in `data`
// as it always has; a bf16 or fp16 view keeps them in `elements` and leaves `data` null, so
// fp32 code handed a 16-bit view fails loudly instead of reading halves as floats. The 16-bit
// element types are qkv::bf16 and qkv::f16 below: the bits, nothing else (no arithmetic).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>

#include "qkv/number_format.h"

namespace qkv {

inline constexpr int kMaxDims = 4;

// bfloat16 and IEEE half elements: 16 bits each, as PyTorch, NumPy (ml_dtypes, float16) and
// GGUF store them. float_to_bf16 / float_to_half round to nearest even.
struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};
inline float to_float(float x) { return x; }
inline float to_float(bf16 x) { return bf16_to_float(x.bits); }
inline float to_float(f16 x) { return half_to_float(x.bits); }

// The TensorType of a C++ element type (float, bf16, f16).
template <class T>
constexpr TensorType type_of();
template <>
constexpr TensorType type_of<float>() { return TensorType::f32; }
template <>
constexpr TensorType type_of<bf16>() { return TensorType::bf16; }
template <>
constexpr TensorType type_of<f16>() { return TensorType::f16; }

// "fp32", "bf16", "fp16" (the names the API and the CLI use).
const char* dtype_name(TensorType type);

struct View {
  float* data = nullptr;  // the elements of an fp32 view; null in a view of another type
  int ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};
  int64_t stride[kMaxDims] = {0, 0, 0, 0};
  TensorType type = TensorType::f32;  // f32, bf16 or f16
  void* elements = nullptr;           // the elements of a bf16 or fp16 view; null for fp32

  View() = default;
  // Contiguous (row-major) view of `data` with the given shape.
  View(float* data, std::initializer_list<int64_t> shape);
  // View with explicit strides (in elements).
  View(float* data, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides);
  // The same over bf16 and fp16 elements.
  View(bf16* data, std::initializer_list<int64_t> shape);
  View(bf16* data, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides);
  View(f16* data, std::initializer_list<int64_t> shape);
  View(f16* data, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides);

  // The first element, whatever the type.
  void* address() const { return type == TensorType::f32 ? data : elements; }
  bool empty() const { return address() == nullptr; }
  int64_t size(int dim) const { return shape[dim]; }
  int64_t numel() const;
  bool is_contiguous() const;
  // Bytes per element: 4 or 2.
  int64_t element_bytes() const { return type == TensorType::f32 ? 4 : 2; }
  // The elements as T (float, bf16 or f16); a qkv::Error if the view holds another type.
  template <class T>
  T* as() const {
    check_type(type_of<T>());
    return static_cast<T*>(address());
  }
  void check_type(TensorType expected) const;

  // Element i, j, k, l of a view of any type, widened to float; set() rounds to nearest even.
  float get(int64_t i, int64_t j, int64_t k, int64_t l) const;
  void set(int64_t i, int64_t j, int64_t k, int64_t l, float value) const;

  // fp32 element access; the number of indices must equal ndim (checked in debug builds only).
  float& operator()(int64_t i) const { return data[i * stride[0]]; }
  float& operator()(int64_t i, int64_t j) const { return data[i * stride[0] + j * stride[1]]; }
  float& operator()(int64_t i, int64_t j, int64_t k) const {
    return data[i * stride[0] + j * stride[1] + k * stride[2]];
  }
  float& operator()(int64_t i, int64_t j, int64_t k, int64_t l) const {
    return data[i * stride[0] + j * stride[1] + k * stride[2] + l * stride[3]];
  }

  // The same data with dims a and b swapped: [B, T, H, D] storage seen as [B, H, T, D].
  View transpose(int a, int b) const;
  // Elements [begin, end) along one dim.
  View slice(int dim, int64_t begin, int64_t end) const;
};

// "[2, 8, 128, 64]"
std::string shape_str(const View& v);
// The same text, made only when streamed: error checks name shapes in their messages without
// building strings on every call that passes (decoding runs thousands of checks a second).
struct ShapeOf {
  View view;
};
inline ShapeOf shape_of(const View& v) { return {v}; }
std::ostream& operator<<(std::ostream& out, const ShapeOf& s);

// Throws qkv::Error "<where>: <name> must have <ndim> dims, got [..]" unless v.ndim == ndim.
void check_ndim(const View& v, int ndim, const char* where, const char* name);

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled, contiguous, 64-byte aligned. Every dim must be > 0.
  explicit Tensor(std::initializer_list<int64_t> shape);

  float* data() const { return storage_.get(); }
  int64_t numel() const { return numel_; }
  int ndim() const { return view_.ndim; }
  int64_t size(int dim) const { return view_.shape[dim]; }
  const View& view() const { return view_; }
  operator View() const { return view_; }  // NOLINT: a Tensor is usable wherever a View is

  void fill(float value);

 private:
  struct FreeAligned {
    void operator()(float* p) const;
  };
  std::unique_ptr<float[], FreeAligned> storage_;
  int64_t numel_ = 0;
  View view_;
};

}  // namespace qkv
