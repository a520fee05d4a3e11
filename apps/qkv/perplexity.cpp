// `qkv perplexity`: a model's perplexity on a text file, windowed as llama.cpp's
// llama-perplexity (include/qkv/perplexity.h), so that the two compare on the same file.
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "qkv/error.h"
#include "qkv/model_file.h"
#include "qkv/perplexity.h"
#include "qkv/targets.h"
#include "qkv/threads.h"

namespace qkv::cli {
namespace {

struct PerplexityCliOptions {
  std::string model, text, matmul = "exact", cache = "f32", cache_k, cache_v, rotation = "auto",
                                               scores = "int8";
  int64_t ctx = 512;
  int threads = 0;
  bool json = false, decode = false;
};

void run_perplexity(const PerplexityCliOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  std::ifstream in(o.text, std::ios::binary);
  check(in.good(), "--text: cannot read \"", o.text, "\"");
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  ModelFile f = load_model_file(o.model, "", /*need_tokenizer=*/true);
  set_matmul(*f.model, o.matmul);
  const Tokenizer& tok = *f.tokenizer;
  const std::vector<int32_t> tokens = tok.encode(text);
  const PerplexityResult r =
      perplexity(*f.model, tokens, o.ctx, tok.adds_bos() ? tok.bos() : -1,
                 KVCacheOptions{.type = cache_type(o.cache),
                                .key_type = cache_type_or_none(o.cache_k),
                                .value_type = cache_type_or_none(o.cache_v),
                                .rotation = cache_rotation(o.rotation),
                                .scores = cache_scores(o.scores)},
                 o.decode);
  const char* rotation = rotation_state(o.cache, o.cache_k, o.cache_v, o.rotation);
  nlohmann::json j = {{"model", o.model},           {"text", o.text},
                      {"tokens", tokens.size()},    {"ctx", r.ctx},
                      {"chunks", r.chunks},         {"scored", r.scored},
                      {"perplexity", r.perplexity}, {"nll", r.nll},
                      {"nll_stderr", r.nll_stderr}, {"matmul", o.matmul},
                      {"cache", o.cache},           {"cache_rotation", rotation},
                      {"cache_k", o.cache_k.empty() ? o.cache : o.cache_k},
                      {"cache_v", o.cache_v.empty() ? o.cache : o.cache_v},
                      {"cache_scores", o.scores},   {"decode", o.decode},
                      {"threads", num_threads()},   {"target", current_target()},
                      {"seconds", r.seconds},       {"chunk_perplexity", r.chunk_perplexity}};
  if (o.json) {
    std::cout << j.dump() << "\n";
    return;
  }
  std::cout << o.text << ": " << tokens.size() << " tokens, " << r.chunks << " chunks of " << r.ctx
            << ", " << r.scored << " scored (" << o.matmul << " matmul, "
            << cache_label(o.cache, o.cache_k, o.cache_v) << " cache, rotation " << rotation << ", " << o.scores << " scores"
            << (o.decode ? ", decoded a token at a time" : "") << ")\n";
  for (size_t k = 0; k < r.chunk_perplexity.size(); ++k)
    std::cout << "[" << k + 1 << "]" << r.chunk_perplexity[k]
              << (k + 1 < r.chunk_perplexity.size() ? "," : "\n");
  std::cout << "perplexity " << r.perplexity << " (mean NLL " << r.nll << " ± " << r.nll_stderr
            << " nats per token), " << r.seconds << " s\n";
}

}  // namespace

void add_perplexity(CLI::App& app) {
  auto o = std::make_shared<PerplexityCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "perplexity",
      "Perplexity of a model on a text file, windowed as llama.cpp's llama-perplexity");
  cmd->add_option("--model", o->model, "GGUF file, llama2.c or qkv checkpoint")->required();
  cmd->add_option("--text", o->text, "The text (UTF-8)")->required();
  cmd->add_option("--ctx", o->ctx, "Tokens per chunk; the second half of each is scored")
      ->capture_default_str();
  add_matmul_option(*cmd, o->matmul);
  add_cache_option(*cmd, o->cache, "KV cache storage");
  add_cache_kv_options(*cmd, o->cache_k, o->cache_v);
  add_cache_rotation_option(*cmd, o->rotation);
  add_cache_scores_option(*cmd, o->scores);
  cmd->add_flag("--decode", o->decode,
                "Score one token at a time through the cache (the decoding kernels) after a "
                "prefill of each chunk's first half, instead of each chunk at once");
  add_threads_option(*cmd, o->threads);
  cmd->add_flag("--json", o->json, "One JSON line");
  cmd->callback([o] { run_perplexity(*o); });
}

}  // namespace qkv::cli
