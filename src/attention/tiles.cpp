// Compiled once per SIMD target (see src/simd/dispatch.h), and for the bf16 units
// (tiles_bf16.cpp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/tiles.cpp"
#include <hwy/foreach_target.h>
#include <hwy/highway.h>
#include "simd/units-inl.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention/tiles-inl.h"
#include "qkv/error.h"

#if QKV_KERNEL_PASS
HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace tiles {

void TileMask::init(const Mask& mask, int64_t b, int64_t i0, int64_t rows, const Shape& n) {
  std::fill_n(begin, n.Mq, 0);
  std::fill_n(end, n.Mq, 0);
  lo = n.Tk;
  hi = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const KeyRange k = visible_keys(mask, b, i0 + r, n.Tq, n.Tk);
    begin[r] = static_cast<int32_t>(k.begin);
    end[r] = static_cast<int32_t>(std::max(k.begin, k.end));
    if (k.begin < k.end) lo = std::min(lo, k.begin), hi = std::max(hi, k.end);
  }
}

// Row tests over lanes, N rows at a time: as scalar loops over the rows, covers() and find()
// took ~0.5% of every key step and ~2.5% of a masked one.
bool TileMask::covers(int64_t j0, int64_t j1, int64_t rows) const {
  const hn::RebindToSigned<simd::Df> di;
  const int64_t N = static_cast<int64_t>(simd::lanes());
  const auto lo = hn::Set(di, static_cast<int32_t>(j0));
  const auto hi = hn::Set(di, static_cast<int32_t>(j1));
  for (int64_t r = 0; r < rows; r += N) {
    const auto real = hn::FirstN(di, static_cast<size_t>(std::min(N, rows - r)));
    const auto sees_all = hn::And(hn::Not(hn::Gt(hn::LoadU(di, begin + r), lo)),
                                  hn::Not(hn::Lt(hn::LoadU(di, end + r), hi)));
    if (!hn::AllTrue(di, hn::Or(sees_all, hn::Not(real)))) return false;
  }
  return true;
}

void VisibleBlocks::find(const TileMask& tm, int nqv, int64_t rows, int64_t j0, int64_t j1) {
  const hn::RebindToSigned<simd::Df> di;
  const int64_t N = static_cast<int64_t>(simd::lanes());
  chunks = static_cast<int>((j1 - j0 + kKeyChunk - 1) / kKeyChunk);
  for (int c = 0; c < chunks; ++c) {
    const int64_t c0 = j0 + c * kKeyChunk, c1 = std::min(c0 + kKeyChunk, j1);
    const auto lo = hn::Set(di, static_cast<int32_t>(c0));
    const auto hi = hn::Set(di, static_cast<int32_t>(c1));
    first[c] = nqv, last[c] = 0;
    for (int v = 0; v < nqv; ++v) {
      // Over the real rows of vector v: does some row see a key of the chunk, does every row
      // see all of them?
      const auto real = hn::FirstN(di, static_cast<size_t>(std::min(N, rows - v * N)));
      const auto begin = hn::LoadU(di, tm.begin + v * N);
      const auto end = hn::LoadU(di, tm.end + v * N);
      const auto sees_some = hn::And(real, hn::And(hn::Lt(begin, hi), hn::Gt(end, lo)));
      const auto sees_all = hn::And(hn::Not(hn::Gt(begin, lo)), hn::Not(hn::Lt(end, hi)));
      const bool some = !hn::AllFalse(di, sees_some);
      const bool all = hn::AllTrue(di, hn::Or(sees_all, hn::Not(real)));
      state[c][v] = !some ? kHidden : all ? kVisible : kPartial;
      if (some) first[c] = std::min(first[c], v), last[c] = v + 1;
    }
    if (first[c] >= last[c]) first[c] = last[c] = 0;
  }
}

void VisibleBlocks::chunks_seen_by(int v, int& first_chunk, int& last_chunk) const {
  first_chunk = last_chunk = 0;
  for (int c = 0; c < chunks; ++c)
    if (state[c][v] != kHidden) {
      if (first_chunk == last_chunk) first_chunk = c;
      last_chunk = c + 1;
    }
}

void VisibleBlocks::narrow(const MaskProgram& p, int64_t b, int64_t h, int nqv, int64_t i0,
                           int64_t rows, int64_t j0, int64_t j1) {
  const int64_t N = static_cast<int64_t>(simd::lanes());
  for (int c = 0; c < chunks; ++c) {
    const int64_t c0 = j0 + c * kKeyChunk, c1 = std::min(c0 + kKeyChunk, j1);
    int lo = nqv, hi = 0;
    for (int v = 0; v < nqv; ++v) {
      evaluate[c][v] = false;
      if (state[c][v] == kHidden) continue;
      const int64_t r0 = i0 + v * N, r1 = std::min(i0 + (v + 1) * N, i0 + rows) - 1;
      const BlockState f = box_state(p, {b, b, h, h, r0, r1, c0, c1 - 1});
      if (f == BlockState::empty) {
        state[c][v] = kHidden;
        continue;
      }
      if (f == BlockState::partial) evaluate[c][v] = true, state[c][v] = kPartial;
      lo = std::min(lo, v), hi = v + 1;
    }
    first[c] = lo < hi ? lo : 0, last[c] = lo < hi ? hi : 0;
  }
  // A vector's P·V runs over its chunks from the first it sees to the last (chunks_seen_by),
  // so a hidden chunk between them must hold P = 0: the chunk's run of vectors takes the
  // vector in, and apply_function sets its scores to -inf.
  for (int v = 0; v < nqv; ++v) {
    int fc, lc;
    chunks_seen_by(v, fc, lc);
    for (int c = fc; c < lc; ++c) {
      if (first[c] == last[c]) first[c] = v, last[c] = v + 1;
      first[c] = std::min(first[c], v), last[c] = std::max(last[c], v + 1);
    }
  }
}

void VisibleBlocks::apply_function(const MaskProgram& p, int64_t b, int64_t h, int64_t i0,
                                   int64_t rows, int64_t j0, int64_t nk, int64_t Mq, float* S,
                                   int32_t* regs) const {
  const int64_t N = static_cast<int64_t>(simd::lanes());
  for (int c = 0; c < chunks; ++c)
    for (int v = first[c]; v < last[c]; ++v) {
      const int64_t keys = keys_in(c, nk);
      float* s = S + c * kKeyChunk * Mq + v * N;
      if (state[c][v] == kHidden) {
        for (int64_t jj = 0; jj < keys; ++jj)
          hn::Store(hn::Set(df, simd::kMinusInf), df, s + jj * Mq);
      } else if (evaluate[c][v]) {
        // The block's keys as rows of N lanes, one query per lane, as S holds them.
        const mask_lanes::Lanes at{b,           h, i0 + v * N, i0 + rows - 1, j0 + c * kKeyChunk,
                                   j0 + nk - 1, N, true};
        const int32_t* shown = mask_lanes::evaluate(p, at, keys, regs, nullptr);
        for (int64_t jj = 0; jj < keys; ++jj)
          for (int64_t l = 0; l < N; ++l)
            s[jj * Mq + l] = shown[jj * N + l] ? s[jj * Mq + l] : simd::kMinusInf;
      }
    }
}

void VisibleBlocks::apply(const TileMask& tm, int nqv, int64_t j0, int64_t nk, int64_t Mq,
                          float* S) const {
  const size_t N = simd::lanes();
  for (int c = 0; c < chunks; ++c)
    for (int v = 0; v < nqv; ++v) {
      if (state[c][v] != kPartial) continue;
      for (int64_t jj = c * kKeyChunk; jj < c * kKeyChunk + keys_in(c, nk); ++jj) {
        float* s = S + jj * Mq + v * N;
        hn::Store(tm.hide(v, j0 + jj, hn::Load(df, s)), df, s);
      }
    }
}

// The per-element score steps after q·k: softcap, bias, ALiBi, then the mask.
void transform_scores(const ScoreRule& rule, const TileMask& tm, int64_t b, int64_t h, int64_t i0,
                      int64_t rows, int64_t j0, int64_t nk, bool masked, const Shape& n, float* S,
                      float* tanh_out) {
  const size_t N = simd::lanes();
  const int64_t nvec = (rows + N - 1) / N;
  const float* slope = rule.alibi;
  const Vf cap = hn::Set(df, rule.softcap),
           inv_cap = hn::Set(df, rule.softcap > 0 ? 1 / rule.softcap : 0);
  alignas(64) float column[hn::MaxLanes(df)];
  for (int64_t jj = 0; jj < nk; ++jj) {
    const int64_t j = j0 + jj;
    for (int64_t v = 0; v < nvec; ++v) {
      float* s = S + jj * n.Mq + v * N;
      Vf x = hn::Load(df, s);
      if (rule.softcap > 0) {
        const Vf t = hn::Tanh(df, hn::Mul(x, inv_cap));
        if (tanh_out) hn::Store(t, df, tanh_out + jj * n.Mq + v * N);
        x = hn::Mul(cap, t);
      }
      if (!rule.bias.empty()) {
        for (size_t l = 0; l < N; ++l) {
          const int64_t i = std::min<int64_t>(i0 + v * N + l, i0 + rows - 1);
          column[l] = rule.bias(b, h, i, j);
        }
        x = hn::Add(x, hn::Load(df, column));
      }
      if (slope) {
        for (size_t l = 0; l < N; ++l) {
          const int64_t i = i0 + v * N + l;
          column[l] = static_cast<float>(std::abs(i + (n.Tk - n.Tq) - j));
        }
        x = hn::NegMulAdd(hn::Set(df, slope[h]), hn::Load(df, column), x);
      }
      if (masked) x = tm.hide(v, j, x);
      hn::Store(x, df, s);
    }
  }
}

// "index 40 is outside bias (dim 1 has 32 elements) at …": a miss, where it was found.
std::string miss_text(const MaskProgram& p, const MaskMiss& miss, const std::string& at) {
  const MaskTensorData& t = *p.tensors[miss.tensor];
  std::string s = "score function: index ";
  s += std::to_string(miss.index) + " is outside " + t.name + " (dim " + std::to_string(miss.dim);
  s += " has " + std::to_string(t.shape[miss.dim]) + " elements) at " + at;
  return s;
}

void fill_score_tables(ScoreCall& call) {
  const ScoreProgram& p = *call.program;
  for (size_t t = 0; t < p.tables.size(); ++t) {
    const ScoreTable& table = p.tables[t];
    std::vector<int32_t> regs(mask_lanes::register_ints(table.program, call.width));
    std::vector<float> reals(score_lanes::register_floats(table.program, call.width, 0));
    const score_lanes::FloatRegisters r{reals.data(), score_lanes::lane_stride(call.width), 0};
    const int64_t heads = table.reads_h ? call.Hq : 1;
    for (int64_t hr = 0; hr < heads; ++hr) {
      // Lane e: q_idx − kv_idx = e + first_difference().
      const int64_t d0 = call.first_difference();
      const mask_lanes::Lanes at{0, hr, d0, d0 + call.width - 1, 0, 0, call.width, true};
      MaskMiss miss;
      const int32_t result = score_lanes::evaluate(table.program, at, 1, {}, regs.data(), r,
                                                   nullptr, nullptr, nullptr, &miss);
      if (miss.found) {
        std::string where = "h = " + std::to_string(hr) + ", q_idx - kv_idx = ";
        where += std::to_string(miss.lane + d0);
        fail(miss_text(table.program, miss, where));
      }
      std::copy_n(r.value(result), call.width, call.tables[t].data() + hr * call.width);
    }
  }
}

void apply_score_function(const ScoreCall& call, int64_t b, int64_t h, int64_t i0, int64_t rows,
                          int64_t j0, int64_t nk, int64_t Mq, float* S, int32_t* regs, float* reals,
                          float* d_score, float* const* d_sources, int32_t* const* index_of) {
  const ScoreProgram& p = *call.program;
  const float* table_rows[kMostScoreTables];
  for (size_t t = 0; t < p.tables.size(); ++t) table_rows[t] = call.table_row(t, h);
  const bool derivatives = d_score != nullptr;
  const int64_t sources = static_cast<int64_t>(p.sources.size());
  const int64_t slots = derivatives ? 1 + sources : 0;
  const int64_t lanes = kScoreRows * Mq;
  const score_lanes::FloatRegisters r{reals, score_lanes::lane_stride(lanes), slots};
  // (What each float register's derivatives hold: after the registers.)
  uint32_t* held =
      reinterpret_cast<uint32_t*>(reals + score_lanes::register_floats(p.main, lanes, slots));
  int32_t* index_rows[32];
  const int64_t q0 = i0 + call.q_origin, kv0 = j0 + call.kv_origin;  // the indices it reads
  for (int64_t jj = 0; jj < nk; jj += kScoreRows) {
    const int64_t count = std::min(kScoreRows, nk - jj), n = count * Mq;
    const mask_lanes::Lanes at{b, h, q0, q0 + rows - 1, kv0 + jj, kv0 + nk - 1, Mq, true};
    const score_lanes::ScoreInputs in{S + jj * Mq, table_rows, call.table_zero()};
    for (int64_t k = 0; derivatives && k < sources; ++k)
      index_rows[k] = index_of && index_of[k] ? index_of[k] + jj * Mq : nullptr;
    MaskMiss miss;
    const int32_t result =
        score_lanes::evaluate(p.main, at, count, in, regs, r, p.depends.data(), held,
                              derivatives ? index_rows : nullptr, call.may_miss ? &miss : nullptr);
    std::copy_n(r.value(result), n, S + jj * Mq);
    if (derivatives) {
      auto derivative = [&](int64_t slot, float* to) {
        if (held[result] >> slot & 1) std::copy_n(r.derivative(result, slot), n, to);
        else std::fill(to, to + n, 0.0f);
      };
      if (!p.additive) derivative(0, d_score + jj * Mq);
      for (int64_t k = 0; k < sources; ++k) derivative(1 + k, d_sources[k] + jj * Mq);
    }
    if (miss.found) {
      const int64_t q = std::min(q0 + miss.lane % Mq, q0 + rows - 1),
                    kv = kv0 + jj + miss.lane / Mq;
      std::string where = "b = " + std::to_string(b) + ", h = " + std::to_string(h);
      where += ", q_idx = " + std::to_string(q) + ", kv_idx = " + std::to_string(kv);
      call.report_miss({b, h, q, kv}, miss_text(p.main, miss, where));
    }
  }
}

void apply_score_function_row(const ScoreCall& call, int64_t b, int64_t h, int64_t i, int64_t j0,
                              int64_t nk, float* s, int32_t* regs, float* reals) {
  const ScoreProgram& p = *call.program;
  const float* table_rows[kMostScoreTables];
  for (size_t t = 0; t < p.tables.size(); ++t) table_rows[t] = call.table_row(t, h);
  const int64_t lanes = score_row_lanes();
  const score_lanes::FloatRegisters r{reals, score_lanes::lane_stride(lanes), 0};
  uint32_t* held =
      reinterpret_cast<uint32_t*>(reals + score_lanes::register_floats(p.main, lanes, 0));
  const int64_t q = i + call.q_origin, kv0 = j0 + call.kv_origin;  // the indices it reads
  for (int64_t jj = 0; jj < nk; jj += lanes) {
    const int64_t count = std::min(lanes, nk - jj);
    const mask_lanes::Lanes at{b, h, q, q, kv0 + jj, kv0 + nk - 1, count, false};
    const score_lanes::ScoreInputs in{s + jj, table_rows, call.table_zero()};
    MaskMiss miss;
    const int32_t result = score_lanes::evaluate(p.main, at, 1, in, regs, r, p.depends.data(), held,
                                                 nullptr, call.may_miss ? &miss : nullptr);
    std::copy_n(r.value(result), count, s + jj);
    if (miss.found) {
      const int64_t kv = kv0 + jj + miss.lane;
      std::string where = "b = " + std::to_string(b) + ", h = " + std::to_string(h);
      where += ", q_idx = " + std::to_string(q) + ", kv_idx = " + std::to_string(kv);
      call.report_miss({b, h, q, kv}, miss_text(p.main, miss, where));
    }
  }
}

}  // namespace tiles
}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();
#endif  // QKV_KERNEL_PASS
