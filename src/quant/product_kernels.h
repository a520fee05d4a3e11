// The kernels of the products with block-format (and 16-bit) weights, quant::linear_forward
// (src/quant/matmul.cpp): which one a weight format, a mode and a number of activation rows
// reach on the target in use, by name, for `qkv info` and for the tests that assert it.
#pragma once

#include <atomic>
#include <cstdint>

#include "qkv/quant.h"

namespace qkv::quant {

enum class ProductKernel : uint32_t {
  rows_widened = 1u << 0,     // exact, one activation row: weights widened to fp32 in registers
  tiles_widened = 1u << 1,    // exact, more rows: 32 weight rows widened to fp32, then the GEMM
  int8_vpdpbusd = 1u << 2,    // int8: AVX512-VNNI on 512-bit vectors
  int8_avx_vnni = 1u << 3,    // int8: AVX-VNNI, vpdpbusd on 256-bit vectors
  int8_vpmaddubsw = 1u << 4,  // int8: vpmaddubsw + vpmaddwd (256-bit; SSE4 in 128-bit halves)
  int8_sdot = 1u << 5,        // int8: Arm's dot product instructions
  int8_int16 = 1u << 6,       // int8: bytes widened to int16 pairs (portable)
  int8_amx = 1u << 7,         // int8, kAmxMinRows rows or more: AMX-INT8 tiles (TDPBUSD)
};

// The fewest activation rows the AMX-INT8 unit multiplies (one B tile of 16); fewer stay on
// the vector unit beneath it, where streaming the weights bounds the time.
inline constexpr int64_t kAmxMinRows = 16;

// The unit's name as `qkv info` and QKV_UNITS say it: fma, vpdpbusd, avx_vnni, vpmaddubsw,
// sdot, int16, amx.
const char* unit_name(ProductKernel k);
// One line on what the kernel does.
const char* kernel_why(ProductKernel k);

// The kernel quant::linear_forward runs on the target in use for weights of type t, in mode
// `mode`, with `rows` activation rows (types the int8 products do not take run exact).
ProductKernel product_kernel(TensorType t, Matmul mode, int64_t rows);

// The kernels calls have reached: linear_forward sets each part's bit once per call (a test
// clears it, runs one combination and reads which one ran).
std::atomic<uint32_t>& kernels_reached();
inline void reached(ProductKernel k) {
  std::atomic<uint32_t>& bits = kernels_reached();
  const auto bit = static_cast<uint32_t>(k);
  if ((bits.load(std::memory_order_relaxed) & bit) == 0)
    bits.fetch_or(bit, std::memory_order_relaxed);
}

}  // namespace qkv::quant
