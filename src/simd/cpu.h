// The CPU-feature registry: what this CPU has, read once from CPUID and XCR0 (x86-64) or the
// kernel's hwcaps (AArch64), and which product unit multiplies each kind of data. The choice
// is a static table by vendor and family (kRules in cpu.cpp: never a timing, so the same
// machine makes the same choice on every run), can be forced (QKV_UNITS, qkv::set_units), and
// is what `qkv info` prints. Every kernel that has more than one unit for its data asks here.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace qkv::simd {

struct CpuFeatures {
  std::string vendor;         // CPUID's vendor ("GenuineIntel", "AuthenticAMD"), or "arm"
  int family = 0, model = 0;  // CPUID's, extended fields added in (x86-64)
  bool avx512 = false;        // AVX-512 F, BW, DQ, VL, and the OS saves the zmm registers
  bool avx512_bf16 = false;   // vdpbf16ps (beside avx512)
  bool avx512_vnni = false;   // 512-bit vpdpbusd (beside avx512)
  bool avx_vnni = false;      // the VEX vpdpbusd on 256-bit vectors
  bool amx_bf16 = false, amx_int8 = false;  // AMX tiles, and the OS saves their state (XCR0)
  bool arm_bf16 = false;                    // bfdot (HWCAP2_BF16)
  bool arm_dotprod = false;                 // sdot / udot (HWCAP_ASIMDDP)
};

// This CPU's features, read once.
const CpuFeatures& cpu_features();

// The data whose products have a choice of unit.
enum class Work { bf16, int8 };
// The product units. fma: widen to fp32, fused multiply-add; bf16_dot: pairs of bf16 into fp32
// (vdpbf16ps, bfdot); avx_vnni: u8 × s8 quads into int32 on 256-bit vectors (VEX vpdpbusd);
// vpmaddubsw: the same through vpmaddubsw + vpmaddwd; sdot: s8 quads on Arm; int16: bytes
// widened to int16 pairs (Highway's ReorderWidenMulAccumulate); amx: Intel's AMX tiles
// (src/simd/amx.h): for bf16 TDPBF16PS, for int8 (x86-64) TDPBUSD on prompts' weight products
// with the vector unit the table chooses beneath it for fewer rows; or their stand-in where
// amx::stand_in() says so. No rule chooses amx: it runs only where forced (QKV_UNITS=bf16=amx,
// int8=amx) until its tests have passed on a CPU with AMX.
enum class Unit { fma, bf16_dot, avx_vnni, vpmaddubsw, sdot, int16, amx, vpdpbusd };

const char* name_of(Work work);
const char* name_of(Unit unit);

struct UnitChoice {
  Unit unit;
  std::string why;
};

// The table's choice for `work` on a CPU with `features` (whether this build has the bf16
// kernels: `bf16_kernels`).
UnitChoice choose_unit(Work work, const CpuFeatures& features, bool bf16_kernels);

// The units forced by a QKV_UNITS-style spec, "bf16=fma,int8=vpmaddubsw" ("" forces nothing),
// checked against `features`: a qkv::Error beginning with `where` names an unknown work or unit,
// a unit that does not multiply that work, or one this CPU (or build) lacks.
std::vector<std::pair<Work, Unit>> parse_units(const std::string& spec, const CpuFeatures& features,
                                               bool bf16_kernels, const char* where);

// The unit that runs `work` now on this CPU: forced by set_units / QKV_UNITS, else the table's.
// (For bf16, the SIMD target must allow the units too: see units.h.)
UnitChoice unit_for(Work work);

// unit_for(work).unit, without the reason: cheap enough for a kernel's entry.
Unit unit_of(Work work);
// Whether the AVX2 target's int8 products use AVX-VNNI's vpdpbusd: the int8 unit is avx_vnni,
// or vpdpbusd or amx (whose other shapes run beneath it) on a CPU with AVX-VNNI.
bool avx_vnni_in_use();
// Whether the byte products (the int8 weight products, src/quant/int8-inl.h, and the int8
// cache scores and values, src/attention/decode_int8-inl.h: one rule for both) use vpdpbusd on
// x86's 512-bit targets (wide: the int8 unit is vpdpbusd or amx, on a CPU with AVX512-VNNI) or
// on AVX2 (avx_vnni_in_use); else vpmaddubsw + vpmaddwd.
bool vnni_in_use(bool wide);
// Whether AArch64's byte products (weights and cache scores alike) use the dot product
// extension's sdot: the int8 unit is sdot.
inline bool sdot_in_use() { return unit_of(Work::int8) == Unit::sdot; }

// Forces the units of a spec as parse_units reads it; "" goes back to the table. Not to be
// called while kernels run on other threads.
void force_units(const std::string& spec, const char* where);
// Forces one work's unit (a test's way to run both paths); nullopt: the table's again.
void force_unit(Work work, std::optional<Unit> unit);

}  // namespace qkv::simd
