// `qkv demo`: the story of attention, told with qkv's own numbers: the worked example by
// hand, then a small model that learns to look things up, and the head that does it.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>

#include "cli.h"
#include "heatmap.h"
#include "qkv/ops.h"
#include "qkv/train.h"

namespace qkv::cli {
namespace {

// Recall tokens as letters: keys A, B, …; values a, b, …; and '?'.
std::string recall_label(int32_t token, int64_t symbols) {
  if (token == 2 * symbols) return "?";
  return std::string(1, token < symbols ? char('A' + token) : char('a' + token - symbols));
}

void train_and_show(std::ostream& out) {
  const int64_t items = 8, symbols = 16;
  TaskData data(Task::recall, items, symbols);
  ModelConfig c;
  c.vocab_size = data.vocab_size();
  c.context = data.seq_len();
  c.d_model = 64;
  c.n_layers = 2;
  c.n_heads = c.n_kv_heads = 4;
  c.d_head = 16;
  c.d_ff = 256;
  c.init_std = 0.125f;
  Model model(c, 1);
  AdamW optimizer(model);
  out << "A 2-layer transformer (" << model.num_params()
      << " parameters) now learns associative recall: it sees 8 key-value pairs such as\n"
         "\"A c  K p  ...\", then '?' and some of the keys, and must answer each key's value.\n"
         "Nothing but attention can find where a key appeared.\n\n";
  const TrainConfig cfg{.steps = 1500, .batch = 64, .warmup = 100, .eval_every = 250, .lr = 1e-3f};
  const bool tty = isatty(STDOUT_FILENO);
  const TrainResult r = train(model, optimizer, data, cfg, 0, [&](const TrainProgress& p) {
    if (!tty && p.accuracy < 0) return true;  // plain lines, at evaluations only
    const int bar = static_cast<int>(30 * p.step / p.steps);
    char line[160];
    std::snprintf(line, sizeof line, "%s  [%-30s] step %4ld  loss %.3f", tty ? "\r" : "",
                  std::string(bar, '#').c_str(),
                  static_cast<long>(p.step), p.loss);
    out << line;
    if (p.accuracy >= 0) {
      std::snprintf(line, sizeof line, "  accuracy %5.1f%%", 100 * p.accuracy);
      out << line;
    }
    out << (tty ? "" : "\n") << std::flush;
    return true;
  });
  out << "\n\nAfter " << r.steps << " steps (" << static_cast<int>(r.seconds)
      << " s): " << 100 * r.final_accuracy << "% of held-out sequences answered right.\n";

  // One example, and the head of the last layer that looks the keys up.
  std::mt19937_64 rng(7);
  const Batch example = data.sample(1, rng);
  model.forward(example.tokens.data(), nullptr, 1, example.T);
  const Tensor w = model.attention_weights(c.n_layers - 1);
  const int64_t T = example.T;
  // The induction head: the one that puts most weight, from each asked key, on the value
  // that followed that key among the pairs.
  int64_t best = 0;
  double best_score = -1;
  for (int64_t h = 0; h < c.n_heads; ++h) {
    double score = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (example.targets[t] == kIgnoreIndex) continue;
      for (int64_t i = 0; i < items; ++i)
        if (example.tokens[2 * i] == example.tokens[t]) score += w.view()(0, h, t, 2 * i + 1);
    }
    if (score > best_score) best_score = score, best = h;
  }
  std::vector<std::string> labels;
  for (int64_t t = 0; t < T; ++t) labels.push_back(recall_label(example.tokens[t], symbols));
  out << "\nLayer " << c.n_layers << ", head " << best
      << ": each row is a query token, each column a key it may look at (darker = more\n"
         "weight; the future is masked). After '?', each asked key looks at the value that\n"
         "followed the same key earlier - that is where its answer comes from.\n\n";
  print_heatmap(out, View(w.data() + best * T * T, {T, T}), labels);
}

}  // namespace

void add_demo(CLI::App& app) {
  auto skip_training = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("demo", "A guided tour: attention by hand, then a model that learns to use it");
  cmd->add_flag("--no-training", *skip_training, "Only the worked example");
  cmd->callback([skip_training] {
    auto& out = std::cout;
    out << "qkv demo\n========\n\n"
        << "Attention lets each token gather information from the others. Every token has a\n"
        << "query (what it looks for), a key (what it offers) and a value (what it passes on).\n"
        << "Below, three tokens - fluffy, blue, creature - work through it step by step.\n\n";
    print_worked_example(out, /*causal=*/false);
    out << "\nIn a language model a token may not look ahead. The causal mask sets the scores\n"
        << "of later keys to -inf, so after the softmax they get exactly zero weight:\n\n";
    print_worked_example(out, /*causal=*/true);
    if (!*skip_training) {
      out << "\n";
      train_and_show(out);
    }
    out << "\nWhat next:\n"
        << "  build/release/qkv explain --input my.json   your own q, k, v\n"
        << "  build/release/qkv explain softmax 2 1 0     softmax on its own\n"
        << "  build/release/qkv params --preset gpt3-175b GPT-3's parameters, head by head\n"
        << "  build/release/qkv train --task recall       the training above, with options\n"
        << "  build/release/qkv bench attention --seq 2048 --dim 128 --causal\n";
  });
}

}  // namespace qkv::cli
