// Yardsticks measured on the machine itself, for the tool and the benchmarks (library
// qkv_yardsticks, not part of libqkv): the fp32 FMA peak and the memory read bandwidth.
// Benchmarks divide by these, measured in the same run, because the clock of these machines
// wanders (3.0–3.3 GHz).
#pragma once

#include <cstddef>
#include <initializer_list>
#include <span>

#include "qkv/clock.h"

namespace qkv::detail {

// GFLOP/s of a register-only FMA loop on `threads` threads (2 flops per FMA lane).
double measure_fma_peak_gflops(int threads, double seconds = 0.2);

// GFLOP/s of the bf16 dot-product unit of the current target (avx512_bf16: vdpbf16ps;
// neon_bf16: bfdot; two products per fp32 lane, 4 flops) on `threads` threads, as the FMA loop measures it; 0 where
// the current target has no bf16 unit.
double measure_bf16_peak_gflops(int threads, double seconds = 0.2);

// The products of Intel's AMX tiles: TDPBF16PS (bf16 pairs into fp32, 2 flops per
// multiply-add) and TDPBUSD (u8 × s8 quads into int32, 2 ops per multiply-add).
enum class AmxProduct { bf16, int8 };

// G(FL)OP/s of `product` on AMX tiles on `threads` threads: 4 independent accumulators per
// thread, each 16 × 16 of depth 32 (bf16) or 64 (int8) a call, operands in tiles; 0 where this
// process may not use the tiles (qkv::amx_unavailable()).
double measure_amx_peak_gflops(AmxProduct product, int threads, double seconds = 0.2);

// GB/s of a plain vectorised read (sum) over the given buffers, one after the other, on
// `threads` threads; the best of a few passes is kept.
double measure_read_gbps(std::initializer_list<std::span<const float>> buffers, int threads,
                         double seconds = 0.3);

// The same over a buffer of `bytes` bytes of its own, allocated like a large tensor and
// touched first.
double measure_read_gbps(size_t bytes, int threads, double seconds = 0.3);

// Peak resident set size of this process so far, in MiB.
double peak_rss_mb();

using ::qkv::now_seconds;  // qkv/clock.h

}  // namespace qkv::detail
