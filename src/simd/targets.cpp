// Target names, QKV_TARGET and set_target (include/qkv/targets.h), over Highway's dispatch:
// HWY_DYNAMIC_DISPATCH runs the best target among those compiled (HWY_TARGETS) and reported
// by hwy::SupportedTargets(). Forcing target T narrows what SupportedTargets reports to T and
// the targets below it (hwy::SetSupportedTargetsForTest), checked first against what the CPU
// really supports, read before any narrowing.
//
// avx512_bf16 (x86-64) and neon_bf16 (AArch64) are qkv's own targets above Highway's (Highway
// 1.0.3 has none for AVX512-BF16 or Arm's BF16): a bit Highway reserves and never sets,
// present when the CPU has the bf16 dot product (beside AVX-512 on x86) and the library was
// built with the kernels that use it (src/simd/units.h). It is in force when forced by name, or
// with nothing forced where the CPU-feature registry gives bf16 to the bf16 dot unit
// (src/simd/cpu.h: not on Intel). Then the kernels with a bf16-unit version run that one for
// bf16 elements; everything else runs Highway's best target below it (for neon_bf16 forced by
// name, NEON: the units' own width).
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
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "qkv/targets.h"
#include "simd/amx.h"
#include "simd/cpu.h"
#include "simd/dispatch.h"
#include "simd/units.h"

namespace qkv {
namespace simd {
namespace {

#if HWY_ARCH_X86 && QKV_HAVE_BF16_UNITS
constexpr int64_t kBf16Units = 1LL << 6;  // reserved by Highway 1.0.3 (detect_targets.h)
static_assert((kBf16Units & (HWY_TARGETS | HWY_AVX3_DL)) == 0, "a bit Highway does not use");
#elif HWY_ARCH_ARM_A64 && QKV_HAVE_BF16_UNITS
constexpr int64_t kBf16Units = 1LL << 23;  // reserved by Highway 1.0.3, just above SVE2_128
static_assert((kBf16Units & (HWY_TARGETS | HWY_SVE2_128)) == 0, "a bit Highway does not use");
#else
constexpr int64_t kBf16Units = 0;
#endif
// What set_target says of the bf16 units: avx512_bf16 / neon_bf16 forced them on, a lower
// target off; otherwise (best, or nothing forced) the CPU-feature registry's unit for bf16.
enum class UnitsByTarget { registry, on, off };
std::atomic<UnitsByTarget> units_by_target{UnitsByTarget::registry};

struct NamedTarget {
  const char* name;
  int64_t bits;
};

// Best first (Highway: a lower bit is a better target).
constexpr NamedTarget kNames[] = {
#if HWY_ARCH_X86
    {"avx512_bf16", kBf16Units}, {"avx512_dl", HWY_AVX3_DL}, {"avx512", HWY_AVX3},
    {"avx2", HWY_AVX2},          {"sse4", HWY_SSE4},         {"ssse3", HWY_SSSE3},
#elif HWY_ARCH_ARM
    // "sve" is SVE with 256-bit vectors, the one SVE target qkv compiles (CMakeLists.txt).
    {"neon_bf16", kBf16Units}, {"sve2_128", HWY_SVE2_128}, {"sve", HWY_SVE_256},
    {"sve2", HWY_SVE2},        {"sve_scalable", HWY_SVE},  {"neon", HWY_NEON},
#endif
    {"emu128", HWY_EMU128},      {"scalar", HWY_SCALAR},
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

// Whether the CPU has AVX512-BF16 beside AVX-512, or on AArch64 the BF16 extension beside NEON
// (src/simd/cpu.h).
bool cpu_has_bf16_units(int64_t hwy_targets) {
#if HWY_ARCH_X86 && QKV_HAVE_BF16_UNITS
  return (hwy_targets & (HWY_AVX3 | HWY_AVX3_DL)) && cpu_features().avx512_bf16;
#elif HWY_ARCH_ARM_A64 && QKV_HAVE_BF16_UNITS
  return (hwy_targets & HWY_NEON) && cpu_features().arm_bf16;
#else
  (void)hwy_targets;
  return false;
#endif
}

// What this CPU supports, before any narrowing by set_target.
int64_t cpu_targets() {
  static const int64_t cpu = [] {
    const int64_t hwy_targets = supported_now();
    return hwy_targets | (cpu_has_bf16_units(hwy_targets) ? kBf16Units : 0);
  }();
  return cpu;
}

// The targets compiled into this build.
constexpr int64_t kCompiled = HWY_TARGETS | kBf16Units;

std::vector<std::string> names_of(int64_t bits) {
  std::vector<std::string> names;
  for (const NamedTarget& t : kNames)
    if (t.bits && (bits & t.bits)) names.push_back(t.name);
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
  const std::string choices = joined(names_of(cpu & kCompiled));
  if (name.empty() || name == "best") {
    hwy::SetSupportedTargetsForTest(0);
    hwy::GetChosenTarget().DeInit();
    units_by_target = UnitsByTarget::registry;
    return;
  }
  bool known = false;
  int64_t bits = 0;
  for (const NamedTarget& t : kNames)
    if (name == t.name) known = true, bits = t.bits;
  check(known, where, ": unknown SIMD target '", name, "' (this CPU and build: ", choices,
        ", or best)");
  check((bits & kCompiled) != 0, where, ": SIMD target '", name,
        "' is not compiled into this build (compiled: ", joined(compiled_targets()), ")");
  check((bits & cpu) != 0, where, ": this CPU does not support SIMD target '", name,
        "' (it supports: ", choices, ")");
  // The target and those below it (for the bf16 units: every Highway target the CPU has, or
  // on AArch64 NEON, whose width the units' kernels have).
  int64_t floor = bits;
#if HWY_ARCH_ARM
  if (bits == kBf16Units) floor = HWY_NEON;
#endif
  hwy::SetSupportedTargetsForTest(cpu & ~kBf16Units & ~(floor - 1));
  hwy::GetChosenTarget().DeInit();  // the next dispatch chooses again
  units_by_target = bits == kBf16Units ? UnitsByTarget::on : UnitsByTarget::off;
}

bool bf16_units() {
  ensure_target();
  if (kBf16Units == 0 || !(cpu_targets() & kBf16Units)) return false;
  switch (units_by_target.load(std::memory_order_relaxed)) {
    case UnitsByTarget::on:
      return true;
    case UnitsByTarget::off:
      return false;
    default:
      return unit_of(Work::bf16) == Unit::bf16_dot;
  }
}

namespace {

int64_t current_bits() {
  if (bf16_units()) return kBf16Units;
  const int64_t t = supported_now() & HWY_TARGETS;
  return t & -t;  // the best (lowest) bit: what HWY_DYNAMIC_DISPATCH runs
}

HWY_EXPORT(vector_bits);
HWY_EXPORT(vector_registers);

}  // namespace

// (On AArch64 the units' kernels are NEON's width, whatever Highway's best target is.)
int current_vector_bits() {
  return HWY_ARCH_ARM && bf16_units() ? 128 : QKV_DISPATCH(vector_bits)();
}
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

std::vector<std::string> compiled_targets() { return simd::names_of(simd::kCompiled); }

std::vector<std::string> supported_targets() {
  return simd::names_of(simd::cpu_targets() & simd::kCompiled);
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

void check_target_environment() {
  simd::ensure_target();
  (void)simd::unit_for(simd::Work::bf16);  // QKV_UNITS
}

void set_units(const std::string& spec) { simd::force_units(spec, "set_units"); }

std::string cpu_identity() {
  const simd::CpuFeatures& f = simd::cpu_features();
  std::string s =
      f.vendor + " family " + std::to_string(f.family) + " model " + std::to_string(f.model) + ":";
  const std::pair<bool, const char*> named[] = {
      {f.avx512, "avx512"},     {f.avx512_bf16, "avx512_bf16"}, {f.avx512_vnni, "avx512_vnni"},
      {f.avx_vnni, "avx_vnni"}, {f.amx_bf16, "amx_bf16"},       {f.amx_int8, "amx_int8"},
      {f.arm_bf16, "bf16"},     {f.arm_dotprod, "dotprod"}};
  for (const auto& [has, name] : named)
    if (has) s += std::string(" ") + name;
  return s;
}

int target_vector_bits() { return simd::current_vector_bits(); }
int target_vector_registers() { return simd::current_vector_registers(); }

}  // namespace qkv
#endif  // HWY_ONCE
