// Attention under mask functions (args.block_mask): a gallery of masks, each forward and
// backward against double-precision math with the mask written by hand as a C++ formula (the
// mask materialised), the reference backward against finite differences of that formula, the
// fixed options and packed sequences against the functions that say the same, and the contract
// for rows that see nothing.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "attention/kernels.h"
#include "attention_problem.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/mask_function.h"
#include "qkv/number_format.h"
#include "qkv/targets.h"
#include "qkv/threads.h"

namespace qkv {
namespace {

using namespace mask_args;
using testing::BiasKind;
using testing::Case;
using testing::Problem;
using testing::VisibleFn;

// A mask as an expression and as a formula written by hand.
struct Entry {
  std::string name;
  MaskExpr expr;
  VisibleFn formula;
};

// Documents of uneven lengths covering T positions: the document of each position.
std::vector<int32_t> documents(int64_t T) {
  const int64_t lengths[] = {37, 120, 5, 90, 48, 61, 200};
  std::vector<int32_t> ids;
  for (int32_t d = 0; static_cast<int64_t>(ids.size()) < T; ++d)
    ids.insert(ids.end(), std::min<int64_t>(lengths[d % 7], T - static_cast<int64_t>(ids.size())),
               d);
  return ids;
}

// The gallery for B batches over Tq queries and Tk keys.
std::vector<Entry> gallery(int64_t B, int64_t Tq, int64_t Tk) {
  const std::vector<int32_t> ids = documents(std::max(Tq, Tk));
  const MaskTensor doc("doc", {static_cast<int64_t>(ids.size())}, ids);
  std::vector<int32_t> prefixes;
  for (int64_t b_ = 0; b_ < B; ++b_) prefixes.push_back(static_cast<int32_t>((b_ * 53 + 17) % Tk));
  const MaskTensor prefix("prefix", {B}, prefixes);
  const int64_t W = 16, grid = 20;  // window; the image's width
  return {
      {"causal", kv_idx <= q_idx, [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i; }},
      {"sliding_window", kv_idx <= q_idx && q_idx - kv_idx < 50,
       [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i && i - j < 50; }},
      {"documents", doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx,
       [ids](int64_t, int64_t, int64_t i, int64_t j) { return ids[i] == ids[j] && j <= i; }},
      {"prefix_lm", kv_idx <= q_idx || kv_idx < prefix[b],
       [prefixes](int64_t bb, int64_t, int64_t i, int64_t j) {
         return j <= i || j < prefixes[bb];
       }},
      {"dilated_window", abs(q_idx - kv_idx) <= 40 && (q_idx - kv_idx) % 4 == 0,
       [](int64_t, int64_t, int64_t i, int64_t j) {
         return std::abs(i - j) <= 40 && (i - j) % 4 == 0;  // (i − j) % 4 == 0 either sign
       }},
      {"global_and_window", abs(q_idx - kv_idx) <= W || kv_idx < 4 || q_idx < 4,
       [W](int64_t, int64_t, int64_t i, int64_t j) {
         return std::abs(i - j) <= W || j < 4 || i < 4;
       }},
      {"neighbourhood_2d",
       abs(q_idx / grid - kv_idx / grid) <= 1 && abs(q_idx % grid - kv_idx % grid) <= 1,
       [grid](int64_t, int64_t, int64_t i, int64_t j) {
         return std::abs(i / grid - j / grid) <= 1 && std::abs(i % grid - j % grid) <= 1;
       }},
  };
}

// Held out of the gallery: a window that widens with the head, rows that see nothing.
std::vector<Entry> held_out() {
  return {
      {"window_per_head", kv_idx <= q_idx && q_idx - kv_idx <= 3 + 7 * h,
       [](int64_t, int64_t hh, int64_t i, int64_t j) { return j <= i && i - j <= 3 + 7 * hh; }},
      {"some_rows_see_nothing", q_idx % 5 != 0 && kv_idx <= q_idx + 2,
       [](int64_t, int64_t, int64_t i, int64_t j) { return i % 5 != 0 && j <= i + 2; }},
      {"checkerboard", (q_idx / 8 + kv_idx / 8) % 2 == 0,
       [](int64_t, int64_t, int64_t i, int64_t j) { return (i / 8 + j / 8) % 2 == 0; }},
  };
}

void expect_forward(const Case& c, const Entry& e, int64_t block) {
  SCOPED_TRACE(e.name + " " + c.name() + " block " + std::to_string(block));
  Problem p(c);
  const BlockMask bm = create_block_mask(e.expr, c.B, c.Hq, c.Tq, c.Tk, block);
  p.args.block_mask = &bm;
  attention(p.args);
  const testing::Expected want = testing::naive_attention(c, testing::inputs_of(p), e.formula);
  const double tol = testing::attention_tolerance(c, want.max_abs_score);
  EXPECT_LE(testing::max_error(p.args.out, want.out), tol);
  EXPECT_LE(testing::max_lse_error(p.args.lse, want.lse), tol);
  // The reference kernel follows the same formula.
  Problem r(c);
  r.args.block_mask = &bm;
  reference::attention(r.args);
  EXPECT_LE(testing::max_error(r.args.out, want.out), tol);
}

TEST(MaskFunctionForward, GalleryMatchesTheFormula) {
  const Case c{.B = 2, .Hq = 4, .Hkv = 2, .Tq = 300, .Tk = 300, .D = 32, .Dv = 24};
  for (const Entry& e : gallery(c.B, c.Tq, c.Tk)) expect_forward(c, e, 128);
}

TEST(MaskFunctionForward, HeldOutAndOtherBlockSizes) {
  const Case c{.B = 1, .Hq = 3, .Hkv = 1, .Tq = 150, .Tk = 210, .D = 16, .Dv = 16};
  for (const Entry& e : held_out())
    for (int64_t block : {128, 32, 200, 7}) expect_forward(c, e, block);
  for (const Entry& e : gallery(c.B, c.Tq, c.Tk)) expect_forward(c, e, 48);
}

// A few queries decode (split-KV): rows in registers, in tiles (16 and more per key/value
// head), with the keys in the lanes (head dims below a vector), over several chunks.
TEST(MaskFunctionForward, DecodingMatchesTheFormula) {
  const uint32_t decoding = static_cast<uint32_t>(detail::Variant::decode_rows) |
                            static_cast<uint32_t>(detail::Variant::decode_rows_bf16_dot) |
                            static_cast<uint32_t>(detail::Variant::decode_tiled) |
                            static_cast<uint32_t>(detail::Variant::decode_tiled_bf16_dot) |
                            static_cast<uint32_t>(detail::Variant::decode_keys_in_lanes);
  for (const Case& c : {Case{.B = 2, .Hq = 4, .Hkv = 2, .Tq = 1, .Tk = 300, .D = 32, .Dv = 24},
                        Case{.B = 1, .Hq = 4, .Hkv = 2, .Tq = 3, .Tk = 300, .D = 16, .Dv = 16},
                        Case{.B = 1, .Hq = 32, .Hkv = 2, .Tq = 2, .Tk = 300, .D = 16, .Dv = 16},
                        Case{.B = 1, .Hq = 2, .Hkv = 1, .Tq = 2, .Tk = 200, .D = 4, .Dv = 4},
                        Case{.B = 1, .Hq = 2, .Hkv = 2, .Tq = 2, .Tk = 2100, .D = 8, .Dv = 8}}) {
    std::vector<Entry> entries = gallery(c.B, c.Tq, c.Tk);
    for (const Entry& e : held_out()) entries.push_back(e);
    for (const Entry& e : entries) {
      detail::kernels_reached() = 0;
      expect_forward(c, e, 128);
      EXPECT_NE(detail::kernels_reached() & decoding, 0u) << e.name << " " << c.name();
    }
  }
}

TEST(MaskFunctionForward, ComposesWithTheOtherOptions) {
  const std::vector<Entry> g = gallery(2, 140, 140);
  const Case base{.B = 2, .Hq = 2, .Hkv = 2, .Tq = 140, .Tk = 140, .D = 16, .Dv = 16};
  for (const Case& c : testing::variations(base, {
                                                     [](Case& c) {
                                                       c.Hq = 4;
                                                       c.bias = BiasKind::head_query_key;
                                                       c.alibi = true;
                                                     },
                                                     [](Case& c) {
                                                       c.Hkv = 1;
                                                       c.causal = true;
                                                       c.softcap = 0.9f;
                                                       c.magnitude = 2;
                                                     },
                                                     [](Case& c) {
                                                       c.Dv = 8;
                                                       c.window_left = 30;
                                                       c.window_right = 5;
                                                       c.padding = true;
                                                     },
                                                     [](Case& c) { c.seq_major = true; },
                                                 }))
    for (const Entry& e : {g[2], g[3], g[6]}) expect_forward(c, e, 64);
}

// ---- gradients ---------------------------------------------------------------------------

struct Grads {
  Tensor dout, dq, dk, dv;
  explicit Grads(const Case& c, uint32_t seed = 3)
      : dout({c.B, c.Hq, c.Tq, c.Dv}),
        dq({c.B, c.Hq, c.Tq, c.D}),
        dk({c.B, c.Hkv, c.Tk, c.D}),
        dv({c.B, c.Hkv, c.Tk, c.Dv}) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-1, 1);
    for (int64_t i = 0; i < dout.numel(); ++i) dout.data()[i] = uniform(rng);
  }
};

double worst_relative(const Tensor& a, const Tensor& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::isnan(a.data()[i])) return INFINITY;
    worst =
        std::max<double>(worst, std::abs(a.data()[i] - b.data()[i]) / (1 + std::abs(b.data()[i])));
  }
  return worst;
}

void expect_backward(const Case& c, const Entry& e, int64_t block) {
  SCOPED_TRACE(e.name + " " + c.name() + " block " + std::to_string(block));
  const BlockMask bm = create_block_mask(e.expr, c.B, c.Hq, c.Tq, c.Tk, block);
  Problem fast(c), ref(c);
  fast.args.block_mask = ref.args.block_mask = &bm;
  attention(fast.args);
  Grads gf(c), gr(c);
  attention_backward(fast.args, gf.dout.view(), gf.dq.view(), gf.dk.view(), gf.dv.view());
  reference::attention_backward(ref.args, gr.dout.view(), gr.dq.view(), gr.dk.view(), gr.dv.view());
  const double tol = 64 * FLT_EPSILON * std::sqrt(double(std::max(c.Tq, c.Tk)) * c.D);
  EXPECT_LE(worst_relative(gf.dq, gr.dq), tol) << "dq";
  EXPECT_LE(worst_relative(gf.dk, gr.dk), tol) << "dk";
  EXPECT_LE(worst_relative(gf.dv, gr.dv), tol) << "dv";
}

TEST(MaskFunctionBackward, GalleryMatchesTheReference) {
  const Case c{.B = 2, .Hq = 4, .Hkv = 2, .Tq = 200, .Tk = 200, .D = 32, .Dv = 16};
  for (const Entry& e : gallery(c.B, c.Tq, c.Tk)) expect_backward(c, e, 128);
  for (const Entry& e : held_out()) expect_backward(c, e, 32);
}

// Rows that see no key: out 0, lse −inf, and no gradient reaches their queries.
TEST(MaskFunctionBackward, RowsThatSeeNothingKeepTheContract) {
  const Case c{.B = 1, .Hq = 2, .Hkv = 2, .Tq = 100, .Tk = 100, .D = 16, .Dv = 16};
  const BlockMask bm = create_block_mask(q_idx % 5 != 0 && kv_idx <= q_idx, 1, 1, 100, 100);
  Problem p(c);
  p.args.block_mask = &bm;
  attention(p.args);
  Grads g(c);
  attention_backward(p.args, g.dout.view(), g.dq.view(), g.dk.view(), g.dv.view());
  for (int64_t h_ = 0; h_ < c.Hq; ++h_)
    for (int64_t i = 0; i < c.Tq; i += 5) {
      EXPECT_EQ(p.args.lse[h_ * c.Tq + i], -INFINITY);
      for (int64_t d = 0; d < c.D; ++d) {
        EXPECT_EQ(p.args.out(0, h_, i, d), 0.0f);
        EXPECT_EQ(g.dq.view()(0, h_, i, d), 0.0f);
      }
    }
}

// The reference backward (which the tiled one is held to) against central differences of
// the formula's double-precision forward, on small problems with every kind of block.
TEST(MaskFunctionBackward, ReferenceMatchesFiniteDifferences) {
  const Case c{.B = 2, .Hq = 2, .Hkv = 1, .Tq = 9, .Tk = 11, .D = 3, .Dv = 2};
  std::vector<Entry> entries = gallery(c.B, c.Tq, c.Tk);
  for (const Entry& e : held_out()) entries.push_back(e);
  for (const Entry& e : entries) {
    SCOPED_TRACE(e.name);
    const BlockMask bm = create_block_mask(e.expr, c.B, c.Hq, c.Tq, c.Tk, 4);
    Problem p(c);
    p.args.block_mask = &bm;
    Grads g(c);
    reference::attention_backward(p.args, g.dout.view(), g.dq.view(), g.dk.view(), g.dv.view());
    testing::Inputs in = testing::inputs_of(p);
    auto loss = [&] {
      const testing::Expected x = testing::naive_attention(c, in, e.formula);
      double l = 0;
      for (size_t i = 0; i < x.out.size(); ++i) l += x.out[i] * g.dout.data()[i];
      return l;
    };
    auto check = [&](std::vector<double>& x, const Tensor& grad, const char* name) {
      for (size_t i = 0; i < x.size(); ++i) {
        const double saved = x[i];
        x[i] = saved + 1e-6;
        const double up = loss();
        x[i] = saved - 1e-6;
        const double down = loss();
        x[i] = saved;
        const double numeric = (up - down) / 2e-6;
        ASSERT_LT(std::abs(grad.data()[i] - numeric) / (1 + std::abs(numeric)), 1e-5)
            << name << "[" << i << "]";
      }
    };
    check(in.q, g.dq, "dq");
    check(in.k, g.dk, "dk");
    check(in.v, g.dv, "dv");
  }
}

// ---- fast paths and functions that say the same --------------------------------------------

double max_difference(const View& a, const View& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.shape[0]; ++i)
    for (int64_t j = 0; j < a.shape[1]; ++j)
      for (int64_t k = 0; k < a.shape[2]; ++k)
        for (int64_t l = 0; l < a.shape[3]; ++l)
          worst = std::max<double>(worst, std::abs(a(i, j, k, l) - b(i, j, k, l)));
  return worst;
}

TEST(MaskFunctionFastPaths, FixedOptionsEqualTheirFunctions) {
  const Case c{.B = 1, .Hq = 2, .Hkv = 2, .Tq = 260, .Tk = 260, .D = 32, .Dv = 32};
  const struct {
    MaskExpr expr;
    bool causal;
    int left, right;
  } pairs[] = {{kv_idx <= q_idx, true, -1, -1},
               {q_idx - kv_idx <= 40 && kv_idx - q_idx <= 3, false, 40, 3}};
  for (const auto& pr : pairs) {
    Problem option(c), function(c);
    option.args.mask.causal = pr.causal;
    option.args.mask.window_left = pr.left, option.args.mask.window_right = pr.right;
    const BlockMask bm = create_block_mask(pr.expr, 1, 1, c.Tq, c.Tk);
    function.args.block_mask = &bm;
    attention(option.args);
    attention(function.args);
    EXPECT_LE(max_difference(option.args.out, function.args.out), 1e-6) << to_string(pr.expr);
  }
}

TEST(MaskFunctionFastPaths, DocumentMaskEqualsPackedSequences) {
  const std::vector<int32_t> ids = documents(300);
  std::vector<int32_t> cu{0};
  for (size_t i = 1; i <= ids.size(); ++i)
    if (i == ids.size() || ids[i] != ids[i - 1]) cu.push_back(static_cast<int32_t>(i));
  const Case c{.B = 1, .Hq = 2, .Hkv = 1, .Tq = 300, .Tk = 300, .D = 32, .Dv = 32, .causal = true};
  Problem packed(c), function(c);
  packed.args.packed = {static_cast<int>(cu.size() - 1), cu.data(), cu.data()};
  const MaskTensor doc("doc", {300}, ids);
  const BlockMask bm = create_block_mask(doc[q_idx] == doc[kv_idx], 1, 1, 300, 300);
  function.args.block_mask = &bm;  // (with the causal option: the two compose)
  attention(packed.args);
  attention(function.args);
  EXPECT_LE(max_difference(packed.args.out, function.args.out), 1e-6);
  Grads a(c), b(c);
  attention_backward(packed.args, a.dout.view(), a.dq.view(), a.dk.view(), a.dv.view());
  attention_backward(function.args, b.dout.view(), b.dq.view(), b.dk.view(), b.dv.view());
  EXPECT_LE(worst_relative(a.dq, b.dq), 1e-5);
  EXPECT_LE(worst_relative(a.dk, b.dk), 1e-5);
  EXPECT_LE(worst_relative(a.dv, b.dv), 1e-5);
}

// Keys and values in blocks the function leaves empty may hold anything: never read.
TEST(MaskFunctionEdges, EmptyBlocksAreNeverRead) {
  const Case c{.B = 1, .Hq = 2, .Hkv = 2, .Tq = 200, .Tk = 400, .D = 16, .Dv = 16};
  const BlockMask bm = create_block_mask(kv_idx < 200, 1, 1, c.Tq, c.Tk);  // key blocks 2, 3 empty
  Problem clean(c), poisoned(c);
  clean.args.block_mask = poisoned.args.block_mask = &bm;
  for (int64_t h_ = 0; h_ < c.Hkv; ++h_)
    for (int64_t j = 256; j < c.Tk; ++j) {
      for (int64_t d = 0; d < c.D; ++d) poisoned.args.k(0, h_, j, d) = NAN;
      for (int64_t d = 0; d < c.Dv; ++d) poisoned.args.v(0, h_, j, d) = NAN;
    }
  attention(clean.args);
  attention(poisoned.args);
  EXPECT_EQ(max_difference(clean.args.out, poisoned.args.out), 0.0);
  Grads a(c), b(c);
  attention_backward(clean.args, a.dout.view(), a.dq.view(), a.dk.view(), a.dv.view());
  attention_backward(poisoned.args, b.dout.view(), b.dq.view(), b.dk.view(), b.dv.view());
  EXPECT_EQ(worst_relative(b.dq, a.dq), 0.0);
}

TEST(MaskFunctionThreads, SameBitsOnOneAndTwoThreads) {
  const Case c{.B = 1, .Hq = 2, .Hkv = 1, .Tq = 330, .Tk = 330, .D = 32, .Dv = 32};
  const std::vector<Entry> g = gallery(1, c.Tq, c.Tk);
  const BlockMask bm = create_block_mask(g[2].expr, 1, 1, c.Tq, c.Tk);
  Problem one(c), two(c);
  one.args.block_mask = two.args.block_mask = &bm;
  const int saved = num_threads();
  Grads ga(c), gb(c);
  set_num_threads(1);
  attention(one.args);
  attention_backward(one.args, ga.dout.view(), ga.dq.view(), ga.dk.view(), ga.dv.view());
  set_num_threads(2);
  attention(two.args);
  attention_backward(two.args, gb.dout.view(), gb.dq.view(), gb.dk.view(), gb.dv.view());
  set_num_threads(saved);
  EXPECT_EQ(max_difference(one.args.out, two.args.out), 0.0);
  for (auto [x, y] : {std::pair{&ga.dq, &gb.dq}, {&ga.dk, &gb.dk}, {&ga.dv, &gb.dv}})
    for (int64_t i = 0; i < x->numel(); ++i) ASSERT_EQ(x->data()[i], y->data()[i]);
}

// bf16 and fp16 inputs: the kernel against the reference over the same 16-bit views.
TEST(MaskFunctionTypes, SixteenBitInputs) {
  const Case c{.B = 1, .Hq = 2, .Hkv = 2, .Tq = 150, .Tk = 150, .D = 32, .Dv = 32};
  const std::vector<Entry> g = gallery(1, c.Tq, c.Tk);
  const BlockMask bm = create_block_mask(g[5].expr, 1, 1, c.Tq, c.Tk);
  for (TensorType type : {TensorType::bf16, TensorType::f16}) {
    Problem p(c);
    std::vector<uint16_t> q(p.q.numel()), k(p.k.numel()), v(p.v.numel());
    auto round = [&](const Tensor& t, std::vector<uint16_t>& bits) {
      for (int64_t i = 0; i < t.numel(); ++i)
        bits[i] =
            type == TensorType::bf16 ? float_to_bf16(t.data()[i]) : float_to_half(t.data()[i]);
    };
    round(p.q, q), round(p.k, k), round(p.v, v);
    AttentionArgs a = p.args;
    auto typed = [&](View view, std::vector<uint16_t>& bits) {
      view.type = type;
      view.data = nullptr;
      view.elements = bits.data();
      return view;
    };
    a.q = typed(p.args.q, q), a.k = typed(p.args.k, k), a.v = typed(p.args.v, v);
    a.block_mask = &bm;
    Tensor ref_out({c.B, c.Hq, c.Tq, c.Dv});
    AttentionArgs r = a;
    r.out = ref_out.view();
    r.lse = nullptr;
    attention(a);
    reference::attention(r);
    // bf16 units round P to bf16 for P·V: an output moves by at most 2^-8 · max |v|.
    const double tol = type == TensorType::bf16 ? 0x1p-7 : 1e-5;
    EXPECT_LE(max_difference(a.out, r.out), tol) << dtype_name(type);
  }
}

// ---- errors --------------------------------------------------------------------------------

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MaskFunctionErrors, ShapesBatchesAndUnsupportedCombinations) {
  const Case c{.B = 2, .Hq = 2, .Hkv = 2, .Tq = 20, .Tk = 20, .D = 8, .Dv = 8};
  Problem p(c);
  const BlockMask wrong_length = create_block_mask(kv_idx <= q_idx, 1, 1, 20, 21);
  p.args.block_mask = &wrong_length;
  EXPECT_NE(error_of([&] { attention(p.args); }).find("KV_LEN 21"), std::string::npos);
  const BlockMask reads_b = create_block_mask(kv_idx <= q_idx + b, 1, 1, 20, 20);
  p.args.block_mask = &reads_b;
  EXPECT_NE(error_of([&] { attention(p.args); }).find("reads b"), std::string::npos);
  const BlockMask fine = create_block_mask(kv_idx <= q_idx + h, 2, 2, 20, 20);
  p.args.block_mask = &fine;
  EXPECT_EQ(error_of([&] { attention(p.args); }), "");
  const BlockMask empty;
  p.args.block_mask = &empty;
  EXPECT_NE(error_of([&] { attention(p.args); }).find("create_block_mask"), std::string::npos);
}

}  // namespace
}  // namespace qkv
