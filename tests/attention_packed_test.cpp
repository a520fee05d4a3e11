// Packed variable-length batches (cu_seqlens): each sequence must come out as if it were a
// batch of its own; the fast kernels must match the reference, forward and backward.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "attention_problem.h"
#include "qkv/attention.h"
#include "qkv/error.h"

namespace qkv {
namespace {

using testing::BiasKind;
using testing::Case;
using testing::Inputs;
using testing::Problem;

struct PackedProblem {
  std::vector<int32_t> cu_q{0}, cu_k{0};
  Problem p;
  PackedProblem(Case c, const std::vector<std::pair<int32_t, int32_t>>& lengths)
      : p(with_totals(c, lengths)) {
    for (auto [lq, lk] : lengths) {
      cu_q.push_back(cu_q.back() + lq);
      cu_k.push_back(cu_k.back() + lk);
    }
    p.args.packed = {static_cast<int>(lengths.size()), cu_q.data(), cu_k.data()};
  }
  static Case with_totals(Case c, const std::vector<std::pair<int32_t, int32_t>>& lengths) {
    c.B = 1;
    c.Tq = c.Tk = 0;
    for (auto [lq, lk] : lengths) c.Tq += lq, c.Tk += lk;
    return c;
  }
};

// Sequence s of the packed inputs as a problem of its own (B = 1).
Inputs sequence_inputs(const PackedProblem& pp, const Inputs& all, int s, Case& c) {
  const Case& full = pp.p.c;
  const int32_t q0 = pp.cu_q[s], q1 = pp.cu_q[s + 1], k0 = pp.cu_k[s], k1 = pp.cu_k[s + 1];
  c = full;
  c.Tq = q1 - q0;
  c.Tk = k1 - k0;
  Inputs in;
  for (int64_t h = 0; h < full.Hq; ++h)
    for (int32_t i = q0; i < q1; ++i) {
      for (int64_t d = 0; d < full.D; ++d) in.q.push_back(all.q[(h * full.Tq + i) * full.D + d]);
      for (int32_t j = k0; j < k1 && !all.bias.empty(); ++j)
        in.bias.push_back(all.bias[(h * full.Tq + i) * full.Tk + j]);
    }
  for (int64_t h = 0; h < full.Hkv; ++h)
    for (int32_t j = k0; j < k1; ++j) {
      for (int64_t d = 0; d < full.D; ++d) in.k.push_back(all.k[(h * full.Tk + j) * full.D + d]);
      for (int64_t e = 0; e < full.Dv; ++e) in.v.push_back(all.v[(h * full.Tk + j) * full.Dv + e]);
    }
  in.alibi = all.alibi;
  in.sinks = all.sinks;
  return in;
}

const std::vector<std::pair<int32_t, int32_t>> kLengths = {{5, 5}, {70, 70}, {1, 1}, {33, 33}};

TEST(PackedReference, EachSequenceAsABatchOfItsOwn) {
  for (bool causal : {false, true}) {
    Case c{.Hq = 4, .Hkv = 2, .D = 16, .Dv = 8};
    c.causal = causal;
    c.bias = BiasKind::head_query_key;
    PackedProblem pp(c, {{5, 9}, {70, 60}, {1, 1}, {33, 40}, {0, 3}});
    Tensor weights({1, c.Hq, pp.p.c.Tq, pp.p.c.Tk});
    reference::attention(pp.p.args, weights);
    const Inputs all = testing::inputs_of(pp.p);
    for (int s = 0; s < pp.p.args.packed.num_seqs; ++s) {
      Case sc;
      const Inputs in = sequence_inputs(pp, all, s, sc);
      if (sc.Tq == 0) continue;
      const testing::Expected e = testing::naive_attention(sc, in);
      const double tol = testing::attention_tolerance(sc, e.max_abs_score);
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t i = 0; i < sc.Tq; ++i) {
          const int64_t row = pp.cu_q[s] + i;
          for (int64_t d = 0; d < c.Dv; ++d)
            EXPECT_NEAR(pp.p.args.out(0, h, row, d), e.out[(h * sc.Tq + i) * c.Dv + d], tol);
          const double lse = pp.p.lse.data()[h * pp.p.c.Tq + row], expected = e.lse[h * sc.Tq + i];
          if (std::isinf(expected))  // rows that see no key (causal, more queries than keys)
            EXPECT_EQ(lse, expected);
          else EXPECT_NEAR(lse, expected, tol);
          // No weight on another sequence's keys.
          for (int64_t j = 0; j < pp.p.c.Tk; ++j)
            if (j < pp.cu_k[s] || j >= pp.cu_k[s + 1]) {
              ASSERT_EQ(weights.view()(0, h, row, j), 0.0f);
            }
        }
    }
  }
}

TEST(PackedReference, SequenceWithoutKeysIsFullyMasked) {
  Case c{.Hq = 2, .Hkv = 2, .D = 8, .Dv = 8};
  PackedProblem pp(c, {{3, 4}, {2, 0}, {3, 3}});
  reference::attention(pp.p.args);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 3; i < 5; ++i) {
      EXPECT_EQ(pp.p.lse.data()[h * 8 + i], -INFINITY);
      for (int64_t d = 0; d < 8; ++d) EXPECT_EQ(pp.p.args.out(0, h, i, d), 0.0f);
    }
}

class PackedFast : public ::testing::TestWithParam<Case> {};

TEST_P(PackedFast, ForwardAndBackwardMatchReference) {
  const Case c = GetParam();
  const std::vector<std::pair<int32_t, int32_t>> lengths = {{5, 9},   {70, 70},  {1, 1}, {0, 4},
                                                            {2, 300}, {100, 80}, {3, 0}};
  PackedProblem fast(c, lengths), ref(c, lengths);
  attention(fast.p.args);
  reference::attention(ref.p.args);
  const testing::Expected e = testing::naive_attention(ref.p.c, testing::inputs_of(ref.p));
  const double tol = 2 * testing::attention_tolerance(fast.p.c, 10);
  for (int64_t i = 0; i < fast.p.out.numel(); ++i)
    ASSERT_NEAR(fast.p.out.data()[i], ref.p.out.data()[i], tol) << i;
  for (int64_t i = 0; i < fast.p.lse.numel(); ++i)
    if (std::isinf(ref.p.lse.data()[i])) ASSERT_EQ(fast.p.lse.data()[i], ref.p.lse.data()[i]);
    else ASSERT_NEAR(fast.p.lse.data()[i], ref.p.lse.data()[i], tol);

  const Case& t = fast.p.c;
  Tensor dout({1, t.Hq, t.Tq, t.Dv});
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(-1, 1);
  for (int64_t i = 0; i < dout.numel(); ++i) dout.data()[i] = uniform(rng);
  Tensor dq1({1, t.Hq, t.Tq, t.D}), dk1({1, t.Hkv, t.Tk, t.D}), dv1({1, t.Hkv, t.Tk, t.Dv});
  Tensor dq2({1, t.Hq, t.Tq, t.D}), dk2({1, t.Hkv, t.Tk, t.D}), dv2({1, t.Hkv, t.Tk, t.Dv});
  std::vector<float> ds1(t.Hq, NAN), ds2(t.Hq, NAN);
  attention_backward(fast.p.args, dout, dq1, dk1, dv1, {t.sinks ? ds1.data() : nullptr});
  reference::attention_backward(ref.p.args, dout, dq2, dk2, dv2, {t.sinks ? ds2.data() : nullptr});
  const double gtol = 64 * FLT_EPSILON * std::sqrt(300.0 * t.D);
  for (auto [a, b] : {std::pair{&dq1, &dq2}, {&dk1, &dk2}, {&dv1, &dv2}})
    for (int64_t i = 0; i < a->numel(); ++i)
      ASSERT_NEAR(a->data()[i], b->data()[i], gtol * (1 + std::abs(b->data()[i])));
  // The sinks' gradient sums a term per row: over the packed rows as over a batch.
  for (int64_t h = 0; h < t.Hq && t.sinks; ++h)
    ASSERT_NEAR(ds1[h], ds2[h], gtol * std::sqrt(double(t.Tq)) * (1 + std::abs(ds2[h]))) << h;
}

INSTANTIATE_TEST_SUITE_P(
    Options, PackedFast,
    ::testing::Values(
        Case{.Hq = 4, .Hkv = 4, .D = 32, .Dv = 32},
        Case{.Hq = 4, .Hkv = 2, .D = 64, .Dv = 32, .causal = true},
        Case{.Hq = 4, .Hkv = 1, .D = 16, .Dv = 16, .causal = true, .window_left = 10},
        Case{.Hq = 2, .Hkv = 2, .D = 32, .Dv = 32, .bias = BiasKind::query_key, .softcap = 2},
        Case{.Hq = 4, .Hkv = 2, .D = 32, .Dv = 32, .causal = true, .sinks = true}),
    [](const auto& info) { return info.param.name(); });

TEST(PackedErrors, BadOffsetsAreNamed) {
  Case c{.Hq = 2, .Hkv = 2, .D = 8, .Dv = 8};
  PackedProblem pp(c, {{3, 3}, {4, 4}});
  auto expect = [&](const std::string& fragment) {
    try {
      attention(pp.p.args);
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  pp.cu_q[2] = 6;
  expect("cu_seqlens_q[2] = 6 must equal the packed length 7");
  pp.cu_q = {0, 5, 3};
  pp.p.args.packed.cu_seqlens_q = pp.cu_q.data();
  expect("cu_seqlens_q must not decrease");
  pp.cu_q = {0, 3, 7};
  pp.p.args.packed.cu_seqlens_q = pp.cu_q.data();
  int32_t lengths[1] = {7};
  pp.p.args.mask.kv_len = lengths;
  expect("kv_len (padding) and packed sequences do not mix");
}

}  // namespace
}  // namespace qkv
