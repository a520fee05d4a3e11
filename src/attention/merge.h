// Attention of one query row over disjoint sets of keys, computed apart and merged by their
// log-sum-exp: split-KV decoding's chunks (decode.cpp) and ring attention's blocks
// (src/dist/ring_attention.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace qkv::detail {

// One part: its largest score m (−inf: the part saw no key), the sum l of e^(s − m) over its
// keys, and its output o = Σ e^(s − m) v, unnormalised. (A normalised output with its
// log-sum-exp is the part m = lse, l = 1.)
struct PartialRow {
  float m, l;
  const float* o;  // [Dv], contiguous
};

// out[e · out_stride] = Σ_c e^(m_c − M) o_c[e] / (e^(sink − M) + Σ_c e^(m_c − M) l_c) with
// M = max(sink, max_c m_c), over parts part(0) … part(count − 1); *lse (when not null) = M +
// log of that denominator. `sink` is an attention sink's logit (include/qkv/attention.h), or
// −inf for none. Sums run in the parts' order (the same bits for any thread count). A row no
// part saw gets out = 0 and lse = sink; a NaN in any part's m or l makes out and lse NaN, as in
// the reference. `out` may be the o of part(0) (merging into a running result).
template <typename Part>
void merge_partials(int64_t count, Part part, int64_t Dv, float* out, int64_t out_stride,
                    float* lse, float sink = -std::numeric_limits<float>::infinity()) {
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  // The largest part max. A NaN from NaN inputs (in a part's max or sum: some targets' Max
  // drops NaN) makes the row NaN, never the fully-masked 0.
  float m = sink;
  bool nan = false;
  for (int64_t c = 0; c < count; ++c) {
    const PartialRow p = part(c);
    nan = nan || std::isnan(p.m) || std::isnan(p.l);
    m = p.m > m ? p.m : m;
  }
  if (nan || m == kMinusInf) {
    for (int64_t e = 0; e < Dv; ++e) out[e * out_stride] = nan ? NAN : 0;
    if (lse) *lse = nan ? NAN : kMinusInf;
    return;
  }
  float l = sink == kMinusInf ? 0 : std::exp(sink - m);
  bool first = true;  // the first part seen is written, the others added (out may alias it)
  for (int64_t c = 0; c < count; ++c) {
    const PartialRow p = part(c);
    if (p.m == kMinusInf) continue;
    const float w = std::exp(p.m - m);
    l += w * p.l;
    if (first)
      for (int64_t e = 0; e < Dv; ++e) out[e * out_stride] = w * p.o[e];
    else
      for (int64_t e = 0; e < Dv; ++e) out[e * out_stride] += w * p.o[e];
    first = false;
  }
  if (first)  // only the sink: no value
    for (int64_t e = 0; e < Dv; ++e) out[e * out_stride] = 0;
  else
    for (int64_t e = 0; e < Dv; ++e) out[e * out_stride] /= l;
  if (lse) *lse = m + std::log(l);
}

}  // namespace qkv::detail
