// Scaled dot-product attention: out = softmax(q kᵀ · scale + bias, masked) v.
//
// Shapes, in storage order of the logical dims (any strides):
//   B batch, Hq query heads, Hkv key/value heads (Hq % Hkv == 0), Tq queries, Tk keys,
//   D query/key head dim, Dv value head dim.
//   q [B, Hq, Tq, D]   k [B, Hkv, Tk, D]   v [B, Hkv, Tk, Dv]   out [B, Hq, Tq, Dv]
// Query head h reads key/value head h / (Hq / Hkv): Hkv == Hq is multi-head attention,
// 1 < Hkv < Hq grouped-query attention (GQA), Hkv == 1 multi-query attention (MQA).
//
// The score of query i and key j, in the order it is computed:
//   s = scale · q_i · k_j                        scale defaults to 1/sqrt(D)
//   s = softcap · tanh(s / softcap)              only when softcap > 0 (Gemma 2, Grok)
//   s = s + bias[b, h, i, j]                     optional additive bias, broadcast
//   s = s - alibi[h] · |i + Tk - Tq - j|         optional ALiBi slopes (as FlashAttention-2)
//   s = -inf where the mask hides key j from query i
// then p = softmax over j, out_i = Σ_j p_ij v_j, lse_i = log Σ_j exp(s_ij) (with dropout, p_ij is
// first dropped or scaled: struct Dropout).
//
// Attention sinks (gpt-oss): with args.sinks, head h's softmax has one more logit, sinks[h],
// in its denominator and no value: p_ij = exp(s_ij) / (exp(sinks[h]) + Σ_j exp(s_ij)), and
// lse_i = log(exp(sinks[h]) + Σ_j exp(s_ij)). The weights then sum to less than one; a row
// whose keys are all masked returns out = 0 with lse = sinks[h]. A sink of -inf is no sink.
//
// The mask. Query i sits at position i + (Tk - Tq) on the key axis ("bottom-right
// alignment": the last query lines up with the last key, as in FlashAttention-2 and a
// KV-cache decode). Key j is visible when all of these hold:
//   causal:   j <= i + (Tk - Tq)
//   window:   i + (Tk - Tq) - window_left <= j <= i + (Tk - Tq) + window_right  (-1 = no limit)
//   padding:  j < kv_len[b]
// A query row that sees no key gets out = 0 and lse = -inf (the sink's logit with one), never
// NaN.
//
// Element types. q, k, v and out are fp32, bf16 or fp16 views (include/qkv/tensor.h):
//   k and v share one type; q may be any (an fp32 or bf16 query against a bf16 or fp16 cache);
//   out is q's type or fp32 (bf16 q, k, v with fp32 out).
//   Backward: dout, dq, dk, dv each in the type of out, q, k, v, or fp32, as the caller asks.
//   The bias, the ALiBi slopes and lse are fp32 whatever the inputs.
// Any other combination is a qkv::Error naming the types. Whatever the types, the scores,
// the softmax state, lse and every accumulator are fp32, and no converted copy of q, k or v is
// made: 16-bit elements are widened in registers as they are read, except bf16 keys and values
// where the bf16 dot unit multiplies them (qkv::units_in_use(), include/qkv/targets.h: AMD
// Zen 4/5 and Arm by default), which takes an fp32 q as the sum of two bf16, rounds P to bf16
// for P·V (an output moves by at most 2^-8 · max|v|: docs/api.md) and reads subnormal bf16
// inputs as zero; a 16-bit output is the fp32 result rounded to nearest even.
#pragma once

#include <cstdint>
#include <optional>

#include "qkv/number_format.h"
#include "qkv/tensor.h"

namespace qkv {

class BlockMask;      // a mask function's blocks: include/qkv/mask_function.h
class ScoreFunction;  // a score function: include/qkv/score_function.h

struct Mask {
  bool causal = false;              // query i sees keys <= i + (Tk - Tq)
  int window_left = -1;             // sliding window: keys in [pos - left, pos + right];
  int window_right = -1;            //   -1 = unbounded on that side
  const int32_t* kv_len = nullptr;  // [B]: keys >= kv_len[b] are padding (0 <= kv_len[b] <= Tk)
  View bias;                        // optional additive bias, broadcastable to [B, Hq, Tq, Tk]:
                                    //   2 to 4 dims, aligned right, each dim 1 or full size
  const float* alibi = nullptr;     // optional [Hq] ALiBi slopes
};

// Packed variable-length batch (FlashAttention's "varlen", cu_seqlens): sequences of
// different lengths laid end to end along T, with B = 1. Sequence s owns queries
// [cu_seqlens_q[s], cu_seqlens_q[s+1]) and keys [cu_seqlens_k[s], cu_seqlens_k[s+1]); it never
// sees another sequence's keys, and its mask (causal, window) is that of a batch of its own.
// No padding is stored or computed. The bias, if any, is indexed by packed positions.
struct Packed {
  int num_seqs = 0;                       // 0 = off
  const int32_t* cu_seqlens_q = nullptr;  // [num_seqs + 1], 0 … Tq, non-decreasing
  const int32_t* cu_seqlens_k = nullptr;  // [num_seqs + 1], 0 … Tk, non-decreasing
};

// Attention dropout (training): after the softmax, each weight p_ij is kept with probability
// 1 − p and scaled by 1/(1 − p), or dropped to 0, as torch.nn.functional.dropout applied to the
// weights (lse stays that of the undropped softmax). Whether pair (b, h, i, j) is kept depends
// on (seed, offset, b + batch_offset, h, i, j) alone: Philox4x32-10 (Salmon et al. 2011) with
// key = seed and counter = (i, ⌊j / 8⌋, (b + batch_offset) · Hq + h, offset) gives four 32-bit
// words; key j takes the low 16 bits of word (j mod 8) / 2 when j is even, the high 16 when it
// is odd, and is kept when they are ≥ round(p · 2¹⁶) (a keep rate within 2⁻¹⁷ of 1 − p; the
// scale stays 1/(1 − p)). Nothing is stored: the backward regenerates the mask,
// and it is the same bits for any thread count and CPU. The tiled forward and backward and the
// reference take it (packed sequences too: sequence s is batch s; a call of few queries runs on
// the tiled kernel, not split-KV decoding); attention over a cache and ring attention refuse it.
// round(x) is ⌊x + ½⌋; a p within 2⁻¹⁷ of 1 drops every weight.
struct Dropout {
  float p = 0;               // 0 = off; 0 <= p <= 1 (p = 1 drops every weight)
  uint64_t seed = 0;         // the Philox key
  uint32_t offset = 0;       // e.g. a step or layer count: a new mask from the same seed
  int64_t batch_offset = 0;  // batch b draws the mask of batch b + batch_offset (a batch split
                             //   over calls keeps the mask of the whole)
};

// keep [B, Hq, Tq, Tk] ← 1 where `d` keeps pair (b, h, i, j), 0 where it drops it: the mask the
// kernels apply, for tests and for materialising the formula elsewhere.
void dropout_mask(const Dropout& d, int64_t B, int64_t Hq, int64_t Tq, int64_t Tk, uint8_t* keep);

struct AttentionArgs {
  View q;                // [B, Hq, Tq, D]
  View k;                // [B, Hkv, Tk, D]
  View v;                // [B, Hkv, Tk, Dv]
  View out;              // [B, Hq, Tq, Dv], written
  float* lse = nullptr;  // optional [B, Hq, Tq] contiguous, written: log-sum-exp of the scores
  float scale = 0;       // 0 means 1/sqrt(D)
  float softcap = 0;     // 0 means off
  Mask mask;
  Packed packed;  // optional: several sequences packed along T (then B must be 1)
  // Optional: a mask function over these B, Hq, Tq and Tk (q_idx 0 … Tq − 1, kv_idx 0 … Tk − 1),
  // as create_block_mask made it (B or H may be 1 when the function does not read b or h). A
  // pair is visible when both `mask` and the function show it. The tiled forward and backward
  // and split-KV decoding take it, for every element type; attention over a cache too, where
  // the indices are positions (below); not with packed sequences.
  const BlockMask* block_mask = nullptr;
  // Optional [Hq] sink logits (above): finite or -inf. Every kernel takes them, forward,
  // backward (ParameterGrads::sinks), decoding and attention over a cache.
  const float* sinks = nullptr;
  // Optional: a score function applied to each scaled score q·k · scale in place of the
  // softcap, bias and ALiBi steps (it is to hold them itself: a qkv::Error when both are
  // given), with q_idx 0 … Tq − 1 and kv_idx 0 … Tk − 1; the masks (and a block_mask) apply
  // after it. The tiled forward and backward and split-KV decoding take it, for every element
  // type; attention over a cache too, where the indices are positions (below); not with
  // packed sequences.
  const ScoreFunction* score_mod = nullptr;
  // Optional: dropout on the softmax weights (above); p = 0 is off, to the bit.
  Dropout dropout;
};

// The gradients attention_backward writes beyond dq, dk and dv, each when asked for.
struct ParameterGrads {
  // [Hq], written: ∂L/∂sinks[h] = −Σ_(b, i) exp(sinks[h] − lse_bhi) · (dO_bhi · O_bhi),
  // summed in a fixed order (the same bits for any thread count). Needs args.sinks.
  float* sinks = nullptr;
};

// The fast path: tiled FlashAttention-2 forward, or split-KV decoding when Tq is small.
// Never allocates Tq × Tk memory.
void attention(const AttentionArgs& args);

// Gradients (FlashAttention-2 backward): `args` as the forward saw them, with `out` and `lse`
// as the forward wrote them (lse is required); dout = ∂L/∂out [B, Hq, Tq, Dv]. Writes (does
// not accumulate into) dq [B, Hq, Tq, D], dk [B, Hkv, Tk, D], dv [B, Hkv, Tk, Dv]; with GQA,
// dk and dv sum over the query heads of each group. The scores are recomputed from lse, so
// nothing Tq × Tk is stored. The bias and ALiBi slopes are constants: no gradient for them;
// the sinks' gradient is written to grads.sinks when it is given. Same bits for any thread
// count.
void attention_backward(const AttentionArgs& args, View dout, View dq, View dk, View dv,
                        const ParameterGrads& grads = {});

// The (query, key) pairs the mask leaves visible, summed over the batch: the work a kernel
// does (4 · Hq · D flops per pair forward, counting multiplies and adds), for benchmarks.
double visible_pairs(const AttentionArgs& args);

// Throws qkv::Error naming the first argument whose shape, layout or value is wrong, or an
// output (out, lse; backward: dq, dk, dv) that shares memory with an input or another output.
// Views are compared when each fills its address range (a contiguous tensor, or a permuted
// view of one); interleaved views of one buffer, as a fused projection's q, k and v, are not
// compared element by element.
void validate(const AttentionArgs& args, const char* where);
void validate_backward(const AttentionArgs& args, const View& dout, const View& dq, const View& dk,
                       const View& dv, const char* where, const ParameterGrads& grads = {});

// ---- attention over stored keys and values (a key/value cache) ----------------------------

// How few decoding queries (the split-KV kernel's rows, fewer than 16 per key/value head)
// meet keys stored in 32-value blocks (q8_0, q4_0, q4_1); other types, and the tiled kernels,
// are exact either way:
//   int8   each query rounded to int8 per 32-block (d = max|q| / 127, to nearest, as the int8
//          weight products round activations), its products with the keys' integers summed as
//          integers on the CPU's byte products (x86 from AVX2: vpdpbusd, else vpmaddubsw
//          pairs; AArch64: sdot, else int16 products; SSE4: exact), the two blocks' scales
//          applied once per block: a score moves by at most
//          Σ_b d_q,b / 2 · Σ |k| over block b, about 1/250 of the block's largest product;
//          and on AVX512-VNNI (value dims of whole 64s up to 256) P·V in integers too: each
//          row's p times a value block's |d| rounded to u8 per 64 keys (σ = the largest / 255),
//          an output moving by at most Σ_k σ / 2 · |v_k / d_k| / Σ p
//   exact  every key and value widened to fp32 (the dequantized rows' result, within fp32
//          rounding)
enum class CacheScores { int8, exact };

// Keys and values as a cache stores them: positions 0 … length − 1 of B sequences, each a row
// of `type` elements, one of kv_row_types(): f32, bf16 or f16, or q8_0, q4_0 or q4_1 (ggml's
// 32-value blocks with an fp16 scale, q4_1 with an fp16 offset too, include/qkv/number_format.h:
// then the dims and strides are multiples of 32 and the value at element offset e lies in
// block e / 32, at byte e / 32 · 34, 18 or 20). The row of
// position p, key/value head h, sequence b
// begins at element b · batch_stride + h · head_stride + slot(p) · row_stride of k (or v):
// slot(p) = p, or in a ring of `slots` rows (a sliding-window model's cache) p mod slots, and
// then only the last `slots` positions are held. The queries are the last Tq positions.
struct StoredKV {
  TensorType type = TensorType::f32;
  // The values' type when it is not `type` (a cache with its own key and value formats, say
  // q8_0 keys and q4_0 values): then `type` is the keys'. Any two of kv_row_types().
  std::optional<TensorType> v_type;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;  // in elements
  int64_t heads = 0;                                          // Hkv
  int64_t dim_k = 0, dim_v = 0;                               // D, Dv
  int64_t length = 0;  // positions so far, the queries' included
  int64_t slots = 0;   // 0: not a ring
  CacheScores scores = CacheScores::int8;  // (block formats: see CacheScores)
  // Optional [B, Hkv, n, D] and [B, Hkv, n, Dv] (any type): the keys and values of the last n
  // positions, given here rather than stored (a ring that storing them would overrun while
  // earlier queries still see what they overwrite). Read as `type` rounds them.
  View fresh_k, fresh_v;
  // 0, or the block of the rotation every key and value row (fresh ones too) went through
  // before it was stored: hadamard_rotate(row, dim, rotation). Attention then rotates each
  // query the same way and each output row back, so that the result is the unrotated one (in
  // real arithmetic: H is orthonormal and symmetric, (H q) · (H k) = q · k). What it buys: a
  // block format's scale is chosen after the rotation has spread a row's outliers over the
  // block, and 4-bit blocks lose far less (docs/api.md).
  int64_t rotation = 0;
};

// The block of the rotation a cache of head dim `dim` uses: the largest power of two that
// divides it (dim itself when it is one).
int64_t rotation_block(int64_t dim);
// x[0, dim) ← H x, H the normalised Walsh–Hadamard transform (Sylvester's ±1 matrix of order
// `block`, times 1/√block) applied to each of the dim / block blocks of x. H is its own
// inverse: applied twice, x comes back (within fp32 rounding). Throws qkv::Error unless block
// is a power of two that divides dim.
void hadamard_rotate(float* x, int64_t dim, int64_t block);

// Attention of args.q over stored keys and values: args as for attention() with k and v left
// empty, and the mask in positions (causal, window_left; ALiBi by position). One road for
// every cache: it reads the rows in place, in their stored type (16-bit rows and 32-value
// blocks widened in registers, or a tile of rows at a time into L1; a ring whose slots are out
// of order too, in position order), or else — beside fresh rows — gathers the positions the
// queries see as an fp32 copy and runs attention() on it.
// Mask and score functions (args.block_mask, args.score_mod) read positions here: kv_idx is
// the key's position and q_idx the query's (length − Tq … length − 1), so that one function
// means the same in a prefill, a chunked prefill and each decoding step. The BlockMask is made
// once over positions, for Q_LEN and KV_LEN at least the cache's length (its capacity, say),
// and serves every step; under a ring, the function may hide the positions it lost.
// Throws qkv::Error for arguments attention() would refuse, a position the queries see that
// the storage no longer holds (under the mask and the mask function), a bias, padding, packed
// sequences, dropout, or a block_mask shorter than the cache.
void attention(const AttentionArgs& args, const StoredKV& kv);

namespace reference {

// The oracle: materialises the Tq × Tk score grid of each (batch, head) and follows the
// formula above step by step. `weights`, when given, receives the softmax weights
// [B, Hq, Tq, Tk] (0 where masked).
void attention(const AttentionArgs& args, View weights = {});

// The backward written from the formula: recomputes P, then dV = (P ∘ Z)ᵀ dO, dP = (dO Vᵀ) ∘ Z
// (Z the dropout's factors, 1 without), dS = P ∘ (dP − rowsum(P ∘ dP)), dQ = scale · dS K, dK =
// scale · dSᵀ Q (through the softcap's derivative when it is on); a sink's gradient from its own
// weight, −Σ_i p_i,sink (dO_i · O_i). Does not need args.out or args.lse.
void attention_backward(const AttentionArgs& args, View dout, View dq, View dk, View dv,
                        const ParameterGrads& grads = {});

}  // namespace reference
}  // namespace qkv
