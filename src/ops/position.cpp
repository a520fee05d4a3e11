// Where a token is: embeddings (token and learned positions), sinusoidal encodings, rotary
// embeddings and ALiBi slopes. Attention alone is blind to order; these break the symmetry.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/rows.h"
#include "qkv/ops.h"
#include "util/parallel.h"
#include "qkv/threads.h"

namespace qkv {

using detail::check_rows;
using detail::row;

namespace {

void check_ids(const int32_t* ids, int64_t N, int64_t size, const char* where, const char* name) {
  for (int64_t n = 0; n < N; ++n)
    check(ids[n] >= 0 && ids[n] < size, where, ": ", name, "[", n, "] = ", ids[n],
          " is outside [0, ", size, ")");
}

}  // namespace

void embedding_forward(View y, const int32_t* tokens, View table, const int32_t* pos,
                       View positions) {
  constexpr const char* where = "embedding_forward";
  check_rows(table, -1, -1, where, "table [V, C]");
  const int64_t C = table.shape[1];
  check_rows(y, -1, C, where, "y [N, C]");
  const int64_t N = y.shape[0];
  check_ids(tokens, N, table.shape[0], where, "tokens");
  if (pos) {
    check_rows(positions, -1, C, where, "positions [T, C]");
    check_ids(pos, N, positions.shape[0], where, "pos");
  }
  detail::parallel_for(N, detail::threads_for(N * C), [&](int64_t n) {
    const float* e = row(table, tokens[n]);
    const float* p = pos ? row(positions, pos[n]) : nullptr;
    float* yr = row(y, n);
    for (int64_t c = 0; c < C; ++c) yr[c] = e[c] + (p ? p[c] : 0.0f);
  });
}

void embedding_backward(View dtable, const int32_t* tokens, View dy, const int32_t* pos,
                        View dpositions) {
  const int64_t N = dy.shape[0], C = dy.shape[1];
  // Serial: several positions may hold the same token.
  for (int64_t n = 0; n < N; ++n) {
    const float* g = row(dy, n);
    if (!dtable.empty()) {
      float* d = row(dtable, tokens[n]);
      for (int64_t c = 0; c < C; ++c) d[c] += g[c];
    }
    if (pos && !dpositions.empty()) {
      float* d = row(dpositions, pos[n]);
      for (int64_t c = 0; c < C; ++c) d[c] += g[c];
    }
  }
}

void sinusoidal_table(View table) {
  check_rows(table, -1, -1, "sinusoidal_table", "table [T, C]");
  const int64_t T = table.shape[0], C = table.shape[1];
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      const double angle = t / std::pow(10000.0, double(c / 2 * 2) / C);
      table(t, c) = static_cast<float>(c % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
}

namespace {

// The rotary table for base theta and head dim D: for each position p and pair j,
// cos(p · θ^(−2j/D)) and sin(…) side by side, the angle in double (positions of tens of
// thousands times small frequencies lose digits in float). Kept per thread and grown as
// positions come, so a decoded token's rotation costs no pow, cos or sin.
const float* rope_table(float theta, int64_t D, int64_t positions) {
  thread_local struct {
    float theta = 0;
    int64_t D = 0, rows = 0;
    std::vector<float> cs;
  } t;
  if (t.theta != theta || t.D != D) t.theta = theta, t.D = D, t.rows = 0, t.cs.clear();
  if (positions > t.rows) {
    const int64_t half = D / 2, rows = std::max({positions, 2 * t.rows, int64_t{1024}});
    t.cs.resize(2 * rows * half);
    for (int64_t p = t.rows; p < rows; ++p)
      for (int64_t j = 0; j < half; ++j) {
        const double angle = p * std::pow(double(theta), -2.0 * j / D);
        t.cs[2 * (p * half + j)] = static_cast<float>(std::cos(angle));
        t.cs[2 * (p * half + j) + 1] = static_cast<float>(std::sin(angle));
      }
    t.rows = rows;
  }
  return t.cs.data();
}

// Rotates every pair of x [B, T, H, D] by ±angle(pos, j); sign = -1 undoes the rotation.
void rotate(View x, int64_t pos0, float theta, RopePairs pairs, float sign, const char* where) {
  check_ndim(x, 4, where, "x [B, T, H, D]");
  const int64_t B = x.shape[0], T = x.shape[1], H = x.shape[2], D = x.shape[3];
  check(D % 2 == 0, where, ": rotary embeddings need an even head dim, got ", D);
  const int64_t half = D / 2;
  // cos and sin of every (position, pair) this call needs, from the table (its angles in
  // double, as before: the same bits as computing them here).
  const float* table = rope_table(theta, D, pos0 + T);
  detail::parallel_for(B * T, detail::threads_for(B * T * H * D), [&](int64_t bt) {
    const int64_t b = bt / T, t = bt % T;
    const float* cs = table + 2 * (pos0 + t) * half;
    for (int64_t j = 0; j < half; ++j) {
      const float c = cs[2 * j], s = sign * cs[2 * j + 1];
      const int64_t i0 = pairs == RopePairs::adjacent ? 2 * j : j;
      const int64_t i1 = pairs == RopePairs::adjacent ? 2 * j + 1 : j + half;
      for (int64_t h = 0; h < H; ++h) {
        float& a = x(b, t, h, i0);
        float& e = x(b, t, h, i1);
        const float x0 = a, x1 = e;
        a = x0 * c - x1 * s;
        e = x0 * s + x1 * c;
      }
    }
  });
}

}  // namespace

void rope_forward(View x, int64_t pos0, float theta, RopePairs pairs) {
  rotate(x, pos0, theta, pairs, 1.0f, "rope_forward");
}

// The rotation is orthogonal: its gradient is the inverse rotation.
void rope_backward(View dx, int64_t pos0, float theta, RopePairs pairs) {
  rotate(dx, pos0, theta, pairs, -1.0f, "rope_backward");
}

void alibi_slopes(int64_t n_heads, float* slopes) {
  check(n_heads >= 1, "alibi_slopes: need at least one head, got ", n_heads);
  int64_t p = 1;  // the largest power of two <= n_heads
  while (p * 2 <= n_heads) p *= 2;
  for (int64_t h = 0; h < p; ++h) slopes[h] = std::exp2(-8.0f * (h + 1) / p);
  // The rest: every other slope of the sequence for 2p heads (ALiBi's reference code).
  for (int64_t h = p; h < n_heads; ++h) slopes[h] = std::exp2(-8.0f * (2 * (h - p) + 1) / (2 * p));
}

}  // namespace qkv
