// What this machine's AMX unit does, and a check of qkv's AMX yardstick: it reports
//   - whether the CPU has AMX and the kernel lets this process use the tile state;
//   - TDPBF16PS and TDPBUSD throughput on 1 and all threads from a loop written here with the
//     compiler's intrinsics, beside qkv's yardstick (yardsticks/yardsticks.cpp:
//     measure_amx_peak_gflops, written over src/simd/amx.h, which `qkv bench` divides by)
//     measured in the same run: their ratio is near 1 when the yardstick is right; and the fp32
//     FMA peak, the yardstick of every other fraction in the docs;
//   - the accuracy of fp32 dot products done as three-way bf16 splits (x = hi + mid + lo,
//     six tile products hi·hi … mid·mid accumulated in fp32), against fp32 FMA and plain bf16,
//     each relative to Σ|products| computed in double.
// Built only where the compiler takes -mamx-tile -mamx-bf16 -mamx-int8 (bench/CMakeLists.txt).
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

// G(FL)OP/s of TDPBF16PS (16 × 16 × 32 multiply-adds each) or TDPBUSD (16 × 16 × 64) on
// `threads` threads, 4 independent accumulator tiles per thread. Ones in, so that the sums
// show the products ran: every accumulator ends at calls · depth (bf16: up to fp32's rounding).
template <bool kInt8>
double tile_gflops(int threads) {
  constexpr long kCalls = 1 << 20;
  constexpr int kDepth = kInt8 ? 64 : 32;
  double seconds = 0;
  bool summed = true;
#pragma omp parallel num_threads(threads) reduction(max : seconds) reduction(&& : summed)
  {
    configure_tiles();
    alignas(64) static thread_local uint16_t a[16 * 32], b[16 * 32];
    for (int i = 0; i < 16 * 32; ++i) a[i] = b[i] = kInt8 ? 0x0101 : 0x3f80;  // 1s: bytes or bf16
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
      if constexpr (kInt8) {
        _tile_dpbusd(0, 4, 5);
        _tile_dpbusd(1, 4, 7);
        _tile_dpbusd(2, 6, 5);
        _tile_dpbusd(3, 6, 7);
      } else {
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 6, 5);
        _tile_dpbf16ps(3, 6, 7);
      }
    }
    alignas(64) uint32_t c[16 * 16];
    _tile_stored(3, c, 64);
    seconds = now() - t0;
    float sum_f;
    std::memcpy(&sum_f, &c[255], 4);
    summed = kInt8 ? c[255] == uint32_t{kCalls} * kDepth
                   : std::abs(sum_f - double(kCalls) * kDepth) < 1e-2 * kCalls * kDepth;
    _tile_release();
  }
  if (!summed)
    std::printf("  (the tile sums are not calls × depth: the loop did not run as written)\n");
  return threads * 4.0 * kCalls * 2 * 16 * 16 * kDepth / seconds / 1e9;
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
    const double bf16 = tile_gflops<false>(t), int8 = tile_gflops<true>(t);
    const double yard_bf16 = qkv::detail::measure_amx_peak_gflops(qkv::detail::AmxProduct::bf16, t);
    const double yard_int8 = qkv::detail::measure_amx_peak_gflops(qkv::detail::AmxProduct::int8, t);
    std::printf(
        "%d thread(s): fp32 FMA peak %.0f GFLOP/s\n"
        "  TDPBF16PS %.0f GFLOP/s = %.1fx the FMA peak (%.2fx with 6 products per fp32 product); "
        "qkv's yardstick %.0f (ratio %.3f)\n"
        "  TDPBUSD   %.0f GOP/s   = %.1fx the FMA peak; qkv's yardstick %.0f (ratio %.3f)\n",
        t, fma, bf16, bf16 / fma, bf16 / fma / 6, yard_bf16, yard_bf16 / bf16, int8, int8 / fma,
        yard_int8, yard_int8 / int8);
  }
  splits_accuracy();
}
