// qkv._qkv._BlockMask: create_block_mask over a mask function in the text form, its captured
// tensors given as (name, int32 array) pairs (qkv/torch.py traces Python functions into this);
// qkv._qkv._ScoreFunction: a score function in the text form over float32 arrays (with
// gradient arrays for the learnable ones) and int32 ones.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "qkv/error.h"
#include "qkv/mask_function.h"
#include "qkv/score_function.h"

namespace qkv::python {

namespace {

MaskTensor captured(const std::string& name, const InArray& a) {
  if (a.dtype() != nb::dtype<int32_t>())
    throw nb::type_error(
        ("captured tensor " + name + " must be int32, got " + dtype_name(a.dtype())).c_str());
  std::vector<int64_t> shape;
  int64_t count = 1, stride = 1;
  for (size_t d = 0; d < a.ndim(); ++d) shape.push_back(static_cast<int64_t>(a.shape(d)));
  for (int64_t n : shape) count *= n;
  for (size_t d = a.ndim(); d-- > 0;) {
    check(a.shape(d) <= 1 || a.stride(d) == stride, "captured tensor ", name,
          " must be contiguous");
    stride *= static_cast<int64_t>(a.shape(d));
  }
  const int32_t* p = static_cast<const int32_t*>(a.data());
  if (shape.empty()) shape.push_back(1);  // a 0-dim tensor read as [0]
  return MaskTensor(name, shape, std::vector<int32_t>(p, p + count));
}

using FloatArray = nb::ndarray<nb::device::cpu>;

// A ScoreFunction and the arrays its tensors borrow (kept alive with it).
struct PyScoreFunction {
  ScoreFunction fn;
  std::vector<FloatArray> arrays;
};

// A contiguous float32 array's shape and data, checked.
std::vector<int64_t> float_shape(const std::string& name, const FloatArray& a) {
  if (a.dtype() != nb::dtype<float>())
    throw nb::type_error(
        ("captured tensor " + name + " must be float32, got " + dtype_name(a.dtype())).c_str());
  std::vector<int64_t> shape;
  int64_t stride = 1;
  for (size_t d = 0; d < a.ndim(); ++d) shape.push_back(static_cast<int64_t>(a.shape(d)));
  for (size_t d = a.ndim(); d-- > 0;) {
    check(a.shape(d) <= 1 || a.stride(d) == stride, "captured tensor ", name,
          " must be contiguous");
    stride *= static_cast<int64_t>(a.shape(d));
  }
  if (shape.empty()) shape.push_back(1);
  return shape;
}

}  // namespace

void bind_mask(nb::module_& m) {
  nb::class_<PyScoreFunction>(m, "_ScoreFunction")
      .def_prop_ro("text", [](const PyScoreFunction& f) { return to_string(f.fn.expr()); })
      .def_prop_ro("tables", [](const PyScoreFunction& f) { return f.fn.tables(); })
      .def_prop_ro("learnable", [](const PyScoreFunction& f) { return f.fn.learnable(); })
      .def_prop_ro(
          "function", [](const PyScoreFunction& f) { return &f.fn; },
          nb::rv_policy::reference_internal);
  nb::class_<ScoreFunction>(m, "_ScoreFunctionRef");
  m.def(
      "_score_function",
      [](const std::string& text, const std::vector<std::string>& names,
         const std::vector<FloatArray>& values, const std::vector<std::optional<FloatArray>>& grads,
         const std::vector<std::pair<std::string, InArray>>& ints) {
        check(names.size() == values.size() && names.size() == grads.size(),
              "_score_function: names, values and grads differ in length");
        auto f = std::make_unique<PyScoreFunction>();
        std::vector<ScoreTensor> tensors;
        for (size_t i = 0; i < names.size(); ++i) {
          const std::vector<int64_t> shape = float_shape(names[i], values[i]);
          float* grad = nullptr;
          if (grads[i]) {
            check(float_shape(names[i], *grads[i]) == shape, "captured tensor ", names[i],
                  ": its grad has another shape");
            grad = static_cast<float*>(grads[i]->data());
            f->arrays.push_back(*grads[i]);
          }
          tensors.emplace_back(names[i], shape, static_cast<const float*>(values[i].data()), grad);
          f->arrays.push_back(values[i]);
        }
        std::vector<MaskTensor> int_tensors;
        for (const auto& [name, a] : ints) int_tensors.push_back(captured(name, a));
        f->fn = ScoreFunction(parse_score(text, tensors, int_tensors));
        return f;
      },
      nb::arg("text"), nb::arg("names"), nb::arg("values"), nb::arg("grads"), nb::arg("ints"));
  nb::class_<BlockMask>(m, "_BlockMask")
      .def_prop_ro("text", [](const BlockMask& b) { return to_string(b.mask()); })
      .def_prop_ro("shape",
                   [](const BlockMask& b) {
                     return nb::make_tuple(b.batch(), b.heads(), b.queries(), b.keys());
                   })
      .def_prop_ro("block", &BlockMask::block)
      .def_prop_ro("query_blocks", &BlockMask::query_blocks)
      .def_prop_ro("key_blocks", &BlockMask::key_blocks)
      .def_prop_ro("visible_pairs", &BlockMask::visible_pairs)
      .def_prop_ro("bytes", &BlockMask::bytes)
      .def_prop_ro("build_seconds", &BlockMask::build_seconds)
      .def("state",
           [](const BlockMask& b, int64_t bb, int64_t h, int64_t qb, int64_t kb) {
             check(bb >= 0 && bb < b.batch() && h >= 0 && h < b.heads() && qb >= 0 &&
                       qb < b.query_blocks() && kb >= 0 && kb < b.key_blocks(),
                   "BlockMask.state: an index is out of range");
             return static_cast<int>(b.state(bb, h, qb, kb));
           })
      .def("key_blocks_of", [](const BlockMask& b, int64_t bb, int64_t h, int64_t qb) {
        check(bb >= 0 && bb < b.batch() && h >= 0 && h < b.heads() && qb >= 0 &&
                  qb < b.query_blocks(),
              "BlockMask.key_blocks_of: an index is out of range");
        const auto f = b.full_key_blocks(bb, h, qb), p = b.partial_key_blocks(bb, h, qb);
        return std::make_pair(std::vector<int32_t>(f.begin(), f.end()),
                              std::vector<int32_t>(p.begin(), p.end()));
      });
  m.def(
      "_create_block_mask",
      [](const std::string& text, const std::vector<std::pair<std::string, InArray>>& tensors,
         int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t block) {
        std::vector<MaskTensor> captured_tensors;
        for (const auto& [name, a] : tensors) captured_tensors.push_back(captured(name, a));
        const MaskExpr mask = parse_mask(text, captured_tensors);
        nb::gil_scoped_release unlocked;
        return create_block_mask(mask, B, H, Tq, Tk, block);
      },
      nb::arg("text"), nb::arg("tensors"), nb::arg("B"), nb::arg("H"), nb::arg("Q_LEN"),
      nb::arg("KV_LEN"), nb::arg("BLOCK_SIZE"));
}

}  // namespace qkv::python
