// The one place that chooses what an attention call runs (plan.h).
#include "attention/plan.h"

#include <string>
#include <vector>

#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "qkv/number_format.h"
#include "qkv/targets.h"
#include "qkv/tensor.h"
#include "simd/amx.h"
#include "simd/units.h"

namespace qkv::detail {

Call call_of(const AttentionArgs& a, const KvRows& K, const KvRows& V) {
  Call c;
  c.k = K.type, c.v = V.type;
  c.queries = a.q.shape[2], c.keys = K.rows;
  c.query_heads = a.q.shape[1], c.kv_heads = K.heads;
  c.dim = a.q.shape[3], c.dim_v = V.dim;
  c.int8_scores = K.int8_scores;
  c.dropout = a.dropout.p > 0;
  return c;
}

Call call_of(const AttentionArgs& a) {
  Call c;
  c.k = a.k.type, c.v = a.v.type;
  c.queries = a.q.shape[2], c.keys = a.k.shape[2];
  c.query_heads = a.q.shape[1], c.kv_heads = a.k.shape[1];
  c.dim = a.q.shape[3], c.dim_v = a.v.shape[3];
  c.dropout = a.dropout.p > 0;
  return c;
}

namespace {

bool both_bf16(const Call& c) { return c.k == TensorType::bf16 && c.v == TensorType::bf16; }

// The bf16-unit pass takes bf16 keys and values of whole pairs while simd::bf16_units() says
// so; its kernels are 512-bit AVX-512 ones on x86 and 128-bit NEON ones on AArch64.
bool on_bf16_units(const Call& c, bool backward) {
  return simd::kBf16UnitKernels && both_bf16(c) && c.dim % 2 == 0 &&
         (!backward || c.dim_v % 2 == 0) && simd::bf16_units();
}

// The facts of the pass that runs the call.
KernelFacts facts_for(bool bf16_units) {
  KernelFacts f = kernel_facts();
  if (bf16_units) f.lanes = kBf16UnitBlock / 2;  // (its pairs' fp32 lanes)
  return f;
}

// AMX-BF16 tiles: only where forced (QKV_UNITS=bf16=amx), for bf16 keys and values whose
// dims fit the tiles; a tile row holds at most 16 fp32 lanes.
bool on_amx(const Call& c, const KernelFacts& f, bool backward) {
  return f.amx_unit && both_bf16(c) && simd::unit_of(simd::Work::bf16) == simd::Unit::amx &&
         amx_fits(c.dim, c.dim_v, backward) && f.lanes <= 16;
}

// The byte product's name: the one rule of simd::vnni_in_use, as the weights' products use it.
const char* byte_unit(const KernelFacts& f) {
#if defined(__aarch64__)
  return f.byte_dot ? "sdot" : "int16";
#else
  return !f.byte_dot ? "vpmaddubsw" : f.wide ? "vpdpbusd" : "avx_vnni";
#endif
}

Plan on_units(Variant fma, Variant bf16_dot, Variant amx, const Plan& p, bool tiles_amx) {
  Plan out = p;
  out.variant = tiles_amx ? amx : p.bf16_units ? bf16_dot : fma;
  out.unit = tiles_amx ? "amx" : p.bf16_units ? "bf16_dot" : "fma";
  return out;
}

Plan plan_decode(const Call& c) {
  Plan p;
  p.driver = Driver::split_kv_decode;
  p.bf16_units = on_bf16_units(c, false);
  const KernelFacts f = facts_for(p.bf16_units);
  const bool one_format = c.k == c.v, blocks = is_kv_block_type(c.k);
  const int64_t R = c.rows_per_kv_head();
  if (!blocks && one_format && c.dim < f.lanes && c.dim_v < f.lanes && R <= kMaxRowsInLanes) {
    p.variant = Variant::decode_keys_in_lanes;  // (block rows: never below a vector)
  } else if (on_amx(c, f, false)) {
    // (at any number of rows: a tile's unused query lanes cost tile products, which are not
    // what bounds a decode)
    p.variant = Variant::decode_tiled_amx, p.unit = "amx";
  } else if (blocks && f.byte_products && c.int8_scores && R < kTiledDecodeMinRows) {
    p.variant = Variant::decode_rows_int8, p.unit = byte_unit(f), p.byte_dot = f.byte_dot;
    p.values_on_bytes = one_format && int8_values_on_bytes(c.k, c.dim_v, R);
  } else if (R >= kTiledDecodeMinRows) {
    p = on_units(Variant::decode_tiled, Variant::decode_tiled_bf16_dot, Variant::decode_tiled,
                 p, false);
  } else if (p.bf16_units && c.dim % kBf16UnitBlock == 0 && c.dim_v % kBf16UnitBlock == 0) {
    p.variant = Variant::decode_rows_bf16_dot, p.unit = "bf16_dot";
  } else {
    p.variant = Variant::decode_rows;
  }
  return p;
}

}  // namespace

Plan plan_tiled_forward(const Call& c) {
  Plan p;
  p.bf16_units = on_bf16_units(c, false);
  return on_units(Variant::forward_tiles, Variant::forward_tiles_bf16_dot,
                  Variant::forward_tiles_amx, p, on_amx(c, facts_for(p.bf16_units), false));
}

Plan plan_forward(const Call& c) {
  // A few queries (decoding against a cache): split the keys instead of the queries, so every
  // core streams its share of K and V. (Dropout runs on the tiled kernel at any length.)
  if (!c.dropout && decodes(c.queries, c.keys, c.query_heads / c.kv_heads)) return plan_decode(c);
  return plan_tiled_forward(c);
}

Plan plan_backward(const Call& c) {
  Plan p;
  p.driver = Driver::tiled_backward;
  p.bf16_units = on_bf16_units(c, true);
  return on_units(Variant::backward_tiles, Variant::backward_tiles_bf16_dot,
                  Variant::backward_tiles_amx, p, on_amx(c, facts_for(p.bf16_units), true));
}

namespace {

struct VariantRow {
  Variant variant;
  const char* name;
  const char* what;
};
constexpr VariantRow kVariants[] = {
    {Variant::forward_tiles, "forward_tiles",
     "the tiled forward: 4 vectors of queries against 64-key tiles on the FMAs, 16-bit and "
     "block rows widened to fp32 a tile at a time"},
    {Variant::forward_tiles_bf16_dot, "forward_tiles_bf16_dot",
     "the tiled forward with bf16 keys and values multiplied as pairs on the bf16 dot unit"},
    {Variant::forward_tiles_amx, "forward_tiles_amx",
     "the tiled forward on AMX-BF16 tiles (forced: QKV_UNITS=bf16=amx)"},
    {Variant::decode_rows, "decode_rows",
     "split-KV decoding, up to 15 query rows per kv head with their sums in registers, on the "
     "FMAs"},
    {Variant::decode_rows_bf16_dot, "decode_rows_bf16_dot",
     "split-KV decoding, the rows in registers, bf16 keys and values as pairs on the bf16 dot "
     "unit"},
    {Variant::decode_rows_int8, "decode_rows_int8",
     "split-KV decoding with the queries rounded to int8 blocks, Q·K on byte products"},
    {Variant::decode_values_int8, "decode_values_int8",
     "P·V on the same byte products, P rounded to 8 bits per value block and 64 keys"},
    {Variant::decode_tiled, "decode_tiled",
     "split-KV decoding, 16 or more query rows per kv head in vector lanes (the tiled "
     "kernels' pieces), on the FMAs"},
    {Variant::decode_tiled_bf16_dot, "decode_tiled_bf16_dot",
     "split-KV decoding, the rows in vector lanes, bf16 as pairs on the bf16 dot unit"},
    {Variant::decode_tiled_amx, "decode_tiled_amx",
     "split-KV decoding on AMX-BF16 tiles (forced: QKV_UNITS=bf16=amx)"},
    {Variant::decode_keys_in_lanes, "decode_keys_in_lanes",
     "split-KV decoding for head dims below a vector: the keys in the lanes"},
    {Variant::backward_tiles, "backward_tiles", "the tiled backward on the FMAs"},
    {Variant::backward_tiles_bf16_dot, "backward_tiles_bf16_dot",
     "the tiled backward with bf16 multiplied as pairs on the bf16 dot unit"},
    {Variant::backward_tiles_amx, "backward_tiles_amx",
     "the tiled backward on AMX-BF16 tiles (forced: QKV_UNITS=bf16=amx)"},
};

const VariantRow& row_of(Variant v) {
  for (const VariantRow& r : kVariants)
    if (r.variant == v) return r;
  fail("attention: variant ", static_cast<uint32_t>(v), " is missing from the plan table");
}

}  // namespace

const char* variant_name(Variant v) { return row_of(v).name; }

std::string plan_why(const Plan& p) {
  std::string why = row_of(p.variant).what;
  if (p.variant == Variant::decode_rows_int8)
    why += p.values_on_bytes ? std::string("; ") + row_of(Variant::decode_values_int8).what
                             : "; P·V widened to fp32";
  return why;
}

}  // namespace qkv::detail

namespace qkv {

using detail::Call;
using detail::Plan;

namespace {

// A decode of one query against a block cache with int8 scores: 4 query rows per kv head,
// dims 128 (SmolLM2's GQA shape).
Call cache_decode(TensorType format, int64_t dim_v, int64_t rows) {
  Call c;
  c.k = c.v = format;
  c.keys = 4096, c.query_heads = rows, c.kv_heads = 1, c.dim = 128, c.dim_v = dim_v;
  c.int8_scores = true;
  return c;
}

}  // namespace

std::vector<UnitInUse> units_in_use() {
  std::vector<UnitInUse> out;
  // Each line is the plan of a representative call: a prompt's forward for the element types
  // (head dim 128, 2048 queries and keys), a decode for the caches.
  const auto forward = [](TensorType t) {
    Call c;
    c.k = c.v = t;
    c.queries = c.keys = 2048, c.dim = c.dim_v = 128;
    return detail::plan_forward(c);
  };
  for (const TensorType t : kKvElementTypes) {
    const Plan p = forward(t);
    std::string why = detail::plan_why(p);
    if (t == TensorType::bf16) {
      const simd::UnitChoice bf16 = simd::unit_for(simd::Work::bf16);
      if (p.unit == std::string("amx"))
        why += amx::stand_in() ? "; on the stand-in (QKV_AMX_STAND_IN)" : "";
      else if ((bf16.unit == simd::Unit::bf16_dot) == p.bf16_units)
        why = bf16.why + "; " + why;  // (the registry's reason)
      else
        why = "target " + current_target() + " forced; " + why;
    }
    out.push_back({lower_name(t), p.unit, why});
  }
  for (const TensorType t : kKvBlockTypes) {
    const Plan p = detail::plan_forward(cache_decode(t, 128, 4));
    out.push_back({lower_name(t) + " cache", p.unit,
                   "decoding 1 query, 4 query heads a kv head, dims 128 (--cache-scores int8): " +
                       detail::plan_why(p)});
  }
  return out;
}

namespace {

KernelPlan public_plan(const Plan& p) {
  const bool values_apart = p.variant == detail::Variant::decode_rows_int8 && !p.values_on_bytes;
  return {detail::variant_name(p.variant), p.unit, values_apart ? "fma" : p.unit,
          detail::plan_why(p)};
}

void check_unpacked(const AttentionArgs& args, const char* where) {
  check(args.packed.num_seqs == 0, where,
        ": packed sequences run a plan each (ask for one sequence's args)");
  check(args.q.ndim == 4, where, ": q must be [B, Hq, Tq, D]");
}

}  // namespace

KernelPlan attention_plan(const AttentionArgs& args) {
  check_unpacked(args, "attention_plan");
  check(args.k.ndim == 4 && args.v.ndim == 4,
        "attention_plan: k and v must be [B, Hkv, Tk, D]");
  const Call c = detail::call_of(args);
  // (A strided head dim is copied and tiled: attention.cpp's forward_one.)
  const bool strided = args.k.stride[3] != 1 || args.v.stride[3] != 1;
  return public_plan(strided ? detail::plan_tiled_forward(c) : detail::plan_forward(c));
}

KernelPlan attention_plan(const AttentionArgs& args, const StoredKV& kv) {
  check_unpacked(args, "attention_plan");
  return public_plan(detail::plan_forward(detail::call_of(args, kv)));
}

KernelPlan attention_backward_plan(const AttentionArgs& args) {
  check_unpacked(args, "attention_backward_plan");
  check(args.k.ndim == 4 && args.v.ndim == 4,
        "attention_backward_plan: k and v must be [B, Hkv, Tk, D]");
  return public_plan(detail::plan_backward(detail::call_of(args)));
}

std::string cache_values_unit(const std::string& cache, int64_t dim_v, int64_t rows) {
  const TensorType type = cache_element_type(cache_type(cache));
  if (!is_kv_block_type(type))
    throw Error("cache_values_unit: '" + cache +
                "' is not a cache of 32-value blocks (q8_0, q4_0, q4_1)");
  if (dim_v < 1 || rows < 1)
    throw Error("cache_values_unit: dim_v " + std::to_string(dim_v) + " and rows " +
                std::to_string(rows) + " must be positive");
  const Plan p = detail::plan_forward(cache_decode(type, dim_v, rows));
  return p.values_on_bytes ? p.unit : "fma";
}

}  // namespace qkv
