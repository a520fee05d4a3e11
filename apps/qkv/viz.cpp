// `qkv viz`: attention patterns of a model on a prompt, as one self-contained HTML page or as
// a heatmap in the terminal. The weights are the reference kernel's exact softmax weights
// (the fast kernel never stores them), from one forward over the prompt.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli.h"
#include "heatmap.h"
#include "qkv/model_file.h"
#include "qkv/viz.h"
#include "qkv/error.h"

namespace qkv::cli {
namespace {

struct VizOptions {
  std::string model, tokenizer, prompt, prompt_ids, out = "attention.html";
  bool example = false, terminal = false, causal_example = false;
  int64_t layer = -1, head = 0;
};

AttentionMaps maps_of_file(const VizOptions& o) {
  ModelFile f = load_model_file(o.model, o.tokenizer, o.prompt_ids.empty());
  return maps_of_model(f, std::filesystem::path(o.model).filename().string(), o.prompt,
                       o.prompt_ids);
}

void run_viz(const VizOptions& o) {
  check(o.example != !o.model.empty(), "give --model FILE with --prompt, or --example");
  check(o.example || !o.prompt.empty() || !o.prompt_ids.empty(),
        "give a --prompt (or --prompt-ids)");
  const AttentionMaps m = o.example ? maps_of_example(o.causal_example) : maps_of_file(o);
  if (o.terminal) {
    const int64_t L = m.weights.size(), H = m.weights[0].size(1), T = m.tokens.size();
    const int64_t layer = o.layer < 0 ? L - 1 : o.layer;
    check(layer < L && o.head >= 0 && o.head < H, "--layer ", o.layer, " --head ", o.head,
          " out of range: the model has ", L, " layers of ", H, " heads");
    std::vector<std::string> labels;
    for (const auto& t : m.tokens) labels.push_back(t.size() > 12 ? t.substr(0, 12) : t);
    std::cout << m.title << ": layer " << layer << ", head " << o.head
              << " (rows: queries, columns: keys; darker = more weight, blank = masked)\n\n";
    print_heatmap(std::cout, View(m.weights[layer].data() + o.head * T * T, {T, T}), labels);
    return;
  }
  const std::string page = attention_html(m);
  std::ofstream out(o.out, std::ios::binary);
  check(out.good(), "cannot write \"", o.out, "\"");
  out << page;
  out.close();
  check(out.good(), "writing \"", o.out, "\" failed");
  std::cout << "wrote " << o.out << " (" << bytes_str(page.size()) << "): " << m.weights.size()
            << " layer(s) × " << m.weights[0].size(1) << " head(s), " << m.tokens.size()
            << " tokens. Open it in a browser.\n";
}

}  // namespace

void add_viz(CLI::App& app) {
  auto o = std::make_shared<VizOptions>();
  CLI::App* cmd =
      app.add_subcommand("viz", "Attention patterns as an HTML page (or in the terminal)");
  cmd->add_option("--model", o->model, "llama2.c (.bin) or qkv (.safetensors) model");
  cmd->add_option("--tokenizer", o->tokenizer, "llama2.c tokenizer; default: beside the model");
  cmd->add_option("--prompt", o->prompt, "The text whose attention to show");
  cmd->add_option("--prompt-ids", o->prompt_ids, "The prompt as token ids (synthetic-task models)");
  cmd->add_flag("--example", o->example, "The articles' worked example instead of a model");
  cmd->add_flag("--causal", o->causal_example, "With --example: apply the causal mask");
  cmd->add_option("-o,--output", o->out, "The HTML file to write")->capture_default_str();
  CLI::Option* terminal =
      cmd->add_flag("--terminal", o->terminal, "Print one head as a Unicode heatmap instead");
  cmd->add_option("--layer", o->layer, "With --terminal: the layer (default: the last)")
      ->needs(terminal);
  cmd->add_option("--head", o->head, "With --terminal: the head")
      ->capture_default_str()
      ->needs(terminal);
  cmd->callback([o] { run_viz(*o); });
}

}  // namespace qkv::cli
