// Split-KV decoding on the AVX512-BF16 units: decode.cpp compiled once more, for Highway's
// AVX3 target with AVX512-BF16 (src/simd/units-inl.h); its entry point decode_forward runs this
// version for bf16 caches while the avx512_bf16 target is in force.
#include "simd/units_pass.h"
#include "attention/decode.cpp"
