// Elementwise layers: GELU (tanh form and exact), SwiGLU, and the residual add.
// Compiled once per SIMD target; the entry points below dispatch (see src/simd/dispatch.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/activation.cpp"
#include <hwy/foreach_target.h>
#include <hwy/highway.h>

#include <cmath>

#include "simd/simd-inl.h"
#include "simd/kernel_namespace.h"
#include "ops/rows.h"
#include "qkv/ops.h"
#include "util/parallel.h"
#include "qkv/threads.h"
#include "simd/dispatch.h"

QKV_KERNEL_BEGIN(qkv)

using detail::check_rows;
using detail::row;

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;

// Applies f(n, c) to every element of an [N, C] shape, rows in parallel.
template <typename F>
void each(int64_t N, int64_t C, F&& f) {
  detail::parallel_for(N, detail::threads_for(N * C), [&](int64_t n) {
    for (int64_t c = 0; c < C; ++c) f(n, c);
  });
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

// Rows in parallel; within a row, whole vectors through `vec(c)` and the tail through `one(c)`
// (the scalar formula): tanh and exp are the cost of these layers, and Highway's vectorised
// ones are ~10× the scalar library's throughput.
template <typename Vec, typename One>
void each_vectorised(int64_t N, int64_t C, Vec&& vec, One&& one) {
  const int64_t L = static_cast<int64_t>(simd::lanes());
  detail::parallel_for(N, detail::threads_for(N * C), [&](int64_t n) {
    int64_t c = 0;
    for (; c + L <= C; c += L) vec(n, c);
    for (; c < C; ++c) one(n, c);
  });
}

Vf vsigmoid(Vf a) {
  const Vf one = hn::Set(df, 1.0f);
  return hn::Div(one, hn::Add(one, hn::Exp(df, hn::Neg(a))));
}

// tanh(√(2/π) (x + 0.044715 x³)) and its argument's derivative.
Vf gelu_tanh_arg(Vf x) {
  const Vf x3 = hn::Mul(hn::Mul(x, x), x);
  return hn::Mul(hn::Set(df, kSqrt2OverPi), hn::MulAdd(hn::Set(df, 0.044715f), x3, x));
}

}  // namespace

void gelu_forward(View y, View x, Gelu kind) {
  check_rows(x, -1, -1, "gelu_forward", "x");
  check_rows(y, x.shape[0], x.shape[1], "gelu_forward", "y");
  auto one = [&](int64_t n, int64_t c) { y(n, c) = gelu(x(n, c), kind); };
  if (kind == Gelu::exact) return each(x.shape[0], x.shape[1], one);
  each_vectorised(
      x.shape[0], x.shape[1],
      [&](int64_t n, int64_t c) {
        const Vf v = hn::LoadU(df, &x(n, c));
        const Vf t = hn::Tanh(df, gelu_tanh_arg(v));
        hn::StoreU(hn::Mul(hn::Mul(hn::Set(df, 0.5f), v), hn::Add(hn::Set(df, 1.0f), t)), df,
                   &y(n, c));
      },
      one);
}

void gelu_backward(View dx, View dy, View x, Gelu kind) {
  check_rows(dy, x.shape[0], x.shape[1], "gelu_backward", "dy");
  check_rows(dx, x.shape[0], x.shape[1], "gelu_backward", "dx");
  auto one = [&](int64_t n, int64_t c) { dx(n, c) += dy(n, c) * gelu_derivative(x(n, c), kind); };
  if (kind == Gelu::exact) return each(x.shape[0], x.shape[1], one);
  each_vectorised(
      x.shape[0], x.shape[1],
      [&](int64_t n, int64_t c) {
        const Vf v = hn::LoadU(df, &x(n, c)), half = hn::Set(df, 0.5f), unit = hn::Set(df, 1.0f);
        const Vf t = hn::Tanh(df, gelu_tanh_arg(v));
        const Vf du = hn::Mul(hn::Set(df, kSqrt2OverPi),
                              hn::MulAdd(hn::Set(df, 3 * 0.044715f), hn::Mul(v, v), unit));
        // 0.5 (1 + t) + 0.5 x (1 − t²) du
        const Vf d = hn::MulAdd(hn::Mul(half, v), hn::Mul(hn::NegMulAdd(t, t, unit), du),
                                hn::Mul(half, hn::Add(unit, t)));
        hn::StoreU(hn::MulAdd(hn::LoadU(df, &dy(n, c)), d, hn::LoadU(df, &dx(n, c))), df,
                   &dx(n, c));
      },
      one);
}

void swiglu_forward(View y, View gate, View up) {
  check_rows(gate, -1, -1, "swiglu_forward", "gate");
  check_rows(up, gate.shape[0], gate.shape[1], "swiglu_forward", "up");
  check_rows(y, gate.shape[0], gate.shape[1], "swiglu_forward", "y");
  each_vectorised(
      gate.shape[0], gate.shape[1],
      [&](int64_t n, int64_t c) {
        const Vf a = hn::LoadU(df, &gate(n, c));
        hn::StoreU(hn::Mul(hn::Mul(a, vsigmoid(a)), hn::LoadU(df, &up(n, c))), df, &y(n, c));
      },
      [&](int64_t n, int64_t c) {
        const float a = gate(n, c);
        y(n, c) = a * sigmoid(a) * up(n, c);
      });
}

// d silu(a)/da = sigmoid(a) · (1 + a · (1 − sigmoid(a))).
void swiglu_backward(View dgate, View dup, View dy, View gate, View up) {
  check_rows(dy, gate.shape[0], gate.shape[1], "swiglu_backward", "dy");
  check_rows(dgate, gate.shape[0], gate.shape[1], "swiglu_backward", "dgate");
  check_rows(dup, gate.shape[0], gate.shape[1], "swiglu_backward", "dup");
  each_vectorised(
      gate.shape[0], gate.shape[1],
      [&](int64_t n, int64_t c) {
        const Vf a = hn::LoadU(df, &gate(n, c)), s = vsigmoid(a), g = hn::LoadU(df, &dy(n, c));
        const Vf unit = hn::Set(df, 1.0f);
        const Vf ds = hn::Mul(s, hn::MulAdd(a, hn::Sub(unit, s), unit));  // s (1 + a (1 − s))
        hn::StoreU(
            hn::MulAdd(hn::Mul(g, hn::LoadU(df, &up(n, c))), ds, hn::LoadU(df, &dgate(n, c))), df,
            &dgate(n, c));
        hn::StoreU(hn::MulAdd(hn::Mul(g, a), s, hn::LoadU(df, &dup(n, c))), df, &dup(n, c));
      },
      [&](int64_t n, int64_t c) {
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

QKV_KERNEL_END();  // qkv::HWY_NAMESPACE

#if HWY_ONCE
namespace qkv {

HWY_EXPORT(gelu_forward);
HWY_EXPORT(gelu_backward);
HWY_EXPORT(swiglu_forward);
HWY_EXPORT(swiglu_backward);
HWY_EXPORT(residual_forward);
HWY_EXPORT(residual_backward);

void gelu_forward(View y, View x, Gelu kind) { QKV_DISPATCH(gelu_forward)(y, x, kind); }
void gelu_backward(View dx, View dy, View x, Gelu kind) {
  QKV_DISPATCH(gelu_backward)(dx, dy, x, kind);
}
void swiglu_forward(View y, View gate, View up) { QKV_DISPATCH(swiglu_forward)(y, gate, up); }
void swiglu_backward(View dgate, View dup, View dy, View gate, View up) {
  QKV_DISPATCH(swiglu_backward)(dgate, dup, dy, gate, up);
}
void residual_forward(View y, View a, View b) { QKV_DISPATCH(residual_forward)(y, a, b); }
void residual_backward(View da, View db, View dy) { QKV_DISPATCH(residual_backward)(da, db, dy); }

}  // namespace qkv
#endif  // HWY_ONCE
