// What runs for one attention call, chosen in one place. plan_forward and plan_backward read
// the registry of product units (simd/cpu.h), the kernels' facts on the target in use
// (kernel_facts, exported by decode.cpp) and the call's shape and formats, and name the
// kernel: its driver, its unit and the compilation pass it lives in. The drivers dispatch on
// the plan without choosing; `qkv info`, cache_values_unit and the tests read the same plans.
#pragma once

#include <cstdint>
#include <string>

#include "attention/kernels.h"
#include "attention/kv_rows.h"
#include "qkv/attention.h"
#include "simd/cpu.h"

namespace qkv::detail {

// Rows (GQA group × queries) per key/value head from which decoding runs the tiled kernels'
// pieces, decode_unit_tiled; below, decode_unit_rows (the two are as fast at 16 rows; below,
// the rows kernel is faster).
inline constexpr int64_t kTiledDecodeMinRows = 16;
// Rows per key/value head that the keys-in-lanes kernel (head dims below a vector) takes.
inline constexpr int64_t kMaxRowsInLanes = 16;
// bf16 elements of one bf16 dot-unit vector of pairs (vdpbf16ps on 512 bits, bfdot on 128):
// decoding's rows run on the unit where both head dims are whole ones.
#if defined(__x86_64__)
inline constexpr int64_t kBf16UnitBlock = 32;
#else
inline constexpr int64_t kBf16UnitBlock = 8;
#endif

// AMX-BF16 attention (amx_unit-inl.h): head dims of whole tile rows of bf16 (32) up to 512 (a
// staged block of keys lives on the stack), value dims of whole tiles (16 rows; the backward,
// whose dP = V dOᵀ runs over the value dim, whole 32s).
inline constexpr int64_t kAmxDepth = 32, kAmxBlock = 16, kAmxMostHeadDim = 512;
inline bool amx_fits(int64_t D, int64_t Dv, bool backward) {
  const bool keys = D % kAmxDepth == 0 && D <= kAmxMostHeadDim;
  if (backward) return keys && Dv % kAmxDepth == 0 && Dv <= kAmxMostHeadDim;
  return keys && Dv % kAmxBlock == 0;
}

// What the kernels of the target in use can do (the parts a plan depends on).
struct KernelFacts {
  int64_t lanes = 4;          // fp32 lanes of a vector
  bool byte_products = false;  // integer Q·K (and P·V) over block caches: x86 from AVX2, AArch64
  bool byte_dot = false;       // ...on a dot instruction: vpdpbusd, AVX-VNNI, sdot
  bool amx_unit = false;       // the AMX-BF16 attention unit is compiled (x86 from AVX2)
  bool wide = false;           // 512-bit x86 vectors
};
KernelFacts kernel_facts();

// What a plan depends on in one call.
struct Call {
  TensorType k = TensorType::f32, v = TensorType::f32;  // the rows' formats
  int64_t queries = 1, keys = 1, query_heads = 1, kv_heads = 1, dim = 64, dim_v = 64;
  bool int8_scores = false;  // block keys: decoding may round the queries to int8
  bool dropout = false;
  int64_t rows_per_kv_head() const { return query_heads / kv_heads * queries; }
};
Call call_of(const AttentionArgs& a, const KvRows& K, const KvRows& V);
Call call_of(const AttentionArgs& a);  // (the backward: a.k and a.v)
// Over a cache: the rows attention(args, kv) reads, in place or gathered (stored.cpp).
Call call_of(const AttentionArgs& a, const StoredKV& kv);

// The drivers: flash_forward.cpp, decode.cpp, flash_backward.cpp.
enum class Driver { tiled_forward, split_kv_decode, tiled_backward };

// One call's kernel.
struct Plan {
  Driver driver = Driver::tiled_forward;
  Variant variant = Variant::forward_tiles;  // the driver's kernel
  bool bf16_units = false;  // compiled in the bf16-unit pass (src/simd/units.h)
  bool byte_dot = false;    // decode_rows_int8: on vpdpbusd / AVX-VNNI / sdot
  bool values_on_bytes = false;  // decode_rows_int8: P·V in integers too (Int8Values)
  const char* unit = "fma";  // as `qkv info` and QKV_UNITS name it
};

// qkv::attention's forward over row sources K and V (a.k and a.v unused): split-KV decoding
// where decodes() says so (never with dropout), else the tiled forward.
Plan plan_forward(const Call& c);
// The tiled forward whatever the shape (a strided head dim, copied first).
Plan plan_tiled_forward(const Call& c);
// qkv::attention_backward.
Plan plan_backward(const Call& c);

// The variant's name ("decode_rows_int8") and one line on what the plan runs, from one table.
const char* variant_name(Variant v);
std::string plan_why(const Plan& p);

}  // namespace qkv::detail
