// The `qkv._qkv` extension module. Every qkv::Error arrives in Python as a ValueError with
// qkv's message; a wrong dtype is a TypeError.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "qkv/error.h"
#include "qkv/targets.h"
#include "qkv/threads.h"
#include "qkv/version.h"

namespace qkv::python {
namespace nb = nanobind;
void bind_attention(nb::module_& m);
void bind_mask(nb::module_& m);
void bind_models(nb::module_& m);
void bind_dist(nb::module_& m);  // python/src/dist.cpp, with MPI
}  // namespace qkv::python

NB_MODULE(_qkv, m) {
  namespace nb = nanobind;
  // Autograd graphs alive at exit hold options objects; nanobind would report them as leaks.
  nb::set_leak_warnings(false);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const qkv::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const std::bad_alloc&) {
      PyErr_SetString(PyExc_MemoryError, "qkv: out of memory");
    }
  });
  m.def("compiled_targets", &qkv::compiled_targets, "SIMD targets built into this module");
  m.def("version", &qkv::version, "qkv's version");
  m.def("build_commit", &qkv::build_commit, "The commit this module was built from, or 'unknown'");
  m.def("supported_targets", &qkv::supported_targets, "the compiled targets this CPU runs");
  m.def("current_target", &qkv::current_target, "the SIMD target the kernels use now");
  m.def("set_target", &qkv::set_target, nb::arg("name"), "use this SIMD target from now on");
  m.def("set_num_threads", &qkv::set_num_threads, nb::arg("n"), "threads for qkv's kernels (>= 1)");
  m.def("num_threads", &qkv::num_threads);
  qkv::python::bind_attention(m);
  qkv::python::bind_mask(m);
  qkv::python::bind_models(m);
#ifdef QKV_HAVE_MPI
  qkv::python::bind_dist(m);
#else
  m.attr("_has_dist") = false;
#endif
}
