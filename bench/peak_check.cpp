// Checks qkv's FMA-peak yardstick (yardsticks/yardsticks.cpp, sized per SIMD target) against an
// independent loop written here with plain intrinsics: 12 chains of FMAs (of mul + add on
// SSE4, which has no FMA) of each target's width; and on avx512_bf16 its bf16 dot-product peak
// against 12 chains of vdpbf16ps written here. For every target this CPU runs, both are
// measured in turns, and the best of several turns of each is printed with their ratio; the
// yardstick is right when the ratio is within a few percent of 1.
//
//   build/release/bench/peak_check [threads]
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "qkv/targets.h"
#include "yardsticks.h"

namespace {

constexpr int kChains = 12;  // FMA latency 4–5 cycles × 2 ports; SSE4's mul + add, ~6 cycles
constexpr long kRounds = 1 << 20;

// acc ← acc · x + y in kChains independent chains, kRounds times; returns a lane of the sum.
#define CHAINS(VEC, SET1, STEP, ADD, LANE0)                          \
  VEC acc[kChains];                                                  \
  for (int c = 0; c < kChains; ++c) acc[c] = SET1(1.0f + c * 1e-3f); \
  const VEC x = SET1(0.999999f), y = SET1(1e-7f);                    \
  for (long i = 0; i < kRounds; ++i)                                 \
    for (int c = 0; c < kChains; ++c) acc[c] = STEP(acc[c], x, y);   \
  VEC sum = acc[0];                                                  \
  for (int c = 1; c < kChains; ++c) sum = ADD(sum, acc[c]);          \
  return LANE0(sum);

__attribute__((target("sse4.2"), noinline)) float chains_sse4() {
#define MUL_ADD_128(a, x, y) _mm_add_ps(_mm_mul_ps(a, x), y)
  CHAINS(__m128, _mm_set1_ps, MUL_ADD_128, _mm_add_ps, _mm_cvtss_f32)
}
__attribute__((target("avx2,fma"), noinline)) float chains_avx2() {
  CHAINS(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_cvtss_f32)
}
__attribute__((target("avx512f"), noinline)) float chains_avx512() {
  CHAINS(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_cvtss_f32)
}

// acc ← acc + (x0·y0 + x1·y1) per fp32 lane from bf16 pairs: 4 flops a lane.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) __m512 dot_bf16(__m512 acc, __m512 x,
                                                                      __m512 y) {
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_castps_si512(x), (__m512bh)_mm512_castps_si512(y));
}
// CHAINS' constants as bf16 pairs: y (1e-7) as (2^-20, 2^-20), the others as (1, 1).
__attribute__((target("avx512f,avx512bw,avx512bf16"))) __m512 bf16_pairs(float f) {
  return _mm512_castsi512_ps(_mm512_set1_epi32(f < 1e-3f ? 0x35803580 : 0x3f803f80));
}
__attribute__((target("avx512f,avx512bw,avx512bf16"), noinline)) float chains_bf16() {
  CHAINS(__m512, bf16_pairs, dot_bf16, _mm512_add_ps, _mm512_cvtss_f32)
}

// GFLOP/s of the independent loop of `bits` width on `threads` threads, over ~0.2 s (bits 16:
// the bf16 chains).
double independent_gflops(int bits, int threads) {
  float (*loop)() = bits == 16    ? chains_bf16
                    : bits == 128 ? chains_sse4
                    : bits == 256 ? chains_avx2
                                  : chains_avx512;
  const double lanes = bits == 16 ? 32 : bits / 32.0;  // a bf16 pair per lane: 2 products
  loop();  // warm up the clock
  volatile float sink = 0;
  double flops = 0;
  const double start = qkv::detail::now_seconds();
  do {
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    {
      sink = sink + loop();
      flops += 2.0 * kChains * lanes * kRounds;
    }
  } while (qkv::detail::now_seconds() - start < 0.2);
  return flops / (qkv::detail::now_seconds() - start) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : omp_get_max_threads();
  std::printf("%-10s %6s %22s %22s %8s\n", "target", "bits", "qkv yardstick GFLOP/s",
              "independent GFLOP/s", "ratio");
  for (const std::string& t : qkv::supported_targets()) {
    qkv::set_target(t);
    const int bits = qkv::target_vector_bits();
    if (bits != 128 && bits != 256 && bits != 512) continue;
    double ours = 0, theirs = 0;
    for (int turn = 0; turn < 5; ++turn) {  // in turns, so that both see the same clock
      ours = std::max(ours, qkv::detail::measure_fma_peak_gflops(threads));
      theirs = std::max(theirs, independent_gflops(bits, threads));
    }
    std::printf("%-10s %6d %22.1f %22.1f %8.3f\n", t.c_str(), bits, ours, theirs, ours / theirs);
    if (t == "avx512_bf16") {
      double ours16 = 0, theirs16 = 0;
      for (int turn = 0; turn < 5; ++turn) {
        ours16 = std::max(ours16, qkv::detail::measure_bf16_peak_gflops(threads));
        theirs16 = std::max(theirs16, independent_gflops(16, threads));
      }
      std::printf("%-10s %6s %22.1f %22.1f %8.3f\n", "  bf16 dot", "512", ours16, theirs16,
                  ours16 / theirs16);
    }
  }
  std::printf("(%d thread(s); chains of the independent loop: %d)\n", threads, kChains);
}
