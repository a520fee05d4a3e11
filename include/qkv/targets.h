// SIMD targets: which instruction sets the library was compiled for, which of them this CPU
// runs, and which one the kernels use.
//
// One build of qkv holds every kernel once per target (on x86-64: sse4, avx2, avx512 and
// avx512_dl; on AArch64: neon and sve, 256-bit SVE) and picks the best one this CPU supports
// the first time a kernel runs. A lower target can be forced for tests, benchmarks and bug reports:
// with the environment variable QKV_TARGET=avx2 (read once, at the first kernel call), with `qkv …
// --target avx2`, or with set_target("avx2").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qkv {

struct AttentionArgs;  // qkv/attention.h
struct StoredKV;

// The targets compiled into this build, best first (names as above).
std::vector<std::string> compiled_targets();

// The compiled targets this CPU can run, best first.
std::vector<std::string> supported_targets();

// The target the kernels run now.
std::string current_target();

// Makes the kernels run `name` from now on; "" or "best" goes back to the best supported.
// Throws qkv::Error naming the target and the choices when `name` is unknown, not compiled
// in, or not supported by this CPU. Not to be called while kernels run on other threads.
void set_target(const std::string& name);
// The same, with errors that begin with `where` (the flag or variable that named it).
void set_target_from(const std::string& name, const char* where);

// Reads QKV_TARGET now (otherwise read at the first kernel call): throws qkv::Error when it
// names a target that is unknown or not supported here.
void check_target_environment();

// The product units: which unit multiplies each kind of data now, and why. A static table by
// CPU vendor and family chooses (the same machine makes the same choice on every run): bf16
// data goes to the bf16 dot unit (vdpbf16ps, bfdot) on AMD Zen 4/5 and Arm, and is widened to
// fp32 on Intel, whose vdpbf16ps peaks below its fp32 FMAs; int8 weight products use AVX-VNNI
// or Arm's sdot where the CPU has them. `qkv info` prints this list, then weight_units(): for
// attention, each line is the kernel the library plans for a representative call of that data
// (a prompt of 2048 queries at head dim 128 for f32, bf16, f16; one query with 4 query heads a
// kv head for the block caches), named by the same table the kernels are chosen from.
struct UnitInUse {
  std::string data;  // "bf16", "q8_0 cache", "q4_k weights, int8", …
  std::string unit;  // "fma", "bf16_dot", "amx", "avx_vnni", "vpmaddubsw", "vpdpbusd", "sdot", …
  std::string why;
};
std::vector<UnitInUse> units_in_use();
// The unit that multiplies P·V when split-KV decoding reads a block cache ("q8_0", "q4_0",
// "q4_1") with int8 scores (CacheScores::int8) for value dim `dim_v` and `rows` query rows per
// key/value head: the scores' byte product ("vpdpbusd", "avx_vnni", "vpmaddubsw") where P is
// rounded to 8 bits per value block and 64 keys, else "fma" (values widened to fp32). Throws
// qkv::Error for another cache type or a dim or row count below 1.
std::string cache_values_unit(const std::string& cache, int64_t dim_v, int64_t rows);
// What one attention call runs on the target in use, as the library plans it (the one place
// that chooses, src/attention/plan.cpp): the kernel ("forward_tiles", "decode_rows_int8", …;
// docs/kernels.md lists them), the unit of its Q·K products ("fma", "bf16_dot", "amx",
// "vpdpbusd", "avx_vnni", "vpmaddubsw", "sdot", "int16"), the unit of P·V, and one line on what
// it runs. The arguments are read for their shapes, types and options only: call it before or
// instead of the call. Throws qkv::Error for packed sequences (each runs a plan of its own).
struct KernelPlan {
  std::string kernel, unit, values_unit, why;
};
KernelPlan attention_plan(const AttentionArgs& args);                     // qkv::attention(args)
KernelPlan attention_plan(const AttentionArgs& args, const StoredKV& kv);  // over a cache
KernelPlan attention_backward_plan(const AttentionArgs& args);  // qkv::attention_backward

// The same for the products with weights held in a format (a GGUF model's matrices in place,
// quant::linear_forward), on the target in use: each format's unit with fp32 activations
// (Matmul::exact, "q4_k weights") and, for the block formats, with int8 ones (Matmul::int8,
// "q4_k weights, int8"). `qkv info` prints these after units_in_use().
std::vector<UnitInUse> weight_units();

// Whether this process may use Intel AMX tiles: nullptr, or why not (the CPU lacks AMX-BF16
// and AMX-INT8, or Linux refused the tile state; QKV_AMX_REFUSE=1 acts as a refusal). The
// tiles run only where forced (QKV_UNITS=bf16=amx, set_units("bf16=amx")): attention over
// bf16 keys and values: the forward, decoding and the backward. `qkv info` prints this.
const char* amx_unavailable();
// The CPU as the table reads it: vendor, family, model and the product features it has, e.g.
// "AuthenticAMD family 25 model 17: avx512 avx512_bf16 avx512_vnni".
std::string cpu_identity();

// Forces units from now on: "bf16=fma", "bf16=bf16_dot,int8=vpmaddubsw"; "" goes back to the
// table. The environment variable QKV_UNITS (read at the first kernel call) does the same.
// Throws qkv::Error naming the work, the unit and the choices when a unit is unknown, does not
// multiply that data, or is one this CPU or build lacks (never an illegal instruction later).
// A SIMD target forced by name (set_target) decides for bf16: avx512_bf16 / neon_bf16 run the
// bf16 dot unit, a lower target widens. Not to be called while kernels run on other threads.
void set_units(const std::string& spec);

// The libraries behind the dense products (linear layers, training, exact-mode prompts): for
// fp32 and for bf16 products, which library runs them on this CPU, its version, the kernels it
// picked and why. A table by CPU (src/ops/gemm.cpp) chooses: OpenBLAS for fp32 where it knows
// the CPU (kernels with AVX2 or AVX-512 FMAs), oneDNN where it falls back to older ones;
// oneDNN's bf16 matmul where it has bf16 dot products or AMX, else bf16 operands widened to
// fp32. QKV_GEMM=openblas or onednn (read once, at the first product) forces the fp32 one.
struct GemmLibraryInUse {
  std::string products;  // "fp32", "bf16"
  std::string library;   // "OpenBLAS", "oneDNN"
  std::string version;   // "0.3.21", "2.6.3"
  std::string kernels;   // OpenBLAS's core name ("Cooperlake") or oneDNN's ISA ("avx512_core_amx")
  std::string why;
};
std::vector<GemmLibraryInUse> gemm_libraries();

// Vector width (bits) and vector register count of the current target.
int target_vector_bits();
int target_vector_registers();

}  // namespace qkv
