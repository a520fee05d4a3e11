// Target names, QKV_TARGET and set_target (include/qkv/targets.h), over Highway's dispatch:
// HWY_DYNAMIC_DISPATCH runs the best target among those compiled (HWY_TARGETS) and reported
// by hwy::SupportedTargets(). Forcing target T narrows what SupportedTargets reports to T and
// the targets below it (hwy::SetSupportedTargetsForTest), checked first against what the CPU
// really supports, read before any narrowing.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/targets.cpp"
#include <hwy/foreach_target.h>
#include <hwy/highway.h>

#include "simd/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::simd {
namespace HWY_NAMESPACE {

int vector_bits() { return static_cast<int>(lanes() * 32); }
int vector_registers() { return kVectorRegisters; }

}  // namespace HWY_NAMESPACE
}  // namespace qkv::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "qkv/error.h"
#include "qkv/targets.h"
#include "simd/dispatch.h"

namespace qkv {
namespace simd {
namespace {

struct NamedTarget {
  const char* name;
  int64_t bits;
};

// Best first (Highway: a lower bit is a better target).
constexpr NamedTarget kNames[] = {
#if HWY_ARCH_X86
    {"avx512_dl", HWY_AVX3_DL}, {"avx512", HWY_AVX3},   {"avx2", HWY_AVX2},
    {"sse4", HWY_SSE4},         {"ssse3", HWY_SSSE3},
#elif HWY_ARCH_ARM
    // "sve" is SVE with 256-bit vectors, the one SVE target qkv compiles (CMakeLists.txt).
    {"sve2_128", HWY_SVE2_128}, {"sve", HWY_SVE_256},   {"sve2", HWY_SVE2},
    {"sve_scalable", HWY_SVE},  {"neon", HWY_NEON},
#endif
    {"emu128", HWY_EMU128},     {"scalar", HWY_SCALAR},
};

// hwy::SupportedTargets(), and Highway's choice for HWY_DYNAMIC_DISPATCH updated to it, as
// a dispatch does. (Highway 1.0.3's SupportedTargets leaves the choice made from what it
// detected before its SVE vector-length check: on a 256-bit SVE CPU, any call of it outside a
// dispatch made the next dispatches run NEON.)
int64_t supported_now() {
  const int64_t targets = hwy::SupportedTargets();
  hwy::GetChosenTarget().Update(targets);
  return targets;
}

// What this CPU supports, before any narrowing by set_target.
int64_t cpu_targets() {
  static const int64_t cpu = supported_now();
  return cpu;
}

std::vector<std::string> names_of(int64_t bits) {
  std::vector<std::string> names;
  for (const NamedTarget& t : kNames)
    if (bits & t.bits) names.push_back(t.name);
  return names;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

void force_target(const std::string& name, const char* where) {
  const int64_t cpu = cpu_targets();
  const std::string choices = joined(names_of(cpu & HWY_TARGETS));
  if (name.empty() || name == "best") {
    hwy::SetSupportedTargetsForTest(0);
    hwy::GetChosenTarget().DeInit();
    return;
  }
  int64_t bits = 0;
  for (const NamedTarget& t : kNames)
    if (name == t.name) bits = t.bits;
  check(bits != 0, where, ": unknown SIMD target '", name, "' (this CPU and build: ", choices,
        ", or best)");
  check((bits & HWY_TARGETS) != 0, where, ": SIMD target '", name,
        "' is not compiled into this build (compiled: ", joined(compiled_targets()), ")");
  check((bits & cpu) != 0, where, ": this CPU does not support SIMD target '", name,
        "' (it supports: ", choices, ")");
  hwy::SetSupportedTargetsForTest(cpu & ~(bits - 1));  // the target and those below it
  hwy::GetChosenTarget().DeInit();                     // the next dispatch chooses again
}

namespace {

int64_t current_bits() {
  ensure_target();
  const int64_t t = supported_now() & HWY_TARGETS;
  return t & -t;  // the best (lowest) bit: what HWY_DYNAMIC_DISPATCH runs
}

HWY_EXPORT(vector_bits);
HWY_EXPORT(vector_registers);

}  // namespace

int current_vector_bits() { return QKV_DISPATCH(vector_bits)(); }
int current_vector_registers() { return QKV_DISPATCH(vector_registers)(); }

void ensure_target() {
  static const bool applied = [] {
    const char* env = std::getenv("QKV_TARGET");
    if (env && *env) force_target(env, "QKV_TARGET");
    return true;
  }();
  (void)applied;
}

}  // namespace simd

std::vector<std::string> compiled_targets() { return simd::names_of(HWY_TARGETS); }

std::vector<std::string> supported_targets() {
  return simd::names_of(simd::cpu_targets() & HWY_TARGETS);
}

std::string current_target() {
  const std::vector<std::string> names = simd::names_of(simd::current_bits());
  return names.empty() ? "unknown" : names[0];
}

void set_target(const std::string& name) { set_target_from(name, "set_target"); }

void set_target_from(const std::string& name, const char* where) {
  simd::ensure_target();  // QKV_TARGET first, so that it cannot undo this later
  simd::force_target(name, where);
}

void check_target_environment() { simd::ensure_target(); }

int target_vector_bits() { return simd::current_vector_bits(); }
int target_vector_registers() { return simd::current_vector_registers(); }

}  // namespace qkv
#endif  // HWY_ONCE
