// Yardsticks. The loops are compiled once per SIMD target and sized for its register file;
// a benchmark divides by the peak of the target its kernels ran (see src/simd/dispatch.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "yardsticks.cpp"
#include <hwy/foreach_target.h>
#include <hwy/highway.h>

#include <omp.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <string>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "simd/dispatch.h"
#include "simd/simd-inl.h"
#include "yardsticks.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace simd = ::qkv::simd::HWY_NAMESPACE;
namespace hn = simd::hn;
using simd::df;
using simd::Vf;

// Independent accumulator chains: enough to hide the FMA latency (4–5 cycles × 2 ports, so
// 8–10 in flight), and few enough to stay in registers with the two constants: 16 of 32
// registers on AVX-512 and AArch64, 12 of 16 on AVX2 and SSE4 (16 chains there spill to the
// stack, and the loop measured 1.7× below the real peak on a Zen 3).
inline constexpr int kChains = simd::kVectorRegisters >= 32 ? 16 : 12;

// Flops of `iterations` rounds of fma_loop.
double fma_flops(int64_t iterations) { return 2.0 * kChains * simd::lanes() * iterations; }

// A register-only loop of FMAs; returns their sum so that nothing is optimised away.
HWY_NOINLINE double fma_loop(int64_t iterations) {
  simd::VfSlot acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = hn::Set(df, 1.0f + c * 1e-3f);
  const Vf x = hn::Set(df, 0.999999f), y = hn::Set(df, 1e-7f);
  for (int64_t i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = hn::MulAdd(acc[c], x, y);
  Vf sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = hn::Add(sum, acc[c]);
  return hn::GetLane(hn::SumOfLanes(df, sum));
}

// Σ data[begin, end) in blocks of 4 vectors (four independent accumulators), end - begin a
// multiple of read_block().
size_t read_block() { return 4 * simd::lanes(); }
float read_sum(const float* data, size_t begin, size_t end) {
  const size_t N = simd::lanes();
  Vf s0 = hn::Zero(df), s1 = hn::Zero(df), s2 = hn::Zero(df), s3 = hn::Zero(df);
  for (size_t i = begin; i < end; i += 4 * N) {
    s0 = hn::Add(s0, hn::LoadU(df, data + i));
    s1 = hn::Add(s1, hn::LoadU(df, data + i + N));
    s2 = hn::Add(s2, hn::LoadU(df, data + i + 2 * N));
    s3 = hn::Add(s3, hn::LoadU(df, data + i + 3 * N));
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
}

}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#if HWY_ARCH_X86
#include <immintrin.h>
#elif HWY_ARCH_ARM_A64
#include <arm_neon.h>
#endif

#include "qkv/targets.h"
#include "simd/amx.h"

namespace qkv::detail {

#if HWY_ARCH_X86 && QKV_HAVE_BF16_UNITS
// 16 chains of vdpbf16ps, each adding two bf16 products to 16 fp32 lanes (64 flops); returns
// their sum so that nothing is optimised away.
constexpr int kBf16Chains = 16;
__attribute__((target("avx512f,avx512bw,avx512bf16"), noinline)) double bf16_dot_loop(
    int64_t iterations) {
  __m512 acc[kBf16Chains];
  for (int c = 0; c < kBf16Chains; ++c) acc[c] = _mm512_set1_ps(1.0f + c * 1e-3f);
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // (1, 1)
  const __m512bh y = (__m512bh)_mm512_set1_epi32(0x35803580);  // (2^-20, 2^-20)
  for (int64_t i = 0; i < iterations; ++i)
    for (int c = 0; c < kBf16Chains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], x, y);
  __m512 sum = acc[0];
  for (int c = 1; c < kBf16Chains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return _mm512_reduce_add_ps(sum);
}
constexpr double kBf16FlopsPerDot = 64;  // 16 lanes × 2 products × 2
#elif HWY_ARCH_ARM_A64 && QKV_HAVE_BF16_UNITS
// 16 chains of bfdot (4 lanes, two bf16 products each: 16 flops).
constexpr int kBf16Chains = 16;
__attribute__((target("arch=armv8.2-a+bf16"), noinline)) double bf16_dot_loop(int64_t iterations) {
  float32x4_t acc[kBf16Chains];
  for (int c = 0; c < kBf16Chains; ++c) acc[c] = vdupq_n_f32(1.0f + c * 1e-3f);
  // (Read through volatile: as immediates the compiler makes them an fp16 fmov, which the
  // BF16 extension alone does not allow.)
  volatile uint32_t one_pair = 0x3f803f80, tiny_pair = 0x35803580;  // (1, 1), (2^-20, 2^-20)
  const bfloat16x8_t x = vreinterpretq_bf16_u32(vdupq_n_u32(one_pair));
  const bfloat16x8_t y = vreinterpretq_bf16_u32(vdupq_n_u32(tiny_pair));
  for (int64_t i = 0; i < iterations; ++i)
    for (int c = 0; c < kBf16Chains; ++c) acc[c] = vbfdotq_f32(acc[c], x, y);
  float32x4_t sum = acc[0];
  for (int c = 1; c < kBf16Chains; ++c) sum = vaddq_f32(sum, acc[c]);
  return vaddvq_f32(sum);
}
constexpr double kBf16FlopsPerDot = 16;
#endif

double measure_bf16_peak_gflops(int threads, double seconds) {
#if QKV_HAVE_BF16_UNITS && (HWY_ARCH_X86 || HWY_ARCH_ARM_A64)
  const std::string target = current_target();
  if (target != "avx512_bf16" && target != "neon_bf16") return 0;
  const int64_t chunk = 1 << 20;
  const double flops_per_chunk = kBf16FlopsPerDot * kBf16Chains * chunk;
  double flops = 0;
  volatile double sink = 0;
  bf16_dot_loop(chunk);  // warm up the clock
  const double start = now_seconds();
  while (now_seconds() - start < seconds) {
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    {
      sink = sink + bf16_dot_loop(chunk);
      flops += flops_per_chunk;
    }
  }
  return flops / (now_seconds() - start) / 1e9;
#else
  (void)threads, (void)seconds;
  return 0;
#endif
}

// 4 × `calls` tile products of one kind, on tiles this thread configures and releases.
template <AmxProduct kProduct>
[[maybe_unused]] void amx_loop(int64_t calls) {
#if defined(__x86_64__)
  using Tiles = amx::Hardware;
  amx::Config config;
  for (int t = 0; t < amx::kTiles; ++t) config.tile(t, amx::kMaxRows, amx::kMaxRowBytes);
  Tiles::configure(config);
  alignas(64) static const uint8_t zeros[amx::kMaxRows * amx::kMaxRowBytes] = {};
  Tiles::load<4>(zeros, 64), Tiles::load<5>(zeros, 64);
  Tiles::load<6>(zeros, 64), Tiles::load<7>(zeros, 64);
  Tiles::zero<0>(), Tiles::zero<1>(), Tiles::zero<2>(), Tiles::zero<3>();
  for (int64_t i = 0; i < calls; ++i) {
    if constexpr (kProduct == AmxProduct::bf16) {
      Tiles::dpbf16ps<0, 4, 6>(), Tiles::dpbf16ps<1, 4, 7>();
      Tiles::dpbf16ps<2, 5, 6>(), Tiles::dpbf16ps<3, 5, 7>();
    } else {
      Tiles::dpbusd<0, 4, 6>(), Tiles::dpbusd<1, 4, 7>();
      Tiles::dpbusd<2, 5, 6>(), Tiles::dpbusd<3, 5, 7>();
    }
  }
  Tiles::release();
#else
  (void)calls;
#endif
}

double measure_amx_peak_gflops(AmxProduct product, int threads, double seconds) {
  if (amx::unavailable()) return 0;
  const int64_t chunk = 1 << 16;
  const int depth = product == AmxProduct::bf16 ? 32 : 64;
  const double ops_per_chunk = 4.0 * chunk * 2 * 16 * 16 * depth;
  const auto loop =
      product == AmxProduct::bf16 ? amx_loop<AmxProduct::bf16> : amx_loop<AmxProduct::int8>;
  loop(chunk);  // warm up the clock
  double ops = 0;
  const double start = now_seconds();
  while (now_seconds() - start < seconds) {
#pragma omp parallel num_threads(threads) reduction(+ : ops)
    {
      loop(chunk);
      ops += ops_per_chunk;
    }
  }
  return ops / (now_seconds() - start) / 1e9;
}

HWY_EXPORT(fma_flops);
HWY_EXPORT(fma_loop);
HWY_EXPORT(read_block);
HWY_EXPORT(read_sum);

double measure_fma_peak_gflops(int threads, double seconds) {
  const int64_t chunk = 1 << 20;
  double flops = 0, elapsed = 0;
  volatile double sink = 0;
  const double flops_per_chunk = QKV_DISPATCH(fma_flops)(chunk);  // the kernels' target
  const auto fma_loop = QKV_DISPATCH(fma_loop);
  fma_loop(chunk);  // warm up the clock
  const double start = now_seconds();
  int64_t rounds = 0;
  while (now_seconds() - start < seconds) {
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    {
      const double r = fma_loop(chunk);
      sink = sink + r;
      flops += flops_per_chunk;
    }
    ++rounds;
  }
  elapsed = now_seconds() - start;
  return flops / elapsed / 1e9;
}

double measure_read_gbps(std::initializer_list<std::span<const float>> buffers, int threads,
                         double seconds) {
  const size_t block = QKV_DISPATCH(read_block)();  // floats per step of read_sum
  const auto read_sum = QKV_DISPATCH(read_sum);
  size_t bytes = 0;
  for (std::span<const float> b : buffers) bytes += b.size_bytes();
  double best = 0;
  volatile float sink = 0;
  const double start = now_seconds();
  do {
    const double t0 = now_seconds();
    float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      // Each thread sums its own contiguous share of each buffer with four independent
      // accumulators.
      const size_t t = omp_get_thread_num(), T = omp_get_num_threads();
      for (std::span<const float> b : buffers) {
        const float* data = b.data();
        const size_t blocks = b.size() / block;
        const size_t begin = blocks * t / T * block, end = blocks * (t + 1) / T * block;
        total += read_sum(data, begin, end);
        if (t == T - 1)  // the last floats, short of a block
          for (size_t i = blocks * block; i < b.size(); ++i) total += data[i];
      }
    }
    sink = sink + total;
    best = std::max(best, bytes / (now_seconds() - t0) / 1e9);
  } while (now_seconds() - start < seconds);
  return best;
}

double measure_read_gbps(size_t bytes, int threads, double seconds) {
  const size_t n = std::max<size_t>(bytes / sizeof(float), 1024);
  // Allocated like a large qkv::Tensor (2 MiB aligned, huge pages), so the yardstick reads
  // memory the way the kernels do.
  const size_t bytes_rounded = (n * sizeof(float) + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  float* data = static_cast<float*>(std::aligned_alloc(2u << 20, bytes_rounded));
  madvise(data, bytes_rounded, MADV_HUGEPAGE);
  // Touch every page first (first touch of a fresh page costs far more than a read).
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t i = 0; i < n; ++i) data[i] = 1.0f;
  const double gbps = measure_read_gbps({std::span<const float>(data, n)}, threads, seconds);
  std::free(data);
  return gbps;
}

double peak_rss_mb() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;  // Linux reports KiB
}

}  // namespace qkv::detail
#endif  // HWY_ONCE
