// Mask functions: the expression's arithmetic against Python's rules worked by hand, the text
// form (reading, printing, errors with their column), and create_block_mask against every pair
// evaluated one by one (random expressions too, so that the interval arithmetic that decides
// whole blocks and the SIMD lanes that decide the rest are both checked).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "qkv/error.h"
#include "qkv/mask_function.h"
#include "qkv/threads.h"

namespace qkv {
namespace {

using namespace mask_args;

// The message of the qkv::Error f throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(MaskExpr, FloorDivisionAndRemainderAsPython) {
  // Python: -7 // 2 == -4, -7 % 2 == 1, 7 // -2 == -4, 7 % -2 == -1, -7 // -2 == 3, -7 % -2 == -1.
  const struct {
    int64_t x, y, quotient, remainder;
  } table[] = {{7, 2, 3, 1},   {-7, 2, -4, 1}, {7, -2, -4, -1}, {-7, -2, 3, -1},
               {6, 3, 2, 0},   {-6, 3, -2, 0}, {0, 5, 0, 0},    {5, 0, 0, 5},
               {-5, 0, 0, -5}, {1, 7, 0, 1},   {-1, 7, -1, 6}};
  for (const auto& t : table) {
    // The operands as q_idx and kv_idx, so nothing is folded.
    EXPECT_EQ(evaluate(q_idx / kv_idx == t.quotient, 0, 0, t.x, t.y), 1) << t.x << " / " << t.y;
    EXPECT_EQ(evaluate(q_idx % kv_idx == t.remainder, 0, 0, t.x, t.y), 1) << t.x << " % " << t.y;
  }
}

TEST(MaskExpr, OperatorsAndFunctions) {
  EXPECT_EQ(evaluate(abs(q_idx - kv_idx) == 3, 0, 0, 2, 5), 1);
  EXPECT_EQ(evaluate(min(q_idx, kv_idx) + max(q_idx, kv_idx) == 7, 0, 0, 2, 5), 1);
  EXPECT_EQ(evaluate(where(q_idx < kv_idx, b, h) == 9, 9, 4, 1, 2), 1);
  EXPECT_EQ(evaluate(where(q_idx < kv_idx, b, h) == 4, 9, 4, 2, 1), 1);
  EXPECT_EQ(evaluate(!(q_idx == kv_idx) || q_idx * 2 == -kv_idx, 0, 0, 3, 3), 0);
  EXPECT_EQ(evaluate(and_masks({q_idx >= 0, kv_idx >= 0}), 0, 0, 1, -1), 0);
  EXPECT_EQ(evaluate(or_masks({q_idx < 0, kv_idx < 0}), 0, 0, 1, -1), 1);
  EXPECT_EQ(evaluate(and_masks({}), 0, 0, 0, 0), 1);
  EXPECT_EQ(evaluate(or_masks({}), 0, 0, 0, 0), 0);
  const MaskTensor grid("grid", {2, 3}, {10, 11, 12, 20, 21, 22});
  EXPECT_EQ(evaluate(grid.at({b, kv_idx}) == 21, 1, 0, 0, 1), 1);
}

TEST(MaskExpr, WrongKindsAndIndicesAreErrors) {
  EXPECT_TRUE(contains(error_of([] { return q_idx && kv_idx; }), "&& takes booleans"));
  EXPECT_TRUE(contains(error_of([] { return (q_idx < 1) + 1; }), "+ takes integers"));
  EXPECT_TRUE(contains(error_of([] { return where(q_idx, 1, 2); }), "condition"));
  EXPECT_TRUE(contains(error_of([] { return where(q_idx < 1, 1, true); }), "one kind"));
  EXPECT_TRUE(contains(error_of([] { return MaskExpr(int64_t{1} << 32); }), "32 bits"));
  const MaskTensor doc("doc", {4}, {0, 0, 1, 1});
  EXPECT_TRUE(contains(error_of([&] { return doc.at({q_idx, kv_idx}); }), "1 dims"));
  EXPECT_TRUE(
      contains(error_of([&] { evaluate(doc[q_idx] == 0, 0, 0, 4, 0); }), "index 4 is outside doc"));
  EXPECT_TRUE(contains(error_of([] { evaluate(q_idx * kv_idx > 0, 0, 0, 1 << 20, 1 << 20); }),
                       "leaves 32 bits"));
  EXPECT_TRUE(contains(error_of([] { MaskTensor("2x", {1}, {0}); }), "not an identifier"));
  EXPECT_TRUE(contains(error_of([] { MaskTensor("t", {2}, {0}); }), "1 values"));
}

// Each text as it reads, and as to_string writes it back.
TEST(MaskText, ReadsAndPrintsBack) {
  const MaskTensor doc("doc", {10}, {0, 0, 0, 1, 1, 2, 2, 2, 2, 3});
  const MaskTensor prefix("prefix", {2}, {3, 5});
  const std::vector<MaskTensor> tensors = {doc, prefix};
  const struct {
    const char* text;
    const char* printed;
  } cases[] = {
      {"kv_idx <= q_idx", "kv_idx <= q_idx"},
      {"kv_idx<=q_idx&&doc[q_idx]==doc[kv_idx]", "kv_idx <= q_idx && doc[q_idx] == doc[kv_idx]"},
      {"(q_idx - kv_idx) % 2 == 0 || kv_idx < prefix[b]",
       "(q_idx - kv_idx) % 2 == 0 || kv_idx < prefix[b]"},
      {"q_idx // 4 == kv_idx / 4", "q_idx / 4 == kv_idx / 4"},
      {"!(q_idx < kv_idx) & ~(h == 1) | false", "!(q_idx < kv_idx) && !(h == 1) || false"},
      {"q_idx - (kv_idx - 1) > -3", "q_idx - (kv_idx - 1) > -3"},
      {"where(q_idx > 2, min(q_idx, 4), abs(-kv_idx)) >= max(1, h)",
       "where(q_idx > 2, min(q_idx, 4), abs(-kv_idx)) >= max(1, h)"},
      {"q_idx * -2 != - 2147483648", "q_idx * -2 != -2147483648"},
      {"(q_idx == 1) == (kv_idx == 1) || true", "(q_idx == 1) == (kv_idx == 1) || true"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    const MaskExpr e = parse_mask(c.text, tensors);
    EXPECT_EQ(to_string(e), c.printed);
    const MaskExpr again = parse_mask(to_string(e), tensors);
    EXPECT_EQ(to_string(again), c.printed);
    for (int64_t bb = 0; bb < 2; ++bb)
      for (int64_t q = 0; q < 10; ++q)
        for (int64_t k = 0; k < 10; ++k)
          EXPECT_EQ(evaluate(e, bb, 1, q, k), evaluate(again, bb, 1, q, k));
  }
  // Precedence as C's: * before +, + before <, < before &&, && before ||.
  const MaskExpr p = parse_mask("1 + 2 * 3 == 7 && 2 < 3 || false");
  EXPECT_EQ(evaluate(p, 0, 0, 0, 0), 1);
  EXPECT_EQ(to_string(parse_mask("(1 + 2) * 3 == 9")), "(1 + 2) * 3 == 9");
  EXPECT_EQ(evaluate(parse_mask("(1 + 2) * 3 == 9"), 0, 0, 0, 0), 1);
  EXPECT_EQ(evaluate(parse_mask("10 - 3 - 2 == 5"), 0, 0, 0, 0), 1);  // left to right
}

TEST(MaskText, ErrorsNameTheColumn) {
  const MaskTensor doc("doc", {4}, {0, 0, 1, 1});
  const std::vector<MaskTensor> tensors = {doc};
  const struct {
    const char* text;
    const char* part;
  } cases[] = {
      {"kv_idx <= ", "column 11: expected an operand, found the end"},
      {"q_idx + (kv_idx", "column 16: expected ')'"},
      {"q_idx < foo", "column 9: expected b, h, q_idx, kv_idx"},
      {"q_idx < 99999999999", "column 9: an integer larger than 32 bits"},
      {"q_idx < 2147483648", "column 9: an integer larger than 32 bits"},
      {"doc[q_idx == 1", "column 15: expected ']'"},
      {"doc[q_idx, kv_idx] == 0", "column 1: doc has 1 dims but is read with 2 indices"},
      {"q_idx + true", "column 7: + takes integers"},
      {"q_idx kv_idx", "column 7: expected an operator or the end"},
      {"min(q_idx)", "column 10: expected ','"},
      {"q_idx < 1 $", "column 11: expected an operator or the end"},
      {"", "column 1: expected an operand"},
      {"q_idx == (((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
       "((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
       "((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
       "1",
       "nesting deeper than 200 levels"},
  };
  for (const auto& c : cases) {
    const std::string message = error_of([&] { parse_mask(c.text, tensors); });
    EXPECT_TRUE(contains(message, c.part)) << "\"" << c.text << "\" gave: " << message;
  }
}

// Every block's state and the visible count, worked out pair by pair with evaluate().
void expect_blocks_match_pairs(const MaskExpr& m, int64_t B, int64_t H, int64_t Tq, int64_t Tk,
                               int64_t block) {
  const BlockMask bm = create_block_mask(m, B, H, Tq, Tk, block);
  ASSERT_EQ(bm.query_blocks(), (Tq + block - 1) / block);
  ASSERT_EQ(bm.key_blocks(), (Tk + block - 1) / block);
  int64_t visible = 0;
  for (int64_t b_ = 0; b_ < B; ++b_)
    for (int64_t h_ = 0; h_ < H; ++h_)
      for (int64_t qb = 0; qb < bm.query_blocks(); ++qb) {
        std::vector<int32_t> full, partial;
        for (int64_t kb = 0; kb < bm.key_blocks(); ++kb) {
          int64_t seen = 0, pairs = 0;
          for (int64_t i = qb * block; i < std::min(Tq, (qb + 1) * block); ++i)
            for (int64_t j = kb * block; j < std::min(Tk, (kb + 1) * block); ++j, ++pairs)
              seen += evaluate(m, b_, h_, i, j) != 0;
          visible += seen;
          const BlockState want = seen == 0       ? BlockState::empty
                                  : seen == pairs ? BlockState::full
                                                  : BlockState::partial;
          ASSERT_EQ(static_cast<int>(bm.state(b_, h_, qb, kb)), static_cast<int>(want))
              << to_string(m) << " b " << b_ << " h " << h_ << " qb " << qb << " kb " << kb;
          if (want == BlockState::full) full.push_back(static_cast<int32_t>(kb));
          if (want == BlockState::partial) partial.push_back(static_cast<int32_t>(kb));
        }
        const auto f = bm.full_key_blocks(b_, h_, qb), p = bm.partial_key_blocks(b_, h_, qb);
        EXPECT_EQ(std::vector<int32_t>(f.begin(), f.end()), full);
        EXPECT_EQ(std::vector<int32_t>(p.begin(), p.end()), partial);
      }
  EXPECT_EQ(bm.visible_pairs(), visible) << to_string(m);
  // The transposed lists: query blocks of each key block.
  for (int64_t kb = 0; kb < bm.key_blocks(); ++kb) {
    std::vector<int32_t> full, partial;
    for (int64_t qb = 0; qb < bm.query_blocks(); ++qb) {
      if (bm.state(B - 1, H - 1, qb, kb) == BlockState::full) full.push_back(qb);
      if (bm.state(B - 1, H - 1, qb, kb) == BlockState::partial) partial.push_back(qb);
    }
    const auto f = bm.full_query_blocks(B - 1, H - 1, kb);
    const auto p = bm.partial_query_blocks(B - 1, H - 1, kb);
    EXPECT_EQ(std::vector<int32_t>(f.begin(), f.end()), full);
    EXPECT_EQ(std::vector<int32_t>(p.begin(), p.end()), partial);
  }
}

TEST(BlockMask, CausalBlocksByHand) {
  const BlockMask bm = create_block_mask(kv_idx <= q_idx, 1, 1, 300, 300);
  ASSERT_EQ(bm.query_blocks(), 3);
  using S = BlockState;
  const S want[3][3] = {{S::partial, S::empty, S::empty},
                        {S::full, S::partial, S::empty},
                        {S::full, S::full, S::partial}};
  for (int qb = 0; qb < 3; ++qb)
    for (int kb = 0; kb < 3; ++kb)
      EXPECT_EQ(static_cast<int>(bm.state(0, 0, qb, kb)), static_cast<int>(want[qb][kb]));
  EXPECT_EQ(bm.visible_pairs(), 300 * 301 / 2);
  EXPECT_FALSE(bm.reads_batch());
  EXPECT_FALSE(bm.reads_head());
  EXPECT_GT(bm.bytes(), 9);
}

TEST(BlockMask, GalleryMatchesPairByPair) {
  std::vector<int32_t> ids;  // documents of lengths 37, 120, 5, 90, 48
  int32_t d = 0;
  for (int32_t len : {37, 120, 5, 90, 48}) {
    ids.insert(ids.end(), len, d);
    ++d;
  }
  const int64_t T = static_cast<int64_t>(ids.size());  // 300
  const MaskTensor doc("doc", {T}, ids);
  const MaskTensor prefix("prefix", {2}, {70, 0});
  const MaskExpr gallery[] = {
      kv_idx <= q_idx,
      kv_idx <= q_idx && q_idx - kv_idx < 50,
      doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx,
      kv_idx <= q_idx || kv_idx < prefix[b],
      abs(q_idx - kv_idx) <= 40 && (q_idx - kv_idx) % 4 == 0,
      abs(q_idx - kv_idx) <= 16 || kv_idx < 4 || q_idx < 4,
      abs(q_idx / 20 - kv_idx / 20) <= 1 && abs(q_idx % 20 - kv_idx % 20) <= 1,
      q_idx - kv_idx <= 3 + 5 * h && kv_idx <= q_idx,
      MaskExpr(false),
      MaskExpr(true),
  };
  for (const MaskExpr& m : gallery)
    for (int64_t block : {128, 64, 37}) expect_blocks_match_pairs(m, 2, 2, T, T - 13, block);
}

// A random expression over the indices, small constants and a tensor read at clamped indices.
MaskExpr random_integer(std::mt19937& rng, const MaskTensor& t, int depth);
MaskExpr random_boolean(std::mt19937& rng, const MaskTensor& t, int depth) {
  std::uniform_int_distribution<int> pick(0, depth > 0 ? 5 : 0);
  auto i = [&] { return random_integer(rng, t, depth - 1); };
  auto c = [&] { return random_boolean(rng, t, depth - 1); };
  switch (pick(rng)) {
    case 0: {
      const int cmp = std::uniform_int_distribution<int>(0, 5)(rng);
      const MaskExpr x = random_integer(rng, t, depth > 0 ? depth - 1 : 0);
      const MaskExpr y = random_integer(rng, t, depth > 0 ? depth - 1 : 0);
      switch (cmp) {
        case 0:
          return x == y;
        case 1:
          return x != y;
        case 2:
          return x < y;
        case 3:
          return x <= y;
        case 4:
          return x > y;
        default:
          return x >= y;
      }
    }
    case 1:
      return c() && c();
    case 2:
      return c() || c();
    case 3:
      return !c();
    case 4:
      return where(c(), c(), c());
    default:
      return i() >= i();
  }
}
MaskExpr random_integer(std::mt19937& rng, const MaskTensor& t, int depth) {
  std::uniform_int_distribution<int> pick(0, depth > 0 ? 14 : 4);
  auto i = [&] { return random_integer(rng, t, depth - 1); };
  switch (pick(rng)) {
    case 0:
      return q_idx;
    case 1:
      return kv_idx;
    case 2:
      return std::uniform_int_distribution<int>(-9, 9)(rng);
    case 3:
      return h;
    case 4:
      return b;
    case 5:
      return i() + i();
    case 6:
      return i() - i();
    case 7:
      return i() * std::uniform_int_distribution<int>(-3, 3)(rng);
    case 8:
      return i() / i();
    case 9:
      return i() % i();
    case 10:
      return min(i(), i());
    case 11:
      return max(i(), i());
    case 12:
      return abs(i());
    case 13:
      return where(random_boolean(rng, t, depth - 1), i(), i());
    default:
      return t[min(max(i(), 0), 49)];
  }
}

TEST(BlockMask, RandomExpressionsMatchPairByPair) {
  std::mt19937 rng(7);
  std::vector<int32_t> values(50);
  for (int32_t& v : values) v = std::uniform_int_distribution<int32_t>(-20, 20)(rng);
  const MaskTensor t("t", {50}, values);
  int checked = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const MaskExpr m = random_boolean(rng, t, 4);
    SCOPED_TRACE(to_string(m));
    expect_blocks_match_pairs(m, 2, 2, 45, 53, 8);
    ++checked;
  }
  EXPECT_EQ(checked, 60);
}

TEST(BlockMask, IndexOutsideATensorIsAnError) {
  const MaskTensor doc("doc", {100}, std::vector<int32_t>(100, 0));
  const std::string m = error_of([&] { create_block_mask(doc[q_idx + 1] == 0, 1, 1, 100, 100); });
  EXPECT_TRUE(contains(m, "index 100 is outside doc")) << m;
  EXPECT_TRUE(contains(m, "q_idx = 99")) << m;
  // Both sides of a where are evaluated, as torch.where's are.
  const std::string w = error_of([&] {
    create_block_mask(where(q_idx < 99, doc[q_idx], doc[q_idx + 5]) == 0, 1, 1, 100, 100);
  });
  EXPECT_TRUE(contains(w, "outside doc")) << w;
  // Within bounds everywhere: no error, however the indices are computed.
  EXPECT_EQ(create_block_mask(doc[min(q_idx + 1, 99)] == 0, 1, 1, 100, 100).visible_pairs(),
            100 * 100);
}

TEST(BlockMask, ValuesBeyond32BitsAreRefused) {
  const std::string m =
      error_of([] { create_block_mask(q_idx * kv_idx * 1000 > 0, 1, 1, 70000, 70000, 4096); });
  EXPECT_TRUE(contains(m, "outside 32 bits")) << m;
  EXPECT_TRUE(contains(error_of([] { create_block_mask(q_idx + 1, 1, 1, 8, 8); }),
                       "an integer, not a boolean"));
  EXPECT_TRUE(contains(error_of([] { create_block_mask(q_idx < 1, 1, 0, 8, 8); }), "at least 1"));
  EXPECT_TRUE(
      contains(error_of([] { create_block_mask(q_idx < 1, 1, 1, 8, 8, 0); }), "BLOCK_SIZE"));
}

TEST(BlockMask, BatchesAndHeadsStoredOnlyWhenRead) {
  const BlockMask shared = create_block_mask(kv_idx <= q_idx, 4, 8, 256, 256);
  const BlockMask per_head = create_block_mask(kv_idx <= q_idx + h, 4, 8, 256, 256);
  EXPECT_TRUE(per_head.reads_head());
  EXPECT_FALSE(per_head.reads_batch());
  EXPECT_LT(shared.bytes() * 4, per_head.bytes());
  EXPECT_EQ(shared.visible_pairs(), 4 * 8 * (256 * 257 / 2));
}

// Long sequences: a document mask over 32k positions in blocks of 128, against the sum of the
// documents' triangles.
TEST(BlockMask, DocumentMaskAt32kPositions) {
  std::vector<int32_t> ids;
  int64_t want = 0;
  int32_t d = 0;
  for (int64_t len : {5000, 12000, 777, 9000, 5991}) {
    ids.insert(ids.end(), len, d++);
    want += len * (len + 1) / 2;
  }
  const int64_t T = static_cast<int64_t>(ids.size());
  ASSERT_EQ(T, 32768);
  const MaskTensor doc("doc", {T}, ids);
  const BlockMask bm = create_block_mask(doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx, 1, 1, T, T);
  EXPECT_EQ(bm.visible_pairs(), want);
  // Each block's state from the documents' extents: query i sees keys [start of its document, i].
  std::vector<int64_t> start(T);
  for (int64_t i = 0; i < T; ++i) start[i] = i > 0 && ids[i] == ids[i - 1] ? start[i - 1] : i;
  for (int64_t qb = 0; qb < bm.query_blocks(); ++qb)
    for (int64_t kb = 0; kb < bm.key_blocks(); ++kb) {
      const int64_t k0 = kb * 128, k1 = k0 + 127;
      int64_t seen = 0;
      for (int64_t i = qb * 128; i < qb * 128 + 128; ++i)
        seen += std::max<int64_t>(0, std::min(i, k1) - std::max(start[i], k0) + 1);
      const BlockState want_state = seen == 0           ? BlockState::empty
                                    : seen == 128 * 128 ? BlockState::full
                                                        : BlockState::partial;
      ASSERT_EQ(bm.state(0, 0, qb, kb), want_state) << qb << " " << kb;
    }
}

TEST(BlockMask, SameOnAnyThreadCount) {
  const MaskTensor doc("doc", {1000}, std::vector<int32_t>(1000, 3));
  const MaskExpr m = abs(q_idx / 30 - kv_idx / 30) <= 1 && doc[kv_idx] == 3;
  const int saved = num_threads();
  set_num_threads(1);
  const BlockMask one = create_block_mask(m, 1, 1, 1000, 1000, 32);
  set_num_threads(2);
  const BlockMask two = create_block_mask(m, 1, 1, 1000, 1000, 32);
  set_num_threads(saved);
  EXPECT_EQ(one.visible_pairs(), two.visible_pairs());
  for (int64_t qb = 0; qb < one.query_blocks(); ++qb)
    for (int64_t kb = 0; kb < one.key_blocks(); ++kb)
      EXPECT_EQ(one.state(0, 0, qb, kb), two.state(0, 0, qb, kb));
}

}  // namespace
}  // namespace qkv
