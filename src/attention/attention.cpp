// qkv::attention (the dispatcher) and the argument checks every kernel shares.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention/kernels.h"
#include "attention/plan.h"
#include "attention/masks.h"
#include "attention/overlap.h"
#include "attention/dropout.h"
#include "attention/packed.h"
#include "util/parallel.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/mask_function.h"
#include "qkv/score_function.h"

namespace qkv {
namespace detail {

View broadcast_bias(const View& bias, int64_t B, int64_t Hq, int64_t Tq, int64_t Tk,
                    const char* where) {
  const int64_t full[4] = {B, Hq, Tq, Tk};
  check(bias.ndim >= 2 && bias.ndim <= 4, where, ": bias must have 2 to 4 dims, got ",
        shape_of(bias));
  View out(bias.data, {B, Hq, Tq, Tk}, {0, 0, 0, 0});
  const int skip = 4 - bias.ndim;  // leading dims the bias leaves out are broadcast
  for (int d = skip; d < 4; ++d) {
    const int64_t n = bias.shape[d - skip];
    check(n == 1 || n == full[d], where, ": bias ", shape_of(bias),
          " does not broadcast to [B, Hq, Tq, Tk] = [", B, ", ", Hq, ", ", Tq, ", ", Tk, "]");
    out.stride[d] = (n == 1) ? 0 : bias.stride[d - skip];
  }
  return out;
}

}  // namespace detail

double visible_pairs(const AttentionArgs& a) {
  const int64_t B = a.q.shape[0], Tq = a.q.shape[2], Tk = a.k.shape[2];
  const BlockMask* m = a.block_mask;
  // A mask function alone: its count, per head (averaged over heads when it reads h).
  if (m && !a.mask.causal && a.mask.window_left < 0 && a.mask.window_right < 0 && !a.mask.kv_len)
    return static_cast<double>(m->visible_pairs()) * static_cast<double>(B / m->batch()) /
           static_cast<double>(m->heads());
  double pairs = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Tq; ++i) {
      const detail::KeyRange r = detail::visible_keys(a.mask, b, i, Tq, Tk);
      if (!m) {
        pairs += std::max<int64_t>(0, r.end - r.begin);
        continue;
      }
      for (int64_t h = 0; h < m->heads(); ++h)  // (pair by pair: for benchmarks only)
        for (int64_t j = r.begin; j < r.end; ++j)
          pairs += evaluate(m->mask(), b, h, i, j) ? 1.0 / static_cast<double>(m->heads()) : 0.0;
    }
  return pairs;
}

namespace {

// "fp32" or "bf16 or fp32": the types an argument may take, for messages.
void check_types(const char* where, const char* name, const View& v, TensorType first,
                 TensorType second, const char* rule) {
  if (v.type != first && v.type != second) {
    if (first == second)
      fail(where, ": ", name, " is ", dtype_name(v.type), " but must be ", dtype_name(first), " (",
           rule, ")");
    fail(where, ": ", name, " is ", dtype_name(v.type), " but must be ", dtype_name(first), " or ",
         dtype_name(second), " (", rule, ")");
  }
}

bool attention_type(TensorType t) {
  return t == TensorType::f32 || t == TensorType::bf16 || t == TensorType::f16;
}

}  // namespace

void detail::validate_types(const AttentionArgs& a, const char* where) {
  const View* all[] = {&a.q, &a.k, &a.v, &a.out};
  const char* names[] = {"q", "k", "v", "out"};
  for (int t = 0; t < 4; ++t)
    check(attention_type(all[t]->type), where, ": ", names[t], " has element type ",
          to_string(all[t]->type), "; attention takes fp32, bf16 and fp16");
  check(a.k.type == a.v.type, where, ": k is ", dtype_name(a.k.type), " but v is ",
        dtype_name(a.v.type), " (k and v must share an element type)");
  check_types(where, "out", a.out, a.q.type, TensorType::f32,
              "out is written in q's element type or in fp32");
  if (!a.mask.bias.empty())
    check_types(where, "bias", a.mask.bias, TensorType::f32, TensorType::f32,
                "the additive bias is fp32 whatever the inputs' type");
}

void detail::validate_shapes(const AttentionArgs& a, const char* where) {
  check_ndim(a.q, 4, where, "q [B, Hq, Tq, D]");
  check_ndim(a.k, 4, where, "k [B, Hkv, Tk, D]");
  check_ndim(a.v, 4, where, "v [B, Hkv, Tk, Dv]");
  check_ndim(a.out, 4, where, "out [B, Hq, Tq, Dv]");
  const View* all[] = {&a.q, &a.k, &a.v, &a.out};
  const char* names[] = {"q", "k", "v", "out"};
  for (int t = 0; t < 4; ++t)
    for (int d = 0; d < 4; ++d)
      check(all[t]->shape[d] > 0, where, ": ", names[t], " has an empty dim: ", shape_of(*all[t]));

  const int64_t B = a.q.shape[0], Hq = a.q.shape[1], Tq = a.q.shape[2], D = a.q.shape[3];
  const int64_t Hkv = a.k.shape[1], Tk = a.k.shape[2], Dv = a.v.shape[3];
  check(a.k.shape[0] == B && a.v.shape[0] == B, where, ": batch sizes differ: q ", shape_of(a.q),
        ", k ", shape_of(a.k), ", v ", shape_of(a.v));
  check(a.k.shape[3] == D, where, ": k has head dim ", a.k.shape[3], " but q has ", D, " (q ",
        shape_of(a.q), ", k ", shape_of(a.k), ")");
  check(a.v.shape[1] == Hkv && a.v.shape[2] == Tk, where, ": v ", shape_of(a.v), " must match k ",
        shape_of(a.k), " in heads and length");
  check(Hq % Hkv == 0, where, ": q has ", Hq, " heads, not a multiple of the ", Hkv,
        " key/value heads");
  validate_types(a, where);
  check(a.out.shape[0] == B && a.out.shape[1] == Hq && a.out.shape[2] == Tq && a.out.shape[3] == Dv,
        where, ": out is ", shape_of(a.out), ", expected [", B, ", ", Hq, ", ", Tq, ", ", Dv, "]");
  check(std::isfinite(a.scale), where, ": scale must be finite, got ", a.scale);
  check(std::isfinite(a.softcap) && a.softcap >= 0, where, ": softcap must be >= 0 (0 = off), got ",
        a.softcap);
  check(a.mask.window_left >= -1 && a.mask.window_right >= -1, where,
        ": window sizes must be >= 0, or -1 for unbounded; got left ", a.mask.window_left,
        ", right ", a.mask.window_right);
  if (a.mask.kv_len)
    for (int64_t b = 0; b < B; ++b)
      check(a.mask.kv_len[b] >= 0 && a.mask.kv_len[b] <= Tk, where, ": kv_len[", b,
            "] = ", a.mask.kv_len[b], " is outside [0, Tk = ", Tk, "]");
  if (!a.mask.bias.empty()) broadcast_bias(a.mask.bias, B, Hq, Tq, Tk, where);
  if (a.mask.alibi)
    for (int64_t h = 0; h < Hq; ++h)
      check(std::isfinite(a.mask.alibi[h]), where, ": alibi slope of head ", h, " is not finite");
  if (a.score_mod) {
    check(!a.score_mod->empty(), where, ": score_mod is an empty ScoreFunction");
    check(a.softcap == 0 && a.mask.bias.empty() && a.mask.alibi == nullptr, where,
          ": a score_mod does not mix with softcap, bias or alibi (write them into the score "
          "function: each is one)");
    check(a.packed.num_seqs == 0, where,
          ": a score_mod does not take packed sequences (a document mask function does what "
          "they do)");
  }
  if (a.sinks)
    for (int64_t h = 0; h < Hq; ++h)
      check(std::isfinite(a.sinks[h]) || a.sinks[h] == -INFINITY, where, ": the sink of head ", h,
            " is ", a.sinks[h], " (a sink is finite, or -inf for none)");
  validate_packed(a, where);
  validate_dropout(a.dropout, a.packed.num_seqs > 0 ? a.packed.num_seqs : B, Hq, Tq, Tk, where);
  if (const BlockMask* m = a.block_mask) {
    validate_block_mask_batch(*m, B, Hq, where);
    check(a.packed.num_seqs == 0, where,
          ": a block_mask does not take packed sequences (a "
          "document mask function does what they do)");
    check(m->queries() == Tq && m->keys() == Tk, where, ": the block_mask is for Q_LEN ",
          m->queries(), " and KV_LEN ", m->keys(), " but q has ", Tq, " queries and k ", Tk,
          " keys");
  }
}

void detail::validate_block_mask_batch(const BlockMask& m, int64_t B, int64_t Hq,
                                       const char* where) {
  check(m.has_mask(), where, ": block_mask was not made by create_block_mask");
  check(m.batch() == B || (m.batch() == 1 && !m.reads_batch()), where,
        ": the block_mask is for B = ", m.batch(),
        m.reads_batch() ? " and its function reads b" : "", ", but q has batch ", B);
  check(m.heads() == Hq || (m.heads() == 1 && !m.reads_head()), where,
        ": the block_mask is for H = ", m.heads(),
        m.reads_head() ? " and its function reads h" : "", ", but q has ", Hq, " heads");
}

void validate(const AttentionArgs& a, const char* where) {
  detail::validate_shapes(a, where);
  using detail::extent_of;
  const int64_t rows = a.q.shape[0] * a.q.shape[1] * a.q.shape[2];
  detail::check_no_overlap(where, {extent_of("out", a.out), extent_of("lse", a.lse, rows)},
                           {extent_of("q", a.q), extent_of("k", a.k), extent_of("v", a.v),
                            extent_of("bias", a.mask.bias)});
}

void validate_backward(const AttentionArgs& a, const View& dout, const View& dq, const View& dk,
                       const View& dv, const char* where, const ParameterGrads& grads) {
  validate(a, where);
  check(!grads.sinks || a.sinks, where,
        ": grads.sinks asks for the sinks' gradient, but args.sinks is not given");
  const struct {
    const View& grad;
    const View& like;
    const char* name;
    const char* like_name;
  } pairs[] = {{dout, a.out, "dout", "out"},
               {dq, a.q, "dq", "q"},
               {dk, a.k, "dk", "k"},
               {dv, a.v, "dv", "v"}};
  for (const auto& p : pairs) {
    check_ndim(p.grad, 4, where, p.name);
    for (int d = 0; d < 4; ++d)
      check(p.grad.shape[d] == p.like.shape[d], where, ": ", p.name, " is ", shape_of(p.grad),
            " but ", p.like_name, " is ", shape_of(p.like));
    if (p.grad.type != p.like.type && p.grad.type != TensorType::f32)
      fail(where, ": ", p.name, " is ", dtype_name(p.grad.type), " but ", p.like_name, " is ",
           dtype_name(p.like.type), " (a gradient is in its input's element type or in fp32)");
  }
  using detail::extent_of;
  const int64_t rows = a.q.shape[0] * a.q.shape[1] * a.q.shape[2];
  detail::check_no_overlap(
      where,
      {extent_of("dq", dq), extent_of("dk", dk), extent_of("dv", dv),
       extent_of("grads.sinks", grads.sinks, a.q.shape[1])},
      {extent_of("q", a.q), extent_of("k", a.k), extent_of("v", a.v), extent_of("out", a.out),
       extent_of("dout", dout), extent_of("lse", a.lse, rows), extent_of("bias", a.mask.bias),
       extent_of("sinks", a.sinks, a.q.shape[1])});
}

std::atomic<uint32_t>& detail::kernels_reached() {
  static std::atomic<uint32_t> bits{0};
  return bits;
}

namespace {

// Forward for one (unpacked) problem: the kernel that suits its shape.
void forward_one(const AttentionArgs& args) {
  // Decoding reads K and V rows as vectors: a (rare) strided head dim goes to the tiled
  // kernel over a contiguous copy.
  if (args.k.stride[3] != 1 || args.v.stride[3] != 1) {
    std::vector<char> k_copy, v_copy;
    const detail::KvRows K = detail::kv_rows(detail::contiguous_rows(args.k, k_copy));
    const detail::KvRows V = detail::kv_rows(detail::contiguous_rows(args.v, v_copy));
    return detail::flash_forward(args, K, V,
                                 detail::plan_tiled_forward(detail::call_of(args, K, V)));
  }
  detail::forward_validated(args, detail::kv_rows(args.k), detail::kv_rows(args.v));
}

}  // namespace

void detail::forward_validated(const AttentionArgs& args, const KvRows& K, const KvRows& V) {
  const Plan plan = plan_forward(call_of(args, K, V));
  if (plan.driver == Driver::split_kv_decode) decode_forward(args, K, V, plan);
  else flash_forward(args, K, V, plan);
}

void detail::forward_validated(const AttentionArgs& args) {
  if (args.packed.num_seqs > 0)  // (inside a team, on one of its threads: the sequences' lse
                                 // and empty rows pass through buffers of the caller's)
    detail::team_serial(
        [&] { run_packed_forward(args, [](const AttentionArgs& seq, int) { forward_one(seq); }); });
  else forward_one(args);
}

void attention(const AttentionArgs& args) {
  validate(args, "attention");
  detail::forward_validated(args);
}

void attention_backward(const AttentionArgs& args, View dout, View dq, View dk, View dv,
                        const ParameterGrads& grads) {
  validate_backward(args, dout, dq, dk, dv, "attention_backward", grads);
  check(args.lse != nullptr, "attention_backward: lse is required (pass the forward's lse)");
  const auto backward = [](const AttentionArgs& a, const View& dout, const View& dq,
                           const View& dk, const View& dv) {
    detail::flash_backward(a, dout, dq, dk, dv, detail::plan_backward(detail::call_of(a)));
  };
  if (args.packed.num_seqs > 0) detail::run_packed_backward(args, dout, dq, dk, dv, backward);
  else backward(args, dout, dq, dk, dv);
  // (Over packed sequences too: lse, out and dout keep the packed [1, Hq, T] rows.)
  if (grads.sinks) detail::sink_gradients(args, dout, grads.sinks);
}

}  // namespace qkv
