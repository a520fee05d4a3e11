// The int8 products' choice of instructions (src/quant/int8-inl.h), from the CPU-feature
// registry (src/simd/cpu.h): on x86's AVX2 target AVX-VNNI or vpmaddubsw + vpmaddwd, on
// AArch64 sdot or int16 pairs.
#pragma once

#include "qkv/number_format.h"
#include "simd/cpu.h"

namespace qkv::quant::int8 {

// The weight formats the int8 products take (the one list: linear_forward's plan and the
// kernels' switch read it; the others keep fp32 activations).
inline constexpr TensorType kWeightTypes[] = {TensorType::q8_0, TensorType::q4_0,
                                              TensorType::q4_1, TensorType::q4_k,
                                              TensorType::q6_k};

// Whether the AVX2 target's products use AVX-VNNI (the VEX vpdpbusd): forced, or beneath a
// forced AMX (which multiplies prompts only) where the CPU has it.
inline bool avx_vnni() { return simd::avx_vnni_in_use(); }
// Whether the 512-bit targets multiply on vpdpbusd (simd::vnni_in_use(true)).
inline bool vnni_wide() { return simd::vnni_in_use(true); }

// Whether int8 products of prompts (quant::kAmxMinRows rows or more) run on AMX-INT8 tiles.
inline bool amx_prompts() { return simd::unit_of(simd::Work::int8) == simd::Unit::amx; }

// Whether AArch64's products use the dot product extension (sdot).
inline bool dot_product_extension() { return simd::sdot_in_use(); }

}  // namespace qkv::quant::int8
