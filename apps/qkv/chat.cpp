// `qkv chat`: a conversation with an instruction-tuned GGUF model (ChatML: SmolLM2, Qwen, …).
// Each line of stdin is a user turn; the answer streams to stdout, one blank line after it.
// Lines "/reset" (forget the conversation) and "/exit" are commands. Statistics go to stderr.
#include <cstdio>
#include <iostream>
#include <unistd.h>

#include "cli.h"
#include "qkv/model_file.h"
#include "qkv/chat.h"
#include "qkv/error.h"
#include "qkv/threads.h"

namespace qkv::cli {
namespace {

struct ChatCliOptions {
  std::string model, system, matmul = "exact";
  bool no_system = false, quiet = false;
  int64_t max_reply = 1024, context = 4096;
  SamplingFlags sampling{.temperature = 0.7f};
  int threads = 0;
};

void run_chat(const ChatCliOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  const Sampling sampling = sampling_of(o.sampling);
  ModelFile f = load_model_file(o.model, "", true);
  check(f.format == "gguf", "--model: chat needs a GGUF file with a chat template; \"", o.model,
        "\" is a ", f.format, " model");
  set_matmul(*f.model, o.matmul);
  const ChatFormat format = chat_format(f.chat_template);
  ChatOptions c{.system = o.no_system        ? ""
                          : o.system.empty() ? default_system_prompt(f.chat_template)
                                             : o.system,
                .sampling = sampling.options,
                .max_reply = o.max_reply,
                .context = o.context,
                .cache = sampling.cache,
                .cache_k = sampling.cache_k,
                .cache_v = sampling.cache_v,
                .cache_rotation = sampling.cache_rotation,
                .cache_scores = sampling.cache_scores};
  Chat chat(*f.model, *f.tokenizer, format, c);
  const bool interactive = isatty(STDIN_FILENO) && !o.quiet;
  if (interactive)
    std::fprintf(stderr, "qkv chat: %s, context %ld. /reset starts over, /exit or Ctrl-D ends.\n",
                 o.model.c_str(), static_cast<long>(chat.context()));
  for (std::string line;;) {
    if (interactive) std::fprintf(stderr, "> "), std::fflush(stderr);
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      chat.reset();
      continue;
    }
    if (line.empty()) continue;
    const ChatTurnStats s = chat.reply(line, [](const std::string& text) {
      std::cout << text << std::flush;
      return true;
    });
    std::cout << "\n\n" << std::flush;
    if (!o.quiet)
      std::fprintf(stderr,
                   "[%ld prompt tokens in %.0f ms; %ld tokens, %.1f tokens/s%s; %ld of %ld "
                   "positions used]\n",
                   static_cast<long>(s.prompt_tokens), 1e3 * s.prefill_seconds,
                   static_cast<long>(s.reply_tokens),
                   s.reply_tokens / std::max(s.decode_seconds, 1e-9),
                   s.finished ? "" : ", cut at --max-reply", static_cast<long>(chat.positions()),
                   static_cast<long>(chat.context()));
  }
}

}  // namespace

void add_chat(CLI::App& app) {
  auto o = std::make_shared<ChatCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "chat", "Talk with an instruction-tuned GGUF model (ChatML), one line per turn");
  cmd->add_option(
         "--model", o->model,
         "GGUF file with a ChatML chat template (SmolLM2-135M-Instruct: scripts/get-models)")
      ->required();
  cmd->add_option("--system", o->system,
                  "System prompt (default: the one the chat template writes, if any)");
  cmd->add_flag("--no-system", o->no_system, "No system prompt at all");
  cmd->add_option("-n,--max-reply", o->max_reply, "Tokens per answer, at most")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--context", o->context,
                  "Positions kept for the whole conversation (0 = the model's)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  add_sampling_flags(*cmd, o->sampling);
  add_matmul_option(*cmd, o->matmul);
  cmd->add_flag("-q,--quiet", o->quiet, "No statistics on stderr");
  add_threads_option(*cmd, o->threads);
  cmd->callback([o] { run_chat(*o); });
}

}  // namespace qkv::cli
