// The row source (kv_rows.h): its construction from a type or a view, and its runs copied.
#include "attention/kv_rows.h"

#include <cstring>

#include "qkv/number_format.h"

namespace qkv::detail {

KvRows kv_rows(TensorType type, const void* data, int64_t batch_stride, int64_t head_stride,
               int64_t row_stride, int64_t heads, int64_t rows, int64_t dim) {
  KvRows r;
  r.type = type;
  r.data = data;
  r.batch_stride = batch_stride, r.head_stride = head_stride, r.row_stride = row_stride;
  r.heads = heads, r.rows = rows, r.dim = dim;
  if (is_kv_block_type(type)) {
    r.unit_values = kKvBlockValues;
    r.unit_bytes = block_size(static_cast<uint32_t>(type))->bytes;
  } else {
    r.unit_bytes = type == TensorType::f32 ? 4 : 2;
  }
  return r;
}

void KvRows::copy_rows(int64_t b, int64_t h, int64_t j, int64_t count, void* to) const {
  auto* out = static_cast<uint8_t*>(to);
  const auto bytes = static_cast<size_t>(row_bytes());
  each_run(j, count, [&](int64_t first, int64_t n) {
    const uint8_t* from = row(b, h, first);
    for (int64_t i = 0; i < n; ++i, from += stride_bytes(), out += bytes)
      std::memcpy(out, from, bytes);
  });
}

KvRows kv_rows(const View& v) {
  return kv_rows(v.type, v.address(), v.stride[0], v.stride[1], v.stride[2], v.shape[1],
                 v.shape[2], v.shape[3]);
}

View contiguous_rows(const View& v, std::vector<char>& storage) {
  if (v.stride[3] == 1) return v;
  const int64_t bytes = v.element_bytes();
  storage.resize(v.numel() * bytes);
  View c = v;
  if (v.type == TensorType::f32) c.data = reinterpret_cast<float*>(storage.data());
  else c.elements = storage.data();
  int64_t step = 1;
  for (int d = 3; d >= 0; --d) c.stride[d] = step, step *= v.shape[d];
  const char* from = static_cast<const char*>(v.address());
  char* to = storage.data();
  for (int64_t a = 0; a < v.shape[0]; ++a)
    for (int64_t b = 0; b < v.shape[1]; ++b)
      for (int64_t i = 0; i < v.shape[2]; ++i)
        for (int64_t d = 0; d < v.shape[3]; ++d, to += bytes)
          std::memcpy(to, from + (a * v.stride[0] + b * v.stride[1] + i * v.stride[2] + d * v.stride[3]) * bytes,
                      static_cast<size_t>(bytes));
  return c;
}

}  // namespace qkv::detail
