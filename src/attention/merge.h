// Attention of one query row over disjoint sets of keys, computed apart and merged by their
// log-sum-exp: split-KV decoding's chunks (decode.cpp) and ring attention's blocks
// (src/dist/ring_attention.cpp).
#pragma once

#include <cstdint>

namespace qkv::detail {

// One part: its largest score m (−inf: the part saw no key), the sum l of e^(s − m) over its
// keys, and its output o = Σ e^(s − m) v, unnormalised. (A normalised output with its
// log-sum-exp is the part m = lse, l = 1.)
struct PartialRow {
  float m, l;
  const float* o;  // [Dv], contiguous
};

// out[e · out_stride] = Σ_c e^(m_c − M) o_c[e] / Σ_c e^(m_c − M) l_c with M = max_c m_c;
// returns the row's log-sum-exp M + log Σ_c e^(m_c − M) l_c. Sums run in the parts' order
// (the same bits for any thread count). A row no part saw gets out = 0 and −inf; a NaN in
// any part's m or l makes out and the result NaN, as in the reference. `out` may be one of
// the parts' o.
float merge_partials(const PartialRow* parts, int64_t count, int64_t Dv, float* out,
                     int64_t out_stride);

}  // namespace qkv::detail
