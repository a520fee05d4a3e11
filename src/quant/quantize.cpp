// Quantizers (see include/qkv/quant.h): llama.cpp's reference rules, so that a file qkv writes
// holds the bytes llama.cpp's own converter would.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "qkv/error.h"
#include "qkv/quant.h"
#include "quant/k_quants.h"

namespace qkv::quant {

using qkv::TensorType;

bool can_quantize(TensorType t) {
  return t == TensorType::f32 || t == TensorType::f16 || t == TensorType::q8_0 ||
         t == TensorType::q4_0 || t == TensorType::q4_1 || t == TensorType::q4_k ||
         t == TensorType::q6_k;
}

namespace {

void put_half(uint8_t* p, float v) {
  const uint16_t h = float_to_half(v);
  p[0] = static_cast<uint8_t>(h & 0xff), p[1] = static_cast<uint8_t>(h >> 8);
}
float rounded_half(float v) { return half_to_float(float_to_half(v)); }

// Round to nearest, ties to even (the rounding llama.cpp's quantizers use, by adding 1.5 · 2^23).
int nearest_int(float v) { return static_cast<int>(std::nearbyint(v)); }

constexpr float kGroupMaxEps = 1e-15f;  // a group with no value larger is all zeros

// The K-quants' search for one group's scale, as llama.cpp's quantizers do it. Each keeps the
// arithmetic in float, in the reference's order (this file compiles without contraction into
// fused multiply-adds), so the bytes are the same.

// Q4_K's: an affine grid (scale, min ≤ 0) over L in [0, nmax], weighted least squares over
// nstep + 1 trial scales around nmax / (max − min). Returns the scale; *neg_min = −min.
float affine_search(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                    float* neg_min, uint8_t* trial, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0], sum_w = weights[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, uint8_t{0});
    *neg_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min), scale = 1 / iscale, best_error = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min)))));
    const float diff = scale * L[i] + min - x[i];
    best_error += weights[i] * (diff * diff);
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min))));
      trial[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * trial[i] + this_min - x[i];
        error += weights[i] * (diff * diff);
      }
      if (error < best_error) {
        std::copy(trial, trial + n, L);
        best_error = error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min = -min;
  return scale;
}

// Q6_K's: a symmetric grid, L in [−nmax, nmax − 1] stored + nmax, the value of largest
// magnitude at −nmax; 18 trial scales around it, weighted by x², keep the best by
// (Σ w x l)² / Σ w l². Returns the scale.
float symmetric_search(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, int8_t{0});
    return 0.f;
  }
  auto level = [&](float iscale, int i) {
    return std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i])));
  };
  float iscale = -nmax / max, sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = level(iscale, i);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = level(iscale, i);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + level(iscale, i));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// One Q4_K super-block (256 values, 144 bytes; layout in k_quants.h).
void q4_k_block(const float* x, uint8_t* o) {
  uint8_t L[256], trial[32];
  float weights[32], mins[8], scales[8], max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xj = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xj[l] * xj[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xj[l]);
    scales[j] = affine_search(32, 15, xj, weights, L + 32 * j, &mins[j], trial, -1.f, 0.1f, 20);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t* sc = o + kQ4kScales;
  std::fill(sc, sc + 12, uint8_t{0});
  for (int j = 0; j < 8; ++j) {
    const int ls = std::min(63, nearest_int(inv_scale * scales[j]));
    const int lm = std::min(63, nearest_int(inv_min * mins[j]));
    if (j < 4) {
      sc[j] = static_cast<uint8_t>(ls), sc[j + 4] = static_cast<uint8_t>(lm);
    } else {
      sc[j + 4] = static_cast<uint8_t>((ls & 15) | (lm & 15) << 4);
      sc[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      sc[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  put_half(o, max_scale / 63.f);
  put_half(o + 2, max_min / 63.f);
  const float d_all = rounded_half(max_scale / 63.f), dmin_all = rounded_half(max_min / 63.f);
  for (int j = 0; j < 8; ++j) {
    int scale, min;
    q4_k_scale_min(j, sc, scale, min);
    const float d = d_all * scale;
    if (d == 0) continue;
    const float dm = dmin_all * min;
    for (int l = 0; l < 32; ++l)
      L[32 * j + l] =
          static_cast<uint8_t>(std::max(0, std::min(15, nearest_int((x[32 * j + l] + dm) / d))));
  }
  uint8_t* q = o + kQ4kValues;
  for (int j = 0; j < 256; j += 64, q += 32)
    for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | L[j + l + 32] << 4);
}

// One Q6_K super-block (256 values, 210 bytes; layout in k_quants.h).
void q6_k_block(const float* x, uint8_t* o) {
  int8_t L[256];
  float scales[16], max_scale = 0, max_abs_scale = 0;
  for (int g = 0; g < 16; ++g) {
    scales[g] = symmetric_search(16, 32, x + 16 * g, L + 16 * g);
    if (std::fabs(scales[g]) > max_abs_scale)
      max_abs_scale = std::fabs(scales[g]), max_scale = scales[g];
  }
  std::fill(o, o + 210, uint8_t{0});
  if (max_abs_scale < kGroupMaxEps) return;  // all zeros, d = 0
  const float iscale = -128.f / max_scale;
  put_half(o + kQ6kScale, 1 / iscale);
  auto* sc = reinterpret_cast<int8_t*>(o + kQ6kScales);
  for (int g = 0; g < 16; ++g)
    sc[g] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[g])));
  const float d_all = rounded_half(1 / iscale);
  for (int g = 0; g < 16; ++g) {
    const float d = d_all * sc[g];
    if (d == 0) continue;
    for (int i = 0; i < 16; ++i)
      L[16 * g + i] =
          static_cast<int8_t>(std::max(-32, std::min(31, nearest_int(x[16 * g + i] / d))) + 32);
  }
  uint8_t *ql = o, *qh = o + kQ6kHigh;
  for (int j = 0; j < 256; j += 128, ql += 64, qh += 32)
    for (int l = 0; l < 32; ++l) {
      const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
      ql[l] = static_cast<uint8_t>((q1 & 15) | (q3 & 15) << 4);
      ql[l + 32] = static_cast<uint8_t>((q2 & 15) | (q4 & 15) << 4);
      qh[l] = static_cast<uint8_t>(q1 >> 4 | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
    }
}

}  // namespace

std::vector<uint8_t> quantize(TensorType type, const float* x, int64_t n) {
  check(can_quantize(type), "quantize: qkv writes F32, F16, Q8_0, Q4_0, Q4_1, Q4_K and Q6_K, not ",
        to_string(type));
  const BlockSize b = block_of(type);
  check(n >= 0 && n % b.elements == 0, "quantize: ", n, " values is not whole ", to_string(type),
        " blocks of ", b.elements);
  std::vector<uint8_t> out(n / b.elements * b.bytes);
  quantize_into(type, x, n, out.data());
  return out;
}

void quantize_into(TensorType type, const float* x, int64_t n, uint8_t* o) {
  const BlockSize b = block_of(type);
  for (int64_t i = 0; i < n / b.elements; ++i, o += b.bytes) {
    const float* v = x + i * b.elements;
    switch (type) {
      case TensorType::f32:
        std::memcpy(o, v, 4);
        break;
      case TensorType::f16:
        put_half(o, *v);
        break;
      case TensorType::q8_0: {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
        const float d = amax / 127, id = d != 0 ? 1 / d : 0;
        put_half(o, d);
        for (int j = 0; j < 32; ++j)
          o[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(v[j] * id)));
        break;
      }
      case TensorType::q4_0: {
        float amax = 0, max = 0;  // the value of largest magnitude, with its sign
        for (int j = 0; j < 32; ++j)
          if (std::fabs(v[j]) > amax) amax = std::fabs(v[j]), max = v[j];
        const float d = max / -8, id = d != 0 ? 1 / d : 0;
        put_half(o, d);
        for (int j = 0; j < 16; ++j) {
          const auto q = [&](float y) {
            return static_cast<uint8_t>(std::min(15.0f, std::trunc(y * id + 8.5f)));
          };
          o[2 + j] = static_cast<uint8_t>(q(v[j]) | q(v[j + 16]) << 4);
        }
        break;
      }
      case TensorType::q4_1: {
        float min = v[0], max = v[0];
        for (int j = 1; j < 32; ++j) min = std::min(min, v[j]), max = std::max(max, v[j]);
        const float d = (max - min) / 15, id = d != 0 ? 1 / d : 0;
        put_half(o, d);
        put_half(o + 2, min);
        for (int j = 0; j < 16; ++j) {
          const auto q = [&](float y) {
            return static_cast<uint8_t>(
                std::min(15, static_cast<int>(static_cast<int8_t>((y - min) * id + 0.5f))));
          };
          o[4 + j] = static_cast<uint8_t>(q(v[j]) | q(v[j + 16]) << 4);
        }
        break;
      }
      case TensorType::q4_k:
        q4_k_block(v, o);
        break;
      case TensorType::q6_k:
        q6_k_block(v, o);
        break;
      default:
        break;
    }
  }
}

}  // namespace qkv::quant
