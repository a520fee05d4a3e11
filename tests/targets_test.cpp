// SIMD targets: the names, forcing one, and the errors for names that cannot run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/targets.h"
#include "simd/cpu.h"
#include "qkv/tensor.h"

namespace qkv {
namespace {

// What each target is, from the instruction sets' definitions (not from the library).
struct Width {
  int bits, registers;
};
const std::map<std::string, Width> kWidths = {
    {"sse4", {128, 16}},      {"avx2", {256, 16}},        {"avx512", {512, 32}},
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
  // The best supported target, but for the bf16 units where the registry widens bf16.
  std::string best = supported_targets().front();
  if ((best == "avx512_bf16" || best == "neon_bf16") &&
      simd::unit_of(simd::Work::bf16) != simd::Unit::bf16_dot)
    best = supported_targets().at(1);
  EXPECT_EQ(current_target(), best);
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

// ---- Product units: the CPU-feature registry's table ---------------------------------------

simd::CpuFeatures intel_emerald_rapids() {
  simd::CpuFeatures f;
  f.vendor = "GenuineIntel", f.family = 6, f.model = 207;
  f.avx512 = f.avx512_bf16 = f.avx512_vnni = f.avx_vnni = f.amx_bf16 = f.amx_int8 = true;
  return f;
}
simd::CpuFeatures amd_zen(int family, bool avx512) {
  simd::CpuFeatures f;
  f.vendor = "AuthenticAMD", f.family = family, f.model = 17;
  f.avx512 = f.avx512_bf16 = f.avx512_vnni = avx512;
  return f;
}
simd::CpuFeatures arm(bool bf16, bool dotprod) {
  simd::CpuFeatures f;
  f.vendor = "arm", f.arm_bf16 = bf16, f.arm_dotprod = dotprod;
  return f;
}

TEST(Units, TheTableChoosesByVendorAndFeatures) {
  using simd::Unit, simd::Work, simd::choose_unit;
  // bf16: widened on Intel (its vdpbf16ps is slower than its FMAs), the dot unit on AMD and
  // Arm where the CPU and the build have it.
  EXPECT_EQ(choose_unit(Work::bf16, intel_emerald_rapids(), true).unit, Unit::fma);
  EXPECT_EQ(choose_unit(Work::bf16, amd_zen(25, true), true).unit, Unit::bf16_dot);
  EXPECT_EQ(choose_unit(Work::bf16, amd_zen(25, true), false).unit, Unit::fma);  // no kernels
  EXPECT_EQ(choose_unit(Work::bf16, amd_zen(25, false), true).unit, Unit::fma);  // Zen 3
  EXPECT_EQ(choose_unit(Work::bf16, arm(true, true), true).unit, Unit::bf16_dot);
  EXPECT_EQ(choose_unit(Work::bf16, arm(false, true), true).unit, Unit::fma);
  EXPECT_NE(choose_unit(Work::bf16, intel_emerald_rapids(), true).why.find("Intel"),
            std::string::npos);
  // int8: this architecture's dot instruction where the CPU has it: AVX512-VNNI's on Zen 4
  // and Emerald Rapids (whose AVX2 target then takes AVX-VNNI where it has it), AVX-VNNI's on a
  // CPU with that alone, vpmaddubsw on Zen 3.
#if defined(__x86_64__)
  EXPECT_EQ(choose_unit(Work::int8, intel_emerald_rapids(), true).unit, Unit::vpdpbusd);
  EXPECT_EQ(choose_unit(Work::int8, amd_zen(25, true), true).unit, Unit::vpdpbusd);
  simd::CpuFeatures alder_lake = intel_emerald_rapids();
  alder_lake.avx512 = alder_lake.avx512_bf16 = alder_lake.avx512_vnni = false;
  alder_lake.amx_bf16 = alder_lake.amx_int8 = false;
  EXPECT_EQ(choose_unit(Work::int8, alder_lake, true).unit, Unit::avx_vnni);
  EXPECT_EQ(choose_unit(Work::int8, amd_zen(25, false), true).unit, Unit::vpmaddubsw);
#elif defined(__aarch64__)
  EXPECT_EQ(choose_unit(Work::int8, arm(false, true), true).unit, Unit::sdot);
  EXPECT_EQ(choose_unit(Work::int8, arm(false, false), true).unit, Unit::int16);
#endif
}

// What a forcing names is checked against the CPU: an error that names the work and the unit,
// never an illegal instruction later.
TEST(Units, ForcingIsCheckedAgainstTheCpu) {
  const auto error_of = [](const std::string& spec, const simd::CpuFeatures& f) -> std::string {
    try {
      simd::parse_units(spec, f, true, "QKV_UNITS");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string no_bf16 = error_of("bf16=bf16_dot", amd_zen(25, false));
  EXPECT_NE(no_bf16.find("QKV_UNITS: cannot force bf16=bf16_dot"), std::string::npos) << no_bf16;
  EXPECT_NE(no_bf16.find("AVX512-BF16"), std::string::npos) << no_bf16;
  const std::string wrong = error_of("bf16=sdot", arm(true, true));
  EXPECT_NE(wrong.find("'sdot' is not a unit for bf16 (fma, bf16_dot, amx)"), std::string::npos)
      << wrong;
  const std::string no_amx = error_of("bf16=amx", amd_zen(25, true));
  EXPECT_NE(no_amx.find("cannot force bf16=amx: the CPU has no AMX-BF16"), std::string::npos)
      << no_amx;
#if defined(__x86_64__)
  const std::string no_amx_int8 = error_of("int8=amx", amd_zen(25, true));
  EXPECT_NE(no_amx_int8.find("cannot force int8=amx: the CPU has no AMX-INT8"), std::string::npos)
      << no_amx_int8;
  simd::CpuFeatures bf16_tiles_only = intel_emerald_rapids();
  bf16_tiles_only.amx_int8 = false;
  EXPECT_NE(error_of("int8=amx", bf16_tiles_only).find("no AMX-INT8"), std::string::npos);
#endif
  EXPECT_NE(error_of("fp8=fma", amd_zen(25, true)).find("unknown work 'fp8'"), std::string::npos);
  EXPECT_NE(error_of("bf16", amd_zen(25, true)).find("not work=unit"), std::string::npos);
  EXPECT_EQ(error_of("bf16=bf16_dot", amd_zen(26, true)), "");
  EXPECT_EQ(error_of("", amd_zen(26, true)), "");
  const auto forced = simd::parse_units("bf16=fma", intel_emerald_rapids(), true, "x");
  ASSERT_EQ(forced.size(), 1u);
  EXPECT_EQ(forced[0].second, simd::Unit::fma);
}

// A forced unit is the one that runs, and the list `qkv info` prints says so.
TEST(Units, AForcedUnitRunsAndIsReported) {
  TargetGuard guard;
  struct UnitsGuard {
    ~UnitsGuard() { set_units(""); }
  } units_guard;
  set_target("best");
  const auto bf16_row = [] {
    for (const UnitInUse& u : units_in_use())
      if (u.data == "bf16") return u;
    return UnitInUse{};
  };
  set_units("bf16=fma");
  EXPECT_EQ(bf16_row().unit, "fma");
  EXPECT_NE(current_target(), "avx512_bf16");
  EXPECT_NE(current_target(), "neon_bf16");
  const auto supported = supported_targets();
  if (contains(supported, "avx512_bf16") || contains(supported, "neon_bf16")) {
    set_units("bf16=bf16_dot");
    EXPECT_EQ(bf16_row().unit, "bf16_dot");
    EXPECT_EQ(current_target(), supported.front());
    set_target(supported.at(1));  // a lower target forced by name widens bf16
    EXPECT_EQ(bf16_row().unit, "fma");
  } else {
    EXPECT_THROW(set_units("bf16=bf16_dot"), Error);
  }
}

// cache_values_unit names what a block cache's P·V runs on, and its mistakes are errors.
TEST(Units, CacheValuesUnitNamesAUnitAndRefusesWhatIsNotABlockCache) {
  for (const char* cache : {"q8_0", "q4_0", "q4_1"}) {
    const std::string unit = cache_values_unit(cache, 128, 4);
    std::string scores;
    for (const UnitInUse& u : units_in_use())
      if (u.data == std::string(cache) + " cache") scores = u.unit;
    // P·V on bytes is the scores' byte product, or the FMAs.
    EXPECT_TRUE(unit == "fma" || unit == scores) << cache << ": " << unit << " beside " << scores;
    EXPECT_EQ(cache_values_unit(cache, 512, 4), "fma");   // (beyond the stack's 256 columns)
    EXPECT_EQ(cache_values_unit(cache, 128, 16), "fma");  // (16 rows: the tiled kernels)
  }
  const auto message = [](const std::string& cache, int64_t dim, int64_t rows) {
    try {
      cache_values_unit(cache, dim, rows);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("bf16", 128, 4).find("not a cache of 32-value blocks"), std::string::npos);
  EXPECT_NE(message("q5_0", 128, 4), "no error");
  EXPECT_NE(message("q8_0", 0, 4).find("must be positive"), std::string::npos);
  EXPECT_NE(message("q8_0", 128, 0).find("must be positive"), std::string::npos);
}

}  // namespace
}  // namespace qkv
