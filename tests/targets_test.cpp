// SIMD targets: the names, forcing one, and the errors for names that cannot run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/targets.h"
#include "qkv/tensor.h"

namespace qkv {
namespace {

// What each target is, from the instruction sets' definitions (not from the library).
struct Width {
  int bits, registers;
};
const std::map<std::string, Width> kWidths = {
    {"sse4", {128, 16}},      {"avx2", {256, 16}}, {"avx512", {512, 32}},
    {"avx512_dl", {512, 32}}, {"avx512_bf16", {512, 32}}, {"neon", {128, 32}},
    {"neon_bf16", {128, 32}}, {"sve", {256, 32}},
};

// Puts the target back as it was (the best, or QKV_TARGET's) when a test ends.
struct TargetGuard {
  std::string saved = current_target();
  ~TargetGuard() { set_target(saved); }
};

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

TEST(Targets, SupportedAreCompiledAndTheCurrentOneIsSupported) {
  const auto compiled = compiled_targets(), supported = supported_targets();
  ASSERT_FALSE(supported.empty());
  for (const std::string& t : supported) EXPECT_TRUE(contains(compiled, t)) << t;
  EXPECT_TRUE(contains(supported, current_target())) << current_target();
  // The code that runs is the current target's (ctest runs this first in its own process:
  // no set_target has run).
  const auto known = kWidths.find(current_target());
  if (known != kWidths.end()) {
    EXPECT_EQ(target_vector_bits(), known->second.bits);
  }
}

TEST(Targets, EachSupportedTargetCanBeForcedAndHasItsOwnWidth) {
  TargetGuard guard;
  for (const std::string& t : supported_targets()) {
    SCOPED_TRACE(t);
    set_target(t);
    EXPECT_EQ(current_target(), t);
    const auto known = kWidths.find(t);
    if (known == kWidths.end()) continue;
    EXPECT_EQ(target_vector_bits(), known->second.bits);
    EXPECT_EQ(target_vector_registers(), known->second.registers);
  }
  set_target("best");
  EXPECT_EQ(current_target(), supported_targets().front());
}

TEST(Targets, EveryTargetComputesTheSameAttentionWithinRounding) {
  // The same causal problem on every supported target, against the reference kernel.
  TargetGuard guard;
  const int64_t B = 1, H = 2, T = 77, D = 40;
  Tensor q({B, H, T, D}), k({B, H, T, D}), v({B, H, T, D}), want({B, H, T, D});
  float* parts[] = {q.data(), k.data(), v.data()};
  for (int p = 0; p < 3; ++p)
    for (int64_t i = 0; i < q.numel(); ++i) parts[p][i] = std::sin(0.37f * i + p) * 0.8f;
  AttentionArgs args{.q = q, .k = k, .v = v, .out = want};
  args.mask.causal = true;
  reference::attention(args);
  for (const std::string& t : supported_targets()) {
    SCOPED_TRACE(t);
    set_target(t);
    Tensor got({B, H, T, D});
    args.out = got;
    attention(args);
    float worst = 0;
    for (int64_t i = 0; i < got.numel(); ++i)
      worst = std::max(worst, std::abs(got.data()[i] - want.data()[i]));
    EXPECT_LT(worst, 1e-5f);  // outputs are O(1); fp32 sums of ≤ 77 terms
  }
}

TEST(Targets, UnknownUncompiledAndUnsupportedNamesAreErrors) {
  TargetGuard guard;
  try {
    set_target("avx1024");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown SIMD target 'avx1024'"), std::string::npos)
        << e.what();
  }
  // A name of another architecture is not compiled in.
#if defined(__x86_64__)
  const std::string foreign = "neon";
#else
  const std::string foreign = "avx2";
#endif
  try {
    set_target(foreign);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(foreign), std::string::npos) << e.what();
  }
  for (const std::string& t : compiled_targets())
    if (!contains(supported_targets(), t)) {
      try {
        set_target(t);
        FAIL() << "no error for " << t;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("does not support"), std::string::npos) << e.what();
      }
    }
  EXPECT_TRUE(contains(supported_targets(), current_target()));  // unchanged by the errors
}

}  // namespace
}  // namespace qkv
