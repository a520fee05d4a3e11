// Intel AMX tiles through one interface that mirrors the instructions, so that a kernel written
// once (a template over the interface) runs on the tiles (amx::Hardware) or, on every other
// CPU and under the sanitizers, on a byte-level stand-in (amx::Emulated) that gives the same
// bits. The operations, each an instruction:
//   configure(config)      LDTILECFG, palette 1: each tile's rows (≤ 16) and bytes a row (≤ 64);
//                          every tile reads as zero after it
//   release()              TILERELEASE: the tiles are unconfigured again
//   zero<t>()              TILEZERO
//   load<t>(base, stride)  TILELOADD: row r of tile t from base + r · stride (stride in bytes),
//                          exactly the configured bytes a row; the rest of the tile reads as zero
//   store<t>(base, stride) TILESTORED: the configured rows and bytes, nothing else
//   dpbf16ps<c, a, b>()    TDPBF16PS: c[m][n] (fp32) += Σ_k Σ_i a[m][2k + i] · b[k][2n + i] over
//                          the bf16 pairs (b holds pairs of rows interleaved: b[k][2n + i] is
//                          row 2k + i of the right matrix at column n), in the order of Intel's
//                          manual: for i = 0 and 1 apart, a sum from zero over k in order, then
//                          c + (sum₀ + sum₁); each product exact, each sum rounded to fp32 (to
//                          nearest, even); bf16 and fp32 denormal inputs read as zero, denormal
//                          sums flushed
//   dpbusd<c, a, b>()      TDPBUSD: c[m][n] (int32) += Σ_k Σ_i u8 a[m][4k + i] · s8 b[k][4n + i],
//                          the sum wrapping around (b: quads of rows interleaved)
// Shapes each product accepts: a has c's rows; a's bytes a row are 4 × b's rows (K ≤ 32 bf16
// or 64 int8 values); b's bytes a row are c's (N ≤ 16 columns); c, a and b are three tiles.
// The stand-in's state is per thread, as the tiles are. It refuses (qkv::Error) what the
// hardware faults on: a tile used before configure() on this thread or after release(), a
// shape the instruction does not take, a configuration outside palette 1.
#pragma once

#include <cstdint>

namespace qkv::amx {

inline constexpr int kTiles = 8, kMaxRows = 16, kMaxRowBytes = 64;

// Palette 1's configuration: rows and bytes a row of each tile (0 and 0: unused).
struct Config {
  uint8_t rows[kTiles] = {};
  uint16_t row_bytes[kTiles] = {};
  // Tile t as `rows` × `row_bytes`.
  Config& tile(int t, int rows_, int row_bytes_) {
    rows[t] = static_cast<uint8_t>(rows_), row_bytes[t] = static_cast<uint16_t>(row_bytes_);
    return *this;
  }
};

// The stand-in (src/simd/amx.cpp).
struct Emulated {
  static void configure(const Config& config);
  static void release();
  template <int T>
  static void zero() {
    zero_at(T);
  }
  template <int T>
  static void load(const void* base, int64_t stride) {
    load_at(T, base, stride);
  }
  template <int T>
  static void store(void* base, int64_t stride) {
    store_at(T, base, stride);
  }
  template <int C, int A, int B>
  static void dpbf16ps() {
    dpbf16ps_at(C, A, B);
  }
  template <int C, int A, int B>
  static void dpbusd() {
    dpbusd_at(C, A, B);
  }

  static void zero_at(int t);
  static void load_at(int t, const void* base, int64_t stride);
  static void store_at(int t, void* base, int64_t stride);
  static void dpbf16ps_at(int c, int a, int b);
  static void dpbusd_at(int c, int a, int b);
};

#if defined(__x86_64__)
// The instructions, written out (the assembler takes them whatever the compiler's target
// options, so a kernel needs no AMX options of its own). Run only where available() says so:
// elsewhere they fault.
struct Hardware {
  static void configure(const Config& config) {
    alignas(64) uint8_t memory[64] = {1};  // palette 1, start row 0
    for (int t = 0; t < kTiles; ++t) {
      memory[16 + 2 * t] = static_cast<uint8_t>(config.row_bytes[t]);
      memory[17 + 2 * t] = static_cast<uint8_t>(config.row_bytes[t] >> 8);
      memory[48 + t] = config.rows[t];
    }
    asm volatile("ldtilecfg %0" : : "m"(memory));
  }
  static void release() { asm volatile("tilerelease" ::: "memory"); }
  template <int T>
  static void zero() {
    asm volatile("tilezero %%tmm%c0" : : "i"(T));
  }
  template <int T>
  static void load(const void* base, int64_t stride) {
    asm volatile("tileloadd (%0,%1,1), %%tmm%c2" : : "r"(base), "r"(stride), "i"(T) : "memory");
  }
  template <int T>
  static void store(void* base, int64_t stride) {
    asm volatile("tilestored %%tmm%c2, (%0,%1,1)" : : "r"(base), "r"(stride), "i"(T) : "memory");
  }
  template <int C, int A, int B>
  static void dpbf16ps() {
    asm volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" : : "i"(C), "i"(A), "i"(B));
  }
  template <int C, int A, int B>
  static void dpbusd() {
    asm volatile("tdpbusd %%tmm%c2, %%tmm%c1, %%tmm%c0" : : "i"(C), "i"(A), "i"(B));
  }
};
#endif

// nullptr where this process may run amx::Hardware (the CPU has AMX-BF16 and AMX-INT8, the OS
// saves the tile state, and Linux granted this process its 8 KiB of it: asked once, by
// arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)); else why not. QKV_AMX_REFUSE=1
// answers as a refusal would, to test what falls back.
const char* unavailable();
// Whether the AMX kernels run on amx::Emulated instead of the instructions (slow: for tests,
// and to see the tile kernels' numbers on a CPU without AMX): QKV_AMX_STAND_IN=1, or
// set_stand_in(true). Not to be switched while kernels run on other threads.
bool stand_in();
void set_stand_in(bool on);

// The same decision from given facts (for tests): the CPU's AMX bits, whether Linux granted
// the state (or its error).
const char* unavailable_because(bool amx_bf16, bool amx_int8, bool granted, int error);

}  // namespace qkv::amx
