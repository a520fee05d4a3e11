// `qkv demo`: the story of attention, told with qkv's own numbers: the worked example by
// hand, then a small model that learns to look things up, and the head that does it.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <vector>

#include <filesystem>
#include <fstream>

#include "cli.h"
#include "heatmap.h"
#include "qkv/generate.h"
#include "qkv/io.h"
#include "qkv/kv_cache.h"
#include "qkv/ops.h"
#include "qkv/tokenizer.h"
#include "qkv/train.h"
#include "qkv/explain.h"
#include "qkv/viz.h"

namespace qkv::cli {
namespace {

// Recall tokens as letters: keys A, B, …; values a, b, …; and '?'.
std::string recall_label(int32_t token, int64_t symbols) {
  if (token == 2 * symbols) return "?";
  return std::string(1, token < symbols ? char('A' + token) : char('a' + token - symbols));
}

// Answers the example's questions by generation: the pairs and '?' are prefilled into the KV
// cache once; then each asked key is one decoding step, and the model's most likely next token
// is its answer.
void answer_by_generation(std::ostream& out, Model& model, const Batch& example, int64_t items,
                          int64_t symbols) {
  KVCache cache(model.config(), {.max_seq = example.T});
  const int64_t prompt = 2 * items + 1;  // the pairs, then '?'
  model.forward_cached(cache, example.tokens.data(), 1, prompt);
  out << "\nNow the model answers by generating, one token at a time. The " << prompt
      << " tokens up to '?' are\nrun once (prefill) and their keys and values kept in the KV "
         "cache; "
         "each question is then\none step that reads the cache instead of recomputing it:\n\n  ";
  for (int64_t t = 0; t < prompt; ++t) out << recall_label(example.tokens[t], symbols) << ' ';
  out << "\n";
  int right = 0, asked = 0;
  for (int64_t t = prompt; t + 1 < example.T; t += 2) {
    const View logits = model.forward_cached(cache, &example.tokens[t], 1, 1);
    const int32_t answer = static_cast<int32_t>(
        std::max_element(logits.data, logits.data + model.config().vocab_size) - logits.data);
    const bool ok = answer == example.tokens[t + 1];
    right += ok, ++asked;
    out << "  " << recall_label(example.tokens[t], symbols) << " → "
        << recall_label(answer, symbols)
        << (ok ? "  right"
               : "  wrong (the value was " + recall_label(example.tokens[t + 1], symbols) + ")")
        << "\n";
    model.forward_cached(cache, &example.tokens[t + 1], 1, 1);  // the true answer joins the cache
  }
  out << "  " << right << " of " << asked << " right; the cache now holds " << cache.length(0)
      << " positions (" << bytes_str(cache.bytes()) << " allocated once).\n";
}

// All heads of the recall model on the example (weights [1, H, T, T] per layer), as the page
// `qkv viz` writes.
void write_page(std::ostream& out, std::vector<Tensor> weights, const Batch& example,
                int64_t symbols, int64_t head, const std::string& path) {
  const int64_t layers = static_cast<int64_t>(weights.size());
  AttentionMaps maps;
  maps.title = "The recall model of qkv demo";
  maps.description =
      "Associative recall: 8 key-value pairs (keys A–P, values a–p), '?', then keys "
      "whose values the model must answer. The head that looks them up: layer " +
      std::to_string(layers - 1) + ", head " + std::to_string(head) + ".";
  for (int64_t t = 0; t < example.T; ++t)
    maps.tokens.push_back(recall_label(example.tokens[t], symbols));
  maps.weights = std::move(weights);
  maps.open_layer = layers - 1;  // the page opens on the head that looks up
  maps.open_head = head;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << attention_html(maps);
  out << "\nEvery head of both layers is in " << path
      << ": open it in a browser and click a head.\n";
}

// The pretrained model that ships in the repository's models/: $QKV_MODELS, else models/ in
// the current folder, else the source tree this binary was built from.
std::filesystem::path stories_dir() {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("QKV_MODELS")) candidates.push_back(env);
  candidates.push_back("models");
  candidates.push_back(QKV_SOURCE_MODELS);
  for (const fs::path& c : candidates)
    if (fs::exists(c / "stories260K" / "stories260K.bin")) return c / "stories260K";
  return {};
}

void tell_a_story(std::ostream& out) {
  const std::filesystem::path dir = stories_dir();
  if (dir.empty()) {
    out << "\n(No pretrained model found in $QKV_MODELS, ./models or " << QKV_SOURCE_MODELS
        << ": set QKV_MODELS to the folder holding stories260K/ to see one write a story.)\n";
    return;
  }
  auto model = load_llama2c((dir / "stories260K.bin").string());
  const Tokenizer tok =
      Tokenizer::load_llama2c((dir / "tok512.bin").string(), model->config().vocab_size);
  out << "\nA real pretrained model: stories260K (llama2.c, 260K parameters, trained on "
         "children's\n"
         "stories), greedy, with the KV cache:\n\n  ";
  const GenerateStats s =
      generate(*model, tok.encode("Once upon a time"),
               {.steps = 120, .sampling = {.temperature = 0}, .stop_tokens = {tok.bos()}},
               [&](int32_t prev, int32_t token) {
                 const std::string piece = tok.decode(prev, token);
                 for (char c : piece) out << c << (c == '\n' ? "  " : "");
                 out << std::flush;
                 return true;
               });
  char line[200];
  std::snprintf(line, sizeof line, "\n\n  prefill %.0f tokens/s, decode %.0f tokens/s\n",
                s.prefill_tokens_per_s, s.decode_tokens_per_s);
  out << line;
}

void train_and_show(std::ostream& out, int64_t steps) {
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
  const TrainConfig cfg{.steps = steps, .batch = 64, .warmup = 100, .eval_every = 250, .lr = 1e-3f};
  const bool tty = isatty(STDOUT_FILENO);
  const TrainResult r = train(model, optimizer, data, cfg, 0, [&](const TrainProgress& p) {
    if (!tty && p.accuracy < 0) return true;  // plain lines, at evaluations only
    const int bar = static_cast<int>(30 * p.step / p.steps);
    char line[160];
    std::snprintf(line, sizeof line, "%s  [%-30s] step %4ld  loss %.3f", tty ? "\r" : "",
                  std::string(bar, '#').c_str(), static_cast<long>(p.step), p.loss);
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
  std::vector<Tensor> weights;
  for (int64_t l = 0; l < c.n_layers; ++l) weights.push_back(model.attention_weights(l));
  const Tensor& w = weights.back();
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
  out << "\nLayer " << c.n_layers - 1 << " (the last), head " << best
      << ": each row is a query token, each column a key it may look at (darker = more\n"
         "weight; the future is masked). After '?', each asked key looks at the value that\n"
         "followed the same key earlier - that is where its answer comes from.\n\n";
  print_heatmap(out, View(w.data() + best * T * T, {T, T}), labels);
  write_page(out, std::move(weights), example, symbols, best, "demo/attention.html");
  answer_by_generation(out, model, example, items, symbols);
}

}  // namespace

void add_demo(CLI::App& app) {
  auto skip_training = std::make_shared<bool>(false);
  auto steps = std::make_shared<int64_t>(1500);
  CLI::App* cmd = app.add_subcommand(
      "demo", "A guided tour: attention by hand, then a model that learns to use it");
  cmd->add_flag("--no-training", *skip_training, "Skip the training (and the recall model's page)");
  cmd->add_option("--steps", *steps, "Training steps of the recall model")->capture_default_str();
  cmd->callback([skip_training, steps] {
    auto& out = std::cout;
    out << "qkv demo\n========\n\n"
        << "Attention lets each token gather information from the others. Every token has a\n"
        << "query (what it looks for), a key (what it offers) and a value (what it passes on).\n"
        << "Below, three tokens - fluffy, blue, creature - work through it step by step.\n\n";
    explain::print_worked_example(out, /*causal=*/false);
    out << "\nIn a language model a token may not look ahead. The causal mask sets the scores\n"
        << "of later keys to -inf, so after the softmax they get exactly zero weight:\n\n";
    explain::print_worked_example(out, /*causal=*/true);
    if (!*skip_training) {
      out << "\n";
      train_and_show(out, *steps);
    }
    tell_a_story(out);
    out << "\nWhat to open: demo/attention.html (every head of the recall model; click one).\n"
        << "What next:\n"
        << "  build/release/qkv explain --input my.json   your own q, k, v\n"
        << "  build/release/qkv explain softmax 2 1 0     softmax on its own\n"
        << "  build/release/qkv params --preset gpt3-175b GPT-3's parameters, head by head\n"
        << "  build/release/qkv train --task recall       the training above, with options\n"
        << "  build/release/qkv viz --example -o example.html   the worked example as a page\n"
        << "  build/release/qkv generate --model models/stories260K/stories260K.bin --prompt "
           "\"Lily\"\n"
        << "  build/release/qkv viz --model models/stories260K/stories260K.bin --prompt \"Once "
           "upon a time\"\n"
        << "  build/release/qkv bench attention --seq 2048 --dim 128 --causal\n";
  });
}

}  // namespace qkv::cli
