// The gradient of attention sinks (include/qkv/attention.h). A sink takes weight
// p_sink = e^(sink − lse) from each row and gives no value, so out_i = Σ_j p_ij v_j shrinks as
// the sink grows: ∂out_i/∂sink = −p_sink,i · out_i, and ∂L/∂sink = −Σ_i p_sink,i (dO_i · O_i).
// The keys' gradients need nothing new: P = e^(S − lse) with the sink inside lse.
#include <cmath>
#include <vector>

#include "attention/kernels.h"
#include "qkv/threads.h"
#include "util/parallel.h"

namespace qkv::detail {

void sink_gradients(const AttentionArgs& a, const View& dout, float* dsinks) {
  const int64_t B = a.q.shape[0], Hq = a.q.shape[1], Tq = a.q.shape[2], Dv = a.out.shape[3];
  // One head per iteration, its rows summed in order: the same bits for any thread count.
  parallel_for(Hq, threads_for(B * Hq * Tq * Dv), [&](int64_t h) {
    if (a.sinks[h] == -INFINITY) {  // no sink (and rows with lse −inf would give NaN)
      dsinks[h] = 0;
      return;
    }
    double sum = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < Tq; ++i) {
        const float lse = a.lse[(b * Hq + h) * Tq + i];
        if (std::isnan(lse)) {
          sum = NAN;
          continue;
        }
        const double p_sink = std::exp(double(a.sinks[h]) - lse);
        if (p_sink == 0) continue;
        double Di = 0;
        for (int64_t e = 0; e < Dv; ++e) Di += double(dout.get(b, h, i, e)) * a.out.get(b, h, i, e);
        sum -= p_sink * Di;
      }
    dsinks[h] = static_cast<float>(sum);
  });
}

}  // namespace qkv::detail
