// The int8 products' choice of instructions (src/quant/int8-inl.h), from the CPU-feature
// registry (src/simd/cpu.h): on x86's AVX2 target AVX-VNNI or vpmaddubsw + vpmaddwd, on
// AArch64 sdot or int16 pairs.
#pragma once

#include "simd/cpu.h"

namespace qkv::quant::int8 {

// Whether the AVX2 target's products use AVX-VNNI (the VEX vpdpbusd): forced, or beneath a
// forced AMX (which multiplies prompts only) where the CPU has it.
inline bool avx_vnni() { return simd::avx_vnni_in_use(); }
// Whether the 512-bit targets multiply on vpdpbusd (simd::vnni_in_use(true)).
inline bool vnni_wide() { return simd::vnni_in_use(true); }

// Whether int8 products of prompts (quant::kAmxMinRows rows or more) run on AMX-INT8 tiles.
inline bool amx_prompts() { return simd::unit_of(simd::Work::int8) == simd::Unit::amx; }

// Whether AArch64's products use the dot product extension (sdot).
inline bool dot_product_extension() { return simd::unit_of(simd::Work::int8) == simd::Unit::sdot; }

}  // namespace qkv::quant::int8
