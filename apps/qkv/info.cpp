// `qkv info`: the machine as qkv sees it — CPU, cores, caches, the SIMD targets compiled in,
// the one in use, and the two yardsticks measured now (the fp32 FMA peak and the read
// bandwidth). The first thing to paste into a bug report.
#include <algorithm>
#include <omp.h>

#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.h"
#include "qkv/targets.h"
#include "qkv/threads.h"
#include "qkv/version.h"
#include "yardsticks.h"

namespace qkv::cli {
namespace {

using nlohmann::json;

// The first value of `key` in /proc/cpuinfo ("model name" on x86, "CPU part" on Arm).
std::string cpuinfo(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "";
}

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

// Data and unified caches of CPU 0 by level, as sysfs gives them: "L1d" → "48K" and how
// many CPUs share one.
json caches() {
  json out = json::array();
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    const std::string level = read_line(dir + "level"), type = read_line(dir + "type");
    if (level.empty()) break;
    if (type == "Instruction") continue;
    const std::string name = "L" + level + (type == "Data" ? "d" : "");
    out.push_back({{"name", name},
                   {"size", read_line(dir + "size")},
                   {"shared_by", read_line(dir + "shared_cpu_list")}});
  }
  return out;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

struct InfoOptions {
  bool json = false;
  int threads = 0;
};

void info(const InfoOptions& o) {
  const int threads = o.threads > 0 ? o.threads : num_threads();
  std::string model = cpuinfo("model name");
  if (model.empty()) model = "CPU part " + cpuinfo("CPU part");
#if defined(__x86_64__)
  const char* arch = "x86_64";
#elif defined(__aarch64__)
  const char* arch = "aarch64";
#else
  const char* arch = "unknown";
#endif
  const std::string target = current_target();
  const double peak = detail::measure_fma_peak_gflops(threads, 0.3);
  const double bf16_peak = detail::measure_bf16_peak_gflops(threads, 0.3);  // 0: no bf16 unit
  const double amx_bf16 = detail::measure_amx_peak_gflops(detail::AmxProduct::bf16, threads, 0.3);
  const double amx_int8 = detail::measure_amx_peak_gflops(detail::AmxProduct::int8, threads, 0.3);
  const double read = detail::measure_read_gbps(size_t{256} << 20, threads);
  json gemm = json::array();
  for (const GemmLibraryInUse& g : gemm_libraries())
    gemm.push_back({{"products", g.products},
                    {"library", g.library},
                    {"version", g.version},
                    {"kernels", g.kernels},
                    {"why", g.why}});
  std::vector<UnitInUse> all_units = units_in_use();
  for (const UnitInUse& u : weight_units()) all_units.push_back(u);
  json units = json::array();
  for (const UnitInUse& u : all_units)
    units.push_back({{"data", u.data}, {"unit", u.unit}, {"why", u.why}});
  const json result = {
      {"version", version()},
      {"commit", build_commit()},
      {"cpu", model},
      {"cpu_id", cpu_identity()},
      {"arch", arch},
      {"logical_cpus", omp_get_num_procs()},
      {"threads", threads},
      {"caches", caches()},
      {"targets_compiled", compiled_targets()},
      {"targets_supported", supported_targets()},
      {"target", target},
      {"vector_bits", target_vector_bits()},
      {"vector_registers", target_vector_registers()},
      {"fma_peak_gflops", peak},
      {"bf16_peak_gflops", bf16_peak > 0 ? json(bf16_peak) : json(nullptr)},
      {"read_gbps", read},
      {"units", units},
      {"gemm", gemm},
      {"amx", amx_unavailable()
                  ? json(std::string("unavailable: ") + amx_unavailable())
                  : json("available: attention over bf16 keys and values "
                         "(QKV_UNITS=bf16=amx) and prompts' int8 weight products (int8=amx) "
                         "where forced; off by default")},
      {"amx_bf16_peak_gflops", amx_bf16 > 0 ? json(amx_bf16) : json(nullptr)},
      {"amx_int8_peak_gops", amx_int8 > 0 ? json(amx_int8) : json(nullptr)},
  };
  if (o.json) {
    std::cout << result.dump() << "\n";
    return;
  }
  std::cout << "qkv:      " << version() << " (commit " << build_commit() << ")\n"
            << "cpu:      " << model << " (" << arch << "), " << omp_get_num_procs()
            << " logical CPUs\n          " << cpu_identity() << "\ncaches:  ";
  for (const json& c : result["caches"])
    std::cout << " " << c["name"].get<std::string>() << " " << c["size"].get<std::string>()
              << " (CPUs " << c["shared_by"].get<std::string>() << ")";
  std::cout << "\nsimd:     compiled " << joined(compiled_targets()) << "; this CPU runs "
            << joined(supported_targets()) << "\n          in use: " << target << " ("
            << target_vector_bits() << "-bit vectors, " << target_vector_registers()
            << " registers)\nunits:    (QKV_UNITS=bf16=fma,… forces)\n";
  size_t width = 22;  // the data's column: its longest name and a space
  for (const UnitInUse& u : all_units) width = std::max(width, u.data.size() + 1);
  for (const UnitInUse& u : all_units)
    std::cout << "  " << std::left << std::setw(static_cast<int>(width)) << u.data << std::setw(11)
              << u.unit << u.why << "\n";
  std::cout << "gemm:     (QKV_GEMM=openblas or onednn forces the fp32 library)\n";
  for (const GemmLibraryInUse& g : gemm_libraries())
    std::cout << "  " << std::left << std::setw(6) << g.products << g.library << " " << g.version
              << ", " << g.kernels << " kernels: " << g.why << "\n";
  std::cout << "amx:      " << result["amx"].get<std::string>() << "\n";
  std::cout << std::right << std::fixed << std::setprecision(1) << "fp32 FMA peak, " << threads
            << " thread(s), " << target << ": " << peak << " GFLOP/s (measured now)\n";
  if (bf16_peak > 0)
    std::cout << "bf16 dot peak (" << (target == "neon_bf16" ? "bfdot" : "vdpbf16ps") << "), "
              << threads << " thread(s), " << target << ": " << bf16_peak
              << " GFLOP/s (measured now)\n";
  else std::cout << "bf16 dot peak: no bf16 unit in use (" << target << " widens bf16 to fp32)\n";
  if (amx_bf16 > 0)
    std::cout << "AMX peaks, " << threads << " thread(s): TDPBF16PS " << amx_bf16
              << " GFLOP/s, TDPBUSD " << amx_int8 << " GOP/s (measured now)\n";
  std::cout << "read bandwidth, " << threads << " thread(s), 256 MiB: " << read
            << " GB/s (measured now)\n"
            << result.dump() << "\n";
}

}  // namespace

void add_info(CLI::App& app) {
  auto o = std::make_shared<InfoOptions>();
  CLI::App* cmd = app.add_subcommand(
      "info",
      "The CPU, its caches, the SIMD targets compiled in and in use, FMA peak and read "
      "bandwidth measured now");
  add_threads_option(*cmd, o->threads);
  cmd->add_flag("--json", o->json, "Print only the JSON line");
  cmd->callback([o] { info(*o); });
}

}  // namespace qkv::cli
