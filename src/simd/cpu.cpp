// The CPU-feature registry (see cpu.h). Compiled for the oldest CPU qkv runs on: it only reads
// CPUID and XCR0 (no compiler builtin: clang and GCC disagree on the feature names) or hwcaps.
#include "simd/cpu.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>

#include "qkv/error.h"
#include "simd/amx.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define QKV_CPU_X86 1
#elif defined(__aarch64__)
#include <sys/auxv.h>
#define QKV_CPU_ARM 1
#endif

namespace qkv::simd {
namespace {

#if QKV_CPU_X86
// XCR0: which register states the OS saves on a context switch (xgetbv needs OSXSAVE).
uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}
bool bit(uint32_t word, int b) { return (word >> b) & 1; }
#endif

CpuFeatures read_cpu_features() {
  CpuFeatures f;
#if QKV_CPU_X86
  uint32_t a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const uint32_t max_leaf = a;
  char vendor[13];
  std::memcpy(vendor, &b, 4), std::memcpy(vendor + 4, &d, 4), std::memcpy(vendor + 8, &c, 4);
  vendor[12] = 0;
  f.vendor = vendor;
  __cpuid(1, a, b, c, d);
  const int base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
  f.family = base_family == 0xf ? base_family + static_cast<int>((a >> 20) & 0xff) : base_family;
  f.model = base_family == 6 || base_family == 0xf
                ? static_cast<int>((a >> 16) & 0xf) * 16 + base_model
                : base_model;
  const uint64_t os = bit(c, 27) ? xcr0() : 0;  // OSXSAVE
  const bool ymm = (os & 0x6) == 0x6, zmm = (os & 0xe6) == 0xe6;
  const bool tiles = (os & (3u << 17)) == (3u << 17);  // XTILECFG, XTILEDATA
  if (max_leaf < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx512 = zmm && bit(b, 16) && bit(b, 17) && bit(b, 30) && bit(b, 31);  // F, DQ, BW, VL
  f.avx512_vnni = f.avx512 && bit(c, 11);
  f.amx_bf16 = tiles && bit(d, 24) && bit(d, 22);
  f.amx_int8 = tiles && bit(d, 24) && bit(d, 25);
  __cpuid_count(7, 1, a, b, c, d);
  f.avx_vnni = ymm && bit(a, 4);
  f.avx512_bf16 = f.avx512 && bit(a, 5);
#elif QKV_CPU_ARM
  f.vendor = "arm";
  f.arm_dotprod = (getauxval(AT_HWCAP) >> 20) & 1;  // HWCAP_ASIMDDP (asm/hwcap.h)
  f.arm_bf16 = (getauxval(AT_HWCAP2) >> 14) & 1;    // HWCAP2_BF16
#endif
  return f;
}

// The units that multiply each work on this architecture, in the order `qkv info` names them.
#if QKV_CPU_ARM
constexpr Unit kInt8Units[] = {Unit::sdot, Unit::int16};
#else
constexpr Unit kInt8Units[] = {Unit::vpdpbusd, Unit::avx_vnni, Unit::vpmaddubsw, Unit::amx};
#endif
bool multiplies(Unit unit, Work work) {
  if (work == Work::bf16) return unit == Unit::bf16_dot || unit == Unit::fma || unit == Unit::amx;
  for (Unit u : kInt8Units)
    if (u == unit) return true;
  return false;
}

// Whether a CPU with `f` (and this build) has the unit for `work`; else why not.
const char* lacks(Unit unit, Work work, const CpuFeatures& f, bool bf16_kernels) {
  switch (unit) {
    case Unit::bf16_dot:
      if (!f.avx512_bf16 && !f.arm_bf16) return "the CPU has no AVX512-BF16 or Arm BF16";
      return bf16_kernels ? nullptr : "this build has no bf16-unit kernels";
    case Unit::avx_vnni:
      return f.avx_vnni ? nullptr : "the CPU has no AVX-VNNI";
    case Unit::vpdpbusd:
      return f.avx512_vnni ? nullptr : "the CPU has no AVX512-VNNI";
    case Unit::sdot:
      return f.arm_dotprod ? nullptr : "the CPU has no Arm dot product extension";
    case Unit::amx:  // the stand-in runs anywhere; the tiles need the CPU and Linux's grant
      if (amx::stand_in()) return nullptr;
      if (work == Work::bf16 && !f.amx_bf16)
        return "the CPU has no AMX-BF16 (QKV_AMX_STAND_IN=1 runs the stand-in)";
      if (work == Work::int8 && !f.amx_int8)
        return "the CPU has no AMX-INT8 (QKV_AMX_STAND_IN=1 runs the stand-in)";
      return amx::unavailable();
    default:
      return nullptr;
  }
}

// The table: for each work the first rule whose vendor matches (empty: any) and whose unit
// the CPU has. The last rule of each work has a unit every CPU has.
struct Rule {
  Work work;
  const char* vendor;
  Unit unit;
  const char* why;
};
constexpr Rule kRules[] = {
    // Intel: vdpbf16ps peaks below the fp32 FMAs (bench/bf16_units_compare.py measures both
    // on one CPU; docs/kernels.md).
    {Work::bf16, "GenuineIntel", Unit::fma,
     "Intel: vdpbf16ps peaks below the fp32 FMAs, so bf16 is widened to fp32"},
    {Work::bf16, "", Unit::bf16_dot,
     "bf16 dot unit: two products per fp32 lane and instruction (AMD Zen 4/5, Arm BF16)"},
    {Work::bf16, "", Unit::fma, "no bf16 dot unit: widened to fp32"},
    {Work::int8, "", Unit::vpdpbusd,
     "AVX512-VNNI: one vpdpbusd per 64 bytes on the 512-bit targets (AVX2's: AVX-VNNI where "
     "the CPU has it, else vpmaddubsw)"},
    {Work::int8, "", Unit::avx_vnni, "AVX-VNNI: one vpdpbusd per 32 bytes"},
    {Work::int8, "", Unit::sdot, "Arm dot product extension: sdot per 16 bytes"},
    {Work::int8, "", Unit::vpmaddubsw, "no AVX-VNNI: vpmaddubsw + vpmaddwd"},
    {Work::int8, "", Unit::int16, "no dot product extension: bytes widened to int16 pairs"},
};

#if defined(QKV_HAVE_BF16_UNITS)
constexpr bool kBf16Kernels = true;
#else
constexpr bool kBf16Kernels = false;
#endif

constexpr int kWorks = 2;
// The forced unit of each work, +1 (0: none forced).
std::atomic<int> forced[kWorks] = {0, 0};

const char* const kWorkNames[] = {"bf16", "int8"};
const char* const kUnitNames[] = {"fma",   "bf16_dot", "avx_vnni", "vpmaddubsw",
                                  "sdot",  "int16",    "amx",      "vpdpbusd"};

std::string choices_for(Work work) {
  std::string s;
  for (int u = 0; u < static_cast<int>(std::size(kUnitNames)); ++u)
    if (multiplies(static_cast<Unit>(u), work))
      s += std::string(s.empty() ? "" : ", ") + kUnitNames[u];
  return s;
}

// QKV_UNITS, applied once, before the first choice is read.
void ensure_environment() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("QKV_UNITS");
    if (env && *env) force_units(env, "QKV_UNITS");
  });
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = read_cpu_features();
  return features;
}

const char* name_of(Work work) { return kWorkNames[static_cast<int>(work)]; }
const char* name_of(Unit unit) { return kUnitNames[static_cast<int>(unit)]; }

UnitChoice choose_unit(Work work, const CpuFeatures& f, bool bf16_kernels) {
  for (const Rule& r : kRules)
    if (r.work == work && multiplies(r.unit, work) && (!*r.vendor || f.vendor == r.vendor) &&
        !lacks(r.unit, work, f, bf16_kernels))
      return {r.unit, r.why};
  return {Unit::fma, "no rule"};  // (not reached: each work's last rule fits every CPU)
}

std::vector<std::pair<Work, Unit>> parse_units(const std::string& spec, const CpuFeatures& f,
                                               bool bf16_kernels, const char* where) {
  std::vector<std::pair<Work, Unit>> out;
  size_t at = 0;
  while (at < spec.size()) {
    size_t end = spec.find(',', at);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(at, end - at);
    at = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    check(eq != std::string::npos, where, ": '", item, "' is not work=unit (e.g. bf16=fma)");
    const std::string work_name = item.substr(0, eq), unit_name = item.substr(eq + 1);
    int w = 0;
    while (w < kWorks && work_name != kWorkNames[w]) ++w;
    check(w < kWorks, where, ": unknown work '", work_name, "' (bf16 or int8)");
    const Work work = static_cast<Work>(w);
    int u = 0;
    while (u < static_cast<int>(std::size(kUnitNames)) && unit_name != kUnitNames[u]) ++u;
    check(u < static_cast<int>(std::size(kUnitNames)) && multiplies(static_cast<Unit>(u), work),
          where, ": '", unit_name, "' is not a unit for ", work_name, " (", choices_for(work), ")");
    const Unit unit = static_cast<Unit>(u);
    if (const char* why = lacks(unit, work, f, bf16_kernels))
      fail(where, ": cannot force ", work_name, "=", unit_name, ": ", why);
    out.emplace_back(work, unit);
  }
  return out;
}

namespace {
// The forced unit of `work`, if any (QKV_UNITS applied first).
std::optional<Unit> forced_unit(Work work) {
  ensure_environment();
  const int f = forced[static_cast<int>(work)].load(std::memory_order_relaxed);
  return f > 0 ? std::optional<Unit>(static_cast<Unit>(f - 1)) : std::nullopt;
}
}  // namespace

UnitChoice unit_for(Work work) {
  if (const auto f = forced_unit(work)) return {*f, "forced (QKV_UNITS or set_units)"};
  return choose_unit(work, cpu_features(), kBf16Kernels);
}

bool avx_vnni_in_use() {
  const Unit unit = unit_of(Work::int8);
  return unit == Unit::avx_vnni ||
         ((unit == Unit::vpdpbusd || unit == Unit::amx) && cpu_features().avx_vnni);
}

bool vnni_in_use(bool wide) {
  const Unit unit = unit_of(Work::int8);
  if (wide)
    return cpu_features().avx512_vnni && (unit == Unit::vpdpbusd || unit == Unit::amx);
  return avx_vnni_in_use();
}

Unit unit_of(Work work) {
  static const Unit table[kWorks] = {choose_unit(Work::bf16, cpu_features(), kBf16Kernels).unit,
                                     choose_unit(Work::int8, cpu_features(), kBf16Kernels).unit};
  return forced_unit(work).value_or(table[static_cast<int>(work)]);
}

void force_units(const std::string& spec, const char* where) {
  const auto units = parse_units(spec, cpu_features(), kBf16Kernels, where);
  for (std::atomic<int>& f : forced) f = 0;
  for (const auto& [work, unit] : units)
    forced[static_cast<int>(work)] = static_cast<int>(unit) + 1;
}

void force_unit(Work work, std::optional<Unit> unit) {
  ensure_environment();
  if (unit)  // checked as QKV_UNITS would check it
    parse_units(std::string(name_of(work)) + "=" + name_of(*unit), cpu_features(), kBf16Kernels,
                "force_unit");
  forced[static_cast<int>(work)] = unit ? static_cast<int>(*unit) + 1 : 0;
}

}  // namespace qkv::simd
