// qkv.dist: ring attention over an mpi4py communicator (its MPI_Comm handle, as
// mpi4py.MPI._handleof gives it). Compiled when qkv is built with MPI.
#include <mpi.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "arrays.h"
#include "attention_args.h"
#include "qkv/dist.h"
#include "qkv/error.h"

namespace qkv::python {
namespace {

dist::Sharding sharding_of(int64_t seq_len, uintptr_t comm, const std::string& name) {
  check(name == "zigzag" || name == "contiguous", "ring_attention: sharding must be \"zigzag\" or ",
        "\"contiguous\", got \"", name, "\"");
  int size = 0;
  dist::check_mpi(MPI_Comm_size(reinterpret_cast<MPI_Comm>(comm), &size), "MPI_Comm_size");
  return {seq_len, size, name == "zigzag" ? dist::Layout::zigzag : dist::Layout::contiguous};
}

}  // namespace

void bind_dist(nb::module_& m) {
  m.attr("_has_dist") = true;
  m.def(
      "_ring_attention",
      [](const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
         const OutArray& lse, const Options& o, uintptr_t comm, int64_t seq_len,
         const std::string& sharding) {
        const AttentionArgs a = make_args(q, k, v, float_view(out, "out"), lse, o);
        const dist::Sharding s = sharding_of(seq_len, comm, sharding);
        nb::gil_scoped_release unlocked;
        dist::ring_attention(a, s, reinterpret_cast<MPI_Comm>(comm));
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"), nb::arg("options"),
      nb::arg("comm"), nb::arg("seq_len"), nb::arg("sharding"));
  m.def(
      "_ring_attention_backward",
      [](const InArray& q, const InArray& k, const InArray& v, const InArray& out,
         const OutArray& lse, const InArray& dout, const OutArray& dq, const OutArray& dk,
         const OutArray& dv, const Options& o, uintptr_t comm, int64_t seq_len,
         const std::string& sharding) {
        const AttentionArgs a = make_args(q, k, v, float_view(out, "out"), lse, o);
        const View g = as_bhtd(float_view(dout, "dout"), o, "dout");
        const View gq = as_bhtd(float_view(dq, "dq"), o, "dq"),
                   gk = as_bhtd(float_view(dk, "dk"), o, "dk"),
                   gv = as_bhtd(float_view(dv, "dv"), o, "dv");
        const dist::Sharding s = sharding_of(seq_len, comm, sharding);
        nb::gil_scoped_release unlocked;
        dist::ring_attention_backward(a, g, gq, gk, gv, s, reinterpret_cast<MPI_Comm>(comm));
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"), nb::arg("dout"),
      nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("options"), nb::arg("comm"),
      nb::arg("seq_len"), nb::arg("sharding"));
}

}  // namespace qkv::python
