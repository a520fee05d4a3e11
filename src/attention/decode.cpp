// Split-KV decoding: a few query rows against a long key/value cache.
//
// With one query per head there is too little work per (batch, head) to split by queries,
// and the cost is reading K and V once: the kernel is memory-bound. So the keys are cut into
// chunks (of a size set by the cache length alone), every (batch, kv head, chunk) is a unit
// of work, and the partial results (running max m, sum l, unnormalised output o) are merged
// with their log-sum-exp afterwards (merge.h; as FlashDecoding and ggml's split-KV path do):
//   m = max_c m_c,  l = Σ_c l_c e^(m_c − m),  out = Σ_c o_c e^(m_c − m) / l.
// The chunk size does not depend on the thread count and the merge runs in chunk order, so
// the result is the same bits for any number of threads.
//
// All query rows that share a key/value head (the heads of a GQA group × Tq) are processed
// together, so each key and value row is read from memory once per unit: up to 15 rows with
// their partial sums in registers (decode_unit_rows), 16 and more in vector lanes with the
// tiled kernels' pieces (decode_unit_tiled), and head dims below a vector with the keys in
// the lanes (decode_unit_keys_in_lanes). Each is written once over
//   a row source for the keys and one for the values (decode_rows-inl.h): elements (fp32,
//   bf16, fp16) or 32-value blocks, the same for both, or values in a format of their own
//   widened a block of rows at a time (WidenedValues), and
//   a product unit for the rows: RowsOnFma (decode_rows-inl.h), RowsOnBf16Dot
//   (decode_units-inl.h), RowsOnInt8 (integer Q·K over blocks, decode_int8-inl.h, with P·V
//   in integers too where Int8Values takes it, int8_values-inl.h); tiles::TileUnit<…>
//   (tile_units-inl.h) for the tiles.
// Compiled once per SIMD target; the entry points below dispatch (see src/simd/dispatch.h).
// Compiled once more for the bf16 units (decode_bf16.cpp, src/simd/units.h), where bf16 rows
// are multiplied as pairs (vdpbf16ps, bfdot) instead of widened: the tiled unit on both, the
// rows in registers on x86 (on Arm those still widen).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/decode.cpp"
#include <hwy/foreach_target.h>
#include <hwy/highway.h>
#include "simd/units-inl.h"

#include <algorithm>
#include <type_traits>
#include <cmath>
#include <vector>

#include "util/parallel.h"
#include "attention/kernels.h"
#include "attention/plan.h"
#include "attention/masks.h"
#include "attention/merge.h"
#include "simd/simd-inl.h"
#include "simd/kernel_namespace.h"
#include "simd/convert-inl.h"
#include "attention/tiles-inl.h"
#include "qkv/threads.h"
#include "qkv/error.h"
#include "util/scratch.h"
#include "simd/dispatch.h"
#include "simd/units.h"
#include "attention/block_rows-inl.h"
#include "attention/decode_rows-inl.h"
#include "attention/decode_units-inl.h"
#include "attention/decode_int8-inl.h"
#include "attention/tile_units-inl.h"

#if QKV_KERNEL_PASS
QKV_KERNEL_BEGIN(qkv::detail)
namespace {

using namespace decoding;  // NOLINT: the row sources and units of this file
// Keys per unit: about a sixteenth of the cache, a power of two from 256 to 2048, so that
// even one (batch, kv head) makes 16 units while caches of 4k and more are long enough.
// Each unit reads its K rows, then its V rows: longer chunks switch between the two streams
// less often. Against 256 keys everywhere, 2048 read a 32k cache 8% faster (64k: 8.5%, 16k
// with 1024: 3%; measured in-process, 8 heads, dim 128, 2 threads). It depends on Tk only, not
// on the thread count, so the bits do not either.
int64_t chunk_for(int64_t Tk) {
  int64_t chunk = 256;
  while (chunk < 2048 && 2 * chunk * 16 <= Tk) chunk *= 2;
  return chunk;
}

struct Shape {
  int64_t B, Hq, Hkv, Tq, Tk, D, Dv, G, R, chunk, chunks;  // G = Hq / Hkv, R = G · Tq rows
  int64_t wrap;  // keys [0, wrap) and [wrap, Tk) each lie a row apart (a ring's wrap; or Tk)
  // Row r of key/value head hkv's group is query query(r) of query head head(hkv, r).
  int64_t head(int64_t hkv, int64_t r) const { return hkv * G + r / Tq; }
  int64_t query(int64_t r) const { return r % Tq; }
  // Chunk c's keys [c0, c1): chunks of `chunk` keys from 0 and, past a ring's wrap, from wrap,
  // so that no chunk crosses it.
  int64_t chunks_before_wrap() const { return (wrap + chunk - 1) / chunk; }
  void keys_of(int64_t c, int64_t& c0, int64_t& c1) const {
    const int64_t before = chunks_before_wrap();
    if (c < before) c0 = c * chunk, c1 = std::min(c0 + chunk, wrap);
    else c0 = wrap + (c - before) * chunk, c1 = std::min(c0 + chunk, Tk);
  }
};

// Partial results of one unit: per row m, l, then o[Dv].
float* partial(float* base, const Shape& n, int64_t unit, int64_t r) {
  return base + (unit * n.R + r) * (n.Dv + 2);
}

// m ← the max of row[0, count), row ← p = e^(row − m), l ← Σ p, in whole vectors: the row
// holds -inf from count to the next whole vector (p = 0 there). A row that sees no key keeps
// m = -inf and gets p = 0 (not e^(-inf + inf) = NaN), l = 0.
void softmax_row(float* row, int64_t count, float& m, float& l) {
  const size_t N = simd::lanes();
  Vf mx = hn::Set(df, simd::kMinusInf);
  for (int64_t j = 0; j < count; j += N) mx = hn::Max(mx, hn::LoadU(df, row + j));
  m = hn::GetLane(hn::MaxOfLanes(df, mx));
  const Vf shift = hn::Set(df, m == simd::kMinusInf ? 0.0f : m);
  Vf sum = hn::Zero(df);
  for (int64_t j = 0; j < count; j += N) {
    const Vf p = simd::exp_nonpositive(hn::Sub(hn::LoadU(df, row + j), shift));
    hn::StoreU(p, df, row + j);
    sum = hn::Add(sum, p);
  }
  l = hn::GetLane(hn::SumOfLanes(df, sum));
}

// (decode_unit_keys_in_lanes: head dims below a vector, as stories260K's 8, waste most lanes
// when a vector runs along d; there the lanes run along 16 keys instead, and K and V columns
// are gathered.)

// N elements of column `e` of rows row0, row0 + stride, … (the rows past `last` repeat it):
// a gather for fp32; 16-bit elements one by one (head dims this small are rare).
template <typename T>
HWY_INLINE Vf column(const T* row0, int64_t stride, int64_t last, int64_t e) {
  const hn::RebindToSigned<simd::Df> di;
  const auto lane = hn::Iota(di, 0);
  if constexpr (std::is_same_v<T, float>) {
    const auto idx = hn::Mul(hn::Min(lane, hn::Set(di, static_cast<int32_t>(last))),
                             hn::Set(di, static_cast<int32_t>(stride)));
    return hn::GatherIndex(df, row0 + e, idx);
  } else {
    alignas(64) float x[hn::MaxLanes(df)];
    for (int64_t l = 0; l < static_cast<int64_t>(simd::lanes()); ++l)
      x[l] = widen_one(row0[std::min(l, last) * stride + e]);
    return hn::Load(df, x);
  }
}

// s[r][j − c0] ← q_r · k_j for the keys [c0, c1) visible to row r (others stay −inf).
template <typename T>
void scores_keys_in_lanes(const ElementSource<T>& K, const Shape& n, int64_t b, int64_t hkv,
                          int64_t c0, int64_t c1, const float* q, const KeyRange* ranges,
                          float* s) {
  const hn::RebindToSigned<simd::Df> di;
  const auto N = static_cast<int64_t>(simd::lanes());
  const int64_t ks = K.step;
  const auto lane = hn::Iota(di, 0);
  for (int64_t j = c0; j < c1; j += N) {
    // Keys past c1 read the last key again (in bounds) and are masked below.
    simd::VfSlot acc[kMaxRowsInLanes];
    for (int64_t r = 0; r < n.R; ++r) acc[r] = hn::Zero(df);
    const T* k = K.row(b, hkv, j);
    for (int64_t d = 0; d < n.D; ++d) {
      const Vf kd = column(k, ks, c1 - 1 - j, d);
      for (int64_t r = 0; r < n.R; ++r)
        acc[r] = hn::MulAdd(hn::Set(df, q[r * n.D + d]), kd, acc[r]);
    }
    const auto key = hn::Add(lane, hn::Set(di, static_cast<int32_t>(j)));
    for (int64_t r = 0; r < n.R; ++r) {
      const auto seen =
          hn::And(hn::Not(hn::Lt(key, hn::Set(di, static_cast<int32_t>(ranges[r].begin)))),
                  hn::Lt(key, hn::Set(di, static_cast<int32_t>(ranges[r].end))));
      const Vf v = hn::IfThenElse(hn::RebindMask(df, seen), acc[r], hn::Set(df, simd::kMinusInf));
      hn::StoreU(v, df, s + r * n.chunk + j - c0);
    }
  }
}

// o_r += Σ_j p_r[j] v_j over the keys [c0, c1), p = s (0 where masked).
template <typename T>
void values_keys_in_lanes(const ElementSource<T>& V, const Shape& n, int64_t b, int64_t hkv,
                          int64_t c0, int64_t c1, const float* s, float* parts, int64_t unit) {
  const auto N = static_cast<int64_t>(simd::lanes());
  const int64_t vs = V.step;
  for (int64_t e = 0; e < n.Dv; ++e) {
    simd::VfSlot acc[kMaxRowsInLanes];
    for (int64_t r = 0; r < n.R; ++r) acc[r] = hn::Zero(df);
    for (int64_t j = c0; j < c1; j += N) {
      const Vf ve = column(V.row(b, hkv, j), vs, c1 - 1 - j, e);
      // Past c1 the probabilities are e^(−inf) = 0, so the repeated last row adds nothing.
      for (int64_t r = 0; r < n.R; ++r)
        acc[r] = hn::MulAdd(hn::LoadU(df, s + r * n.chunk + j - c0), ve, acc[r]);
    }
    for (int64_t r = 0; r < n.R; ++r)
      partial(parts, n, unit, r)[2 + e] += hn::GetLane(hn::SumOfLanes(df, Vf(acc[r])));
  }
}

// ---- Mask and score functions (args.block_mask, args.score_mod), a row of keys at a time ----

// Keys per evaluation of a mask function over lanes (the registers function_register_ints
// gives).
int64_t mask_piece() { return tiles::kKeyChunk * static_cast<int64_t>(simd::lanes()); }

// 1 where the mask function shows key index kv0 + e (e < count <= mask_piece()) to query index
// q of (b, h), else 0.
const int32_t* shown_keys(const BlockMask& m, int64_t b, int64_t h, int64_t q, int64_t kv0,
                          int64_t count) {
  const MaskProgram& p = m.program();
  int32_t* regs =
      thread_scratch_for<int32_t>(ForwardSlot::mask_registers, tiles::function_register_ints(p));
  const mask_lanes::Lanes at{b, h, q, q, kv0, kv0 + count - 1, count, false};
  return mask_lanes::evaluate(p, at, 1, regs, nullptr);
}

// `range` narrowed to the keys from the first the mask function shows query i of (b, h) to the
// last: empty blocks at either end skipped, and the edge blocks that are partial evaluated
// (a window written as a function then reads the keys the window option would, not its
// blocks'). What it hides between is hidden by apply_functions.
KeyRange narrow_to_blocks(const ScoreRule& rule, int64_t b, int64_t h, int64_t i, KeyRange range) {
  const BlockMask* m = rule.block_mask;
  if (!m || range.begin >= range.end) return range;
  const int64_t s = m->block(), ko = rule.kv_origin, q = i + rule.q_origin, qb = q / s;
  const int64_t piece = mask_piece();
  int64_t begin = range.begin, end = range.end;
  // From the front: the first key shown.
  for (bool found = false; begin < end && !found;) {
    const int64_t kb = (begin + ko) / s, block_end = std::min(end, (kb + 1) * s - ko);
    const BlockState st = m->state(b, h, qb, kb);
    found = st == BlockState::full;
    for (int64_t j0 = begin; st == BlockState::partial && !found && j0 < block_end; j0 += piece) {
      const int64_t count = std::min(piece, block_end - j0);
      const int32_t* shown = shown_keys(*m, b, h, q, j0 + ko, count);
      for (int64_t e = 0; e < count && !found; ++e)
        if (shown[e]) found = true, begin = j0 + e;
    }
    if (!found) begin = block_end;
  }
  // From the back: the last key shown.
  for (bool found = false; end > begin && !found;) {
    const int64_t kb = (end - 1 + ko) / s, block_begin = std::max(begin, kb * s - ko);
    const BlockState st = m->state(b, h, qb, kb);
    found = st == BlockState::full;
    for (int64_t j1 = end; st == BlockState::partial && !found && j1 > block_begin; j1 -= piece) {
      const int64_t count = std::min(piece, j1 - block_begin), j0 = j1 - count;
      const int32_t* shown = shown_keys(*m, b, h, q, j0 + ko, count);
      for (int64_t e = count - 1; e >= 0 && !found; --e)
        if (shown[e]) found = true, end = j0 + e + 1;
    }
    if (!found) end = block_begin;
  }
  return {begin, std::max(begin, end)};
}

// s[j − lo] for the keys j in `range` of query i of (b, h): the score function, then -inf
// where the mask function hides the key (its empty blocks at once, its partial ones evaluated
// over lanes, its full ones untouched).
void apply_functions(const ScoreRule& rule, int64_t b, int64_t h, int64_t i, KeyRange range,
                     int64_t lo, float* s) {
  if (range.begin >= range.end) return;
  if (rule.call) {
    const ScoreCall& call = *rule.call;
    const int64_t Mq = tiles::kQueryVectors * static_cast<int64_t>(simd::lanes());
    int32_t* ints =
        thread_scratch_for<int32_t>(ForwardSlot::score_ints, tiles::score_register_ints(call, Mq));
    float* reals =
        thread_scratch(ForwardSlot::score_floats, tiles::score_register_floats(call, Mq, 0));
    tiles::apply_score_function_row(call, b, h, i, range.begin, range.end - range.begin,
                                    s + (range.begin - lo), ints, reals);
  }
  const BlockMask* m = rule.block_mask;
  if (!m) return;
  const int64_t bs = m->block(), q = i + rule.q_origin, qb = q / bs, piece = mask_piece();
  for (int64_t j = range.begin; j < range.end;) {
    const int64_t kb = (j + rule.kv_origin) / bs;
    const int64_t end = std::min(range.end, (kb + 1) * bs - rule.kv_origin);
    const BlockState state = m->state(b, h, qb, kb);
    if (state == BlockState::empty) std::fill(s + (j - lo), s + (end - lo), simd::kMinusInf);
    for (int64_t j0 = j; state == BlockState::partial && j0 < end; j0 += piece) {
      const int64_t count = std::min(piece, end - j0);
      const int32_t* shown = shown_keys(*m, b, h, q, j0 + rule.kv_origin, count);
      float* x = s + (j0 - lo);
      for (int64_t e = 0; e < count; ++e) x[e] = shown[e] ? x[e] : simd::kMinusInf;
    }
    j = end;
  }
}

// Unit (b, hkv, c): its chunk of keys [c0, c1), its rows' visible keys within it (empty:
// begin = end), and their union [lo, hi): key and value rows outside it are never read (past
// a kv_len they may hold anything). q holds each row's scaled query at q[r · D].
struct UnitRows {
  int64_t c0, c1, unit, lo, hi;
  KeyRange* ranges;  // [R], in the thread's scratch
  float* q;
};
// UnitRows for unit (b, hkv, c), in the calling thread's scratch, with each row's partial
// result started as "no key seen" and the first `paired` elements of each query in pair order.
UnitRows start_unit(const AttentionArgs& a, const ScoreRule& rule, float scale, const Shape& n,
                    int64_t b, int64_t hkv, int64_t c, float* parts, int64_t paired = 0) {
  UnitRows u;
  n.keys_of(c, u.c0, u.c1);
  u.unit = (b * n.Hkv + hkv) * n.chunks + c;
  u.lo = u.c1, u.hi = u.c0;
  u.ranges = thread_scratch_for<KeyRange>(ForwardSlot::key_ranges, n.R);
  u.q = thread_scratch(ForwardSlot::queries, n.R * n.D);
  for (int64_t r = 0; r < n.R; ++r) {
    const int64_t h = n.head(hkv, r), i = n.query(r);
    const KeyRange k = visible_keys(a.mask, b, i, n.Tq, n.Tk);
    KeyRange& range = u.ranges[r];
    range.begin = std::max(k.begin, u.c0);
    range.end = std::max(std::min(k.end, u.c1), range.begin);
    range = narrow_to_blocks(rule, b, h, i, range);
    if (range.begin < range.end)
      u.lo = std::min(u.lo, range.begin), u.hi = std::max(u.hi, range.end);
    tiles::with_element_type(a.q.type, [&](auto element) {
      using Q = decltype(element);
      const Q* row = static_cast<const Q*>(a.q.address()) + b * a.q.stride[0] + h * a.q.stride[1] +
                     i * a.q.stride[2];
      for (int64_t d = 0; d < n.D; ++d)
        u.q[r * n.D + d] = scale * widen_one(row[d * a.q.stride[3]]);
    });
    pair_order(u.q + r * n.D, paired, false);
    float* out = partial(parts, n, u.unit, r);
    out[0] = simd::kMinusInf, out[1] = 0;
    std::fill(out + 2, out + 2 + n.Dv, 0.0f);
  }
  return u;
}

// A row's scores s[j − lo] for keys j in [lo, hi), of which it sees `range`: the score
// transforms on the keys it sees, -inf on the rest up to the next whole vector past hi, then
// softmax_row into the row's partial result.
void finish_scores(const AttentionArgs& a, const ScoreRule& rule, const Shape& n, int64_t b,
                   int64_t hkv, int64_t r, KeyRange range, int64_t lo, int64_t hi, float* s,
                   float* out) {
  const int64_t N = static_cast<int64_t>(simd::lanes());
  if (rule.transforms())
    for (int64_t j = range.begin; j < range.end; ++j)
      s[j - lo] = rule.transform(b, n.head(hkv, r), n.query(r), j, s[j - lo]);
  apply_functions(rule, b, n.head(hkv, r), n.query(r), range, lo, s);
  const int64_t begin = std::clamp(range.begin, lo, hi), end = std::clamp(range.end, begin, hi);
  std::fill(s, s + (begin - lo), simd::kMinusInf);
  std::fill(s + (end - lo), s + (hi - lo + N - 1) / N * N, simd::kMinusInf);
  softmax_row(s, hi - lo, out[0], out[1]);
}

// One unit with the keys in the lanes (see keys_in_lanes).
template <typename T>
void decode_unit_keys_in_lanes(const AttentionArgs& a, const ElementSource<T>& K,
                               const ElementSource<T>& V, const ScoreRule& rule, float scale,
                               const Shape& n, int64_t b, int64_t hkv, int64_t c, float* parts) {
  const UnitRows u = start_unit(a, rule, scale, n, b, hkv, c, parts);
  if (u.lo >= u.hi) return;
  float* s = thread_scratch(ForwardSlot::scores, n.R * n.chunk);
  // Scores of the keys [c0, hi), -inf where a row may not look.
  scores_keys_in_lanes(K, n, b, hkv, u.c0, u.hi, u.q, u.ranges, s);
  for (int64_t r = 0; r < n.R; ++r)
    finish_scores(a, rule, n, b, hkv, r, u.ranges[r], u.c0, u.hi, s + r * n.chunk,
                  partial(parts, n, u.unit, r));
  values_keys_in_lanes(V, n, b, hkv, u.c0, u.hi, s, parts, u.unit);
}

// ---- A few rows per key/value head, their sums in registers --------------------------------

// One unit of R < kTiledDecodeMinRows rows: the scores of the keys N at a time, each row's
// softmax, then P·V over blocks of value rows, in groups of up to 4 rows and passes of
// kValueVectors columns. Each key and value row is read from memory once. Src: where the rows
// are and how they are read; Unit: which instructions multiply them (RowsOnFma, RowsOnBf16Dot).
template <class Unit, class KSrc, class VSrc>
void decode_unit_rows(const AttentionArgs& a, const KSrc& K, const VSrc& V, const ScoreRule& rule,
                      float scale, const Shape& n, int64_t b, int64_t hkv, int64_t c,
                      float* parts) {
  const int64_t N = static_cast<int64_t>(simd::lanes());
  const UnitRows u =
      start_unit(a, rule, Unit::kScalesScores ? 1.0f : scale, n, b, hkv, c, parts, Unit::paired(K));
  const int64_t lo = u.lo, hi = u.hi;
  if (lo >= hi) return;
  Unit unit;
  unit.prepare(K, u.q, n.R, n.D, a.q.type != TensorType::bf16, hi - lo);
  const int64_t stride = n.chunk + N;  // a row of scores, and room for a whole vector past it
  float* s = thread_scratch(ForwardSlot::scores, n.R * stride);
  // Rows kPrefetchRows ahead, up to hi, are asked for as each row is read.
  const auto ahead = [&](int64_t j, int64_t count) {
    return std::clamp<int64_t>(hi - (j + kPrefetchRows), 0, count);
  };
  for (int64_t j = lo; j < hi; j += N) {
    const int64_t nk = std::min(N, hi - j);
    unit.scores(K, u.q, n.R, K.row(b, hkv, j), nk, ahead(j, nk), scale, s + (j - lo), stride);
  }
  float* o[kTiledDecodeMinRows];
  for (int64_t r = 0; r < n.R; ++r) {
    float* out = partial(parts, n, u.unit, r);
    finish_scores(a, rule, n, b, hkv, r, u.ranges[r], lo, hi, s + r * stride, out);
    unit.probabilities(s + r * stride, hi - lo, r);
    o[r] = out + 2;
  }
  // (o starts at zero: already in pair order.)
  for (int64_t j = lo; j < hi; j += kValueBlock) {
    const int64_t nk = std::min(kValueBlock, hi - j);
    unit.values(V, s, stride, j - lo, nk, V.row(b, hkv, j), ahead(j, nk), n.R, o);
  }
  unit.finish(V, o, n.R);
}

// The element the tiled unit multiplies: K's and V's tiles' own where they share it, else
// fp32 (values of their own format beside 16-bit keys: both widened).
template <class KSrc, class VSrc>
using TileElementOf = std::conditional_t<
    std::is_same_v<typename KSrc::TileElement, typename VSrc::TileElement>,
    typename KSrc::TileElement, float>;

// Rows [j0, j0 + nk) of a source as a tile of E: its own tile, or 16-bit rows widened to fp32
// into `scratch` (nk × dim).
template <class E, class Src>
const E* tile_as(const Src& s, int64_t b, int64_t h, int64_t j0, int64_t nk, float* scratch,
                 int64_t& stride) {
  using Own = typename Src::TileElement;
  if constexpr (std::is_same_v<Own, E>) {
    return s.tile(b, h, j0, nk, scratch, stride);
  } else {
    static_assert(std::is_same_v<E, float>, "only fp32 tiles are widened");
    widen_element_rows<Own>(reinterpret_cast<const uint8_t*>(s.row(b, h, j0)),
                            s.step * static_cast<int64_t>(sizeof(Own)), nk, s.dim, scratch);
    stride = s.dim;
    return scratch;
  }
}

// Many rows per key/value head (a large GQA group, several queries each): up to 64 rows per
// block in vector lanes, the chunk walked in tiles of 64 keys with the tiled forward's
// micro-kernels and online softmax: S = K Qt, P = e^(S − m), Ot = alpha Ot + Vᵀ P, each key
// and value row still read from memory once per unit. (MQA with 32 heads, cache 32k, dim 128,
// 2 threads: 51.7 ms through the tiled forward, which reads K and V once per query head,
// 2.45 ms this way.) A tile of rows comes from the source in place, or widened into the
// thread's scratch (blocks); the tile unit multiplies it (bf16 rows on the bf16 dot unit in
// the units' pass, everything else widened).
template <class Unit, class KSrc, class VSrc>
void decode_unit_tiled(const AttentionArgs& a, const KSrc& K, const VSrc& V, const ScoreRule& rule,
                       float scale, const Shape& n, int64_t b, int64_t hkv, int64_t c,
                       float* parts) {
  using tiles::kKeyTile;
  using E = TileElementOf<KSrc, VSrc>;
  const int64_t N = static_cast<int64_t>(simd::lanes());
  const UnitRows u = start_unit(a, rule, Unit::kScalesScores ? 1.0f : scale, n, b, hkv, c, parts);
  const bool two = a.q.type != TensorType::bf16;  // (the bf16 unit takes q as hi + lo)
  const int64_t lo = u.lo, hi = u.hi;
  if (lo >= hi) return;
  const int64_t Mq = std::min<int64_t>(tiles::kQueryVectors * N, (n.R + N - 1) / N * N);
  const int64_t blocks = (n.R + Mq - 1) / Mq;
  float* Qt = thread_scratch(ForwardSlot::q_tiles, blocks * n.D * Mq);
  float* S = thread_scratch(ForwardSlot::scores, kKeyTile * Mq);
  float* Ot = thread_scratch(ForwardSlot::out_tiles, blocks * n.Dv * Mq);
  float* state = thread_scratch(ForwardSlot::softmax_state, blocks * 3 * Mq);  // m, l, alpha
  float* Vt = thread_scratch(ForwardSlot::v_tiles, n.Dv * kKeyTile);
  // Each block's rows' keys in this chunk.
  auto* masks = thread_scratch_for<tiles::TileMask>(ForwardSlot::tile_masks, blocks);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t rows = std::min(Mq, n.R - blk * Mq);
    tiles::TileMask& tm = masks[blk];
    std::fill_n(tm.begin, Mq, 0);
    std::fill_n(tm.end, Mq, 0);
    for (int64_t lane = 0; lane < rows; ++lane) {
      tm.begin[lane] = static_cast<int32_t>(u.ranges[blk * Mq + lane].begin);
      tm.end[lane] = static_cast<int32_t>(u.ranges[blk * Mq + lane].end);
    }
    Unit::pack_queries(View(u.q, {1, 1, n.R, n.D}), 0, 0, blk * Mq, rows, n.D, Mq, 1.0f, two,
                       Qt + blk * n.D * Mq);
    std::fill(Ot + blk * n.Dv * Mq, Ot + (blk + 1) * n.Dv * Mq, 0.0f);
    float* m = state + blk * 3 * Mq;
    std::fill(m, m + Mq, simd::kMinusInf);
    std::fill(m + Mq, m + 2 * Mq, 0.0f);
  }
  // The next key tile's rows are asked for while this one computes, spread over the tile's
  // micro-kernel calls (with 16 rows per block there are few, and the tiled forward's 8 lines
  // per call left most for one burst at the next tile, which stalls on the line-fill buffers).
  // Against none: 21% faster from a cache in memory (256 MiB), 3% slower from one in L3.
  products::PrefetchQueue prefetch;
  const int64_t NK = products::product_rows(static_cast<int>(Mq / N));
  const int64_t calls = blocks * ((kKeyTile + NK - 1) / NK + (n.Dv + NK - 1) / NK);
  using KStored = std::remove_cv_t<std::remove_pointer_t<typename KSrc::Ptr>>;
  using VStored = std::remove_cv_t<std::remove_pointer_t<typename VSrc::Ptr>>;
  const int64_t lines_per_row = (K.width() * static_cast<int64_t>(sizeof(KStored)) + 63) / 64 +
                                (V.width() * static_cast<int64_t>(sizeof(VStored)) + 63) / 64;
  // Tiles widened into scratch (blocks, values of their own format), else read in place.
  constexpr bool kWidenK = !std::is_same_v<KStored, E>, kWidenV = !std::is_same_v<VStored, E>;
  float* k_scratch = kWidenK ? thread_scratch(BlockSlot::keys, kKeyTile * n.D) : nullptr;
  float* v_scratch = kWidenV ? thread_scratch(BlockSlot::values, kKeyTile * n.Dv) : nullptr;
  Unit::begin();
  for (int64_t j0 = lo; j0 < hi; j0 += kKeyTile) {
    const int64_t nk = std::min(kKeyTile, hi - j0);
    const int64_t next = j0 + nk, next_rows = std::min(kKeyTile, hi - next);
    const int64_t per_call = std::max<int64_t>(8, (next_rows * lines_per_row + calls - 1) / calls);
    prefetch.issue_all();
    prefetch.reset(K.row(b, hkv, next), K.step, K.width(), V.row(b, hkv, next), V.step, V.width(),
                   next_rows, static_cast<int>(per_call));
    int64_t ks, vs;
    const E* k_rows = tile_as<E>(K, b, hkv, j0, nk, k_scratch, ks);
    const E* v_rows = tile_as<E>(V, b, hkv, j0, nk, v_scratch, vs);
    Unit::pack_values(v_rows, vs, nk, n.Dv, Vt);
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const tiles::TileMask& tm = masks[blk];
      const int64_t rows = std::min(Mq, n.R - blk * Mq);
      float* m = state + blk * 3 * Mq;
      float *l = m + Mq, *alpha = l + Mq;
      simd::with_count<tiles::kQueryVectors>(static_cast<int>((rows + N - 1) / N), [&](auto c) {
        constexpr int NQV = decltype(c)::value;
        Unit::template scores<NQV>(k_rows, ks, nk, Qt + blk * n.D * Mq, n.D, Mq, two, scale, S,
                                   &prefetch);
        if (rule.transforms())
          for (int64_t lane = 0; lane < rows; ++lane) {
            const int64_t r = blk * Mq + lane;
            for (int64_t jj = 0; jj < nk; ++jj) {
              float& x = S[jj * Mq + lane];
              x = rule.transform(b, n.head(hkv, r), n.query(r), j0 + jj, x);
            }
          }
        if (rule.call || rule.block_mask)  // (each row's scores gathered into a row and back)
          for (int64_t lane = 0; lane < rows; ++lane) {
            const int64_t r = blk * Mq + lane;
            const KeyRange seen{std::max(u.ranges[r].begin, j0),
                                std::min(u.ranges[r].end, j0 + nk)};
            if (seen.begin >= seen.end) continue;
            float row[kKeyTile];
            for (int64_t jj = 0; jj < nk; ++jj) row[jj] = S[jj * Mq + lane];
            apply_functions(rule, b, n.head(hkv, r), n.query(r), seen, j0, row);
            for (int64_t jj = 0; jj < nk; ++jj) S[jj * Mq + lane] = row[jj];
          }
        if (!tm.covers(j0, j0 + nk, rows))
          for (int64_t jj = 0; jj < nk; ++jj)
            for (int v = 0; v < NQV; ++v) {
              float* s = S + jj * Mq + v * N;
              hn::Store(tm.hide(v, j0 + jj, hn::Load(df, s)), df, s);
            }
        tiles::online_softmax<NQV>(S, Mq, m, l, alpha, tiles::every_score<NQV>(nk));
        Unit::template accumulate<NQV>(S, nk, Mq, Vt, n.Dv, alpha, Ot + blk * n.Dv * Mq, &prefetch);
      });
    }
  }
  Unit::end();
  for (int64_t r = 0; r < n.R; ++r) {
    const int64_t blk = r / Mq, lane = r % Mq;
    const float* m = state + blk * 3 * Mq;
    float* out = partial(parts, n, u.unit, r);
    out[0] = m[lane];
    out[1] = m[Mq + lane];
    for (int64_t e = 0; e < n.Dv; ++e) out[2 + e] = Ot[(blk * n.Dv + e) * Mq + lane];
  }
}

// The split-KV driver over a row source for the keys and one for the values: the same one, or
// WidenedValues for values stored in a format of their own.
template <class Src, class VSrc = Src>
void decode(const AttentionArgs& a, const KvRows& KR, const KvRows& VR, const Plan& plan) {
  const Src K(KR);
  const VSrc V(VR);
  constexpr bool kOneSource = std::is_same_v<Src, VSrc>;
  Shape n{};
  n.B = a.q.shape[0], n.Hq = a.q.shape[1], n.Hkv = KR.heads, n.Tq = a.q.shape[2];
  n.Tk = KR.rows, n.D = a.q.shape[3], n.Dv = VR.dim;
  n.G = n.Hq / n.Hkv;
  n.R = n.G * n.Tq;
  n.chunk = chunk_for(n.Tk);
  n.wrap = KR.wrap();
  n.chunks = n.chunks_before_wrap() + (n.Tk - n.wrap + n.chunk - 1) / n.chunk;
  ScoreRule rule = score_rule(a, n.Tk, "attention");
  rule.q_origin = KR.query_origin(n.Tq), rule.kv_origin = KR.key_origin();
  ScoreCall call;  // a score function's tables, filled before the threads start
  prepare_score_call(a, n.Tk, call, "attention", rule.q_origin, rule.kv_origin);
  if (call) tiles::fill_score_tables(call), rule.call = &call;
  const float scale = effective_scale(a);
  constexpr bool kElements = !std::is_same_v<typename Src::Ptr, const uint8_t*>;
  const int64_t units = n.B * n.Hkv * n.chunks;
  float* parts = team_scratch(ForwardSlot::partials, units * n.R * (n.Dv + 2));
  const int threads = detail::threads_for(units * n.chunk * (n.D + n.Dv) * n.R);
  // Every unit of a call runs the same kernel (the choice depends on the shape alone).
  const auto each_unit = [&](Variant variant, auto&& kernel) {
    reached(variant);
    parallel_for(units, threads, [&](int64_t u) {
      const int64_t c = u % n.chunks, hkv = (u / n.chunks) % n.Hkv, b = u / (n.chunks * n.Hkv);
      kernel(a, K, V, rule, scale, n, b, hkv, c, parts);
    });
  };
  using Tiles = tiles::TileUnit<tiles::kOnUnits<TileElementOf<Src, VSrc>>>;
  constexpr bool kBf16 = kOneSource && std::is_same_v<Src, ElementSource<simd::Bf16>>;
  // The plan's kernel (plan.cpp chose it); false where this pass does not compile it.
  const auto run = [&]() -> bool {
    switch (plan.variant) {
      case Variant::decode_keys_in_lanes:
        if constexpr (kElements && kOneSource) {
          each_unit(plan.variant, [](auto&&... x) { decode_unit_keys_in_lanes(x...); });
          return true;
        }
        break;
      case Variant::decode_tiled_amx:
        if constexpr (kBf16)
          return tiles::run_on_amx([&](auto amx) {
            each_unit(plan.variant,
                      [](auto&&... x) { decode_unit_tiled<decltype(amx)>(x...); });
          });
        break;
      case Variant::decode_rows_int8:
        if constexpr (!kElements && kInt8Scores) {
          if (plan.byte_dot)
            each_unit(plan.variant, [](auto&&... x) {
              decode_unit_rows<RowsOnInt8<Src::kFormat, true>>(x...);
            });
          else
            each_unit(plan.variant, [](auto&&... x) {
              decode_unit_rows<RowsOnInt8<Src::kFormat, false>>(x...);
            });
          return true;
        }
        break;
      case Variant::decode_tiled:
      case Variant::decode_tiled_bf16_dot:
        if (Tiles::kBf16Dot != (plan.variant == Variant::decode_tiled_bf16_dot)) break;
        each_unit(plan.variant, [](auto&&... x) { decode_unit_tiled<Tiles>(x...); });
        return true;
      case Variant::decode_rows_bf16_dot:
        if constexpr (kRowsOnUnits && kBf16) {
          each_unit(plan.variant, [](auto&&... x) { decode_unit_rows<RowsOnBf16Dot>(x...); });
          return true;
        }
        break;
      case Variant::decode_rows:
        each_unit(plan.variant, [](auto&&... x) { decode_unit_rows<RowsOnFma>(x...); });
        return true;
      default:
        break;
    }
    return false;
  };
  check(run(), "attention: decoding's plan names ", variant_name(plan.variant),
        ", which this pass does not compile for ", dtype_name(KR.type), " keys and ",
        dtype_name(VR.type), " values");
  if (call) call.check_miss();  // an index a kernel found outside its tensor
  // Merge the chunks of each row in chunk order.
  const int64_t rows = n.B * n.Hkv * n.R;
  parallel_for(rows, detail::threads_for(rows * n.chunks * n.Dv), [&](int64_t row) {
    const int64_t r = row % n.R, hkv = (row / n.R) % n.Hkv, b = row / (n.R * n.Hkv);
    const int64_t h = n.head(hkv, r), i = n.query(r);
    const int64_t first = (b * n.Hkv + hkv) * n.chunks;
    const auto chunk = [&](int64_t c) {
      const float* p = partial(parts, n, first + c, r);
      return PartialRow{p[0], p[1], p + 2};
    };
    float* lse = a.lse ? &a.lse[(b * n.Hq + h) * n.Tq + i] : nullptr;
    const float sink = a.sinks ? a.sinks[h] : simd::kMinusInf;
    if (a.out.type == TensorType::f32)
      return merge_partials(n.chunks, chunk, n.Dv, &a.out(b, h, i, 0), a.out.stride[3], lse, sink);
    // A 16-bit output: merged in fp32, then rounded once.
    float* merged = thread_scratch(ForwardSlot::merged_row, n.Dv);
    merge_partials(n.chunks, chunk, n.Dv, merged, 1, lse, sink);
    for (int64_t e = 0; e < n.Dv; ++e) a.out.set(b, h, i, e, merged[e]);
  });
}

}  // namespace

void decode_forward(const AttentionArgs& a, const KvRows& K, const KvRows& V, const Plan& plan) {
  if (K.type != V.type) {  // values in a format of their own
#if !defined(QKV_BF16_UNITS)  // (the bf16 pass runs bf16 keys and values only)
    if (K.in_blocks())
      return with_block_format(K.type, [&](auto format) {
        decode<BlockSource<decltype(format)::value>, WidenedValues>(a, K, V, plan);
      });
    return tiles::with_element_type(K.type, [&](auto element) {
      decode<ElementSource<decltype(element)>, WidenedValues>(a, K, V, plan);
    });
#endif
  }
  if (K.in_blocks())
    return with_block_format(K.type, [&](auto format) {
      decode<BlockSource<decltype(format)::value>>(a, K, V, plan);
    });
  tiles::with_element_type(
      K.type, [&](auto element) { decode<ElementSource<decltype(element)>>(a, K, V, plan); });
}

// What the plan needs to know of this target's kernels (plan.h).
KernelFacts facts() {
  KernelFacts f;
  f.lanes = static_cast<int64_t>(simd::lanes());
  f.byte_products = kInt8Scores;
  f.byte_dot = int8_scores_vnni();
  f.amx_unit = tiles::kAmxUnit;
  f.wide = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3;
  return f;
}

// Whether P·V runs in integers (Int8Values) under int8 scores over format's blocks, for value
// dim Dv and R query rows per key/value head. (A template so that targets without integer
// scores never instantiate RowsOnInt8.)
template <bool kHave = kInt8Scores>
bool values_on_bytes(TensorType format, int64_t Dv, int64_t R) {
  if constexpr (kHave) {
    bool on = false;
    if (R < kTiledDecodeMinRows)
      with_block_format(format, [&](auto f) {
        constexpr TensorType kFormat = decltype(f)::value;
        on = int8_scores_vnni() ? RowsOnInt8<kFormat, true>::on_bytes(Dv, R)
                                : RowsOnInt8<kFormat, false>::on_bytes(Dv, R);
      });
    return on;
  } else {
    return false;
  }
}
bool int8_values_on_bytes(TensorType format, int64_t Dv, int64_t R) {
  return values_on_bytes(format, Dv, R);
}

QKV_KERNEL_END();  // qkv::detail::HWY_NAMESPACE
#endif  // QKV_KERNEL_PASS

#if HWY_ONCE
namespace qkv::detail {

// The bf16-unit pass (decode_bf16.cpp) where the plan says so.
QKV_ENTRY_WITH_BF16_UNITS(decode_forward,
                          (const AttentionArgs& a, const KvRows& K, const KvRows& V,
                           const Plan& plan),
                          (a, K, V, plan), plan.bf16_units)

#if !defined(QKV_BF16_UNITS)
HWY_EXPORT(int8_values_on_bytes);
bool int8_values_on_bytes(TensorType format, int64_t Dv, int64_t R) {
  return QKV_DISPATCH(int8_values_on_bytes)(format, Dv, R);
}
HWY_EXPORT(facts);
KernelFacts kernel_facts() { return QKV_DISPATCH(facts)(); }
#endif

}  // namespace qkv::detail
#endif  // HWY_ONCE
