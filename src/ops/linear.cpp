// Linear layer: y = x Wᵀ + b and its backward, through the GEMM interface.
#include "ops/gemm.h"
#include "ops/rows.h"
#include "qkv/error.h"
#include "qkv/ops.h"
#include "util/parallel.h"

namespace qkv {

using detail::check_rows;
using detail::gemm;

namespace {

detail::Products products_of(TensorType t, const char* where) {
  check(t == TensorType::f32 || t == TensorType::bf16, where, ": products are fp32 or bf16, not ",
        dtype_name(t));
  return t == TensorType::bf16 ? detail::Products::bf16 : detail::Products::fp32;
}

}  // namespace

void linear_forward(View y, View x, View W, const float* b, TensorType products) {
  constexpr const char* where = "linear_forward";
  const detail::Products p = products_of(products, where);
  check_rows(W, -1, -1, where, "W [out, in]");
  const int64_t out = W.shape[0], in = W.shape[1];
  check_rows(x, -1, in, where, "x [N, in]");
  const int64_t N = x.shape[0];
  check_rows(y, N, out, where, "y [N, out]");
  if (b) {  // y ← broadcast b, then y += x Wᵀ
    detail::team_serial([&] {
      for (int64_t n = 0; n < N; ++n)
        for (int64_t o = 0; o < out; ++o) y(n, o) = b[o];
    });
  }
  gemm(false, true, N, out, in, 1.0f, x.data, x.stride[0], W.data, W.stride[0], b ? 1.0f : 0.0f,
       y.data, y.stride[0], p);
}

void linear_backward(View dx, View dW, float* db, View dy, View x, View W, TensorType products) {
  constexpr const char* where = "linear_backward";
  const detail::Products p = products_of(products, where);
  const int64_t out = W.shape[0], in = W.shape[1], N = x.shape[0];
  check_rows(dy, N, out, where, "dy [N, out]");
  if (!dx.empty()) {  // dx += dy W
    check_rows(dx, N, in, where, "dx [N, in]");
    gemm(false, false, N, in, out, 1.0f, dy.data, dy.stride[0], W.data, W.stride[0], 1.0f, dx.data,
         dx.stride[0], p);
  }
  if (!dW.empty()) {  // dW += dyᵀ x
    check_rows(dW, out, in, where, "dW [out, in]");
    gemm(true, false, out, in, N, 1.0f, dy.data, dy.stride[0], x.data, x.stride[0], 1.0f, dW.data,
         dW.stride[0], p);
  }
  if (db)  // db += Σ_n dy
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < out; ++o) db[o] += dy(n, o);
}

}  // namespace qkv
