// Can this machine's AMX unit do qkv's fp32 tile products, and how fast? A probe for the
// next step of the attention kernels (docs/kernels.md, "The CPU-feature registry and its unit table":
// why AMX is not used yet): it reports
//   - whether the CPU has AMX-BF16 and the kernel lets this process use the tile state;
//   - TDPBF16PS throughput on 1 and all threads, against the fp32 FMA peak measured in the
//     same run (the yardstick of every other fraction in the docs);
//   - the accuracy of fp32 dot products done as three-way bf16 splits (x = hi + mid + lo,
//     six tile products hi·hi … mid·mid accumulated in fp32), against fp32 FMA and plain bf16,
//     each relative to Σ|products| computed in double.
// Built only where the compiler takes -mamx-tile -mamx-bf16 (bench/CMakeLists.txt).
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cpuid.h>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>

#include "yardsticks.h"

namespace {

// The tile configuration of palette 1: 8 tiles of 16 rows × 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

void configure_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) c.bytes_per_row[t] = 64, c.rows[t] = 16;
  _tile_loadconfig(&c);
}

bool cpu_has_amx_bf16() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (d >> 24 & 1) && (d >> 22 & 1);  // AMX-TILE, AMX-BF16
}

// Linux hands out the 8 KiB tile state only on request (ARCH_REQ_XCOMP_PERM, XTILEDATA = 18).
bool request_tile_state() { return syscall(SYS_arch_prctl, 0x1023, 18) == 0; }

double now() { return qkv::detail::now_seconds(); }

// GFLOP/s of TDPBF16PS (16 × 16 × 32 multiply-adds each) on `threads` threads, 4 independent
// accumulator tiles per thread.
double tile_gflops(int threads) {
  constexpr long kCalls = 1 << 20;
  double seconds = 0;
#pragma omp parallel num_threads(threads) reduction(max : seconds)
  {
    configure_tiles();
    alignas(64) static thread_local uint16_t a[16 * 32], b[16 * 32];
    for (int i = 0; i < 16 * 32; ++i) a[i] = b[i] = 0x3f80;  // bf16 1.0
    _tile_loadd(4, a, 64);
    _tile_loadd(5, b, 64);
    _tile_loadd(6, a, 64);
    _tile_loadd(7, b, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
#pragma omp barrier
    const double t0 = now();
    for (long i = 0; i < kCalls; ++i) {
      _tile_dpbf16ps(0, 4, 5);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 6, 5);
      _tile_dpbf16ps(3, 6, 7);
    }
    alignas(64) float c[16 * 16];
    _tile_stored(0, c, 64);  // keeps the loop
    seconds = now() - t0 + (c[0] < 0 ? 1 : 0);
    _tile_release();
  }
  return threads * 4.0 * kCalls * 2 * 16 * 16 * 32 / seconds / 1e9;
}

uint16_t to_bf16(float x) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7fff + (u >> 16 & 1)) >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Worst |error| / Σ|products| over random 16 × 16 tiles of dot products of length 32.
void splits_accuracy() {
  configure_tiles();
  alignas(64) static float x[16][32], y[32][16], c[16][16];
  alignas(64) static uint16_t A[3][16][32], B[3][16][32];  // B in pairs: [d / 2][j][d % 2]
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-2, 2);
  double worst_fp32 = 0, worst_split = 0, worst_bf16 = 0;
  for (int trial = 0; trial < 200; ++trial) {
    for (auto& row : x)
      for (float& v : row) v = uniform(rng);
    for (auto& row : y)
      for (float& v : row) v = uniform(rng);
    auto split = [](float v, uint16_t* part) {
      for (int k = 0; k < 3; ++k) part[k] = to_bf16(v), v -= from_bf16(part[k]);
    };
    uint16_t part[3];
    for (int i = 0; i < 16; ++i)
      for (int d = 0; d < 32; ++d) {
        split(x[i][d], part);
        for (int k = 0; k < 3; ++k) A[k][i][d] = part[k];
      }
    for (int d = 0; d < 32; ++d)
      for (int j = 0; j < 16; ++j) {
        split(y[d][j], part);
        for (int k = 0; k < 3; ++k) B[k][d / 2][2 * j + d % 2] = part[k];
      }
    // The six products whose size is at least 2^-16 of hi·hi, smallest first.
    const int six[6][2] = {{1, 1}, {0, 2}, {2, 0}, {0, 1}, {1, 0}, {0, 0}};
    for (const bool plain : {false, true}) {
      _tile_zero(0);
      for (int p = plain ? 5 : 0; p < 6; ++p) {
        _tile_loadd(1, A[six[p][0]], 64);
        _tile_loadd(2, B[six[p][1]], 64);
        _tile_dpbf16ps(0, 1, 2);
      }
      _tile_stored(0, c, 64);
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 16; ++j) {
          double exact = 0, size = 0;
          float fma = 0;
          for (int d = 0; d < 32; ++d) {
            exact += double(x[i][d]) * y[d][j];
            size += std::abs(double(x[i][d]) * y[d][j]);
            fma = std::fma(x[i][d], y[d][j], fma);
          }
          double& worst = plain ? worst_bf16 : worst_split;
          worst = std::max(worst, std::abs(c[i][j] - exact) / size);
          if (!plain) worst_fp32 = std::max(worst_fp32, std::abs(fma - exact) / size);
        }
    }
  }
  _tile_release();
  std::printf(
      "fp32 dot products of length 32, worst |error| / sum |products| (200 tiles):\n"
      "  fp32 FMA %.2e   three-way bf16 split, 6 tile products %.2e   plain bf16 %.2e\n",
      worst_fp32, worst_split, worst_bf16);
}

}  // namespace

int main() {
  if (!cpu_has_amx_bf16()) {
    std::printf("this CPU has no AMX-BF16\n");
    return 0;
  }
  if (!request_tile_state()) {
    std::printf("the CPU has AMX-BF16, but the kernel refuses this process the tile state\n");
    return 0;
  }
  const int threads = omp_get_num_procs();
  for (int t = 1; t <= threads; t = t < threads ? threads : t + 1) {
    const double fma = qkv::detail::measure_fma_peak_gflops(t);
    const double amx = tile_gflops(t);
    std::printf(
        "%d thread(s): TDPBF16PS %.0f GFLOP/s (bf16) = %.1fx the fp32 FMA peak of %.0f "
        "GFLOP/s; with 6 products per fp32 product: %.2fx\n",
        t, amx, amx / fma, fma, amx / fma / 6);
  }
  splits_accuracy();
}
