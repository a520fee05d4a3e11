// The tiles' per-target helpers for the bf16-unit kernels (src/simd/units-inl.h).
#include "simd/units_pass.h"
#include "attention/tiles.cpp"
