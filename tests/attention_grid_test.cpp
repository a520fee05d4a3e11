// The kernel grid, in the manner of ggml's test-backend-ops: every attention driver × key/value
// format × row source × product unit × option, on tiny shapes, against the reference kernel
// over the same keys and values as the format stores them. Each combination is forced (the
// unit through qkv::set_units, the driver through its shape), named in the output, and asserts
// the kernel variant it reached (detail::kernels_reached()). The full cross runs: every pair
// of axes is covered. Combinations that cannot exist (blocks below 32 values, a unit the CPU
// lacks) are counted as skipped, with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention/kernels.h"
#include "attention/plan.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/mask_function.h"
#include "qkv/number_format.h"
#include "qkv/quant.h"
#include "qkv/score_function.h"
#include "qkv/targets.h"
#include "qkv/tensor.h"
#include "simd/amx.h"
#include "int8_query.h"

namespace qkv {
namespace {

using detail::Variant;

enum class Driver { forward, decode_rows, decode_tiled, decode_keys_in_lanes, backward };
enum class Source { view, cache, ring };
enum class Option {
  plain,
  causal,
  window,
  alibi,
  softcap,
  bias,
  sinks,
  dropout,
  mask_function,
  score_function
};

const char* name_of(Driver d) {
  const char* names[] = {"forward", "decode_rows", "decode_tiled", "decode_keys_in_lanes",
                         "backward"};
  return names[static_cast<int>(d)];
}
const char* name_of(Source s) {
  const char* names[] = {"view", "cache", "ring"};
  return names[static_cast<int>(s)];
}
const char* name_of(Option o) {
  const char* names[] = {"plain", "causal",  "window",        "alibi",         "softcap",
                         "bias",  "sinks",   "dropout",       "mask_function", "score_function"};
  return names[static_cast<int>(o)];
}
std::string name_of(TensorType t) { return lower_name(t); }

struct Shape {
  int64_t Hq, Hkv, Tq, Tk, D;
};
// Each driver's shape: the tiled forward takes 40 queries; decoding one query per head with 2
// rows per kv head (rows in registers), 16 (tiles), or a head dim below every vector (keys in
// the lanes, 2 elements: below SSE4's 4 lanes too).
Shape shape_of(Driver d) {
  switch (d) {
    case Driver::forward:
    case Driver::backward:
      return {2, 1, 40, 150, 32};
    case Driver::decode_rows:
      return {4, 2, 1, 300, 64};
    case Driver::decode_tiled:
      return {32, 2, 1, 300, 32};
    default:
      return {4, 2, 1, 300, 2};
  }
}

// Keys or values of Hkv × rows × D as `type` stores them, and as fp32 (what the storage holds,
// read back: rounded or dequantized), for the reference.
struct Stored {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};
Stored store(TensorType type, const std::vector<float>& x, int64_t D) {
  Stored s;
  s.values = x;
  const int64_t rows = static_cast<int64_t>(x.size()) / D;
  if (type == TensorType::f32) {
    s.bytes.resize(x.size() * 4);
    std::memcpy(s.bytes.data(), x.data(), s.bytes.size());
  } else if (type == TensorType::bf16 || type == TensorType::f16) {
    s.bytes.resize(x.size() * 2);
    auto* bits = reinterpret_cast<uint16_t*>(s.bytes.data());
    for (size_t i = 0; i < x.size(); ++i) {
      bits[i] = type == TensorType::bf16 ? float_to_bf16(x[i]) : float_to_half(x[i]);
      s.values[i] = type == TensorType::bf16 ? bf16_to_float(bits[i]) : half_to_float(bits[i]);
    }
  } else {
    const int64_t row_bytes = quant::row_bytes(type, D);
    s.bytes.resize(rows * row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
      quant::quantize_into(type, &x[r * D], D, s.bytes.data() + r * row_bytes);
      quant::dequantize(type, s.bytes.data() + r * row_bytes, D, &s.values[r * D]);
    }
  }
  return s;
}

// Whether int8 scores run on the target in use: x86-64 from AVX2 and AArch64 (a byte dot
// product unit named for the caches in units_in_use); elsewhere the scores are exact.
bool byte_dot_here() {
  for (const UnitInUse& u : units_in_use())
    if (u.data == "q8_0 cache") return u.unit != "fma";
  return false;
}

// Whether decoding's P·V over a q8_0/q4_0/q4_1 cache runs in integers now, for a value dim of
// Dv and R rows per kv head, as the docs state it: on the x86 byte products (vpdpbusd on the
// 512-bit targets; AVX-VNNI or vpmaddubsw on AVX2) for value dims of whole 64s (512 bits) or
// 32s (256) up to 256, Q8_0 (and on AVX2 Q4_1) from 2 rows; and that cache_values_unit() says
// the same.
bool int8_values_here(TensorType format, int64_t Dv, int64_t R) {
  std::string unit;
  for (const UnitInUse& u : units_in_use())
    if (u.data == "q8_0 cache") unit = u.unit;
  const bool wide = current_target().rfind("avx512", 0) == 0;
  const bool on = (wide ? unit == "vpdpbusd" : unit == "avx_vnni" || unit == "vpmaddubsw") &&
                  Dv % (wide ? 64 : 32) == 0 && Dv <= 256 &&
                  (R >= 2 || format == TensorType::q4_0 || (wide && format == TensorType::q4_1));
  EXPECT_EQ(cache_values_unit(name_of(format), Dv, R), on ? unit : "fma")
      << name_of(format) << " Dv " << Dv << " R " << R;
  return on;
}

// Whether the bf16 dot unit multiplies bf16 data now (the unit forced, and the target allows it).
bool bf16_dot_in_use() {
  for (const UnitInUse& u : units_in_use())
    if (u.data == "bf16") return u.unit == "bf16_dot";
  return false;
}

struct Outcome {
  int ran = 0;
  std::map<std::string, int> skipped;  // reason → count
};

// One combination: its output against the reference's, and the variant it reached.
void run_case(Driver driver, TensorType format, Source source, const std::string& unit,
              Option option, Outcome& outcome) {
  const Shape sh = shape_of(driver);
  const std::string name = std::string(name_of(driver)) + "_" + name_of(format) + "_" +
                           name_of(source) + "_" + unit + "_" + name_of(option);
  SCOPED_TRACE(name);
  const bool blocks = is_kv_block_type(format);
  if (blocks && sh.D % kKvBlockValues != 0) {
    ++outcome.skipped["a block format needs head dims of whole 32s"];
    return;
  }
  if (blocks && source == Source::view) {
    ++outcome.skipped["a block format is read through a cache (StoredKV), not a view"];
    return;
  }
  const bool int8 = unit == "int8";  // CacheScores::int8 (the "fma" unit reads blocks exactly)
  if (int8 && !blocks) {
    ++outcome.skipped["int8 scores multiply q8_0, q4_0 and q4_1 keys only"];
    return;
  }
  if (int8 && source == Source::view) return;  // (counted above, under the fma unit)
  if ((option == Option::bias || option == Option::dropout) && source != Source::view) {
    ++outcome.skipped["a bias and dropout are for views (attention over a cache refuses them)"];
    return;
  }
  if ((option == Option::mask_function || option == Option::score_function) &&
      source != Source::view) {
    ++outcome.skipped["functions over a cache read positions (attention_stored_test)"];
    return;
  }
  const bool backward = driver == Driver::backward;
  if (backward && (blocks || source != Source::view)) {
    ++outcome.skipped["the backward reads views of f32, bf16 or f16"];
    return;
  }
  if (unit == "amx" && format != TensorType::bf16) {
    ++outcome.skipped["amx multiplies bf16 rows only (other rows run as with fma)"];
    return;
  }
  if (unit == "amx" && current_target().rfind("avx", 0) != 0) {
    ++outcome.skipped["the AMX unit is compiled for x86-64's AVX2 and AVX-512 targets only"];
    return;
  }
  try {
    set_units(int8 ? "" : "bf16=" + unit);
  } catch (const Error&) {
    ++outcome.skipped["the CPU (or build) has no " + unit + " unit"];
    return;
  }
  const int64_t Hq = sh.Hq, Hkv = sh.Hkv, Tq = sh.Tq, Tk = sh.Tk, D = sh.D;
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>{}(name)));
  std::uniform_real_distribution<float> u(-1, 1);
  // A ring holds the last `slots` positions, out of order; the queries see exactly those.
  const int64_t slots = source == Source::ring ? Tk - 37 : Tk;
  std::vector<float> k(Hkv * slots * D), v(Hkv * slots * D), kp(Hkv * Tk * D), vp(Hkv * Tk * D);
  for (float* x : {kp.data(), vp.data()})
    for (int64_t i = 0; i < Hkv * Tk * D; ++i) x[i] = u(rng);
  // kp, vp: positions in order; k, v: as the storage lays them (row p mod slots).
  for (int64_t h = 0; h < Hkv; ++h)
    for (int64_t p = Tk - slots; p < Tk; ++p)
      for (int64_t d = 0; d < D; ++d) {
        k[(h * slots + p % slots) * D + d] = kp[(h * Tk + p) * D + d];
        v[(h * slots + p % slots) * D + d] = vp[(h * Tk + p) * D + d];
      }
  const Stored ks = store(format, k, D), vs = store(format, v, D);
  for (int64_t h = 0; h < Hkv; ++h)  // the reference reads what the storage holds
    for (int64_t p = Tk - slots; p < Tk; ++p)
      for (int64_t d = 0; d < D; ++d) {
        kp[(h * Tk + p) * D + d] = ks.values[(h * slots + p % slots) * D + d];
        vp[(h * Tk + p) * D + d] = vs.values[(h * slots + p % slots) * D + d];
      }
  Tensor q({1, Hq, Tq, D}), got({1, Hq, Tq, D}), want({1, Hq, Tq, D});
  for (int64_t i = 0; i < q.numel(); ++i) q.data()[i] = u(rng);
  std::vector<float> slopes(Hq), sinks(Hq), bias(Hq * Tq * Tk), lse(Hq * Tq), ref_lse(Hq * Tq);
  for (int64_t h = 0; h < Hq; ++h) slopes[h] = 0.02f * static_cast<float>(h + 1);
  for (int64_t h = 0; h < Hq; ++h) sinks[h] = 0.5f * static_cast<float>(h) - 0.25f;
  for (float& x : bias) x = u(rng);
  // Functions that read every index (a mask with holes in every row; a score offset by both).
  const BlockMask block_mask =
      create_block_mask(parse_mask("(q_idx + 2 * kv_idx) % 5 != 1"), 1, 1, Tq, Tk, 32);
  const ScoreFunction score_mod(
      parse_score("score + 0.01 * float(kv_idx % 7) - 0.02 * float(q_idx % 3)"));
  AttentionArgs args{.q = q, .out = got};
  if (backward) args.lse = lse.data();
  switch (option) {
    case Option::causal:
      args.mask.causal = true;
      break;
    case Option::window:
      args.mask.window_left = 50;
      break;
    case Option::alibi:
      args.mask.alibi = slopes.data();
      break;
    case Option::softcap:
      args.softcap = 2.0f;
      break;
    case Option::bias:
      args.mask.bias = View(bias.data(), {1, Hq, Tq, Tk});
      break;
    case Option::sinks:
      args.sinks = sinks.data();
      break;
    case Option::dropout:
      args.dropout = {.p = 0.2f, .seed = 7};
      break;
    case Option::mask_function:
      args.block_mask = &block_mask;
      break;
    case Option::score_function:
      args.score_mod = &score_mod;
      break;
    default:
      break;
  }
  if (source == Source::ring) args.mask.window_left = slots - Tq;  // what the ring holds
  detail::kernels_reached() = 0;
  KernelPlan planned;  // what the library says the call runs, asked before it runs
  if (source == Source::view) {
    const auto* bytes_k = ks.bytes.data();
    const auto* bytes_v = vs.bytes.data();
    auto* kk = const_cast<uint8_t*>(bytes_k);
    auto* vv = const_cast<uint8_t*>(bytes_v);
    if (format == TensorType::f32)
      args.k = View(reinterpret_cast<float*>(kk), {1, Hkv, Tk, D}),
      args.v = View(reinterpret_cast<float*>(vv), {1, Hkv, Tk, D});
    else if (format == TensorType::bf16)
      args.k = View(reinterpret_cast<bf16*>(kk), {1, Hkv, Tk, D}),
      args.v = View(reinterpret_cast<bf16*>(vv), {1, Hkv, Tk, D});
    else
      args.k = View(reinterpret_cast<f16*>(kk), {1, Hkv, Tk, D}),
      args.v = View(reinterpret_cast<f16*>(vv), {1, Hkv, Tk, D});
    planned = attention_plan(args);
    attention(args);
  } else {
    const StoredKV kv{.type = format,
                      .k = ks.bytes.data(),
                      .v = vs.bytes.data(),
                      .batch_stride = Hkv * slots * D,
                      .head_stride = slots * D,
                      .row_stride = D,
                      .heads = Hkv,
                      .dim_k = D,
                      .dim_v = D,
                      .length = Tk,
                      .slots = source == Source::ring ? slots : 0,
                      .scores = int8 ? CacheScores::int8 : CacheScores::exact};
    planned = attention_plan(args, kv);
    attention(args, kv);
  }
  // Int8 scores run where few rows decode and the CPU has this target's byte dot product: the
  // reference then takes the query as they round it (scaled, per 32-block: d = max|x| / 127,
  // x · (1 / d) to nearest), whose products with the keys they compute exactly.
  const bool int8_ran = int8 && driver == Driver::decode_rows && byte_dot_here();
  const bool int8_p = int8_ran && int8_values_here(format, D, Tq * (Hq / Hkv));
  Tensor rounded({1, Hq, Tq, D});
  if (int8_ran)
    testing::round_query_like_int8_scores(q.data(), q.numel(), 1 / std::sqrt(float(D)),
                                          rounded.data());
  // The reference over the positions in order.
  AttentionArgs ref = args;
  if (int8_ran) ref.q = rounded;
  ref.k = View(kp.data(), {1, Hkv, Tk, D});
  ref.v = View(vp.data(), {1, Hkv, Tk, D});
  ref.out = want;
  if (backward) ref.lse = ref_lse.data();
  reference::attention(ref);
  // The backward: the gradients of a random dout against the reference's, from each one's
  // own forward.
  Tensor dout({1, Hq, Tq, D}), dq({1, Hq, Tq, D}), dk({1, Hkv, Tk, D}), dv({1, Hkv, Tk, D});
  Tensor want_dq({1, Hq, Tq, D}), want_dk({1, Hkv, Tk, D}), want_dv({1, Hkv, Tk, D});
  if (backward) {
    for (int64_t i = 0; i < dout.numel(); ++i) dout.data()[i] = u(rng);
    detail::kernels_reached() = 0;
    planned = attention_backward_plan(args);
    attention_backward(args, dout, dq, dk, dv);
    reference::attention_backward(ref, dout, want_dq, want_dk, want_dv);
  }
  // The variant this combination must reach. A ring is read in place, in position order, by
  // every driver (run by run: the tiled forward copies together the tile its wrap splits).
  // (AMX tiles take head dims of whole 32s; dropout runs the tiled forward at any shape.)
  const bool amx = format == TensorType::bf16 && unit == "amx" && D % 32 == 0;
  const bool dot = amx || (format == TensorType::bf16 && bf16_dot_in_use());
  Variant want_variant = Variant::forward_tiles;
  switch (option == Option::dropout && !backward ? Driver::forward : driver) {
    case Driver::forward:
      want_variant = amx   ? Variant::forward_tiles_amx
                     : dot ? Variant::forward_tiles_bf16_dot
                           : Variant::forward_tiles;
      break;
    case Driver::decode_rows:  // (AMX decodes any number of rows on tiles)
      want_variant = amx        ? Variant::decode_tiled_amx
                     : dot      ? Variant::decode_rows_bf16_dot
                     : int8_ran ? Variant::decode_rows_int8
                                : Variant::decode_rows;
      if (int8_p)
        want_variant = static_cast<Variant>(static_cast<uint32_t>(Variant::decode_rows_int8) |
                                            static_cast<uint32_t>(Variant::decode_values_int8));
      break;
    case Driver::decode_tiled:
      want_variant = amx   ? Variant::decode_tiled_amx
                     : dot ? Variant::decode_tiled_bf16_dot
                           : Variant::decode_tiled;
      break;
    case Driver::decode_keys_in_lanes:
      want_variant = Variant::decode_keys_in_lanes;
      break;
    case Driver::backward:
      want_variant = amx   ? Variant::backward_tiles_amx
                     : dot ? Variant::backward_tiles_bf16_dot
                           : Variant::backward_tiles;
      break;
  }
  EXPECT_EQ(detail::kernels_reached().load(), static_cast<uint32_t>(want_variant))
      << "want " << detail::variant_name(want_variant)
      << "; variants reached (bits): " << detail::kernels_reached().load();
  // The plan asked for beforehand names the kernel, and the unit P·V ran on.
  const auto values_bit = static_cast<uint32_t>(Variant::decode_values_int8);
  EXPECT_EQ(planned.kernel, detail::variant_name(static_cast<Variant>(
                                static_cast<uint32_t>(want_variant) & ~values_bit)));
  if (int8_ran) {
    EXPECT_EQ(planned.values_unit == planned.unit, int8_p) << planned.values_unit;
  }
  // Tolerance: fp32 sums of ≤ 300 terms of O(1); the bf16 dot unit and AMX round P to bf16 (an
  // output moves by at most 2^-8 max|v|) and takes q as hi + lo (16 of its 24 bits); int8 P
  // rounds p |d| to u8 per 64 keys (its bound, checked in attention_stored_test, is of the same
  // order here).
  const float tol = dot || int8_p ? 8e-3f : 5e-5f;
  float worst = 0;
  for (int64_t i = 0; i < got.numel(); ++i)
    worst = std::max(worst, std::abs(got.data()[i] - want.data()[i]));
  EXPECT_LE(worst, tol);
  // The gradients, relative to the largest of each (sums of up to 150 terms; the bf16 units
  // also round dS and dO to bf16).
  if (backward)
    for (const auto& [name, g, w] : {std::tuple{"dq", &dq, &want_dq}, std::tuple{"dk", &dk, &want_dk},
                                     std::tuple{"dv", &dv, &want_dv}}) {
      float largest = 0, off = 0;
      for (int64_t i = 0; i < g->numel(); ++i) {
        largest = std::max(largest, std::abs(w->data()[i]));
        off = std::max(off, std::abs(g->data()[i] - w->data()[i]));
      }
      EXPECT_LE(off, (dot ? 2e-2f : 1e-4f) * largest) << name;
    }
  ++outcome.ran;
}

// AMX runs on its stand-in here (amx_test.cpp compares the instructions with it where the
// CPU has them).
class KernelGrid : public ::testing::TestWithParam<Driver> {
 protected:
  void SetUp() override { amx::set_stand_in(true); }
  void TearDown() override {
    set_units("");
    amx::set_stand_in(false);
  }
};

TEST_P(KernelGrid, EveryFormatSourceUnitAndOptionMatchesTheReference) {
  const Driver driver = GetParam();
  Outcome outcome;
  for (TensorType format : kv_row_types())
    for (Source source : {Source::view, Source::cache, Source::ring})
      for (const char* unit : {"fma", "bf16_dot", "amx", "int8"})
        for (Option option :
             {Option::plain, Option::causal, Option::window, Option::alibi, Option::softcap,
              Option::bias, Option::sinks, Option::dropout, Option::mask_function,
              Option::score_function})
          run_case(driver, format, source, unit, option, outcome);
  std::string skipped;
  for (const auto& [why, count] : outcome.skipped)
    skipped += "\n  " + std::to_string(count) + " skipped: " + why;
  std::printf("%s on %s: %d combinations ran%s\n", name_of(driver), current_target().c_str(),
              outcome.ran, skipped.c_str());
  EXPECT_GT(outcome.ran, 0);
}

INSTANTIATE_TEST_SUITE_P(Drivers, KernelGrid,
                         ::testing::Values(Driver::forward, Driver::decode_rows,
                                           Driver::decode_tiled, Driver::decode_keys_in_lanes,
                                           Driver::backward),
                         [](const auto& info) { return std::string(name_of(info.param)); });

}  // namespace
}  // namespace qkv
