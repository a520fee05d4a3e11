// The gradients of a score function's learnable values in the tiled backward
// (flash_backward.cpp): each unit sums dS · ∂score_mod/∂value per source of the program, in
// a fixed order (add_source_gradients), and the units' sums become each ScoreTensor's grad,
// a table's rows through the derivatives of its expression (write_score_gradients). Per
// target, like src/simd/simd-inl.h.
#if defined(QKV_ATTENTION_SCORE_GRADIENTS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_SCORE_GRADIENTS_INL_H_
#undef QKV_ATTENTION_SCORE_GRADIENTS_INL_H_
#else
#define QKV_ATTENTION_SCORE_GRADIENTS_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <vector>

#include <hwy/highway.h>

#include "attention/score_call.h"
#include "mask/lanes-inl.h"
#include "mask/score_lanes-inl.h"
#include "mask/score_program.h"
#include "simd/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace tiles {

// A score function in the backward: the call, and the running unit's sums of the gradients
// of its learnable values (per source of the program: a table's rows of the unit's heads, or
// a tensor's elements), in double.
struct ScoreGrads {
  const ScoreCall* call = nullptr;
  double* sums = nullptr;  // the unit's, at offsets[k] for source k
  const std::vector<int64_t>* offsets = nullptr;
  int64_t first_head = 0;  // the unit's first query head
};

// Source k's sums in a unit: a table's rows (one per head of the group when it reads h, else
// one) of call.width entries, or a tensor's elements.
inline int64_t source_size(const ScoreCall& call, int64_t k, int64_t group) {
  const ScoreProgram& p = *call.program;
  const MaskInstr& in = p.main.code[p.sources[k]];
  if (in.op == MaskOp::table) return (p.tables[in.value].reads_h ? group : 1) * call.width;
  return p.main.tensors[in.tensor]->numel;
}

// The learnable values' part of one key step: each visible pair (P > 0) adds dS ·
// ∂score_mod/∂value to its value's sum, in a fixed order (the chunks', then key rows, then
// queries): the same bits whichever thread runs the unit.
template <class Chunks>
inline void add_source_gradients(const ScoreGrads& g, int64_t h, int64_t i0, int64_t rows,
                                 int64_t j0, int64_t Mq, const float* P, const float* dS,
                                 float* const* d_sources, int32_t* const* index_of,
                                 Chunks&& chunks) {
  const ScoreCall& call = *g.call;
  const ScoreProgram& p = *call.program;
  const int64_t N = static_cast<int64_t>(simd::lanes());
  for (size_t k = 0; k < p.sources.size(); ++k) {
    const MaskInstr& in = p.main.code[p.sources[k]];
    double* sums = g.sums + (*g.offsets)[k];
    const bool table = in.op == MaskOp::table;
    if (table && p.tables[in.value].reads_h) sums += (h - g.first_head) * call.width;
    const float* d = d_sources[k];
    chunks([&](int64_t jj0, int64_t keys, int64_t v0, int64_t count) {
      const int64_t q0 = v0 * N, q1 = std::min((v0 + count) * N, rows);
      for (int64_t jj = jj0; jj < jj0 + keys; ++jj) {
        const int64_t at = jj * Mq;
        if (table) {  // a contiguous run of the table row: entry q − kv + Tk − 1
          double* row = sums + (i0 - (j0 + jj) + call.Tk - 1);
          for (int64_t q = q0; q < q1; ++q)
            if (P[at + q] != 0) row[q] += double(dS[at + q]) * d[at + q];
        } else {
          const int32_t* index = index_of[k] + at;
          for (int64_t q = q0; q < q1; ++q)
            if (P[at + q] != 0) sums[index[q]] += double(dS[at + q]) * d[at + q];
        }
      }
    });
  }
}

// The learnable values' gradients from the units' sums (summed in unit order), written to
// each ScoreTensor's grad; a table's row through the derivatives of its expression.
inline void write_score_gradients(const ScoreCall& call, const std::vector<double>& sums,
                                  int64_t unit_sums, const std::vector<int64_t>& offsets, int64_t B,
                                  int64_t Hkv, int64_t group) {
  const ScoreProgram& p = *call.program;
  const int64_t units = B * Hkv, width = call.width;
  std::vector<const MaskTensorData*> tensors;  // each tensor with a grad once, and its sums
  std::vector<std::vector<double>> totals;
  auto total_of = [&](const MaskTensorData* t) -> std::vector<double>& {
    for (size_t i = 0; i < tensors.size(); ++i)
      if (tensors[i] == t) return totals[i];
    tensors.push_back(t);
    totals.emplace_back(t->numel, 0.0);
    return totals.back();
  };
  for (size_t k = 0; k < p.sources.size(); ++k) {
    const MaskInstr& in = p.main.code[p.sources[k]];
    const int64_t off = offsets[k];
    if (in.op != MaskOp::table) {  // a tensor's elements
      std::vector<double>& total = total_of(p.main.tensors[in.tensor].get());
      for (int64_t u = 0; u < units; ++u)
        for (size_t e = 0; e < total.size(); ++e) total[e] += sums[u * unit_sums + off + e];
      continue;
    }
    const ScoreTable& table = p.tables[in.value];
    const int64_t slots = 1 + static_cast<int64_t>(table.sources.size());
    std::vector<int32_t> regs(mask_lanes::register_ints(table.program, width));
    std::vector<float> reals(score_lanes::register_floats(table.program, width, slots));
    std::vector<uint32_t> held(std::max(table.program.real_registers, 1));
    std::vector<std::vector<int32_t>> index(table.sources.size(), std::vector<int32_t>(width));
    std::vector<int32_t*> index_of;
    for (auto& x : index) index_of.push_back(x.data());
    const score_lanes::FloatRegisters r{reals.data(), score_lanes::lane_stride(width), slots};
    std::vector<double> d_table(width);
    for (int64_t hr = 0; hr < (table.reads_h ? call.Hq : 1); ++hr) {
      std::fill(d_table.begin(), d_table.end(), 0.0);
      for (int64_t u = 0; u < units; ++u) {
        if (table.reads_h && hr / group != u % Hkv) continue;  // (not a head of unit u)
        const double* from =
            sums.data() + u * unit_sums + off + (table.reads_h ? (hr % group) * width : 0);
        for (int64_t e = 0; e < width; ++e) d_table[e] += from[e];
      }
      const mask_lanes::Lanes at{0, hr, -(call.Tk - 1), call.Tq - 1, 0, 0, width, true};
      const int32_t result =
          score_lanes::evaluate(table.program, at, 1, {}, regs.data(), r, table.depends.data(),
                                held.data(), index_of.data(), nullptr);
      for (size_t s = 0; s < table.sources.size(); ++s) {
        if (!(held[result] >> (1 + s) & 1)) continue;
        const float* d = r.derivative(result, static_cast<int64_t>(1 + s));
        const MaskInstr& lookup = table.program.code[table.sources[s]];
        std::vector<double>& total = total_of(table.program.tensors[lookup.tensor].get());
        for (int64_t e = 0; e < width; ++e)
          if (d_table[e] != 0) total[index[s][e]] += d_table[e] * d[e];
      }
    }
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    for (int64_t e = 0; e < tensors[i]->numel; ++e)
      tensors[i]->grad[e] = static_cast<float>(totals[i][e]);
}

}  // namespace tiles
}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
