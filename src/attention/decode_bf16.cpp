// Split-KV decoding on the bf16 units: decode.cpp compiled once more, for Highway's AVX3
// target with AVX512-BF16, or its NEON target with BF16 on AArch64 (src/simd/units-inl.h); its
// entry point decode_forward runs this version for bf16 caches while the avx512_bf16 or
// neon_bf16 target is in force.
#include "simd/units_pass.h"
#include "attention/decode.cpp"
