// The one loop of the weight products (quant::linear_forward): XR rows of activations against
// R weight rows, every unit and format. A unit says how a step of the rows is multiplied:
//   kBlocks       the blocks a step covers (its own blocks: 32 values of a block format, a
//                 vector of an element format), from `begin` in steps up to `end`
//   Weights       the R weight rows' step, decoded once for all XR activation rows:
//                 decode(w, rb, b, state, weights), rows rb bytes apart; a step's own, so the
//                 compiler keeps it in registers
//   State         what a unit keeps from step to step (a K-quant's unpacked scales)
//   Acc           one activation row's R running sums (zero when made):
//                 accumulate(acc, weights, x, b) for activation row x, finish(acc, y) sets
//                 y[0, R) to the row's R products
// The units: the int8 ones (quant/int8-inl.h: per instruction set a block at a time, or pairs
// of blocks on AVX-512 DL) and the exact ones (quant/matmul.cpp: widened to fp32 against fp32
// activations). Every activation row's sums are formed alone, in the same order whatever XR, so
// a prompt's tile and a decoding step give the same bits for the same row.
// Included by src/quant/matmul.cpp (through int8-inl.h), once per target.
#if defined(QKV_QUANT_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_QUANT_TILE_INL_H_
#undef QKV_QUANT_TILE_INL_H_
#else
#define QKV_QUANT_TILE_INL_H_
#endif

#include <cstdint>

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace qkv::quant {
namespace HWY_NAMESPACE {

// y[i][0, R) = the R weight rows at w (rb bytes apart) · activation row x[i], for i < XR, over
// the unit's blocks [begin, end).
template <class Unit, int XR, class Activations>
HWY_INLINE void tile(const uint8_t* w, int64_t rb, int64_t begin, int64_t end, const Activations* x,
                     float* const* y) {
  typename Unit::State state;
  typename Unit::Acc acc[XR];
  for (int64_t b = begin; b < end; b += Unit::kBlocks) {
    typename Unit::Weights weights;
    Unit::decode(w, rb, b, state, weights);
    for (int i = 0; i < XR; ++i) Unit::accumulate(acc[i], weights, x[i], b);
  }
  for (int i = 0; i < XR; ++i) Unit::finish(acc[i], y[i]);
}

}  // namespace HWY_NAMESPACE
}  // namespace qkv::quant
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
