// create_block_mask and the BlockMask's lists (include/qkv/mask_function.h). A block's state
// comes from interval arithmetic over its index ranges when that decides it, else from the
// mask evaluated at every pair of the block with the kernels' SIMD evaluator.
// Compiled once per SIMD target; the entry point below dispatches (see src/simd/dispatch.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "mask/block_mask.cpp"
#include <hwy/foreach_target.h>
#include <hwy/highway.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "mask/lanes-inl.h"
#include "mask/program.h"
#include "qkv/error.h"
#include "qkv/mask_function.h"
#include "qkv/threads.h"
#include "simd/dispatch.h"
#include "util/parallel.h"

#ifndef QKV_MASK_BLOCK_GRID
#define QKV_MASK_BLOCK_GRID
namespace qkv::detail {
// The sizes of a BlockMask being made, and what one row of query blocks found.
struct BlockGrid {
  int64_t Tq, Tk, block, q_blocks, kv_blocks;
};
struct BlockRowReport {
  int64_t visible = 0;
  MaskMiss miss;  // an index outside its tensor, at (q, kv)
  int64_t miss_q = 0, miss_kv = 0;
};
}  // namespace qkv::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {

// The states of query block qb's key blocks for batch b, head h, into states[kv_blocks].
void classify_query_block(const MaskProgram& p, const std::vector<TensorRanges>& ranges,
                          const BlockGrid& g, int64_t b, int64_t h, int64_t qb, uint8_t* states,
                          BlockRowReport& report) {
  const int64_t q0 = qb * g.block, q1 = std::min(q0 + g.block, g.Tq) - 1;
  MaskIntervals iv;
  std::vector<int32_t> regs;
  for (int64_t kb = 0; kb < g.kv_blocks; ++kb) {
    const int64_t k0 = kb * g.block, k1 = std::min(k0 + g.block, g.Tk) - 1;
    const int64_t pairs = (q1 - q0 + 1) * (k1 - k0 + 1);
    intervals(p, ranges, {b, b, h, h, q0, q1, k0, k1}, iv);
    const int64_t lo = iv.lo[p.result], hi = iv.hi[p.result];
    if (!iv.lookup_outside && lo == hi) {
      states[kb] = static_cast<uint8_t>(lo ? BlockState::full : BlockState::empty);
      report.visible += lo ? pairs : 0;
      continue;
    }
    // Pair by pair, a few query rows of the block at a time.
    const int64_t width = k1 - k0 + 1, rows = std::max<int64_t>(1, 2048 / width);
    regs.resize(mask_lanes::register_ints(p, rows * width));
    int64_t seen = 0;
    for (int64_t q = q0; q <= q1; q += rows) {
      const int64_t n = std::min(rows, q1 - q + 1);
      mask_lanes::Lanes at{b, h, q, q1, k0, k1, width, /*q_inner=*/false};
      MaskMiss miss;
      const int32_t* m = mask_lanes::evaluate(p, at, n, regs.data(), &miss);
      if (miss.found && !report.miss.found) {
        report.miss = miss;
        report.miss_q = q + miss.lane / width, report.miss_kv = k0 + miss.lane % width;
      }
      for (int64_t e = 0; e < n * width; ++e) seen += m[e];
    }
    report.visible += seen;
    states[kb] = static_cast<uint8_t>(seen == 0       ? BlockState::empty
                                      : seen == pairs ? BlockState::full
                                                      : BlockState::partial);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qkv {
namespace detail {
HWY_EXPORT(classify_query_block);
}  // namespace detail

namespace {

// Offsets and items of per-row lists of the indices whose state is `want`, in a grid walked
// by `at(row, index)`.
template <class At>
void lists(int64_t rows, int64_t per_row, BlockState want, At&& at, std::vector<int64_t>& offsets,
           std::vector<int32_t>& items) {
  offsets.assign(rows + 1, 0);
  items.clear();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < per_row; ++k)
      if (at(r, k) == want) items.push_back(static_cast<int32_t>(k));
    offsets[r + 1] = static_cast<int64_t>(items.size());
  }
}

}  // namespace

BlockMask create_block_mask(const MaskExpr& mask, int64_t B, int64_t H, int64_t Tq, int64_t Tk,
                            int64_t block) {
  using namespace detail;
  const auto start = std::chrono::steady_clock::now();
  check(B >= 1 && H >= 1 && Tq >= 1 && Tk >= 1,
        "create_block_mask: B, H, Q_LEN and KV_LEN must be "
        "at least 1, got ",
        B, ", ", H, ", ", Tq, ", ", Tk);
  check(Tq < (int64_t{1} << 31) && Tk < (int64_t{1} << 31) && B < (int64_t{1} << 31) &&
            H < (int64_t{1} << 31),
        "create_block_mask: a size leaves 32 bits");
  check(block >= 1, "create_block_mask: BLOCK_SIZE must be at least 1, got ", block);
  auto program = std::make_shared<MaskProgram>(compile(mask));
  const MaskProgram& p = *program;
  std::vector<TensorRanges> ranges;
  for (const auto& t : p.tensors) ranges.emplace_back(*t);

  // Every value the lanes hold must fit 32 bits over the whole grid.
  MaskIntervals all;
  intervals(p, ranges, {0, B - 1, 0, H - 1, 0, Tq - 1, 0, Tk - 1}, all);
  if (all.wide >= 0)
    fail("create_block_mask: ", node_text(*p.code[all.wide].node), " may reach [", all.wide_lo,
         ", ", all.wide_hi, "], outside 32 bits, for b < ", B, ", h < ", H, ", q_idx < ", Tq,
         ", kv_idx < ", Tk);

  BlockMask m;
  m.mask_ = std::make_shared<const MaskExpr>(mask);
  m.B_ = B, m.H_ = H, m.Tq_ = Tq, m.Tk_ = Tk, m.block_ = block;
  m.q_blocks_ = (Tq + block - 1) / block;
  m.kv_blocks_ = (Tk + block - 1) / block;
  m.reads_b_ = p.reads_b, m.reads_h_ = p.reads_h;
  // Only the batches (heads) the function tells apart are stored.
  const int64_t sb = p.reads_b ? B : 1, sh = p.reads_h ? H : 1, rows = sb * sh;
  m.stored_B_ = sb, m.stored_H_ = sh;
  const BlockGrid g{Tq, Tk, block, m.q_blocks_, m.kv_blocks_};
  m.state_.assign(rows * g.q_blocks * g.kv_blocks, 0);
  std::vector<BlockRowReport> reports(rows * g.q_blocks);
  simd::ensure_target();
  parallel_for<Schedule::dynamic>(rows * g.q_blocks, num_threads(), [&](int64_t r) {
    const int64_t row = r / g.q_blocks, qb = r % g.q_blocks;
    HWY_DYNAMIC_DISPATCH(classify_query_block)
    (p, ranges, g, row / sh, row % sh, qb, m.state_.data() + r * g.kv_blocks, reports[r]);
  });
  for (int64_t r = 0; r < rows * g.q_blocks; ++r) {
    const BlockRowReport& rep = reports[r];
    if (rep.miss.found) {
      const MaskTensorData& t = *p.tensors[rep.miss.tensor];
      const int64_t row = r / g.q_blocks;
      fail("create_block_mask: index ", rep.miss.index, " is outside ", t.name, " (dim ",
           rep.miss.dim, " has ", t.shape[rep.miss.dim], " elements) at b = ", row / sh,
           ", h = ", row % sh, ", q_idx = ", rep.miss_q, ", kv_idx = ", rep.miss_kv);
    }
    m.visible_pairs_ += rep.visible;
  }
  m.visible_pairs_ *= (B / sb) * (H / sh);

  const int64_t nq = g.q_blocks, nk = g.kv_blocks;
  const uint8_t* s = m.state_.data();
  auto by_query = [&](int64_t r, int64_t kb) {  // r: (row, query block)
    return static_cast<BlockState>(s[r * nk + kb]);
  };
  auto by_key = [&](int64_t r, int64_t qb) {  // r: (row, key block)
    return static_cast<BlockState>(s[((r / nk) * nq + qb) * nk + r % nk]);
  };
  lists(rows * nq, nk, BlockState::full, by_query, m.full_kv_at_, m.full_kv_);
  lists(rows * nq, nk, BlockState::partial, by_query, m.partial_kv_at_, m.partial_kv_);
  lists(rows * nk, nq, BlockState::full, by_key, m.full_q_at_, m.full_q_);
  lists(rows * nk, nq, BlockState::partial, by_key, m.partial_q_at_, m.partial_q_);
  m.program_ = program;
  m.build_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return m;
}

std::span<const int32_t> BlockMask::list(const std::vector<int64_t>& offsets,
                                         const std::vector<int32_t>& items, int64_t at) const {
  return std::span<const int32_t>(items.data() + offsets[at], items.data() + offsets[at + 1]);
}

std::span<const int32_t> BlockMask::full_key_blocks(int64_t b, int64_t h, int64_t qb) const {
  return list(full_kv_at_, full_kv_, row(b, h) * q_blocks_ + qb);
}
std::span<const int32_t> BlockMask::partial_key_blocks(int64_t b, int64_t h, int64_t qb) const {
  return list(partial_kv_at_, partial_kv_, row(b, h) * q_blocks_ + qb);
}
std::span<const int32_t> BlockMask::full_query_blocks(int64_t b, int64_t h, int64_t kb) const {
  return list(full_q_at_, full_q_, row(b, h) * kv_blocks_ + kb);
}
std::span<const int32_t> BlockMask::partial_query_blocks(int64_t b, int64_t h, int64_t kb) const {
  return list(partial_q_at_, partial_q_, row(b, h) * kv_blocks_ + kb);
}

int64_t BlockMask::bytes() const {
  const auto v64 = [](const std::vector<int64_t>& v) { return static_cast<int64_t>(v.size()) * 8; };
  const auto v32 = [](const std::vector<int32_t>& v) { return static_cast<int64_t>(v.size()) * 4; };
  return static_cast<int64_t>(state_.size()) + v64(full_kv_at_) + v64(partial_kv_at_) +
         v64(full_q_at_) + v64(partial_q_at_) + v32(full_kv_) + v32(partial_kv_) + v32(full_q_) +
         v32(partial_q_);
}

}  // namespace qkv
#endif  // HWY_ONCE
