// Attention over stored keys and values (qkv::attention with a StoredKV): every storage a cache
// uses — fp32, bf16 or fp16 rows, or Q8_0 and Q4_0 blocks, in order or in a ring, with or
// without fresh rows beside it — against the reference kernel over the same keys and values
// laid out plainly (blocks: as the reference dequantizer reads them). Slots the storage does
// not hold are NaN, so a read of one shows. A rotated storage (StoredKV::rotation) holds rows
// in the rotated space: the reference reads them rotated back.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/mask_function.h"
#include "qkv/score_function.h"
#include "qkv/number_format.h"
#include "qkv/quant.h"
#include "qkv/targets.h"
#include "int8_query.h"
#include "attention/kernels.h"

namespace qkv {
namespace {

struct StoredCase {
  TensorType type = TensorType::f32;
  std::optional<TensorType> v_type;  // values of their own type (StoredKV::v_type)
  int64_t slots = 0;  // 0: rows in order; else a ring of that many slots
  int64_t Tq = 1;
  int window = -1;  // window_left; -1: the whole prefix
  bool alibi = false;
  bool fresh = false;      // the queries' own keys and values given beside the storage
  int64_t Hq = 4, L = 37;  // query heads (of 2 key/value heads); positions
  int64_t rotation = 0;    // the rows' rotation block; 0: none
  bool sinks = false;      // a sink logit per query head
  // Functions over positions: 1 a mask function (documents, and the first two positions),
  // 2 a score function (a relative bias table and a term of kv_idx), 4 a window's mask
  // function (q_idx − kv_idx < 8) in place of the documents.
  int functions = 0;
};

bool in_blocks(TensorType t) { return is_kv_block_type(t); }

std::string type_name(TensorType t) { return in_blocks(t) ? to_string(t) : dtype_name(t); }

std::string name_of(const StoredCase& c) {
  std::string s = type_name(c.type);
  if (c.v_type) s += "_v" + type_name(*c.v_type);
  s += c.slots ? "_ring" + std::to_string(c.slots) : "_rows";
  s += "_Tq" + std::to_string(c.Tq) + "_win" + std::to_string(c.window + 1);
  if (c.alibi) s += "_alibi";
  if (c.fresh) s += "_fresh";
  if (c.Hq != 4) s += "_Hq" + std::to_string(c.Hq);
  if (c.L != 37) s += "_L" + std::to_string(c.L);
  if (c.rotation) s += "_rot" + std::to_string(c.rotation);
  if (c.sinks) s += "_sinks";
  if (c.functions) s += "_fn" + std::to_string(c.functions);
  return s;
}

void PrintTo(const StoredCase& c, std::ostream* os) { *os << name_of(c); }

class StoredAttention : public ::testing::TestWithParam<StoredCase> {};

TEST_P(StoredAttention, MatchesTheReferenceOverPlainRows) {
  const StoredCase c = GetParam();
  const int64_t Hq = c.Hq, Hkv = 2, L = c.L;  // L positions, the queries the last Tq
  const TensorType k_type = c.type, v_type = c.v_type.value_or(c.type);
  const bool k_blocks = in_blocks(k_type), blocks = k_blocks || in_blocks(v_type);
  const int64_t D = blocks ? 64 : 16;
  // x as a row of `type` holds it (16-bit types round each element).
  auto rounded = [](TensorType type, float x) {
    return type == TensorType::bf16  ? bf16_to_float(float_to_bf16(x))
           : type == TensorType::f16 ? half_to_float(float_to_half(x))
                                     : x;
  };
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  // The keys and values of every position, as the storage will hold them (rounded).
  Tensor k({1, Hkv, L, D}), v({1, Hkv, L, D}), q({1, Hq, c.Tq, D});
  for (Tensor* t : {&k, &v, &q})
    for (int64_t i = 0; i < t->numel(); ++i) {
      const float x = u(rng);
      t->data()[i] = t == &q ? x : rounded(t == &k ? k_type : v_type, x);
    }
  // Blocks: each row as the reference dequantizer reads its quantized bytes.
  for (auto [t, type] : {std::pair{&k, k_type}, std::pair{&v, v_type}})
    for (int64_t r = 0; in_blocks(type) && r < Hkv * L; ++r) {
      float* row = t->data() + r * D;
      quant::dequantize(type, quant::quantize(type, row, D).data(), D, row);
    }
  // The storage: [Hkv, rows, D] of `type` per tensor, NaN where nothing is held (blocks: each
  // block's scale a NaN).
  const int64_t rows = c.slots ? c.slots : L;
  const int64_t stored_end = c.fresh ? L - c.Tq : L;
  const int64_t held_from = c.slots ? std::max<int64_t>(0, stored_end - c.slots) : 0;
  auto storage = [&](const Tensor& t, TensorType type) {
    const int64_t row_bytes = bytes_of(type, D);
    std::vector<uint8_t> bytes(Hkv * rows * row_bytes);
    const std::vector<float> nan_row(D, NAN);
    auto put = [&](uint8_t* at, const float* x) {
      if (in_blocks(type)) {
        const std::vector<uint8_t> q = quant::quantize(type, x, D);
        std::copy(q.begin(), q.end(), at);
        if (std::isnan(x[0]))
          for (int64_t b = 0; b < D / 32; ++b)
            at[b * row_bytes / (D / 32)] = 0x00, at[b * row_bytes / (D / 32) + 1] = 0x7e;
      } else if (type == TensorType::f32) {
        std::memcpy(at, x, D * sizeof(float));
      } else {
        for (int64_t d = 0; d < D; ++d) {
          const uint16_t b = type == TensorType::bf16 ? float_to_bf16(x[d]) : float_to_half(x[d]);
          std::memcpy(at + 2 * d, &b, 2);
        }
      }
    };
    for (int64_t r = 0; r < Hkv * rows; ++r) put(bytes.data() + r * row_bytes, nan_row.data());
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t p = held_from; p < stored_end; ++p)
        put(bytes.data() + (h * rows + (c.slots ? p % c.slots : p)) * row_bytes,
            &t.view()(0, h, p, 0));
    return bytes;
  };
  const std::vector<uint8_t> ks = storage(k, k_type), vs = storage(v, v_type);
  // Fresh rows as the model has them: fp32, not yet rounded (blocks: a dequantized row
  // quantizes back to the same bytes).
  Tensor fk({1, Hkv, c.Tq, D}), fv({1, Hkv, c.Tq, D});
  for (int64_t h = 0; h < Hkv; ++h)
    for (int64_t t = 0; t < c.Tq; ++t)
      for (int64_t d = 0; d < D; ++d) {
        fk.view()(0, h, t, d) = k.view()(0, h, L - c.Tq + t, d);
        fv.view()(0, h, t, d) = v.view()(0, h, L - c.Tq + t, d);
      }
  StoredKV kv{.type = c.type,
              .v_type = c.v_type,
              .k = ks.data(),
              .v = vs.data(),
              .batch_stride = Hkv * rows * D,
              .head_stride = rows * D,
              .row_stride = D,
              .heads = Hkv,
              .dim_k = D,
              .dim_v = D,
              .length = L,
              .slots = c.slots,
              .scores = CacheScores::exact,
              .rotation = c.rotation};
  if (c.fresh) kv.fresh_k = fk, kv.fresh_v = fv;
  std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  Tensor out({1, Hq, c.Tq, D}), expected({1, Hq, c.Tq, D});
  std::vector<float> lse(Hq * c.Tq), expected_lse(Hq * c.Tq);
  AttentionArgs a{.q = q, .out = out, .lse = lse.data()};
  a.mask.causal = true;
  a.mask.window_left = c.window;
  if (c.alibi) a.mask.alibi = slopes.data();
  std::vector<float> sinks(Hq);
  for (int64_t h = 0; h < Hq; ++h)
    sinks[h] = h == 0 ? -INFINITY : -2.0f + static_cast<float>(h % 5);
  if (c.sinks) a.sinks = sinks.data();
  // The functions read positions 0 … L − 1 (the queries L − Tq …): made for a capacity past L.
  const int64_t capacity = L + 9;
  std::vector<int32_t> ids;
  for (int32_t d = 0; static_cast<int64_t>(ids.size()) < capacity; ++d)
    ids.insert(ids.end(), std::vector<int32_t>{7, 3, 12, 5, 30, 9, 200, 40}[d % 8], d);
  const MaskTensor doc("doc", {static_cast<int64_t>(ids.size())}, ids);
  using namespace score_args;
  // Each function of the query's index q: positions over the cache (q = q_idx); the
  // reference's views index the queries from 0 (q = q_idx + L − Tq).
  auto mask_of = [&](const MaskExpr& q) {
    return c.functions & 4 ? MaskExpr(q - kv_idx < 8) : (doc[q] == doc[kv_idx] || kv_idx < 2);
  };
  std::vector<float> table(Hq * 16);
  for (float& x : table) x = u(rng);
  const ScoreTensor bias("bias", {Hq, 16}, table.data());
  auto score_of = [&](const MaskExpr& q) {
    return score + bias.at({h, min(max(q - kv_idx, 0), 15)}) - 0.01 * to_float(kv_idx % 7);
  };
  const MaskExpr shifted = q_idx + static_cast<int>(L - c.Tq);
  const ScoreFunction score_fn(score_of(q_idx)), score_fn_of_views(score_of(shifted));
  const bool masks = c.functions & 5;
  BlockMask blocks_over_capacity, blocks_of_views;
  if (masks) {
    blocks_over_capacity = create_block_mask(mask_of(q_idx), 1, 1, capacity, capacity, 16);
    blocks_of_views = create_block_mask(mask_of(shifted), 1, 1, c.Tq, L, 16);
    a.block_mask = &blocks_over_capacity;
  }
  if (c.functions & 2) a.score_mod = &score_fn;
  attention(a, kv);
  // Blocks again with int8 scores (the default): each score moves by at most what rounding
  // the scaled (and rotated) query to int8 blocks moves it, δ = Σ_b d_b / 2 · Σ_b |k| (k as
  // stored), so the output by at most (e^2δ − 1) max |v| and the log-sum-exp by δ.
  Tensor out8({1, Hq, c.Tq, D});
  std::vector<float> lse8(Hq * c.Tq);
  double delta = 0, vmax = 0;
  if (k_blocks) {
    StoredKV kv8 = kv;
    kv8.scores = CacheScores::int8;
    AttentionArgs a8 = a;
    a8.out = out8, a8.lse = lse8.data();
    attention(a8, kv8);
    const double scale = 1 / std::sqrt(static_cast<double>(D));
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t t = 0; t < c.Tq; ++t) {
        std::vector<float> qr(D);
        for (int64_t d = 0; d < D; ++d) qr[d] = q.view()(0, h, t, d);
        if (c.rotation) hadamard_rotate(qr.data(), D, c.rotation);
        for (int64_t p = 0; p < L; ++p) {
          double bound = 0;
          for (int64_t b = 0; b < D / 32; ++b) {
            double amax = 0, ksum = 0;
            for (int64_t i = 32 * b; i < 32 * (b + 1); ++i)
              amax = std::max(amax, scale * std::abs(qr[i])),
              ksum += std::abs(k.view()(0, h / (Hq / Hkv), p, i));
            bound += amax / 127 / 2 * ksum;
          }
          delta = std::max(delta, bound);
        }
      }
    for (int64_t i = 0; i < v.numel(); ++i) vmax = std::max(vmax, std::abs(double(v.data()[i])));
  }

  // The rows attention sees: those stored, rotated back (H is its own inverse).
  for (Tensor* t : {&k, &v})
    for (int64_t r = 0; c.rotation && r < Hkv * L; ++r)
      hadamard_rotate(t->data() + r * D, D, c.rotation);
  AttentionArgs r = a;
  r.k = k, r.v = v, r.out = expected, r.lse = expected_lse.data();
  r.block_mask = masks ? &blocks_of_views : nullptr;
  r.score_mod = c.functions & 2 ? &score_fn_of_views : nullptr;
  reference::attention(r);
  for (int64_t i = 0; i < out.numel(); ++i)
    ASSERT_NEAR(out.data()[i], expected.data()[i], 2e-5) << "element " << i;
  for (int64_t i = 0; i < Hq * c.Tq; ++i) ASSERT_NEAR(lse[i], expected_lse[i], 2e-5) << "row " << i;
  if (!k_blocks) return;
  for (int64_t i = 0; i < out.numel(); ++i)
    ASSERT_NEAR(out8.data()[i], expected.data()[i], std::expm1(2 * delta) * vmax + 2e-5)
        << "int8 scores, element " << i;
  for (int64_t i = 0; i < Hq * c.Tq; ++i)
    ASSERT_NEAR(lse8[i], expected_lse[i], delta + 2e-5) << "int8 scores, row " << i;
}

std::vector<StoredCase> stored_cases() {
  std::vector<StoredCase> cases;
  for (TensorType type : kv_row_types())  // every type a cache stores
    for (int64_t Tq : {1, 3}) {
      cases.push_back({.type = type, .Tq = Tq});               // rows in order
      cases.push_back({.type = type, .Tq = Tq, .window = 5});  // a window over them
      cases.push_back({.type = type, .Tq = Tq, .alibi = true});
      // A ring, wrapped: exactly the slots the queries see, more, with ALiBi (order matters),
      // not yet full, and one the new positions would overrun (they come as fresh rows).
      const int64_t seen = 5 + Tq;
      cases.push_back({.type = type, .slots = seen, .Tq = Tq, .window = 5});
      cases.push_back({.type = type, .slots = seen + 3, .Tq = Tq, .window = 5});
      cases.push_back({.type = type, .slots = seen, .Tq = Tq, .window = 5, .alibi = true});
      cases.push_back({.type = type, .slots = 64, .Tq = Tq, .window = 5});
      cases.push_back({.type = type, .slots = 6, .Tq = Tq, .window = 5, .fresh = true});
      cases.push_back({.type = type, .Tq = Tq, .fresh = true});
    }
  // Blocks through every kernel: split-KV decoding with its rows in registers and in tiles
  // (16 rows per key/value head), over several chunks, and the tiled forward (40 queries).
  for (TensorType type : kv_row_types()) {
    if (!in_blocks(type)) continue;
    cases.push_back({.type = type, .Tq = 1, .Hq = 32});
    cases.push_back({.type = type, .Tq = 2, .window = 300, .Hq = 8, .L = 1100});
    cases.push_back({.type = type, .Tq = 40, .L = 300});
    cases.push_back({.type = type, .Tq = 40, .window = 100, .Hq = 8, .L = 300});
  }
  // A ring wrapped inside a long cache, decoded in place: split-KV chunks on both sides of
  // the wrap (600 slots holding positions 500 … 1099, slot 0 at position 600).
  for (TensorType type : kv_row_types()) {
    cases.push_back({.type = type, .slots = 600, .Tq = 2, .window = 590, .L = 1100});
    cases.push_back({.type = type, .slots = 600, .Tq = 1, .window = 599, .alibi = true, .L = 1100});
  }
  // A wrapped ring under the tiled forward (40 queries), read in place run by run: 200 slots
  // holding positions 100 … 299, the wrap inside the second key tile, which is copied together
  // (f32 and blocks: bf16 and f16 rows meet the bf16 units there, beyond this test's bound).
  for (TensorType type : kv_row_types()) {
    if (type != TensorType::f32 && !in_blocks(type)) continue;
    cases.push_back({.type = type, .slots = 200, .Tq = 40, .window = 150, .L = 300});
    cases.push_back({.type = type, .slots = 200, .Tq = 40, .window = 150, .alibi = true, .L = 300});
    cases.push_back(
        {.type = type, .slots = 200, .Tq = 40, .window = 150, .L = 300, .functions = 3});
  }
  const auto q4_0 = std::optional<TensorType>(TensorType::q4_0);  // (q8_0 keys, q4_0 values)
  cases.push_back(
      {.type = TensorType::q8_0, .v_type = q4_0, .slots = 200, .Tq = 40, .window = 150, .L = 300});
  // Sinks over every storage: decoding, a ring with fresh rows (gathered), the tiled forward.
  for (TensorType type : kv_row_types()) {
    cases.push_back({.type = type, .Tq = 1, .sinks = true});
    cases.push_back({.type = type, .slots = 6, .Tq = 3, .window = 5, .fresh = true, .sinks = true});
    if (type == TensorType::f32 || in_blocks(type))
      cases.push_back({.type = type, .Tq = 40, .L = 100, .sinks = true});
  }
  // Rotated rows, every storage: decoding, a ring with fresh rows, a rotation block below the
  // head dim, and the tiled forward (f32 and blocks: bf16 and f16 rows meet the bf16 units
  // there, which round P, beyond this test's bound).
  for (TensorType type : kv_row_types()) {
    const int64_t D = in_blocks(type) ? 64 : 16;
    cases.push_back({.type = type, .Tq = 1, .rotation = D});
    cases.push_back({.type = type, .Tq = 3, .alibi = true, .rotation = D / 4});
    cases.push_back({.type = type, .slots = 6, .Tq = 3, .window = 5, .fresh = true, .rotation = D});
    if (type == TensorType::f32 || in_blocks(type))
      cases.push_back({.type = type, .Tq = 40, .L = 100, .rotation = D});
  }
  // Mask and score functions over positions, every storage: decoding (rows in registers, and
  // in tiles: 16 rows per key/value head), chunked prefill on the tiled forward (20 queries
  // at positions 80 … 99), a wrapped ring decoded in place over several chunks, a ring with
  // fresh rows (gathered), rings whose lost positions only the function hides (in place, and
  // gathered), and rotated rows.
  for (TensorType type : kv_row_types()) {
    const bool exact_p = type == TensorType::f32 || in_blocks(type);  // (as above)
    cases.push_back({.type = type, .Tq = 1, .functions = 3});
    cases.push_back({.type = type, .Tq = 3, .window = 5, .functions = 1});
    if (exact_p) cases.push_back({.type = type, .Tq = 2, .Hq = 16, .functions = 3});
    if (exact_p) cases.push_back({.type = type, .Tq = 20, .L = 100, .functions = 3});
    cases.push_back(
        {.type = type, .slots = 600, .Tq = 2, .window = 590, .L = 1100, .functions = 3});
    cases.push_back(
        {.type = type, .slots = 6, .Tq = 3, .window = 5, .fresh = true, .functions = 3});
    cases.push_back({.type = type, .slots = 8, .Tq = 3, .fresh = true, .functions = 7});
    cases.push_back({.type = type, .Tq = 3, .rotation = in_blocks(type) ? 64 : 16, .functions = 3});
    cases.push_back({.type = type, .slots = 8, .Tq = 1, .functions = 7});
  }
  // Keys and values each in a type of their own (a cache's --cache-k/--cache-v): 8-bit keys
  // with 4-bit values and the reverse, blocks beside 16-bit and fp32 rows, through decoding
  // with rows in registers and in tiles (16-bit keys widened too), several chunks, a wrapped
  // ring, fresh rows, rotation, the tiled forward, functions.
  using T = TensorType;
  for (auto [kt, vt] : {std::pair{T::q8_0, T::q4_0}, std::pair{T::q4_0, T::q8_0},
                        std::pair{T::q8_0, T::q4_1}, std::pair{T::f32, T::q4_0},
                        std::pair{T::q8_0, T::f16}, std::pair{T::f16, T::q8_0},
                        std::pair{T::bf16, T::f32}}) {
    const std::optional<TensorType> v = vt;
    const int64_t D = in_blocks(kt) || in_blocks(vt) ? 64 : 16;
    cases.push_back({.type = kt, .v_type = v, .Tq = 1});
    cases.push_back({.type = kt, .v_type = v, .Tq = 3, .window = 5, .alibi = true});
    cases.push_back({.type = kt, .v_type = v, .Tq = 1, .Hq = 32});
    cases.push_back({.type = kt, .v_type = v, .Tq = 2, .window = 300, .Hq = 8, .L = 1100});
    cases.push_back({.type = kt, .v_type = v, .slots = 600, .Tq = 2, .window = 590, .L = 1100});
    cases.push_back({.type = kt, .v_type = v, .slots = 6, .Tq = 3, .window = 5, .fresh = true});
    cases.push_back({.type = kt, .v_type = v, .Tq = 1, .rotation = D, .sinks = true});
    cases.push_back({.type = kt, .v_type = v, .Tq = 40, .L = 300});
    cases.push_back({.type = kt, .v_type = v, .Tq = 3, .functions = 3});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Storage, StoredAttention, ::testing::ValuesIn(stored_cases()),
                         [](const auto& info) { return name_of(info.param); });

// Over a cache a mask function reads positions: a BlockMask must cover the cache's length, and
// a ring may not have lost a position the function shows a query.
TEST(StoredAttentionFunctions, ErrorsNameWhatIsWrong) {
  using namespace mask_args;
  const int64_t H = 2, D = 8, L = 40, slots = 16;
  std::vector<float> rows(H * L * D, 0.5f), out(H * D);
  StoredKV kv{.k = rows.data(),
              .v = rows.data(),
              .batch_stride = H * L * D,
              .head_stride = L * D,
              .row_stride = D,
              .heads = H,
              .dim_k = D,
              .dim_v = D,
              .length = L};
  std::vector<float> q(H * D, 1.0f);
  AttentionArgs a{.q = View(q.data(), {1, H, 1, D}), .out = View(out.data(), {1, H, 1, D})};
  auto error_of = [&](const StoredKV& cache) -> std::string {
    try {
      attention(a, cache);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const BlockMask short_mask = create_block_mask(kv_idx <= q_idx, 1, 1, L - 1, L - 1, 16);
  a.block_mask = &short_mask;
  EXPECT_NE(error_of(kv).find("make it for the cache's capacity"), std::string::npos);
  // A ring of 16 slots holds positions 24 … 39: a window of 16 as a function is fine there,
  // a causal function sees position 0, which the ring lost.
  StoredKV ring = kv;
  ring.slots = slots;
  const BlockMask window = create_block_mask(q_idx - kv_idx < slots && kv_idx <= q_idx, 1, 1, L, L);
  a.block_mask = &window;
  EXPECT_EQ(error_of(ring), "");
  const BlockMask causal = create_block_mask(kv_idx <= q_idx, 1, 1, L, L);
  a.block_mask = &causal;
  EXPECT_NE(error_of(ring).find("the queries see position 0, but the ring of 16 slots holds "
                                "positions from 24 on"),
            std::string::npos);
  const BlockMask reads_b = create_block_mask(kv_idx <= q_idx + b, 2, 1, L, L);
  a.block_mask = &reads_b;
  EXPECT_NE(error_of(kv).find("reads b"), std::string::npos);
}

// Int8 scores (CacheScores::int8, decoding): the reference over the query as the kernel
// rounds it (scaled, per 32-block: d = max|x| / 127, x · (1 / d) to nearest) gives the same
// result within fp32 rounding: the integer block sums times the two scales are exactly the
// products of the rounded query with the stored keys. Keys past a whole 16 (37 positions),
// several chunks (300), 4 and 12 rows per key/value head, D 64 and 128. Where the CPU has no
// byte dot product the scores are exact, and that is what is checked.
// Each block's scale d and each value's integer n (v = d n, plus Q4_1's min) of `rows` stored
// rows of D values, read from the bytes as the formats define them.
void stored_integers(TensorType type, const uint8_t* bytes, int64_t rows, int64_t D,
                     std::vector<float>& d, std::vector<float>& n) {
  const int64_t blocks = rows * D / 32, size = type == TensorType::q8_0   ? 34
                                               : type == TensorType::q4_0 ? 18
                                                                          : 20;
  const int64_t data = type == TensorType::q4_1 ? 4 : 2;
  d.resize(blocks), n.resize(blocks * 32);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = bytes + b * size;
    d[b] = half_to_float(static_cast<uint16_t>(blk[0] | blk[1] << 8));
    for (int64_t i = 0; i < 32; ++i)
      n[b * 32 + i] = type == TensorType::q8_0
                          ? static_cast<int8_t>(blk[data + i])
                          : (i < 16 ? blk[data + i] & 15 : blk[data + i - 16] >> 4) -
                                (type == TensorType::q4_0 ? 8 : 0);
  }
}

// Where P is rounded to 8 bits too, the tolerance adds that rounding's bound.
TEST(StoredAttentionInt8Scores, AreTheReferenceOverTheRoundedQuery) {
  const int64_t Hq = 8, Hkv = 2;
  int reached = 0, values_reached = 0, runs = 0;
  // Both byte products: vpdpbusd where the CPU has it, and vpmaddubsw + vpmaddwd forced.
  for (const char* units : {"", "int8=vpmaddubsw"})
    for (TensorType type : {TensorType::q8_0, TensorType::q4_0, TensorType::q4_1})
      for (int64_t D : {64, 128})
        for (int64_t L : {37, 300})
          for (int64_t Tq : {1, 3}) {
            SCOPED_TRACE(::testing::Message() << to_string(type) << " D " << D << " L " << L
                                              << " Tq " << Tq << " units '" << units << "'");
            set_units(units);
            std::mt19937 rng(static_cast<unsigned>(D + L + Tq));
            std::normal_distribution<float> normal;
            Tensor k({1, Hkv, L, D}), v({1, Hkv, L, D}), q({1, Hq, Tq, D}), rounded({1, Hq, Tq, D});
            for (int64_t i = 0; i < q.numel(); ++i) q.data()[i] = normal(rng);
            std::vector<uint8_t> kq, vq;
            for (Tensor* t : {&k, &v})
              for (int64_t r = 0; r < Hkv * L; ++r) {
                float* row = t->data() + r * D;
                for (int64_t d = 0; d < D; ++d) row[d] = normal(rng);
                const auto bytes = quant::quantize(type, row, D);
                quant::dequantize(type, bytes.data(), D, row);
                (t == &k ? kq : vq).insert((t == &k ? kq : vq).end(), bytes.begin(), bytes.end());
              }
            const float scale = 1 / std::sqrt(static_cast<float>(D));
            testing::round_query_like_int8_scores(q.data(), q.numel(), scale, rounded.data());
            const StoredKV kv{.type = type,
                              .k = kq.data(),
                              .v = vq.data(),
                              .batch_stride = Hkv * L * D,
                              .head_stride = L * D,
                              .row_stride = D,
                              .heads = Hkv,
                              .dim_k = D,
                              .dim_v = D,
                              .length = L};
            Tensor out({1, Hq, Tq, D}), expected({1, Hq, Tq, D});
            AttentionArgs a{.q = q, .out = out};
            a.mask.causal = true;
            detail::kernels_reached() = 0;
            attention(a, kv);
            const bool int8 = (detail::kernels_reached().load() &
                               static_cast<uint32_t>(detail::Variant::decode_rows_int8)) != 0;
            reached += int8, ++runs;
            const bool int8_p = (detail::kernels_reached().load() &
                                 static_cast<uint32_t>(detail::Variant::decode_values_int8)) != 0;
            values_reached += int8_p;
            AttentionArgs r = a;
            r.q = int8 ? rounded : q, r.k = k, r.v = v, r.out = expected;
            reference::attention(r);
            // Where P was rounded to u8, each row's bound on that rounding (int8_query.h).
            std::vector<float> scales, ints;
            if (int8_p) stored_integers(type, vq.data(), Hkv * L, D, scales, ints);
            for (int64_t h = 0; h < Hq; ++h)
              for (int64_t t = 0; t < Tq; ++t) {
                const int64_t hkv = h / (Hq / Hkv), end = L - Tq + t + 1, row = h * Tq + t;
                std::vector<double> bound(D, 0.0);
                if (int8_p) {
                  // P's levels: 8 bits, 7 with a sign for Q4_0 and, on vpmaddubsw (whose int16
                  // pairs would overflow at 255 · 127 · 2), against Q8_0's bytes.
                  const bool pairs = cache_values_unit("q8_0", D, Tq * (Hq / Hkv)) == "vpmaddubsw";
                  const int levels =
                      type == TensorType::q4_0 || (type == TensorType::q8_0 && pairs) ? 127 : 255;
                  std::vector<double> s(end);
                  for (int64_t j = 0; j < end; ++j) {
                    double dot = 0;
                    for (int64_t e = 0; e < D; ++e)
                      dot += double((int8 ? rounded : q).data()[row * D + e]) *
                             k.data()[(hkv * L + j) * D + e];
                    s[j] = dot * scale;
                  }
                  bound = testing::int8_p_bound(s, end, scales.data() + hkv * L * (D / 32),
                                                ints.data() + hkv * L * D, D, levels);
                }
                for (int64_t e = 0; e < D; ++e)
                  ASSERT_NEAR(out.data()[row * D + e], expected.data()[row * D + e],
                              2e-5 + bound[e])
                      << (int8 ? "int8" : "exact") << " scores, " << (int8_p ? "int8" : "fp32")
                      << " P, row " << row << " column " << e;
              }
          }
  set_units("");
  std::printf("int8 scores ran in %d of %d cases, int8 P in %d, on target %s\n", reached, runs,
              values_reached, current_target().c_str());
}

// The mistakes a caller can make get errors that name them.
// A bf16 query and output (a bf16 model's attention) against q8_0 blocks, one query
// (split-KV decoding) and several (the tiled forward): the query read as bf16 as against any
// cache, the output the fp32 result rounded to bf16 once.
TEST(StoredAttentionBf16Query, AgainstBlocks) {
  const int64_t Hq = 4, Hkv = 2, L = 50, D = 64;
  for (int64_t Tq : {1, 6}) {
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-1, 1);
    Tensor k({1, Hkv, L, D}), v({1, Hkv, L, D}), q({1, Hq, Tq, D}), expected({1, Hq, Tq, D});
    std::vector<uint16_t> qb(q.numel()), ob(q.numel());
    for (int64_t i = 0; i < q.numel(); ++i)
      qb[i] = float_to_bf16(u(rng)), q.data()[i] = bf16_to_float(qb[i]);
    std::vector<uint8_t> kq, vq;
    for (Tensor* t : {&k, &v})
      for (int64_t r = 0; r < Hkv * L; ++r) {
        float* row = t->data() + r * D;
        for (int64_t d = 0; d < D; ++d) row[d] = u(rng);
        const auto bytes = quant::quantize(TensorType::q8_0, row, D);
        quant::dequantize(TensorType::q8_0, bytes.data(), D, row);  // what the blocks hold
        (t == &k ? kq : vq).insert((t == &k ? kq : vq).end(), bytes.begin(), bytes.end());
      }
    const StoredKV kv{.type = TensorType::q8_0,
                      .k = kq.data(),
                      .v = vq.data(),
                      .batch_stride = Hkv * L * D,
                      .head_stride = L * D,
                      .row_stride = D,
                      .heads = Hkv,
                      .dim_k = D,
                      .dim_v = D,
                      .length = L};
    View qv(reinterpret_cast<bf16*>(qb.data()), {1, Hq, Tq, D}),
        ov(reinterpret_cast<bf16*>(ob.data()), {1, Hq, Tq, D});
    qv.type = ov.type = TensorType::bf16;
    AttentionArgs a{.q = qv, .out = ov};
    a.mask.causal = true;
    attention(a, kv);
    AttentionArgs r{.q = q, .k = k, .v = v, .out = expected};
    r.mask.causal = true;
    reference::attention(r);
    for (int64_t i = 0; i < q.numel(); ++i)  // |x| < 1: half a bf16 ulp is at most 2^-9
      ASSERT_NEAR(bf16_to_float(ob[i]), expected.data()[i], 2.5e-3)
          << "Tq " << Tq << ", element " << i;
  }
}

TEST(StoredAttentionErrors, NameWhatIsWrong) {
  std::vector<float> rows(2 * 8 * 4, 0.5f);
  Tensor q({1, 2, 1, 4}), out({1, 2, 1, 4});
  StoredKV kv{.k = rows.data(),
              .v = rows.data(),
              .batch_stride = 2 * 8 * 4,
              .head_stride = 8 * 4,
              .row_stride = 4,
              .heads = 2,
              .dim_k = 4,
              .dim_v = 4,
              .length = 8};
  AttentionArgs a{.q = q, .out = out};
  EXPECT_NO_THROW(attention(a, kv));
  auto fails = [&](AttentionArgs x, StoredKV s, const std::string& words) {
    try {
      attention(x, s);
      ADD_FAILURE() << "no error; expected one naming " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  AttentionArgs with_k = a;
  with_k.k = q;
  fails(with_k, kv, "leave args.k");
  StoredKV q41 = kv;
  q41.type = TensorType::q4_1;
  fails(a, q41, "Q4_1");
  StoredKV q8 = kv;  // rows of 4 values
  q8.type = TensorType::q8_0;
  fails(a, q8, "multiples of 32");
  AttentionArgs biased = a;
  biased.mask.bias = View(rows.data(), {1, 8});
  fails(biased, kv, "bias");
  StoredKV ring = kv;
  ring.slots = 3;  // holds positions 5 … 7; a query at 7 with a window of 4 sees 3 …
  AttentionArgs windowed = a;
  windowed.mask.window_left = 4;
  fails(windowed, ring, "holds positions from 5");
  StoredKV short_cache = kv;
  short_cache.length = 0;
  fails(a, short_cache, "fewer than the 1 queries");
  StoredKV wide = kv;
  wide.dim_k = 8;
  fails(a, wide, "head dim");
  for (int64_t block : {-4, 3, 8}) {  // not a power of two, or not dividing the head dim of 4
    StoredKV rotated = kv;
    rotated.rotation = block;
    fails(a, rotated, "rotation " + std::to_string(block));
  }
}

}  // namespace
}  // namespace qkv
