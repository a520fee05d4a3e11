// `qkv generate`: text from a model, streamed to stdout as it is produced; statistics to
// stderr, so stdout is exactly the text (llama2.c's run.c conventions: the prompt included,
// -n counting positions, one newline at the end).
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "cli.h"
#include "qkv/model_file.h"
#include "qkv/error.h"
#include "qkv/generate.h"
#include "qkv/threads.h"

namespace qkv::cli {
namespace {

struct GenerateCliOptions {
  std::string model, tokenizer, prompt, prompt_ids, matmul = "exact";
  int64_t steps = 256;
  SamplingFlags sampling;
  int threads = 0;
};

void run_generate(const GenerateCliOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  const Sampling sampling = sampling_of(o.sampling);
  ModelFile f = load_model_file(o.model, o.tokenizer, o.prompt_ids.empty());
  Model& model = *f.model;
  set_matmul(model, o.matmul);
  const std::vector<int32_t> prompt = prompt_tokens(f, o.prompt, o.prompt_ids);
  GenerateOptions g{.steps = o.steps,
                    .sampling = sampling.options,
                    .cache = sampling.cache,
                    .cache_k = sampling.cache_k,
                    .cache_v = sampling.cache_v,
                    .cache_rotation = sampling.cache_rotation,
                    .cache_scores = sampling.cache_scores};
  g.stop_tokens = stop_tokens(f);

  // run.c's -n: positions in all, the prompt included. A prompt that fills them is echoed and
  // nothing is generated; say so rather than stop quietly.
  const int64_t context = model.config().context;
  const bool by_context = o.steps <= 0 || o.steps > context;
  const int64_t positions = by_context ? context : o.steps;
  const auto prompt_len = static_cast<int64_t>(prompt.size());
  if (prompt_len > positions) {
    const int64_t dropped = std::max<int64_t>(0, prompt_len - positions - 1);
    std::string why = "the prompt is " + std::to_string(prompt_len) + " tokens and " +
                      (by_context ? "the model's context" : "-n") + " allows " +
                      std::to_string(positions) + " positions: nothing is generated";
    if (dropped > 0) why += ", and the prompt's last " + std::to_string(dropped) + " are dropped";
    if (!by_context) why += " (give -n more than " + std::to_string(prompt_len) + ")";
    std::fprintf(stderr, "qkv: warning: %s\n", why.c_str());
  }
  const bool as_text = o.prompt_ids.empty();
  if (!as_text) std::cout << prompt[0];
  else if (prompt[0] != f.tokenizer->bos())
    std::cout << f.tokenizer->decode(-1, prompt[0]);  // the first token is text
  const GenerateStats s = generate(model, prompt, g, [&](int32_t prev, int32_t token) {
    if (as_text) std::cout << f.tokenizer->decode(prev, token);
    else std::cout << ' ' << token;
    std::cout.flush();
    return true;
  });
  std::cout << "\n";
  // A rate only for work that was done (a prompt that filled every position ran no prefill).
  auto line = [](const char* phase, int64_t tokens, double seconds) {
    if (tokens > 0 && seconds > 0)
      std::fprintf(stderr, "%s: %ld tokens, %.1f ms, %.1f tokens/s\n", phase,
                   static_cast<long>(tokens), 1e3 * seconds, tokens / seconds);
    else std::fprintf(stderr, "%s: none\n", phase);
  };
  line("prefill", s.prefill_seconds > 0 ? s.prompt_tokens : 0, s.prefill_seconds);
  line("decode", s.generated_tokens, s.decode_seconds);
  std::fprintf(
      stderr, "(model: %s, %s parameters, %d threads, %s cache (rotation %s), seed %llu)\n",
      f.format.c_str(), short_count(model.num_params()).c_str(), num_threads(),
      cache_label(o.sampling.cache, o.sampling.cache_k, o.sampling.cache_v).c_str(),
      rotation_state(o.sampling.cache, o.sampling.cache_k, o.sampling.cache_v,
                     o.sampling.cache_rotation),
      static_cast<unsigned long long>(g.sampling.seed));
}

}  // namespace

void add_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generate text with a KV cache (llama2.c, qkv or GGUF models)");
  cmd->add_option("--model", o->model,
                  "llama2.c checkpoint (.bin), qkv checkpoint (.safetensors) or GGUF file (.gguf)")
      ->required();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "llama2.c tokenizer; default: tokenizer.bin or tok<vocab>.bin beside the model");
  cmd->add_option("--prompt", o->prompt, "Text to continue");
  cmd->add_option("--prompt-ids", o->prompt_ids,
                  "The prompt as token ids (models of synthetic tasks)");
  cmd->add_option("-n,--steps", o->steps,
                  "Positions in all, prompt included (0 = the model's context)")
      ->capture_default_str();
  add_sampling_flags(*cmd, o->sampling);
  add_matmul_option(*cmd, o->matmul);
  add_threads_option(*cmd, o->threads);
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace qkv::cli
