// Tensor (owning, 64-byte aligned fp32 storage) and View (pointer + shape + strides).
//
// Kernels take Views, so the same data can be seen as [B, H, T, D] (PyTorch's layout) or as
// [B, T, H, D] (FlashAttention's, and what a fused QKV projection writes) without a copy:
// a View is a pointer, up to 4 dims and a stride per dim, counted in elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>

namespace qkv {

inline constexpr int kMaxDims = 4;

struct View {
  float* data = nullptr;
  int ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};
  int64_t stride[kMaxDims] = {0, 0, 0, 0};

  View() = default;
  // Contiguous (row-major) view of `data` with the given shape.
  View(float* data, std::initializer_list<int64_t> shape);
  // View with explicit strides (in elements).
  View(float* data, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides);

  bool empty() const { return data == nullptr; }
  int64_t size(int dim) const { return shape[dim]; }
  int64_t numel() const;
  bool is_contiguous() const;

  // Element access; the number of indices must equal ndim (checked in debug builds only).
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
