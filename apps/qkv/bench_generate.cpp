// `qkv bench generate`: prefill and decode speed of a model file, against yardsticks measured
// in the same run — the fp32 FMA peak (prefill is compute-bound) and a plain read loop over
// the bytes one decoded token must read: every weight matrix once, plus the cached keys and
// values (decode is memory-bound).
#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli.h"
#include "qkv/model_file.h"
#include "qkv/targets.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "qkv/threads.h"
#include "yardsticks.h"

namespace qkv::cli {
namespace {

struct BenchGenerateOptions {
  std::string model, cache = "f32", rotation = "auto", matmul = "exact";
  int64_t prompt = 512, decode = 24, repeats = 3;
  std::vector<int64_t> lengths = {128, 1000};
  std::vector<int> threads;  // each count in turn; none: num_threads()
  bool json = false;
};

// Multiply-adds of one token's matrix products (the weights it reads once: all but the
// embedding table's lookup, which is the classifier when the embedding is tied).
double matrix_flops_per_token(const ModelConfig& c) {
  const double C = c.d_model, W = (c.n_heads + 2 * c.n_kv_heads) * c.d_head;
  const double A = c.n_heads * c.d_head, F = c.d_ff;
  const double ffn = (c.mlp == MlpKind::swiglu ? 3 : 2) * F * C;
  return 2 * (c.n_layers * (W * C + C * A + ffn) + c.vocab_size * C);
}

// Bytes of weights one decoded token reads: every matrix once, in its storage format (fp32,
// or a GGUF block format read in place), the norms, one embedding row (and the classifier,
// the whole embedding table again when tied).
double weight_bytes_per_token(const Model& m) {
  const ModelConfig& c = m.config();
  double bytes = 0;
  for (const ParamInfo& p : m.params()) {
    const std::vector<quant::Matrix>* q = m.external(p.name);
    double size = 0;
    if (q)
      for (const quant::Matrix& part : *q)
        size += static_cast<double>(part.rows) * quant::row_bytes(part.type, part.cols);
    else size = 4.0 * p.rows * p.cols;
    if (p.name == "embedding.token" && !c.tied_embeddings) size /= c.vocab_size;  // one row
    if (p.name == "embedding.position") size /= c.context;
    bytes += size;
  }
  return bytes;
}

void bench_generate(const BenchGenerateOptions& o) {
  for (int t : o.threads) check(t >= 0 && t <= 1024, "--threads must be 0 to 1024, got ", t);
  check(o.prompt >= 1 && o.decode >= 1 && o.repeats >= 1,
        "--prompt, --decode and --repeats must be >= 1");
  ModelFile f = load_model_file(o.model, "", /*need_tokenizer=*/false);
  Model& m = *f.model;
  set_matmul(m, o.matmul);
  const ModelConfig& c = m.config();
  const CacheType type = cache_type(o.cache);
  check(o.prompt <= c.context, "--prompt ", o.prompt, " is longer than the model's context of ",
        c.context);
  check(o.decode < c.context, "--decode ", o.decode, " does not fit the model's context of ",
        c.context);
  // A cache length the context cannot hold (with the decoded tokens after it) is cut to fit.
  std::vector<int64_t> lengths;
  for (int64_t len : o.lengths) {
    check(len >= 1, "--cache-lengths must be >= 1, got ", len);
    lengths.push_back(std::min(len, c.context - o.decode));
  }
  const int64_t longest =
      std::max(o.prompt, *std::max_element(lengths.begin(), lengths.end()) + o.decode);
  KVCache cache(c, {.max_seq = longest, .type = type, .rotation = cache_rotation(o.rotation)});
  const char* rotation = rotation_state(o.cache, o.rotation);
  std::mt19937 rng(1);
  std::vector<int32_t> tokens(longest);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % c.vocab_size);
  // Bytes stored per cached value: what decode reads per key and value element.
  const double element = static_cast<double>(cache.bytes()) /
                         (2.0 * c.n_layers * c.n_kv_heads * cache.slots() * c.d_head);

  // Each thread count asked for in turn, everything measured again at it.
  const int initial = num_threads();
  const std::vector<int> counts = o.threads.empty() ? std::vector<int>{0} : o.threads;
  for (const int count : counts) {
    const int threads = count > 0 ? count : initial;  // 0: the default, all cores
    set_num_threads(threads);
    // Prefill: the whole prompt in one call; best of `repeats`.
    double prefill = 1e30;
    for (int64_t r = 0; r < o.repeats + 1; ++r) {  // the first call allocates: not counted
      cache.reset();
      const double t0 = detail::now_seconds();
      m.forward_cached(cache, tokens.data(), 1, o.prompt);
      if (r > 0) prefill = std::min(prefill, detail::now_seconds() - t0);
    }
    const double P = o.prompt;
    const double prefill_flops =
        P * (matrix_flops_per_token(c) - 2.0 * c.vocab_size * c.d_model) +
        2.0 * c.vocab_size * c.d_model +                  // logits of the last position
        c.n_layers * 2.0 * c.n_heads * P * P * c.d_head;  // causal attention
    const double peak = detail::measure_fma_peak_gflops(threads);
    nlohmann::json r = {{"benchmark", "generate"},
                        {"model", o.model},
                        {"format", f.format},
                        {"parameters", m.num_params()},
                        {"d_model", c.d_model},
                        {"layers", c.n_layers},
                        {"heads", c.n_heads},
                        {"kv_heads", c.n_kv_heads},
                        {"vocab", c.vocab_size},
                        {"threads", threads},
                        {"target", current_target()},
                        {"cache", o.cache},
                        {"cache_rotation", rotation},
                        {"matmul", o.matmul},
                        {"prompt_tokens", o.prompt},
                        {"prefill_ms", prefill * 1e3},
                        {"prefill_tokens_per_s", P / prefill},
                        {"prefill_gflops", prefill_flops / prefill * 1e-9},
                        {"peak_gflops", peak},
                        {"prefill_fraction_of_peak", prefill_flops / prefill * 1e-9 / peak}};
    // A prompt's int8 products forced onto AMX-INT8 tiles: their TDPBUSD peak too (0 where the
    // tiles cannot run: the stand-in).
    const std::vector<UnitInUse> weights = weight_units();
    const bool amx_prompts = o.matmul == "int8" && o.prompt >= 16 &&
                             std::any_of(weights.begin(), weights.end(),
                                         [](const UnitInUse& u) { return u.unit == "amx"; });
    const double amx_peak =
        amx_prompts ? detail::measure_amx_peak_gflops(detail::AmxProduct::int8, threads) : 0;
    if (amx_prompts) r["prefill_int8_unit"] = "amx";
    if (amx_peak > 0) {
      r["amx_int8_peak_gops"] = amx_peak;
      r["prefill_fraction_of_amx_int8_peak"] = prefill_flops / prefill * 1e-9 / amx_peak;
    }
    if (!o.json)
      std::cout << "model " << o.model << ": " << short_count(m.num_params()) << " parameters, "
                << threads << " thread(s), " << o.cache << " cache (rotation " << rotation << "), "
                << o.matmul << " matmul\n"
                << "prefill " << o.prompt << " tokens: " << prefill * 1e3 << " ms, "
                << static_cast<int64_t>(P / prefill) << " tokens/s, "
                << prefill_flops / prefill * 1e-9
                << " GFLOP/s = " << 100 * prefill_flops / prefill * 1e-9 / peak << "% of the "
                << peak << " GFLOP/s FMA peak\n";
    if (!o.json && amx_prompts) {
      std::cout << "  int8 products on AMX-INT8 tiles";
      if (amx_peak > 0)
        std::cout << ": " << 100 * prefill_flops / prefill * 1e-9 / amx_peak << "% of the "
                  << amx_peak << " GOP/s TDPBUSD peak\n";
      else std::cout << ", on the stand-in\n";
    }

    // Decode at each cache length: fill the cache to that length, then time `decode` tokens.
    nlohmann::json decode = nlohmann::json::array();
    for (int64_t len : lengths) {
      cache.reset();
      m.forward_cached(cache, tokens.data(), 1, len);
      const detail::SyncCount before = detail::sync_count();
      const double t0 = detail::now_seconds();
      for (int64_t i = 0; i < o.decode; ++i) m.forward_cached(cache, &tokens[len + i], 1, 1);
      const double seconds = (detail::now_seconds() - t0) / o.decode;
      const detail::SyncCount after = detail::sync_count();
      const double regions = static_cast<double>(after.regions - before.regions) / o.decode;
      const double barriers = static_cast<double>(after.barriers - before.barriers) / o.decode;
      const double mean_len = len + (o.decode + 1) / 2.0;
      const double cache_bytes = 2.0 * c.n_layers * c.n_kv_heads * c.d_head * mean_len * element;
      const double bytes = weight_bytes_per_token(m) + cache_bytes;
      const double read = detail::measure_read_gbps(static_cast<size_t>(bytes), threads);
      const double gbps = bytes / seconds * 1e-9;
      decode.push_back({{"cache_length", len},
                        {"ms_per_token", seconds * 1e3},
                        {"tokens_per_s", 1 / seconds},
                        {"bytes_per_token", bytes},
                        {"gbps", gbps},
                        {"read_gbps", read},
                        {"fraction_of_read", gbps / read},
                        {"regions_per_token", regions},
                        {"barriers_per_token", barriers}});
      if (!o.json)
        std::cout << "decode at cache length " << len << ": " << seconds * 1e3 << " ms/token, "
                  << static_cast<int64_t>(1 / seconds) << " tokens/s, " << gbps << " GB/s of "
                  << bytes_str(bytes) << " per token = " << 100 * gbps / read
                  << "% of a read loop (" << read << " GB/s); " << regions
                  << " parallel regions and " << barriers << " barriers per token\n";
    }
    r["decode"] = decode;
    r["peak_rss_mb"] = detail::peak_rss_mb();
    std::cout << r.dump() << "\n";
  }
}

}  // namespace

void add_bench_generate(CLI::App& bench) {
  auto o = std::make_shared<BenchGenerateOptions>();
  CLI::App* cmd = bench.add_subcommand("generate", "Prefill and decode speed of a model file");
  cmd->add_option("--model", o->model, "GGUF file, llama2.c or qkv checkpoint")->required();
  cmd->add_option("--prompt", o->prompt, "Prefill length")->capture_default_str();
  cmd->add_option("--cache-lengths", o->lengths, "Cache lengths to decode at")
      ->capture_default_str()
      ->delimiter(',');
  cmd->add_option("--decode", o->decode, "Tokens timed at each cache length")
      ->capture_default_str();
  cmd->add_option("--repeats", o->repeats, "Prefill runs (the best is kept)")
      ->capture_default_str();
  add_cache_option(*cmd, o->cache, "KV cache storage");
  add_cache_rotation_option(*cmd, o->rotation);
  add_matmul_option(*cmd, o->matmul);
  cmd->add_option("--threads", o->threads,
                  "Thread counts, each measured in turn (1,2,4,...); default (0) all cores")
      ->delimiter(',');
  cmd->add_flag("--json", o->json, "Only the JSON line");
  cmd->callback([o] { bench_generate(*o); });
}

}  // namespace qkv::cli
