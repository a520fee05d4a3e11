// The merge of partial attention results (see merge.h).
#include "attention/merge.h"

#include <cmath>
#include <limits>
#include <vector>

namespace qkv::detail {

float merge_partials(const PartialRow* parts, int64_t count, int64_t Dv, float* out,
                     int64_t out_stride) {
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  // The largest part max. A NaN from NaN inputs (in a part's max or sum: some targets' Max
  // drops NaN) makes the row NaN, as in the reference, never the fully-masked 0.
  float m = kMinusInf;
  bool nan = false;
  for (int64_t c = 0; c < count; ++c) {
    nan = nan || std::isnan(parts[c].m) || std::isnan(parts[c].l);
    m = std::max(m, parts[c].m);
  }
  if (nan || m == kMinusInf) {
    for (int64_t e = 0; e < Dv; ++e) out[e * out_stride] = nan ? NAN : 0;
    return nan ? NAN : kMinusInf;
  }
  thread_local std::vector<float> weights;
  weights.resize(count);
  float l = 0;
  for (int64_t c = 0; c < count; ++c) {
    weights[c] = parts[c].m == kMinusInf ? 0 : std::exp(parts[c].m - m);
    if (parts[c].m != kMinusInf) l += weights[c] * parts[c].l;
  }
  // Element by element, every part read before the element is written: `out` may alias a part.
  for (int64_t e = 0; e < Dv; ++e) {
    float sum = 0;
    for (int64_t c = 0; c < count; ++c)
      if (parts[c].m != kMinusInf) sum += weights[c] * parts[c].o[e];
    out[e * out_stride] = sum / l;
  }
  return l == 0 ? kMinusInf : m + std::log(l);
}

}  // namespace qkv::detail
