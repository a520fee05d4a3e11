// The qkv command line: one file per subcommand, each registering itself on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <ostream>
#include <string>

#include "qkv/generate.h"
#include "qkv/kv_cache.h"

namespace qkv::cli {

// Parses argv, runs the chosen subcommand. Errors print "qkv: error: …" to stderr and
// return 2; --help returns 0.
int run(int argc, const char* const* argv);

void add_explain(CLI::App& app);
void add_params(CLI::App& app);
void add_demo(CLI::App& app);
void add_bench(CLI::App& app);
void add_train(CLI::App& app);
void add_bench_train(CLI::App& bench);
void add_bench_generate(CLI::App& bench);
void add_bench_ring(CLI::App& bench);  // apps/qkv/bench_ring.cpp (with MPI)
void add_generate(CLI::App& app);
void add_chat(CLI::App& app);
void add_quantize(CLI::App& app);
void add_random_model(CLI::App& app);

// The worked example of `qkv explain`, printed as text; `qkv demo` tells it too.
void print_worked_example(std::ostream& out, bool causal);
// The same as `qkv explain --json` prints it: tokens, q, k, v and every step per query.
std::string worked_example_json(bool causal);
// The same for your own q, k, v: `input` is what `qkv explain --input` reads
// ({"q": [[…]], "k": …, "v": …, "tokens": […]}), `source` names it in errors.
std::string explain_json(const std::string& input, bool causal, const std::string& source);
void add_viz(CLI::App& app);
void add_info(CLI::App& app);

// --threads N, 0 to 1024: 0 (the default) means every core.
void add_threads_option(CLI::App& cmd, int& threads);

// The sampling and KV-cache flags of generate and chat: --temperature, --top-p, --top-k,
// --seed (0: from the clock) and --cache f32|bf16.
struct SamplingFlags {
  float temperature = 1.0f, top_p = 0.9f;
  int64_t top_k = 0;
  uint64_t seed = 0;
  std::string cache = "f32";
};
void add_sampling_flags(CLI::App& cmd, SamplingFlags& flags);
// The flags as options: the seed drawn from the clock when none was given, --cache checked.
struct Sampling {
  SamplingOptions options;
  CacheType cache;
};
Sampling sampling_of(const SamplingFlags& flags);

// 1234567 -> "1,234,567"
std::string with_commas(int64_t n);
// 174591057920 -> "174.6B"; 1572864 -> "1.6M"
std::string short_count(double n);
// 4718592 -> "4.5 MiB"
std::string bytes_str(double bytes);

}  // namespace qkv::cli
