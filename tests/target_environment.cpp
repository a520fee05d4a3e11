// Linked into every kernel test: ctest runs each of them once per compiled SIMD target with
// QKV_TARGET set (tests/CMakeLists.txt), and on a CPU that lacks that target the whole run is
// skipped, not failed. (An unknown or uncompiled name still fails: the kernels throw.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "qkv/targets.h"

namespace {

// The CPU feature a target of qkv's own needs, as /proc/cpuinfo names it.
std::string missing_flag(const std::string& target) {
  if (target == "avx512_bf16") return " (no avx512_bf16 in its CPUID flags)";
  if (target == "neon_bf16") return " (no bf16 in its CPU features)";
  return "";
}

class TargetEnvironment : public testing::Environment {
 public:
  void SetUp() override {
    const char* name = std::getenv("QKV_TARGET");
    if (!name || !*name) return;
    const auto supported = qkv::supported_targets();
    const auto compiled = qkv::compiled_targets();
    const bool built = std::find(compiled.begin(), compiled.end(), name) != compiled.end();
    if (built && std::find(supported.begin(), supported.end(), name) == supported.end())
      GTEST_SKIP() << "this CPU does not run SIMD target " << name << missing_flag(name);
  }
};

const testing::Environment* const registered =
    testing::AddGlobalTestEnvironment(new TargetEnvironment);

}  // namespace
