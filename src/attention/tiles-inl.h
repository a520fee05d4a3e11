// Pieces shared by the tiled forward and backward kernels: tile sizes, the per-tile mask,
// and the score transforms applied to a tile of scores. Per Highway target, like
// src/simd/simd-inl.h; tiles.cpp holds the functions not defined here.
//
// Tiles hold one query per vector lane: a score tile S is [Kt][Mq], row jj holding key
// j0 + jj's score for the Mq queries of the tile (see src/simd/simd-inl.h).
#if defined(QKV_ATTENTION_TILES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_TILES_INL_H_
#undef QKV_ATTENTION_TILES_INL_H_
#else
#define QKV_ATTENTION_TILES_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <type_traits>

#include <hwy/highway.h>

#include "attention/masks.h"
#include "attention/products-inl.h"
#include "attention/score_call.h"
#include "mask/lanes-inl.h"
#include "mask/score_lanes-inl.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "simd/convert-inl.h"
#include "simd/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::detail {
namespace HWY_NAMESPACE {
namespace simd = ::qkv::simd::HWY_NAMESPACE;
namespace tiles {

// The names every tile file uses (this target's Highway ops, fp32 tag and vector).
namespace hn = simd::hn;
using simd::df;
using simd::Vf;

inline constexpr int kQueryVectors = 4;  // Mq = 4 N: 64 rows on AVX-512 (Qt of D = 128 is 32 KiB)
inline constexpr int64_t kKeyTile = 64;  // S is Kt × Mq = 16 KiB: stays in L1 between uses

// Whether K and V of type T go through the bf16 units in this pass (src/simd/units-inl.h):
// bf16 ones, in the translation units that compile a kernel for the units.
template <class T>
#if defined(QKV_BF16_UNITS)
inline constexpr bool kOnUnits = std::is_same_v<T, simd::Bf16>;
#else
inline constexpr bool kOnUnits = false;
#endif

// f(p) with p the address of element (b, h, i, d) of a view, typed as its elements: fp32,
// bf16 or fp16 (hwy's types, whose bits qkv::bf16 and qkv::f16 share).
template <class F>
HWY_INLINE auto with_typed(const View& v, int64_t b, int64_t h, int64_t i, int64_t d, F&& f) {
  const int64_t at = b * v.stride[0] + h * v.stride[1] + i * v.stride[2] + d * v.stride[3];
  switch (v.type) {
    case TensorType::bf16:
      return f(static_cast<simd::Bf16*>(v.elements) + at);
    case TensorType::f16:
      return f(static_cast<simd::F16*>(v.elements) + at);
    default:
      return f(v.data + at);
  }
}

// f(T{}) with T the element type of `type` (float, bf16, fp16): how a kernel instantiates its
// inner loops for the type of K and V.
template <class F>
HWY_INLINE void with_element_type(TensorType type, F&& f) {
  static_assert(std::size(kKvElementTypes) == 3, "with_element_type: a case per element type");
  switch (type) {
    case TensorType::f32:
      return f(float{});
    case TensorType::bf16:
      return f(simd::Bf16{});
    case TensorType::f16:
      return f(simd::F16{});
    default:
      fail("kernels: ", to_string(type), " is not an element type (f32, bf16, f16)");
  }
}

struct Shape {
  int64_t B, Hq, Hkv, Tq, Tk, D, Dv, Mq;
};

// The most query rows of a tile on this target: Mq.
inline constexpr int64_t kMostTileRows = kQueryVectors * simd::hn::MaxLanes(simd::df);

// Per-lane visible key ranges of one query tile, and which key tiles need a mask. Plain
// data, no heap: a kernel keeps it on its stack or in scratch.
struct TileMask {
  int32_t begin[kMostTileRows], end[kMostTileRows];  // [Mq], read N lanes at a time; padded
                                                     // lanes: empty
  int64_t lo = 0, hi = 0;  // keys any real query of the tile can see: [lo, hi)

  void init(const Mask& mask, int64_t b, int64_t i0, int64_t rows, const Shape& n);
  // True when every real query sees every key of [j0, j1): the tile needs no mask.
  bool covers(int64_t j0, int64_t j1, int64_t rows) const;
  // x, the scores of key j for the queries of vector v, with -inf where they may not see it.
  simd::Vf hide(int64_t v, int64_t j, simd::Vf x) const {
    const hn::RebindToSigned<simd::Df> di;
    const size_t N = simd::lanes();
    const auto jv = hn::Set(di, static_cast<int32_t>(j));
    const auto hidden = hn::Or(hn::Lt(jv, hn::LoadU(di, begin + v * N)),
                               hn::Not(hn::Lt(jv, hn::LoadU(di, end + v * N))));
    return hn::IfThenElse(hn::RebindMask(simd::df, hidden), hn::Set(simd::df, simd::kMinusInf), x);
  }
};

// A key tile that needs a mask (the diagonal under a causal mask, a window's edges, padding)
// is often mostly hidden: cut into chunks of kKeyChunk keys, chunk c is seen only by the
// query vectors [first[c], last[c]) (the visible keys of consecutive rows move together), and
// the tile products skip the rest. On the causal diagonal that is 6 of 16 blocks.
inline constexpr int64_t kKeyChunk = 16;

struct VisibleBlocks {
  enum State : uint8_t { kHidden, kPartial, kVisible };  // to every real row of the block
  int chunks = 0;
  int first[kKeyTile / kKeyChunk], last[kKeyTile / kKeyChunk];
  State state[kKeyTile / kKeyChunk][kQueryVectors];

  // The blocks of key tile [j0, j1) for a query tile of `rows` rows in `nqv` vectors.
  void find(const TileMask& tm, int nqv, int64_t rows, int64_t j0, int64_t j1);
  // The mask on a score tile whose only transform is the mask: the per-row test on partial
  // blocks, nothing on the rest (the score product left hidden blocks unwritten, and the
  // kernels never read them).
  void apply(const TileMask& tm, int nqv, int64_t j0, int64_t nk, int64_t Mq, float* S) const;
  // The chunks [first_chunk, last_chunk) query vector v sees some key of (empty if none):
  // one run of chunks, as each row's visible keys are one range.
  void chunks_seen_by(int v, int& first_chunk, int& last_chunk) const;

  // A mask function's part (on a tile its blocks leave partial): each block that the interval
  // arithmetic over its indices shows hidden becomes hidden, and those it cannot decide are
  // marked to evaluate. [first, last) stays one run of vectors per chunk; a hidden block inside
  // it is set to -inf by apply_function.
  bool evaluate[kKeyTile / kKeyChunk][kQueryVectors];
  void narrow(const MaskProgram& p, int64_t b, int64_t h, int nqv, int64_t i0, int64_t rows,
              int64_t j0, int64_t j1);
  // -inf in S where the function hides a pair of a marked block (evaluated over SIMD lanes in
  // `regs`, function_register_ints of them) and in the hidden blocks of the runs.
  void apply_function(const MaskProgram& p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                      int64_t j0, int64_t nk, int64_t Mq, float* S, int32_t* regs) const;
  // Keys in chunk c of a tile of nk keys.
  int64_t keys_in(int c, int64_t nk) const { return std::min(kKeyChunk, nk - c * kKeyChunk); }
};

// One step of the online softmax on a score tile S [Kt][Mq], lane by lane (each lane is one
// query row), over the score vectors for_scores(f) visits as f(jj, v): m ← max(m, max_j S),
// alpha ← e^(m_old − m), S ← P = e^(S − m), l ← alpha · l + Σ_j P. The NQV vectors of a key
// row are independent chains: walking them together keeps max and sum off the add latency.
template <int NQV, typename ForScores>
void online_softmax(float* S, int64_t Mq, float* m, float* l, float* alpha,
                    ForScores&& for_scores) {
  const size_t N = simd::lanes();
  simd::VfSlot mx[NQV], shift[NQV], sum[NQV];
  for (int v = 0; v < NQV; ++v) mx[v] = hn::Load(df, m + v * N);
  for_scores([&](int64_t jj, int v) { mx[v] = hn::Max(mx[v], hn::Load(df, S + jj * Mq + v * N)); });
  for (int v = 0; v < NQV; ++v) {
    // A row that has seen no key yet keeps max -inf; subtract 0 instead so that
    // e^(-inf - (-inf)) does not become NaN.
    const Vf row_max = mx[v];
    shift[v] = hn::IfThenZeroElse(hn::Eq(row_max, hn::Set(df, simd::kMinusInf)), row_max);
    sum[v] = hn::Zero(df);
  }
  for_scores([&](int64_t jj, int v) {
    float* s = S + jj * Mq + v * N;
    const Vf p = simd::exp_nonpositive(hn::Sub(hn::Load(df, s), shift[v]));
    hn::Store(p, df, s);
    sum[v] = hn::Add(sum[v], p);
  });
  for (int v = 0; v < NQV; ++v) {
    const Vf a_v = simd::exp_nonpositive(hn::Sub(hn::Load(df, m + v * N), shift[v]));
    hn::Store(hn::MulAdd(hn::Load(df, l + v * N), a_v, sum[v]), df, l + v * N);
    hn::Store(a_v, df, alpha + v * N);
    hn::Store(mx[v], df, m + v * N);
  }
}

// f(jj, v) for every score vector of a whole tile of nk key rows.
template <int NQV>
auto every_score(int64_t nk) {
  return [nk](auto&& f) {
    for (int64_t jj = 0; jj < nk; ++jj)
      for (int v = 0; v < NQV; ++v) f(jj, v);
  };
}

// The per-element score steps after q·k on a tile S (scaled scores in, final scores out):
// softcap, bias, ALiBi, then -inf where `masked` and the key is hidden. When `tanh_out` is
// given and softcap is on, it receives tanh(s / softcap), which the backward needs.
void transform_scores(const ScoreRule& rule, const TileMask& tm, int64_t b, int64_t h, int64_t i0,
                      int64_t rows, int64_t j0, int64_t nk, bool masked, const Shape& n, float* S,
                      float* tanh_out);

// ---- Score functions (include/qkv/score_function.h) ----

// Key rows of a score tile evaluated at once: 4 × Mq lanes, whose registers stay in L1.
inline constexpr int64_t kScoreRows = 4;

// The relative tables of the call, evaluated over the lanes of d = q_idx − kv_idx. Throws
// qkv::Error for an index outside a tensor, naming it (before any kernel runs).
void fill_score_tables(ScoreCall& call);

// Integers and floats a thread needs to evaluate the call's function over a score tile, with
// `slots` derivatives per float register (0 in the forward).
inline int64_t score_register_ints(const ScoreCall& call, int64_t Mq) {
  return mask_lanes::register_ints(call.program->main, kScoreRows * Mq);
}
inline int64_t score_register_floats(const ScoreCall& call, int64_t Mq, int64_t slots) {
  return score_lanes::register_floats(call.program->main, kScoreRows * Mq, slots) +
         call.program->main.real_registers + 1;  // (and a word per register: what it holds)
}

// S ← score_mod(S) on a tile of nk key rows from j0 ([Kt][Mq]) for the query rows
// [i0, i0 + rows) of (b, h). Without `d_score`, values only (the forward). With it (the
// backward), also d_score [Kt][Mq] ← ∂score_mod/∂score (left alone when the function is
// additive: it is 1), and per learnable source k of the program d_sources[k] [Kt][Mq] ← the
// derivative with respect to it and, for a lookup, index_of[k] [Kt][Mq] ← the element read.
// An index outside a tensor is reported to the call (ScoreCall::report_miss).
void apply_score_function(const ScoreCall& call, int64_t b, int64_t h, int64_t i0, int64_t rows,
                          int64_t j0, int64_t nk, int64_t Mq, float* S, int32_t* regs, float* reals,
                          float* d_score = nullptr, float* const* d_sources = nullptr,
                          int32_t* const* index_of = nullptr);

// Decoding's form (one query row, the keys along the lanes): s[jj] ← score_mod(s[jj]) for keys
// j0 + jj, jj < nk, of query i of (b, h), score_row_lanes() keys at a time, in registers
// score_register_ints and score_register_floats (Mq = kQueryVectors · lanes, slots 0) give.
inline int64_t score_row_lanes() {
  return kScoreRows * kQueryVectors * static_cast<int64_t>(simd::lanes());
}
void apply_score_function_row(const ScoreCall& call, int64_t b, int64_t h, int64_t i, int64_t j0,
                              int64_t nk, float* s, int32_t* regs, float* reals);

// The registers VisibleBlocks::apply_function evaluates a mask function in.
inline int64_t function_register_ints(const MaskProgram& p) {
  return mask_lanes::register_ints(p, kKeyChunk * static_cast<int64_t>(simd::lanes()));
}

// tile_state (attention/masks.h) of query rows [i0, i0 + rows) and the key tile at j0; a tile
// of a partial block refined by the interval arithmetic over its own indices (most tiles of a
// partial block are wholly shown or hidden: the diagonal's, a document's edge, a window's).
inline BlockState key_tile_state(const BlockMask* fn, int64_t b, int64_t h, int64_t i0,
                                 int64_t rows, int64_t j0, int64_t Tk) {
  const int64_t j1 = std::min(j0 + kKeyTile, Tk);
  const BlockState st = tile_state(fn, b, h, i0, i0 + rows, j0, j1);
  if (st != BlockState::partial) return st;
  return box_state(fn->program(), {b, b, h, h, i0, i0 + rows - 1, j0, j1 - 1});
}

}  // namespace tiles
}  // namespace HWY_NAMESPACE
}  // namespace qkv::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
