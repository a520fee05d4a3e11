// Elementwise layers: GELU (tanh form and exact), SwiGLU, and the residual add.
#include <cmath>

#include "ops/rows.h"
#include "qkv/ops.h"
#include "qkv/threads.h"

namespace qkv {

using detail::check_rows;
using detail::row;

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;

// Applies f(n, c) to every element of an [N, C] shape, rows in parallel.
template <typename F>
void each(int64_t N, int64_t C, F&& f) {
#pragma omp parallel for schedule(static) num_threads(detail::threads_for(N * C))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) f(n, c);
}

float gelu(float x, Gelu kind) {
  if (kind == Gelu::exact) return 0.5f * x * (1 + std::erf(x * kInvSqrt2));
  return 0.5f * x * (1 + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

float gelu_derivative(float x, Gelu kind) {
  if (kind == Gelu::exact) {  // Φ(x) + x φ(x)
    const float pdf = 0.3989422804014327f * std::exp(-0.5f * x * x);
    return 0.5f * (1 + std::erf(x * kInvSqrt2)) + x * pdf;
  }
  const float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
  const float t = std::tanh(u);
  const float du = kSqrt2OverPi * (1 + 3 * 0.044715f * x * x);
  return 0.5f * (1 + t) + 0.5f * x * (1 - t * t) * du;
}

float sigmoid(float x) { return 1 / (1 + std::exp(-x)); }

}  // namespace

void gelu_forward(View y, View x, Gelu kind) {
  check_rows(x, -1, -1, "gelu_forward", "x");
  check_rows(y, x.shape[0], x.shape[1], "gelu_forward", "y");
  each(x.shape[0], x.shape[1], [&](int64_t n, int64_t c) { y(n, c) = gelu(x(n, c), kind); });
}

void gelu_backward(View dx, View dy, View x, Gelu kind) {
  check_rows(dy, x.shape[0], x.shape[1], "gelu_backward", "dy");
  check_rows(dx, x.shape[0], x.shape[1], "gelu_backward", "dx");
  each(x.shape[0], x.shape[1],
       [&](int64_t n, int64_t c) { dx(n, c) += dy(n, c) * gelu_derivative(x(n, c), kind); });
}

void swiglu_forward(View y, View gate, View up) {
  check_rows(gate, -1, -1, "swiglu_forward", "gate");
  check_rows(up, gate.shape[0], gate.shape[1], "swiglu_forward", "up");
  check_rows(y, gate.shape[0], gate.shape[1], "swiglu_forward", "y");
  each(gate.shape[0], gate.shape[1], [&](int64_t n, int64_t c) {
    const float a = gate(n, c);
    y(n, c) = a * sigmoid(a) * up(n, c);
  });
}

// d silu(a)/da = sigmoid(a) · (1 + a · (1 − sigmoid(a))).
void swiglu_backward(View dgate, View dup, View dy, View gate, View up) {
  check_rows(dy, gate.shape[0], gate.shape[1], "swiglu_backward", "dy");
  check_rows(dgate, gate.shape[0], gate.shape[1], "swiglu_backward", "dgate");
  check_rows(dup, gate.shape[0], gate.shape[1], "swiglu_backward", "dup");
  each(gate.shape[0], gate.shape[1], [&](int64_t n, int64_t c) {
    const float a = gate(n, c), s = sigmoid(a), g = dy(n, c);
    dgate(n, c) += g * up(n, c) * s * (1 + a * (1 - s));
    dup(n, c) += g * a * s;
  });
}

void residual_forward(View y, View a, View b) {
  check_rows(a, -1, -1, "residual_forward", "a");
  check_rows(b, a.shape[0], a.shape[1], "residual_forward", "b");
  check_rows(y, a.shape[0], a.shape[1], "residual_forward", "y");
  each(a.shape[0], a.shape[1], [&](int64_t n, int64_t c) { y(n, c) = a(n, c) + b(n, c); });
}

void residual_backward(View da, View db, View dy) {
  check_rows(dy, -1, -1, "residual_backward", "dy");
  if (!da.empty()) check_rows(da, dy.shape[0], dy.shape[1], "residual_backward", "da");
  if (!db.empty()) check_rows(db, dy.shape[0], dy.shape[1], "residual_backward", "db");
  each(dy.shape[0], dy.shape[1], [&](int64_t n, int64_t c) {
    if (!da.empty()) da(n, c) += dy(n, c);
    if (!db.empty()) db(n, c) += dy(n, c);
  });
}

}  // namespace qkv
