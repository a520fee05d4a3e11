// The qkv command line: one file per subcommand, each registering itself on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <ostream>
#include <optional>
#include <string>

#include "qkv/generate.h"
#include "qkv/kv_cache.h"
#include "qkv/text.h"

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
void add_perplexity(CLI::App& app);
void add_quantize(CLI::App& app);
void add_random_model(CLI::App& app);

void add_viz(CLI::App& app);
void add_info(CLI::App& app);

// --threads N, 0 to 1024: 0 (the default) means every core.
void add_threads_option(CLI::App& cmd, int& threads);

// --cache: a key/value cache's storage, one of cache_type_names() (checked as it is parsed).
CLI::Option* add_cache_option(CLI::App& cmd, std::string& cache, const std::string& help);
// --cache-rotation auto|on|off: whether the cache rotates its rows (CacheRotation).
void add_cache_rotation_option(CLI::App& cmd, std::string& rotation);
// --cache-scores int8|exact: how decoding queries meet a block cache's keys (CacheScores).
void add_cache_scores_option(CLI::App& cmd, std::string& scores);
// --cache-k, --cache-v: the keys' or the values' storage when it is not --cache's ("": it is).
void add_cache_kv_options(CLI::App& cmd, std::string& cache_k, std::string& cache_v);
// A --cache-k or --cache-v value as an option: none for "".
std::optional<CacheType> cache_type_or_none(const std::string& name);
// The keys' and values' storage as the commands print it: "q8_0", or "q8_0 keys, q4_0 values".
std::string cache_label(const std::string& cache, const std::string& cache_k,
                        const std::string& cache_v);
// "on" or "off": whether a cache of that type and setting rotates (what the commands print).
const char* rotation_state(const std::string& cache, const std::string& rotation);
const char* rotation_state(const std::string& cache, const std::string& cache_k,
                           const std::string& cache_v, const std::string& rotation);

// The sampling and KV-cache flags of generate and chat: --temperature, --top-p, --top-k,
// --seed (0: from the clock), --cache and --cache-rotation.
// --matmul: how products with Q8_0, Q4_0 and Q4_1 weights take their activations
// (quant::Matmul), applied to a loaded model by set_matmul.
void add_matmul_option(CLI::App& cmd, std::string& matmul);
void set_matmul(Model& model, const std::string& matmul);

struct SamplingFlags {
  float temperature = 1.0f, top_p = 0.9f;
  int64_t top_k = 0;
  uint64_t seed = 0;
  std::string cache = "f32", cache_k, cache_v, cache_rotation = "auto", cache_scores = "int8";
};
void add_sampling_flags(CLI::App& cmd, SamplingFlags& flags);
// The flags as options: the seed drawn from the clock when none was given, --cache checked.
struct Sampling {
  SamplingOptions options;
  CacheType cache;
  std::optional<CacheType> cache_k, cache_v;
  CacheRotation cache_rotation;
  CacheScores cache_scores;
};
Sampling sampling_of(const SamplingFlags& flags);

using ::qkv::bytes_str;  // qkv/text.h
using ::qkv::short_count;
using ::qkv::with_commas;

}  // namespace qkv::cli
