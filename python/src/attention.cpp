// qkv.attention and qkv.attention_backward: the C++ kernels on the caller's arrays. The Python
// side (qkv/_attention.py) allocates what the caller did not pass and checks the options.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>

#include "arrays.h"
#include "attention_args.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/targets.h"

namespace qkv::python {

View as_bhtd(View v, const Options& o, const char* what) {
  check(o.layout == "bhtd" || o.layout == "bthd",
        "attention: layout must be \"bhtd\" or \"bthd\", got \"", o.layout, "\"");
  const bool packed = o.cu_seqlens_q.has_value();
  check(v.ndim == (packed ? 3 : 4), "attention: ", what, " must have ", packed ? 3 : 4, " dims (",
        packed ? (o.layout == "bthd" ? "[total, heads, dim]" : "[heads, total, dim]")
               : (o.layout == "bthd" ? "[batch, seq, heads, dim]" : "[batch, heads, seq, dim]"),
        "), got ", shape_of(v));
  if (packed) {  // [1, …] in front, keeping the element type
    for (int d = 3; d >= 1; --d) v.shape[d] = v.shape[d - 1], v.stride[d] = v.stride[d - 1];
    v.shape[0] = 1, v.stride[0] = 0, v.ndim = 4;
  }
  return o.layout == "bthd" ? v.transpose(1, 2) : v;
}

AttentionArgs make_args(const InArray& q, const InArray& k, const InArray& v, const View& out,
                        const std::optional<OutArray>& lse, const Options& o) {
  AttentionArgs a;
  a.q = as_bhtd(element_view(q, "q"), o, "q");
  a.k = as_bhtd(element_view(k, "k"), o, "k");
  a.v = as_bhtd(element_view(v, "v"), o, "v");
  a.out = as_bhtd(out, o, "out");
  const int64_t B = a.q.shape[0], Hq = a.q.shape[1], Tq = a.q.shape[2];
  if (lse) {
    const View l = float_view(*lse, "lse");
    check(l.is_contiguous() && l.numel() == B * Hq * Tq,
          "attention: lse must be a contiguous array of ", B * Hq * Tq,
          " floats ([batch, heads, seq]), got ", shape_of(l));
    a.lse = l.data;
  }
  a.scale = o.scale;
  a.softcap = o.softcap;
  a.mask.causal = o.causal;
  a.mask.window_left = o.window_left;
  a.mask.window_right = o.window_right;
  if (o.kv_len) {
    a.mask.kv_len = int32_data(*o.kv_len, "kv_len");
    check(static_cast<int64_t>(o.kv_len->shape(0)) == B, "attention: kv_len has ",
          o.kv_len->shape(0), " entries for a batch of ", B);
  }
  if (o.bias) a.mask.bias = float_view(*o.bias, "bias");
  if (o.alibi) {
    const View s = float_view(*o.alibi, "alibi");
    check(s.ndim == 1 && s.shape[0] == Hq && s.is_contiguous(), "attention: alibi must be ", Hq,
          " contiguous slopes, one per query head, got ", shape_of(s));
    a.mask.alibi = s.data;
  }
  if (o.sinks) {
    const View s = float_view(*o.sinks, "sinks");
    check(s.ndim == 1 && s.shape[0] == Hq && s.is_contiguous(), "attention: sinks must be ", Hq,
          " contiguous logits, one per query head, got ", shape_of(s));
    a.sinks = s.data;
  }
  check(o.cu_seqlens_q.has_value() == o.cu_seqlens_k.has_value(),
        "attention: cu_seqlens_q and cu_seqlens_k go together");
  if (o.cu_seqlens_q) {
    const size_t n = o.cu_seqlens_q->shape(0);
    check(n >= 2 && o.cu_seqlens_k->shape(0) == n,
          "attention: cu_seqlens_q and cu_seqlens_k must have the same ",
          "length, at least 2 (num_seqs + 1), got ", n, " and ", o.cu_seqlens_k->shape(0));
    a.packed = {static_cast<int>(n - 1), int32_data(*o.cu_seqlens_q, "cu_seqlens_q"),
                int32_data(*o.cu_seqlens_k, "cu_seqlens_k")};
  }
  a.block_mask = o.block_mask;
  a.score_mod = o.score_mod;
  a.dropout = {o.dropout_p, o.dropout_seed, o.dropout_offset};
  return a;
}

void bind_attention(nb::module_& m) {
  m.def(
      "_attention",
      [](const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
         const std::optional<OutArray>& lse, const Options& o) {
        const AttentionArgs a = make_args(q, k, v, element_view(out, "out"), lse, o);
        nb::gil_scoped_release unlocked;
        attention(a);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(),
      nb::arg("options"));
  m.def(
      "_attention_backward",
      [](const InArray& q, const InArray& k, const InArray& v, const InArray& out,
         const OutArray& lse, const InArray& dout, const OutArray& dq, const OutArray& dk,
         const OutArray& dv, const Options& o, const std::optional<OutArray>& dsinks) {
        const AttentionArgs a = make_args(q, k, v, element_view(out, "out"), lse, o);
        const View g = as_bhtd(element_view(dout, "dout"), o, "dout");
        const View gq = as_bhtd(element_view(dq, "dq"), o, "dq"),
                   gk = as_bhtd(element_view(dk, "dk"), o, "dk"),
                   gv = as_bhtd(element_view(dv, "dv"), o, "dv");
        ParameterGrads grads;
        if (dsinks) {
          const View s = float_view(*dsinks, "dsinks");
          check(s.numel() == a.q.shape[1] && s.is_contiguous(),
                "attention_backward: dsinks must be ", a.q.shape[1],
                " contiguous floats, one per query head, got ", shape_of(s));
          grads.sinks = s.data;
        }
        nb::gil_scoped_release unlocked;
        attention_backward(a, g, gq, gk, gv, grads);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"), nb::arg("dout"),
      nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("options"),
      nb::arg("dsinks").none() = nb::none());

  // What qkv.attention (backward: qkv.attention_backward) runs for these arrays and options:
  // qkv.attention_plan. (q stands in for out: nothing is written.)
  m.def(
      "_attention_plan",
      [](const InArray& q, const InArray& k, const InArray& v, const Options& o, bool backward) {
        const AttentionArgs a = make_args(q, k, v, element_view(q, "q"), std::nullopt, o);
        const KernelPlan p = backward ? attention_backward_plan(a) : attention_plan(a);
        return nb::make_tuple(p.kernel, p.unit, p.values_unit, p.why);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("options"), nb::arg("backward"));

  // keep [B, H, Tq, Tk] as bytes (1 kept, 0 dropped): qkv.dropout_mask.
  m.def(
      "_dropout_mask",
      [](float p, uint64_t seed, uint32_t offset, int64_t batch_offset, int64_t B, int64_t H,
         int64_t Tq, int64_t Tk) {
        constexpr double kMost = double(int64_t{1} << 34);
        check(B > 0 && H > 0 && Tq > 0 && Tk > 0 && double(B) * H * Tq * Tk <= kMost,
              "dropout_mask: the sizes must be positive and at most 2^34 pairs in all, got ", B,
              " × ", H, " × ", Tq, " × ", Tk);
        std::string keep(B * H * Tq * Tk, '\0');
        dropout_mask({p, seed, offset, batch_offset}, B, H, Tq, Tk,
                     reinterpret_cast<uint8_t*>(keep.data()));
        return nb::bytes(keep.data(), keep.size());
      },
      nb::arg("p"), nb::arg("seed"), nb::arg("offset"), nb::arg("batch_offset"), nb::arg("B"),
      nb::arg("H"), nb::arg("Tq"), nb::arg("Tk"));

  nb::class_<Options>(m, "_AttentionOptions")
      .def(nb::init<>())
      .def_rw("causal", &Options::causal)
      .def_rw("window_left", &Options::window_left)
      .def_rw("window_right", &Options::window_right)
      .def_rw("kv_len", &Options::kv_len, nb::arg().none())
      .def_rw("bias", &Options::bias, nb::arg().none())
      .def_rw("alibi", &Options::alibi, nb::arg().none())
      .def_rw("sinks", &Options::sinks, nb::arg().none())
      .def_rw("cu_seqlens_q", &Options::cu_seqlens_q, nb::arg().none())
      .def_rw("cu_seqlens_k", &Options::cu_seqlens_k, nb::arg().none())
      .def_rw("softcap", &Options::softcap)
      .def_rw("scale", &Options::scale)
      .def_rw("layout", &Options::layout)
      .def_rw("dropout_p", &Options::dropout_p)
      .def_rw("dropout_seed", &Options::dropout_seed)
      .def_rw("dropout_offset", &Options::dropout_offset)
      .def_prop_rw(
          "block_mask", [](const Options&) { return nb::none(); },
          [](Options& o, const BlockMask* m) { o.block_mask = m; }, nb::arg().none())
      .def_prop_rw(
          "score_mod", [](const Options&) { return nb::none(); },
          [](Options& o, const ScoreFunction* f) { o.score_mod = f; }, nb::arg().none());
}

}  // namespace qkv::python
