// The fast attention kernels against the reference kernel: every option on a grid of
// deliberately awkward shapes, fully masked rows, huge logits, strided layouts, threads.
#include <gtest/gtest.h>
#include "qkv/ops.h"
#include "attention/kernels.h"
#include <random>
#include <cstring>

#include <cmath>

#include "attention_problem.h"
#include "qkv/attention.h"
#include "qkv/targets.h"
#include "qkv/threads.h"

namespace qkv {
namespace {

using testing::BiasKind;
using testing::Case;
using testing::Problem;

// Runs qkv::attention and the reference on the same inputs and compares out and lse.
void expect_matches_reference(const Case& c, uint32_t seed = 7) {
  Problem fast(c, seed), ref(c, seed);
  attention(fast.args);
  reference::attention(ref.args);
  // The reference sums in double; the fast kernel in fp32 over tiles. Both are within the
  // fp32 tolerance of the exact answer, so of each other within twice that.
  double max_abs_score = 0;
  {
    const testing::Expected e = testing::naive_attention(ref);
    max_abs_score = e.max_abs_score;
  }
  const double tol = 2 * testing::attention_tolerance(c, max_abs_score);
  std::vector<double> expected_out, expected_lse;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Tq; ++i)
        for (int64_t e = 0; e < c.Dv; ++e) expected_out.push_back(ref.args.out(b, h, i, e));
  for (int64_t i = 0; i < ref.lse.numel(); ++i) expected_lse.push_back(ref.lse.data()[i]);
  EXPECT_LE(testing::max_error(fast.args.out, expected_out), tol) << c.name();
  EXPECT_LE(testing::max_lse_error(fast.lse.data(), expected_lse), tol) << c.name();
}

class FlashOptions : public ::testing::TestWithParam<Case> {};

TEST_P(FlashOptions, MatchesReference) { expect_matches_reference(GetParam()); }

std::vector<Case> option_grid() {
  return testing::variations(Case{.B = 2, .Hq = 4, .Hkv = 4, .Tq = 67, .Tk = 67, .D = 32, .Dv = 32},
                             {
                                 [](Case&) {},
                                 [](Case& c) {
                                   c.causal = true;
                                   c.dropout = 0.2f;
                                 },
                                 [](Case& c) {
                                   c.B = 3;
                                   c.Tq = 130;
                                   c.Tk = 150;
                                   c.padding = true;
                                   c.sinks = true;
                                   c.window_left = 40;
                                   c.dropout = 0.5f;
                                 },
                                 [](Case& c) { c.causal = true; },
                                 [](Case& c) {
                                   c.Tq = 1;
                                   c.Tk = 1;
                                 },
                                 [](Case& c) {
                                   c.Tq = 7;
                                   c.Tk = 300;
                                   c.causal = true;
                                 },
                                 [](Case& c) {
                                   c.Tq = 300;
                                   c.Tk = 7;
                                   c.causal = true;
                                 },  // first rows see nothing
                                 [](Case& c) {
                                   c.Tq = 200;
                                   c.Tk = 200;
                                   c.window_left = 20;
                                   c.causal = true;
                                 },
                                 [](Case& c) {
                                   c.Tq = 200;
                                   c.Tk = 200;
                                   c.window_left = 9;
                                   c.window_right = 30;
                                 },
                                 [](Case& c) {
                                   c.padding = true;
                                   c.B = 3;
                                   c.Tq = c.Tk = 150;
                                 },
                                 [](Case& c) {
                                   c.padding = true;
                                   c.causal = true;
                                   c.B = 3;
                                   c.Tq = c.Tk = 150;
                                 },
                                 [](Case& c) { c.bias = BiasKind::full; },
                                 [](Case& c) {
                                   c.bias = BiasKind::query_key;
                                   c.causal = true;
                                 },
                                 [](Case& c) { c.bias = BiasKind::batch_key; },
                                 [](Case& c) { c.bias = BiasKind::head_query_key; },
                                 [](Case& c) {
                                   c.alibi = true;
                                   c.causal = true;
                                 },
                                 [](Case& c) { c.alibi = true; },
                                 [](Case& c) {
                                   c.softcap = 1.5f;
                                   c.magnitude = 3;
                                 },
                                 [](Case& c) { c.scale = 0.3f; },
                                 [](Case& c) {
                                   c.Hkv = 2;
                                   c.causal = true;
                                 },
                                 [](Case& c) { c.Hkv = 1; },
                                 [](Case& c) {
                                   c.Tq = 33;
                                   c.Tk = 150;
                                   c.D = 16;
                                   c.Dv = 40;
                                 },  // cross, Dv ≠ D
                                 [](Case& c) {
                                   c.seq_major = true;
                                   c.causal = true;
                                 },
                                 [](Case& c) {
                                   c.dim_strided = true;
                                   c.Hkv = 2;
                                   c.Tq = 70;
                                   c.Tk = 90;
                                   c.causal = true;
                                 },
                                 [](Case& c) {  // decoding's shape: the tiled kernel takes it
                                   c.dim_strided = true;
                                   c.Hkv = 2;
                                   c.Tq = 1;
                                   c.Tk = 200;
                                 },
                                 [](Case& c) {  // an output of 4 MiB: written with streaming stores
                                   c.B = 1;
                                   c.Tq = 1030;
                                   c.Tk = 70;
                                   c.Dv = 256;
                                   c.causal = true;
                                 },
                                 [](Case& c) {
                                   c.Hkv = 2;
                                   c.Tq = 70;
                                   c.Tk = 190;
                                   c.Dv = 24;
                                   c.causal = true;
                                   c.window_left = 50;
                                   c.padding = true;
                                   c.bias = BiasKind::batch_key;
                                   c.alibi = true;
                                   c.softcap = 2;
                                   c.seq_major = true;
                                 },
                                 [](Case& c) {  // sinks, and rows that see only their sink
                                   c.Tq = 130;
                                   c.Tk = 70;
                                   c.Hkv = 2;
                                   c.causal = true;
                                   c.sinks = true;
                                 },
                             });
}

INSTANTIATE_TEST_SUITE_P(Options, FlashOptions, ::testing::ValuesIn(option_grid()),
                         [](const auto& info) { return info.param.name(); });

// The shape grid of the issue: T = 1, 7, 63, 65, 129, 1000; D = 16 … 256; Hq/Hkv = 8/8, 8/2,
// 8/1; causal and not. Sizes are paired so the grid stays quick on two cores.
std::vector<Case> shape_grid() {
  std::vector<Case> cases;
  const int64_t Ts[] = {1, 7, 63, 65, 129, 1000};
  const int64_t Ds[] = {16, 32, 64, 80, 96, 128, 256};
  const int64_t Hkvs[] = {8, 2, 1};
  int n = 0;
  for (int64_t T : Ts)
    for (int64_t D : Ds) {
      if (T == 1000 && D > 64) continue;  // the long rows are covered at small D
      Case c{.B = 1, .Hq = 8, .Hkv = Hkvs[n % 3], .Tq = T, .Tk = T, .D = D, .Dv = D};
      c.causal = (n % 2) == 0;
      ++n;
      cases.push_back(c);
    }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashOptions, ::testing::ValuesIn(shape_grid()),
                         [](const auto& info) { return info.param.name(); });

// Decoding: up to 15 queries against a long cache (32 when a kv head serves several query
// heads) take the split-KV path (several chunks).
std::vector<Case> decode_grid() {
  return testing::variations(
      Case{.B = 2, .Hq = 8, .Hkv = 8, .Tq = 1, .Tk = 1000, .D = 64, .Dv = 64},
      {
          [](Case&) {},
          [](Case& c) { c.dropout = 0.25f; },  // (on the tiled kernel: decoding has none)
          [](Case& c) {
            c.Tq = 4;
            c.causal = true;
          },
          // Up to 15 rows per kv head: in registers, in groups of 4 rows (decode.cpp).
          [](Case& c) {
            c.Tq = 3;
            c.causal = true;
            c.Hkv = 2;
          },  // 12 rows per kv head
          [](Case& c) {
            c.Hkv = 1;
            c.D = 128;
            c.Dv = 128;
          },  // MQA: 8 rows per kv head
          [](Case& c) {
            c.Hq = 7;
            c.Hkv = 1;
            c.D = 80;
            c.Dv = 80;
          },  // 4 + 3 rows, 5 vectors
          [](Case& c) {
            c.Hq = 5;
            c.Hkv = 1;
            c.Tq = 3;
            c.causal = true;
          },  // 15 rows
          [](Case& c) {
            c.Hkv = 2;
            c.D = 40;
            c.Dv = 24;
          },  // head dims not whole vectors
          [](Case& c) {
            c.Tq = 3;
            c.Hkv = 2;
            c.window_left = 500;
            c.sinks = true;
          },  // sinks merged with the chunks
          // The last chunk holds one key, seen by 2 of the 8 rows of each kv head.
          [](Case& c) {
            c.Tq = 4;
            c.causal = true;
            c.Hkv = 4;
            c.Tk = 769;
          },
          // More queries: draft tokens verified at once, a short chunk of a prompt.
          [](Case& c) {
            c.Tq = 8;
            c.causal = true;
            c.window_left = 200;
          },  // 8 rows
          [](Case& c) {
            c.Tq = 15;
            c.Hq = 2;
            c.Hkv = 2;
            c.causal = true;
            c.padding = true;
          },
          [](Case& c) {
            c.Tq = 16;
            c.Hkv = 4;
            c.causal = true;
            c.seq_major = true;
          },  // 32 rows
          [](Case& c) {
            c.Tq = 32;
            c.Hkv = 2;
            c.causal = true;
            c.Tk = 2100;
          },  // 128 rows
          [](Case& c) {
            c.Tk = 3000;
            c.D = 16;
            c.Dv = 40;
          },
          [](Case& c) {
            c.Tk = 257;
            c.padding = true;
            c.B = 3;
          },
          [](Case& c) {
            c.Tq = 2;
            c.window_left = 300;
            c.causal = true;
          },
          [](Case& c) {
            c.bias = BiasKind::batch_key;
            c.alibi = true;
            c.softcap = 2;
          },
          [](Case& c) {
            c.bias = BiasKind::full;
            c.Tq = 2;
            c.Hkv = 4;
          },
          [](Case& c) {
            c.seq_major = true;
            c.Tq = 2;
            c.Hkv = 4;
            c.causal = true;
          },
          [](Case& c) {
            c.D = 256;
            c.Dv = 256;
            c.Tk = 600;
          },
          // Caches of 8k and more take longer chunks (512 keys here, the last one partial).
          [](Case& c) {
            c.Tk = 9000;
            c.D = 32;
            c.Dv = 32;
            c.Hq = 4;
            c.Hkv = 2;
            c.padding = true;
          },
          // 16 rows and more per kv head go in vector lanes, up to 64 per block (decode.cpp).
          [](Case& c) {
            c.Hq = 32;
            c.Hkv = 1;
            c.Tq = 3;
            c.causal = true;
          },  // 96 rows: 2 blocks
          [](Case& c) {
            c.Hq = 71;
            c.Hkv = 1;
            c.padding = true;
            c.B = 3;
            c.Tk = 700;
          },  // 64 + 7
          [](Case& c) {
            c.Hq = 16;
            c.Hkv = 2;
            c.Tq = 2;
            c.bias = BiasKind::full;
            c.alibi = true;
            c.softcap = 2;
          },
          [](Case& c) {
            c.Hkv = 1;
            c.Tq = 4;
            c.window_left = 100;
            c.causal = true;
            c.seq_major = true;
          },
          [](Case& c) {
            c.Hq = 16;
            c.Hkv = 1;
            c.D = 16;
            c.Dv = 40;
            c.Tk = 3000;
          },
      });
}

INSTANTIATE_TEST_SUITE_P(Decode, FlashOptions, ::testing::ValuesIn(decode_grid()),
                         [](const auto& info) { return info.param.name(); });

// Head dims below a vector (stories260K's are 8) decode with the keys in the vector lanes:
// every mask, odd cache lengths (a partial block of 16 keys, several chunks), GQA groups up
// to 16 rows, D ≠ Dv, strided layouts.
std::vector<Case> small_head_decode_grid() {
  return testing::variations(Case{.B = 2, .Hq = 8, .Hkv = 4, .Tq = 1, .Tk = 613, .D = 8, .Dv = 8},
                             {
                                 [](Case&) {}, [](Case& c) { c.Tk = 7; },
                                 [](Case& c) {
                                   c.Tq = 4;
                                   c.causal = true;
                                   c.Hkv = 2;
                                 },  // 16 rows per kv head
                                 [](Case& c) {
                                   c.Tq = 2;
                                   c.causal = true;
                                   c.Hkv = 1;
                                 },  // 16 rows, MQA
                                 [](Case& c) {
                                   c.D = 4;
                                   c.Dv = 12;
                                   c.Tk = 300;
                                 },
                                 [](Case& c) {
                                   c.padding = true;
                                   c.B = 3;
                                   c.Tk = 257;
                                 },
                                 [](Case& c) {
                                   c.Tq = 2;
                                   c.window_left = 100;
                                   c.causal = true;
                                 },
                                 [](Case& c) {
                                   c.bias = BiasKind::batch_key;
                                   c.alibi = true;
                                   c.softcap = 2;
                                 },
                                 [](Case& c) {
                                   c.seq_major = true;
                                   c.Tq = 3;
                                   c.causal = true;
                                 },
                                 [](Case& c) {
                                   c.Tq = 3;
                                   c.Hkv = 1;
                                   c.causal = true;
                                 },  // 24 rows: rows in lanes
                                 [](Case& c) {
                                   c.Tk = 17000;
                                   c.Tq = 2;
                                   c.window_left = 5000;
                                   c.causal = true;
                                 },  // 1024-key chunks
                             });
}

INSTANTIATE_TEST_SUITE_P(DecodeSmallHeads, FlashOptions,
                         ::testing::ValuesIn(small_head_decode_grid()),
                         [](const auto& info) { return info.param.name(); });

// Decoding straight from bf16 rows (a KV cache's bf16 storage) against the reference on the
// same rounded numbers: every head dim path, masks, GQA, several chunks.
TEST(DecodeBf16, MatchesReferenceOnRoundedRows) {
  auto to_bf16 = [](float x) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    return static_cast<uint16_t>((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
  };
  auto from_bf16 = [](uint16_t h) {
    const uint32_t b = static_cast<uint32_t>(h) << 16;
    float x;
    std::memcpy(&x, &b, 4);
    return x;
  };
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  struct Shape {
    int64_t Hq, Hkv, Tq, Tk, D, Dv;
    int window;
    bool alibi;
  };
  for (const Shape& c :
       {Shape{4, 2, 1, 39, 8, 8, 3, false}, Shape{8, 8, 1, 700, 64, 64, -1, false},
        Shape{8, 2, 2, 300, 128, 128, 100, true}, Shape{4, 1, 4, 17, 16, 40, -1, false},
        Shape{6, 2, 1, 500, 40, 24, -1, false}, Shape{72, 1, 1, 700, 64, 64, 200, false}}) {
    const int64_t slots = c.Tk + 5;  // rows of a cache longer than what is used
    Tensor q({1, c.Hq, c.Tq, c.D}), k({1, c.Hkv, c.Tk, c.D}), v({1, c.Hkv, c.Tk, c.Dv});
    Tensor expected({1, c.Hq, c.Tq, c.Dv}), got({1, c.Hq, c.Tq, c.Dv});
    std::vector<uint16_t> kb(c.Hkv * slots * c.D), vb(c.Hkv * slots * c.Dv);
    for (int64_t i = 0; i < q.numel(); ++i) q.data()[i] = u(rng);
    for (int64_t h = 0; h < c.Hkv; ++h)
      for (int64_t j = 0; j < c.Tk; ++j) {
        for (int64_t d = 0; d < c.D; ++d)
          k.view()(0, h, j, d) = from_bf16(kb[(h * slots + j) * c.D + d] = to_bf16(u(rng)));
        for (int64_t e = 0; e < c.Dv; ++e)
          v.view()(0, h, j, e) = from_bf16(vb[(h * slots + j) * c.Dv + e] = to_bf16(u(rng)));
      }
    std::vector<float> slopes(c.Hq);
    alibi_slopes(c.Hq, slopes.data());
    AttentionArgs ref{.q = q, .k = k, .v = v, .out = expected};
    ref.mask.causal = true;
    ref.mask.window_left = c.window;
    if (c.alibi) ref.mask.alibi = slopes.data();
    reference::attention(ref);
    AttentionArgs a = ref;
    a.k = View(reinterpret_cast<bf16*>(kb.data()), {1, c.Hkv, c.Tk, c.D},
               {c.Hkv * slots * c.D, slots * c.D, c.D, 1});
    a.v = View(reinterpret_cast<bf16*>(vb.data()), {1, c.Hkv, c.Tk, c.Dv},
               {c.Hkv * slots * c.Dv, slots * c.Dv, c.Dv, 1});
    a.out = got;
    attention(a);
    // The widening kernels: fp32 rounding only. The bf16 units' kernels (even head dims; on
    // Arm from 16 rows per kv head, on x86 also fewer rows when the head dims are whole 32s)
    // round P to bf16 (≤ 2^-8 max|v|) and take the fp32 query as two bf16 terms (scores within
    // 2^-16 · scale · Σ|q k| ≤ 2^-16 √D, moving an output by about twice that): see
    // attention_dtype_test. A shape that widens on those targets is held to the tight bound on
    // the others.
    const bool units = testing::on_bf16_units_target() && c.D % 2 == 0;
    const double tol = 2e-6 + (units ? 0x1p-8 + 2.01 * 0x1p-16 * std::sqrt(double(c.D)) : 0);
    for (int64_t i = 0; i < got.numel(); ++i)
      ASSERT_NEAR(got.data()[i], expected.data()[i], tol) << "D " << c.D << " Tk " << c.Tk;
  }
}

TEST(FlashEdges, FullyMaskedRowsGiveZeroAndMinusInf) {
  for (const int64_t Tq : {40, 1}) {  // tiled and decoding paths
    Case c{.B = 2, .Hq = 2, .Hkv = 2, .Tq = Tq, .Tk = 600, .D = 16, .Dv = 16};
    c.padding = true;
    Problem p(c);
    p.kv_len = {600, 0};
    attention(p.args);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        EXPECT_EQ(p.lse.data()[(2 + h) * Tq + i], -INFINITY);
        EXPECT_TRUE(std::isfinite(p.lse.data()[h * Tq + i]));
        for (int64_t e = 0; e < 16; ++e) ASSERT_EQ(p.args.out(1, h, i, e), 0.0f);
      }
  }
}

TEST(FlashEdges, FullyMaskedRowsInLanesGiveZeroAndMinusInf) {
  // Decoding 16 heads of one kv head: the rows of a kv head share vector lanes.
  Case c{.B = 2, .Hq = 16, .Hkv = 1, .Tq = 1, .Tk = 600, .D = 16, .Dv = 16};
  c.padding = true;
  Problem p(c);
  p.kv_len = {600, 0};
  attention(p.args);
  for (int64_t h = 0; h < 16; ++h) {
    EXPECT_EQ(p.lse.data()[16 + h], -INFINITY);
    EXPECT_TRUE(std::isfinite(p.lse.data()[h]));
    for (int64_t e = 0; e < 16; ++e) ASSERT_EQ(p.args.out(1, h, 0, e), 0.0f);
  }
}

TEST(FlashEdges, KeysPastKvLenAreNeverRead) {
  // Rows past a sequence's kv_len may hold anything (a cache's unused slots): NaN there must
  // not reach the output. Tiled forward, then decoding with the rows' sums in registers (1
  // and 4 rows per kv head), with rows in vector lanes (16 rows), and with keys in the lanes
  // (head dim 8).
  struct Heads {
    int64_t Hq, Hkv, Tq, D;
  };
  for (const Heads& s : {Heads{2, 2, 40, 32}, Heads{2, 2, 1, 32}, Heads{8, 2, 1, 32},
                         Heads{16, 1, 1, 32}, Heads{4, 2, 1, 8}}) {
    testing::PaddedPair p(
        {.B = 2, .Hq = s.Hq, .Hkv = s.Hkv, .Tq = s.Tq, .Tk = 600, .D = s.D, .Dv = s.D}, 300);
    attention(p.clean.args);
    attention(p.poisoned.args);
    for (int64_t i = 0; i < p.clean.out.numel(); ++i)
      ASSERT_EQ(p.clean.out.data()[i], p.poisoned.out.data()[i]) << "Hq " << s.Hq << " Tq " << s.Tq;
  }
}

TEST(FlashEdges, NaNInTheInputsReachesTheOutputAsInTheReference) {
  // A NaN in a query row makes that row NaN; a NaN in a key row makes every row that sees it
  // NaN (causal: the rows at or after it). Never a silent 0 (the fully-masked answer). Tiled
  // and decoding paths, rows in registers and in lanes, one and several key chunks.
  struct Heads {
    int64_t Hq, Hkv, Tq, Tk;
  };
  for (const Heads& s : {Heads{2, 2, 40, 70}, Heads{2, 2, 1, 600}, Heads{8, 2, 1, 600},
                         Heads{16, 1, 1, 5000}, Heads{2, 2, 3, 3000}}) {
    for (const bool in_key : {false, true}) {
      Case c{.B = 1, .Hq = s.Hq, .Hkv = s.Hkv, .Tq = s.Tq, .Tk = s.Tk, .D = 16, .Dv = 16};
      c.causal = true;
      Problem fast(c), ref(c);
      for (Problem* p : {&fast, &ref}) {
        if (in_key) p->args.k(0, 0, s.Tk - s.Tq, 3) = NAN;  // seen by every query of kv head 0
        else p->args.q(0, 0, s.Tq - 1, 5) = NAN;            // the last query of head 0
      }
      attention(fast.args);
      reference::attention(ref.args);
      int nans = 0;
      for (int64_t i = 0; i < fast.out.numel(); ++i) {
        ASSERT_EQ(std::isnan(fast.out.data()[i]), std::isnan(ref.out.data()[i]))
            << "Hq " << s.Hq << " Tq " << s.Tq << " Tk " << s.Tk << (in_key ? " key" : " query")
            << " at " << i;
        nans += std::isnan(fast.out.data()[i]);
      }
      EXPECT_GE(nans, 16) << "Hq " << s.Hq << " Tq " << s.Tq;
      for (int64_t i = 0; i < fast.lse.numel(); ++i)
        ASSERT_EQ(std::isnan(fast.lse.data()[i]), std::isnan(ref.lse.data()[i])) << "lse " << i;
    }
  }
}

TEST(FlashEdges, LogitsOfTenThousand) {
  for (float sign : {1.0f, -1.0f}) {
    Case c{.B = 1, .Hq = 2, .Hkv = 2, .Tq = 80, .Tk = 80, .D = 16, .Dv = 16};
    c.causal = true;
    c.scale = sign * 1e4f / 4;  // |q·k| up to ~5 → scores up to ~1e4
    Problem fast(c), ref(c);
    attention(fast.args);
    reference::attention(ref.args);
    for (int64_t i = 0; i < fast.out.numel(); ++i) {
      ASSERT_TRUE(std::isfinite(fast.out.data()[i]));
      // Nearly one-hot rows: fp32 score rounding (~1e-3 at 1e4) may move near-ties.
      EXPECT_NEAR(fast.out.data()[i], ref.out.data()[i], 2e-2);
    }
    for (int64_t i = 0; i < fast.lse.numel(); ++i)
      EXPECT_NEAR(fast.lse.data()[i], ref.lse.data()[i], 1e-6 * std::abs(ref.lse.data()[i]) + 1e-3);
  }
}

TEST(FlashThreads, SameBitsWithOneAndTwoThreads) {
  // The tiled path, then the decoding path (256-key chunks, then 512), then one head of 16
  // query tiles, which the tiled forward runs in groups of 4 tiles on 1 thread and of 2 on 2
  // threads (a row's arithmetic must not depend on the group it is in).
  Case one_head{.B = 1, .Hq = 1, .Hkv = 1, .Tq = 1000, .Tk = 1000, .D = 64, .Dv = 64};
  one_head.window_left = 300;
  // Decoding with 8, 4 and 2 rows per kv head has them in registers; with 16 query heads and
  // 4 queries, 32 rows go in vector lanes.
  for (const int64_t Tq : {300, 4, 2, 1, 0, -1}) {
    Case c{.B = 1, .Hq = 4, .Hkv = 2, .Tq = Tq, .Tk = Tq == 1 ? 9000 : 2000, .D = 64, .Dv = 64};
    if (Tq == 0) c = one_head;
    if (Tq == -1) c.Hq = 16, c.Tq = 4;
    c.causal = true;
    c.padding = true;
    Problem one(c), two(c);
    const int saved = num_threads();
    set_num_threads(1);
    attention(one.args);
    set_num_threads(2);
    attention(two.args);
    set_num_threads(saved);
    for (int64_t i = 0; i < one.out.numel(); ++i)
      ASSERT_EQ(one.out.data()[i], two.out.data()[i]) << "Tq " << Tq;
    for (int64_t i = 0; i < one.lse.numel(); ++i)
      ASSERT_EQ(one.lse.data()[i], two.lse.data()[i]) << "Tq " << Tq;
  }
}

}  // namespace
}  // namespace qkv
