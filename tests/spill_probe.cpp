// The attention micro-kernels at their largest block of each target, as functions of their
// own (in the library they are inlined into the kernels), so that tests/check_spills.sh can
// read their assembly: every vector register they use must stay a register, no stack slot.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "spill_probe.cpp"
#include <hwy/foreach_target.h>
#include <hwy/highway.h>

#include <cstdint>

#include "attention/products-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
using namespace products;  // NOLINT: the micro-kernels probed

constexpr int kV = kBlockVectors, kRows = kProductRows<kBlockVectors>;
constexpr int kTv = kTransposedMaxVectors, kTrows = kTransposedRows<kTransposedMaxVectors>;

HWY_NOINLINE void spill_probe_scores(const float* a, int64_t as, const float* bt, int64_t depth,
                                     int64_t Mq, float* c) {
  rows_times_packed<kV, kRows, Into::kStore>(a, as, bt, depth, Mq, c, nullptr);
}
HWY_NOINLINE void spill_probe_rescale_add(const float* a, int64_t as, const float* bt,
                                          int64_t depth, int64_t Mq, float* c, const float* alpha) {
  rows_times_packed<kV, kRows, Into::kRescaleAdd>(a, as, bt, depth, Mq, c, alpha);
}
HWY_NOINLINE void spill_probe_rows(const float* p, int64_t rows, int64_t Mq, const float* b,
                                   int64_t bs, float* ct) {
  packed_times_rows<kV, kRows, Into::kAdd>(p, rows, Mq, b, bs, 0, ct);
}
HWY_NOINLINE void spill_probe_transposed(const float* p, int64_t Mq, int64_t queries,
                                         const float* r, int64_t rs, float* c, int64_t cs) {
  packed_transposed_times_rows<kTrows, kTv>(p, Mq, queries, r, rs, 0, c, cs);
}

}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();
