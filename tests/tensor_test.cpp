#include <gtest/gtest.h>

#include <cstdint>

#include "qkv/error.h"
#include "qkv/tensor.h"

namespace qkv {
namespace {

TEST(Tensor, ZeroFilledAlignedAndContiguous) {
  Tensor t({2, 3, 5, 7});
  EXPECT_EQ(t.numel(), 210);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.data()[i], 0.0f);
  const View v = t.view();
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.stride[0], 105);
  EXPECT_EQ(v.stride[3], 1);
  EXPECT_EQ(&v(1, 2, 3, 4), t.data() + 105 + 2 * 35 + 3 * 7 + 4);
}

TEST(Tensor, RejectsEmptyDims) {
  EXPECT_THROW(Tensor({3, 0}), Error);
  EXPECT_THROW(Tensor({-1}), Error);
}

TEST(View, TransposeSeesSeqMajorStorageAsHeadMajor) {
  Tensor bthd({2, 5, 3, 4});  // [B, T, H, D]
  for (int64_t i = 0; i < bthd.numel(); ++i) bthd.data()[i] = static_cast<float>(i);
  const View bhtd = bthd.view().transpose(1, 2);
  EXPECT_EQ(bhtd.shape[1], 3);
  EXPECT_EQ(bhtd.shape[2], 5);
  EXPECT_FALSE(bhtd.is_contiguous());
  EXPECT_EQ(bhtd(1, 2, 4, 3), bthd.view()(1, 4, 2, 3));
}

TEST(View, SliceKeepsStrides) {
  Tensor t({4, 6});
  const View s = t.view().slice(1, 2, 5);
  EXPECT_EQ(s.shape[1], 3);
  EXPECT_EQ(s.stride[0], 6);
  EXPECT_EQ(&s(1, 0), t.data() + 6 + 2);
  EXPECT_THROW(t.view().slice(1, 4, 7), Error);
  EXPECT_THROW(t.view().slice(2, 0, 1), Error);
}

TEST(View, ShapeErrorsNameTheFunctionAndArgument) {
  Tensor t({2, 3});
  try {
    check_ndim(t, 4, "attention", "q");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "attention: q must have 4 dims, got [2, 3]");
  }
  EXPECT_EQ(shape_str(View()), "(none)");
}

}  // namespace
}  // namespace qkv
