// Linked into every kernel test: ctest runs each of them once per compiled SIMD target with
// QKV_TARGET set, and model-level tests also with a target and product units forced together
// by QKV_TEST_FORCE="target/units" (tests/CMakeLists.txt: "avx2/int8=vpmaddubsw"). On a CPU
// that lacks the target the whole run is skipped, not failed (an unknown or uncompiled name
// still fails: the kernels throw), and so is a run whose target and units are the ones this CPU
// runs anyway: the ".best" run tests the same code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "qkv/targets.h"

namespace {

// The CPU feature a target of qkv's own needs, as /proc/cpuinfo names it.
std::string missing_flag(const std::string& target) {
  if (target == "avx512_bf16") return " (no avx512_bf16 in its CPUID flags)";
  if (target == "neon_bf16") return " (no bf16 in its CPU features)";
  return "";
}

// The target and each kind of data's unit, as `qkv info` names them.
std::vector<std::string> what_runs() {
  std::vector<std::string> out = {qkv::current_target()};
  for (const qkv::UnitInUse& u : qkv::units_in_use()) out.push_back(u.data + ": " + u.unit);
  for (const qkv::UnitInUse& u : qkv::weight_units()) out.push_back(u.data + ": " + u.unit);
  return out;
}

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

class TargetEnvironment : public testing::Environment {
 public:
  void SetUp() override {
    std::string target = env("QKV_TARGET"), units = env("QKV_UNITS");
    const std::string force = env("QKV_TEST_FORCE");
    if (!force.empty()) {
      const size_t slash = force.find('/');
      target = force.substr(0, slash);
      units = slash == std::string::npos ? "" : force.substr(slash + 1);
    }
    if (target.empty() && units.empty()) return;
    if (!target.empty()) {
      const auto supported = qkv::supported_targets();
      const auto compiled = qkv::compiled_targets();
      const bool built = std::find(compiled.begin(), compiled.end(), target) != compiled.end();
      if (built && std::find(supported.begin(), supported.end(), target) == supported.end())
        GTEST_SKIP() << "this CPU does not run SIMD target " << target << missing_flag(target);
    }
    // What runs without them, then what runs with them (the forcing the tests keep).
    qkv::check_target_environment();  // QKV_TARGET and QKV_UNITS read first: nothing undoes this
    qkv::set_target("best");
    qkv::set_units("");
    const std::vector<std::string> best = what_runs();
    qkv::set_target_from(target.empty() ? "best" : target, "the test's target");
    qkv::set_units(units);
    if (what_runs() == best)
      GTEST_SKIP() << "target " << (target.empty() ? "best" : target) << ", units '" << units
                   << "' are what this CPU runs without them: the .best run tests it";
  }
};

const testing::Environment* const registered =
    testing::AddGlobalTestEnvironment(new TargetEnvironment);

}  // namespace
