// Attention dropout: the generator against Random123's known answers, the mask against its
// documented counter, its statistics, the kernels' mask against dropout_mask (read back through
// identity values), thread counts, the edges (p = 0, p = 1, rows that see nothing) and errors.
// (The kernels against the reference with dropout: the grids of attention_flash_test and
// attention_backward_test, and the reference backward against finite differences.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attention/dropout.h"
#include "attention_problem.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/tensor.h"
#include "qkv/threads.h"

namespace qkv {
namespace {

using testing::Case;
using testing::Grads;
using testing::Problem;

// Random123's known-answer vectors for Philox4x32-10 (its tests/kat_vectors).
TEST(Philox, MatchesRandom123KnownAnswers) {
  struct Kat {
    std::array<uint32_t, 4> counter;
    std::array<uint32_t, 2> key;
    std::array<uint32_t, 4> out;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) EXPECT_EQ(detail::philox4x32(k.counter, k.key), k.out);
}

// The mask is what include/qkv/attention.h says: of counter (i, j / 8, (b + batch_offset) · Hq +
// h, offset) under key seed, word (j mod 8) / 2's low 16 bits for even j, high for odd, kept when
// ≥ round(p · 2¹⁶).
TEST(DropoutMask, FollowsTheDocumentedCounter) {
  const Dropout d{.p = 0.3f, .seed = 0xFEDCBA9876543210ull, .offset = 77, .batch_offset = 3};
  const int64_t B = 2, H = 3, Tq = 5, Tk = 11;
  std::vector<uint8_t> keep(B * H * Tq * Tk);
  dropout_mask(d, B, H, Tq, Tk, keep.data());
  const uint32_t threshold = 19661;  // round(0.3 · 65536)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t j = 0; j < Tk; ++j) {
          const auto w =
              detail::philox4x32({uint32_t(i), uint32_t(j / 8), uint32_t((b + 3) * H + h), 77u},
                                 {0x76543210u, 0xFEDCBA98u});
          const uint32_t word = w[(j % 8) / 2], half = j % 2 ? word >> 16 : word & 0xFFFF;
          ASSERT_EQ(keep[((b * H + h) * Tq + i) * Tk + j], half >= threshold ? 1 : 0)
              << b << " " << h << " " << i << " " << j;
        }
}

// |z| of a count against its binomial mean: above 6 has a false-alarm rate of 2e-9 per check.
double z_score(double kept, double n, double rate) {
  return (kept - n * rate) / std::sqrt(n * rate * (1 - rate));
}

// The keep rate is 1 − p, and whether a pair is kept is independent of its neighbours in
// every index (query, key within and across Philox's four words, head, batch, offset, seed):
// the 2 × 2 table of (this pair, its neighbour) has a χ² (1 degree of freedom) below 36
// (false-alarm rate 2e-9 per table). 2^21 pairs per mask.
TEST(DropoutMask, KeepsOneMinusPIndependentlyOfTheNeighbours) {
  const int64_t B = 2, H = 4, Tq = 256, Tk = 512, n = B * H * Tq * Tk;
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const Dropout d{.p = p, .seed = 42, .offset = 1};
    std::vector<uint8_t> keep(n), other_offset(n), other_seed(n);
    dropout_mask(d, B, H, Tq, Tk, keep.data());
    dropout_mask({.p = p, .seed = 42, .offset = 2}, B, H, Tq, Tk, other_offset.data());
    dropout_mask({.p = p, .seed = 43, .offset = 1}, B, H, Tq, Tk, other_seed.data());
    double kept = 0;
    for (uint8_t k : keep) kept += k;
    // (The keep rate is 1 − round(p · 2¹⁶) / 2¹⁶.)
    const double rate = 1 - std::round(double(p) * 65536) / 65536;
    EXPECT_LT(std::abs(z_score(kept, double(n), rate)), 6) << "p " << p;
    // χ² of the pairs (a[x], b[x]) over the x that `pairs` gives.
    auto chi2 = [](auto&& pairs) {
      double t[2][2] = {};
      pairs([&](int x, int y) { t[x][y] += 1; });
      const double total = t[0][0] + t[0][1] + t[1][0] + t[1][1];
      double s = 0;
      for (int x = 0; x < 2; ++x)
        for (int y = 0; y < 2; ++y) {
          const double e = (t[x][0] + t[x][1]) * (t[0][y] + t[1][y]) / total;
          s += (t[x][y] - e) * (t[x][y] - e) / e;
        }
      return s;
    };
    auto at = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
      return ((b * H + h) * Tq + i) * Tk + j;
    };
    auto neighbours = [&](int64_t db, int64_t dh, int64_t di, int64_t dj) {
      return chi2([&](auto&& add) {
        for (int64_t b = 0; b + db < B; ++b)
          for (int64_t h = 0; h + dh < H; ++h)
            for (int64_t i = 0; i + di < Tq; ++i)
              for (int64_t j = 0; j + dj < Tk; ++j)
                add(keep[at(b, h, i, j)], keep[at(b + db, h + dh, i + di, j + dj)]);
      });
    };
    EXPECT_LT(neighbours(0, 0, 0, 1), 36) << "next key (the other half), p " << p;
    EXPECT_LT(neighbours(0, 0, 0, 2), 36) << "next word's key, p " << p;
    EXPECT_LT(neighbours(0, 0, 0, 8), 36) << "next counter's key, p " << p;
    EXPECT_LT(neighbours(0, 0, 1, 0), 36) << "next query, p " << p;
    EXPECT_LT(neighbours(0, 1, 0, 0), 36) << "next head, p " << p;
    EXPECT_LT(neighbours(1, 0, 0, 0), 36) << "next batch, p " << p;
    for (const auto* o : {&other_offset, &other_seed})
      EXPECT_LT(chi2([&](auto&& add) {
                  for (int64_t x = 0; x < n; ++x) add(keep[x], (*o)[x]);
                }),
                36)
          << (o == &other_offset ? "next offset" : "next seed") << ", p " << p;
  }
}

// The kernels' mask, read back: with values the identity (Dv = Tk, v_j = e_j) the output is
// the dropped weights themselves, out_ij = P_ij Z_ij. It is zero exactly where dropout_mask
// drops, and P_ij / (1 − p) (the reference's weight) elsewhere: on full tiles, the chunks of a
// causal diagonal and a window's edges, and a last partial key tile.
TEST(DropoutKernels, ApplyDropoutMask) {
  for (const Case& shape :
       {Case{.B = 2, .Hq = 2, .Hkv = 1, .Tq = 70, .Tk = 150, .D = 16}, Case{.B = 1,
                                                                       .Hq = 3,
                                                                       .Hkv = 3,
                                                                       .Tq = 131,
                                                                       .Tk = 131,
                                                                       .D = 8,
                                                                       .causal = true,
                                                                       .window_left = 50}}) {
    Case c = shape;
    c.Dv = c.Tk;
    c.dropout = 0.4f;
    Problem p(c), ref(c);
    for (Problem* x : {&p, &ref})
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t h = 0; h < c.Hkv; ++h)
          for (int64_t j = 0; j < c.Tk; ++j)
            for (int64_t e = 0; e < c.Dv; ++e) x->args.v(b, h, j, e) = j == e ? 1.0f : 0.0f;
    Tensor weights({c.B, c.Hq, c.Tq, c.Tk});
    attention(p.args);
    reference::attention(ref.args, weights.view());
    std::vector<uint8_t> keep(c.B * c.Hq * c.Tq * c.Tk);
    dropout_mask(p.args.dropout, c.B, c.Hq, c.Tq, c.Tk, keep.data());
    int64_t dropped = 0, kept = 0;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t i = 0; i < c.Tq; ++i)
          for (int64_t j = 0; j < c.Tk; ++j) {
            const float w = weights.view()(b, h, i, j), out = p.args.out(b, h, i, j);
            if (w == 0) continue;  // masked: no weight to drop
            if (!keep[((b * c.Hq + h) * c.Tq + i) * c.Tk + j]) {
              ASSERT_EQ(out, 0.0f) << c.name() << " dropped (" << b << h << " " << i << " " << j;
              ++dropped;
            } else {
              ASSERT_NEAR(out, w / 0.6, 1e-5 * (1 + w)) << c.name() << " kept " << i << " " << j;
              ++kept;
            }
          }
    EXPECT_GT(dropped, 0);
    EXPECT_GT(kept, dropped);
  }
}

// The forward and backward give the same bits at 1, 2, 3 and 16 threads (MQA at batch 3: the
// third unit's key tiles shared out).
TEST(DropoutKernels, SameBitsAtAnyThreadCount) {
  const Case c{.B = 3,
               .Hq = 4,
               .Hkv = 1,
               .Tq = 150,
               .Tk = 200,
               .D = 32,
               .Dv = 32,
               .causal = true,
               .dropout = 0.1f};
  const int saved = num_threads();
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 2, 3, 16}) {
    set_num_threads(threads);
    Problem p(c);
    attention(p.args);
    Grads g(c);
    attention_backward(p.args, g.dout, g.dq, g.dk, g.dv);
    std::vector<float> all;
    for (const Tensor* t : {&p.out, &g.dq, &g.dk, &g.dv})
      all.insert(all.end(), t->data(), t->data() + t->numel());
    runs.push_back(all);
  }
  set_num_threads(saved);
  for (size_t r = 1; r < runs.size(); ++r)
    ASSERT_EQ(std::memcmp(runs[r].data(), runs[0].data(), runs[0].size() * sizeof(float)), 0)
        << "run " << r;
}

// p = 0 is no dropout, to the bit, whatever the seed; p = 1 drops every weight (out and the
// gradients 0, lse unchanged); a row that sees no key keeps out 0 and lse -inf.
TEST(DropoutKernels, Edges) {
  Case c{.B = 2, .Hq = 2, .Hkv = 2, .Tq = 40, .Tk = 70, .D = 16, .Dv = 16, .causal = true};
  Problem plain(c), zero(c);
  zero.args.dropout = {.p = 0, .seed = 99, .offset = 3};
  attention(plain.args);
  attention(zero.args);
  ASSERT_EQ(std::memcmp(plain.out.data(), zero.out.data(), plain.out.numel() * 4), 0);

  c.dropout = 1;
  Problem all(c);
  attention(all.args);
  Grads g(c);
  attention_backward(all.args, g.dout, g.dq, g.dk, g.dv);
  for (const Tensor* t : {&all.out, &g.dq, &g.dk, &g.dv})
    for (int64_t i = 0; i < t->numel(); ++i) ASSERT_EQ(t->data()[i], 0.0f);
  for (int64_t i = 0; i < all.lse.numel(); ++i) ASSERT_EQ(all.lse.data()[i], plain.lse.data()[i]);

  // Padding to no key in batch 1: out 0 and lse -inf there, with dropout as without.
  Case pad{.B = 2, .Hq = 2, .Hkv = 2, .Tq = 20, .Tk = 30, .D = 8, .Dv = 8, .dropout = 0.5f};
  Problem empty(pad);
  empty.kv_len = {30, 0};
  empty.args.mask.kv_len = empty.kv_len.data();
  attention(empty.args);
  for (int64_t h = 0; h < pad.Hq; ++h)
    for (int64_t i = 0; i < pad.Tq; ++i) {
      ASSERT_EQ(empty.lse.data()[(pad.Hq + h) * pad.Tq + i], -INFINITY);
      for (int64_t e = 0; e < pad.Dv; ++e) ASSERT_EQ(empty.args.out(1, h, i, e), 0.0f);
    }
}

// A packed sequence s draws batch s's mask: the same as the batch of the sequences unpacked.
TEST(DropoutKernels, PackedSequenceIsItsBatch) {
  const Case c{.B = 2,
               .Hq = 2,
               .Hkv = 2,
               .Tq = 33,
               .Tk = 33,
               .D = 16,
               .Dv = 16,
               .causal = true,
               .dropout = 0.3f};
  Problem batch(c);
  attention(batch.args);
  Tensor q({1, c.Hq, 2 * c.Tq, c.D}), k({1, c.Hkv, 2 * c.Tk, c.D}), v({1, c.Hkv, 2 * c.Tk, c.Dv}),
      out({1, c.Hq, 2 * c.Tq, c.Dv});
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Tq; ++i)
        for (int64_t d = 0; d < c.D; ++d) {
          q.view()(0, h, b * c.Tq + i, d) = batch.args.q(b, h, i, d);
          k.view()(0, h, b * c.Tk + i, d) = batch.args.k(b, h, i, d);
          v.view()(0, h, b * c.Tk + i, d) = batch.args.v(b, h, i, d);
        }
  const int32_t cu[] = {0, 33, 66};
  AttentionArgs a = batch.args;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = out.view(), a.lse = nullptr;
  a.packed = {2, cu, cu};
  attention(a);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Tq; ++i)
        for (int64_t e = 0; e < c.Dv; ++e)
          ASSERT_EQ(out.view()(0, h, b * c.Tq + i, e), batch.args.out(b, h, i, e));
}

TEST(DropoutErrors, NamesTheProblem) {
  Problem p(Case{});
  for (float bad : {-0.1f, 1.5f, NAN}) {
    p.args.dropout.p = bad;
    try {
      attention(p.args);
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("dropout p must be in [0, 1]"), std::string::npos)
          << e.what();
    }
  }
  p.args.dropout = {.p = 0.1f, .batch_offset = -1};
  EXPECT_THROW(attention(p.args), Error);
  p.args.dropout = {.p = 0.1f, .batch_offset = int64_t{1} << 32};
  EXPECT_THROW(attention(p.args), Error);
  // Over a cache: none (dropout is for training).
  p.args.dropout = {.p = 0.1f};
  StoredKV kv;
  kv.k = p.args.k.data, kv.v = p.args.v.data, kv.heads = 2, kv.dim_k = kv.dim_v = 8;
  kv.length = 5, kv.row_stride = 8, kv.head_stride = 40, kv.batch_stride = 80;
  AttentionArgs a = p.args;
  a.k = a.v = {};
  try {
    attention(a, kv);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dropout is not supported over a cache"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(dropout_mask({.p = 2}, 1, 1, 1, 1, nullptr), Error);
}

}  // namespace
}  // namespace qkv
