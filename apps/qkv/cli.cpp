#include "cli.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <tuple>

#include "qkv/error.h"
#include "qkv/targets.h"
#include "qkv/version.h"

namespace qkv::cli {

void add_threads_option(CLI::App& cmd, int& threads) {
  cmd.add_option("--threads", threads, "Threads; default (0) all cores")
      ->check(CLI::Range(0, 1024));
}

void add_matmul_option(CLI::App& cmd, std::string& matmul) {
  cmd.add_option("--matmul", matmul,
                 "Products with block-format weights (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K): exact (fp32 "
                 "activations) or int8 "
                 "(activations rounded to int8 blocks, integer dot products: llama.cpp's "
                 "arithmetic, which moves perplexity by a fraction of a percent)")
      ->check(CLI::IsMember({"exact", "int8"}))
      ->capture_default_str();
}

void set_matmul(Model& model, const std::string& matmul) {
  model.set_matmul(quant::matmul_from_name(matmul));
}

void add_sampling_flags(CLI::App& cmd, SamplingFlags& f) {
  cmd.add_option("--temperature", f.temperature, "0 = greedy")->capture_default_str();
  cmd.add_option("--top-p", f.top_p, "Nucleus sampling (0 or 1 = off)")->capture_default_str();
  cmd.add_option("--top-k", f.top_k, "Keep the k most likely tokens (0 = off)")
      ->capture_default_str();
  cmd.add_option("--seed", f.seed, "Random seed (default: from the clock)");
  add_cache_option(cmd, f.cache, "KV cache storage");
  add_cache_kv_options(cmd, f.cache_k, f.cache_v);
  add_cache_rotation_option(cmd, f.cache_rotation);
  add_cache_scores_option(cmd, f.cache_scores);
}

void add_cache_rotation_option(CLI::App& cmd, std::string& rotation) {
  cmd.add_option("--cache-rotation", rotation,
                 "Store the cache's keys and values rotated (a normalised Walsh-Hadamard "
                 "transform over the head dim; attention rotates the queries alike and the "
                 "outputs back): auto (the block formats q8_0, q4_0, q4_1), on or off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
}

void add_cache_scores_option(CLI::App& cmd, std::string& scores) {
  cmd.add_option("--cache-scores", scores,
                 "How decoding queries meet q8_0, q4_0 and q4_1 keys and values: int8 (each "
                 "query rounded to int8 blocks, integer dot products; on x86-64 P rounded to 8 "
                 "bits for P·V too) or exact (every key and value widened to fp32)")
      ->check(CLI::IsMember({"int8", "exact"}))
      ->capture_default_str();
}

const char* rotation_state(const std::string& cache, const std::string& rotation) {
  return rotation_state(cache, "", "", rotation);
}

const char* rotation_state(const std::string& cache, const std::string& cache_k,
                           const std::string& cache_v, const std::string& rotation) {
  const CacheType type = cache_type(cache);
  return cache_rotates(cache_type_or_none(cache_k).value_or(type),
                       cache_type_or_none(cache_v).value_or(type), cache_rotation(rotation))
             ? "on"
             : "off";
}

void add_cache_kv_options(CLI::App& cmd, std::string& cache_k, std::string& cache_v) {
  for (auto [flag, name, target] : {std::tuple{"--cache-k", "keys", &cache_k},
                                    std::tuple{"--cache-v", "values", &cache_v}})
    cmd.add_option(flag, *target,
                   std::string("The cache's ") + name + " in a storage of their own (default: " +
                       "--cache's): " + cache_type_choices() +
                       ". 8-bit keys with 4-bit values cost little, 4-bit keys much more "
                       "(docs/tuning.md)")
        ->check(CLI::IsMember(cache_type_names()));
}

std::optional<CacheType> cache_type_or_none(const std::string& name) {
  if (name.empty()) return std::nullopt;
  return cache_type(name);
}

std::string cache_label(const std::string& cache, const std::string& cache_k,
                        const std::string& cache_v) {
  const std::string k = cache_k.empty() ? cache : cache_k, v = cache_v.empty() ? cache : cache_v;
  return k == v ? k : k + " keys, " + v + " values";
}

CLI::Option* add_cache_option(CLI::App& cmd, std::string& cache, const std::string& help) {
  return cmd
      .add_option("--cache", cache,
                  help + ": " + cache_type_choices() +
                      " (bf16 and f16 round each value; q8_0 costs about nothing in "
                      "perplexity, q4_0 and q4_1 a few percent: docs/tuning.md)")
      ->check(CLI::IsMember(cache_type_names()))
      ->capture_default_str();
}

Sampling sampling_of(const SamplingFlags& f) {
  const uint64_t seed =
      f.seed ? f.seed
             : static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  return {{.temperature = f.temperature, .top_k = f.top_k, .top_p = f.top_p, .seed = seed},
          cache_type(f.cache),
          cache_type_or_none(f.cache_k),
          cache_type_or_none(f.cache_v),
          cache_rotation(f.cache_rotation),
          cache_scores(f.cache_scores)};
}

int run(int argc, const char* const* argv) {
  CLI::App app{"qkv: transformer attention, explained and fast.", "qkv"};
  app.set_version_flag("--version",
                       std::string("qkv ") + version() + " (commit " + build_commit() + ")",
                       "Print the version and the commit it was built from, then exit");
  app.require_subcommand(1);
  app.failure_message([](const CLI::App*, const CLI::Error& e) { return std::string(e.what()); });
  // --target applies to every command, before or after its name (fallthrough: subcommands
  // hand options they do not know to the app).
  app.fallthrough();
  app.add_option_function<std::string>(
      "--target", [](const std::string& t) { set_target_from(t, "--target"); },
      "SIMD target to run: sse4, avx2, avx512, avx512_dl, avx512_bf16 (x86-64), neon, neon_bf16, "
      "sve (AArch64); default "
      "the best this CPU supports, or $QKV_TARGET (see qkv info)");
  add_explain(app);
  add_params(app);
  add_demo(app);
  add_bench(app);
  add_train(app);
  add_generate(app);
  add_chat(app);
  add_perplexity(app);
  add_quantize(app);
  add_random_model(app);
  add_viz(app);
  add_info(app);
  try {
    check_target_environment();  // QKV_TARGET, before --target
    // CLI11 would report an unknown command as "a subcommand is required"; say what it is.
    if (argc > 1 && argv[1][0] != '-') {
      bool known = false;
      std::string names;
      for (const CLI::App* sub : app.get_subcommands({})) {
        known = known || sub->get_name() == argv[1];
        names += (names.empty() ? "" : ", ") + sub->get_name();
      }
      check(known, "unknown command \"", argv[1], "\"; commands: ", names);
    }
    app.parse(argc, argv);
    return 0;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << "\n";
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << "qkv: error: " << e.what() << "\n(run `qkv --help` for usage)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "qkv: error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace qkv::cli
