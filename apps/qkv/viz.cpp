// `qkv viz`: attention patterns of a model on a prompt, as one self-contained HTML page or as
// a heatmap in the terminal. The weights are the reference kernel's exact softmax weights
// (the fast kernel never stores them), from one forward over the prompt.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "heatmap.h"
#include "model_file.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "viz_html.h"

namespace qkv::cli {
namespace {

constexpr int64_t kMaxTokens = 256;  // beyond this a page of every head grows past ~10 MB

struct VizOptions {
  std::string model, tokenizer, prompt, prompt_ids, out = "attention.html";
  bool example = false, terminal = false, causal_example = false;
  int64_t layer = -1, head = 0;
};

// A token as a label: whitespace made visible, control bytes as \xNN.
std::string label(const std::string& piece) {
  std::string out;
  for (unsigned char c : piece) {
    if (c == ' ') out += "␣";
    else if (c == '\n') out += "↵";
    else if (c == '\t') out += "⇥";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out.empty() ? "∅" : out;
}

}  // namespace

AttentionMaps maps_of_model(ModelFile& f, const std::string& name, const std::string& prompt,
                            const std::string& prompt_ids) {
  Model& model = *f.model;
  const std::vector<int32_t> ids = prompt_tokens(f, prompt, prompt_ids);
  std::vector<std::string> labels;
  for (int32_t id : ids) {
    check(id >= 0 && id < model.config().vocab_size, "token id ", id, " is not in the vocabulary");
    if (!prompt_ids.empty()) labels.push_back(std::to_string(id));
    // The piece as the vocabulary holds it (BOS as <s>), not as it prints.
    else labels.push_back(id == f.tokenizer->bos() ? "<s>" : label(f.tokenizer->piece(id)));
  }
  const int64_t T = static_cast<int64_t>(ids.size());
  check(T <= kMaxTokens, "the prompt is ", T, " tokens; attention maps show at most ", kMaxTokens);
  check(T <= model.config().context || model.config().positions != PositionKind::learned,
        "the prompt is ", T, " tokens, longer than the model's context of ", model.config().context);
  model.forward(ids.data(), nullptr, 1, T);
  AttentionMaps m;
  m.title = "Attention of " + name;
  const ModelConfig& c = model.config();
  m.description = f.format + " model, " + std::to_string(c.n_layers) + " layers × " +
                  std::to_string(c.n_heads) + " heads, " + short_count(model.num_params()) +
                  " parameters; prompt of " + std::to_string(T) + " tokens";
  if (!prompt.empty()) m.description += ": “" + prompt + "”";
  m.tokens = labels;
  m.causal = c.causal;
  for (int64_t l = 0; l < c.n_layers; ++l) m.weights.push_back(model.attention_weights(l));
  return m;
}

namespace {

AttentionMaps maps_of_model(const VizOptions& o) {
  ModelFile f = load_model_file(o.model, o.tokenizer, o.prompt_ids.empty(), GgufWeights::fp32);
  return maps_of_model(f, std::filesystem::path(o.model).filename().string(), o.prompt, o.prompt_ids);
}

// The articles' three tokens, weights from the reference kernel on their q, k, v.
AttentionMaps maps_of_example(bool causal) {
  const std::string steps = worked_example_json(causal);
  const nlohmann::json e = nlohmann::json::parse(steps);
  const auto q = e["q"].get<std::vector<std::vector<double>>>();
  const auto k = e["k"].get<std::vector<std::vector<double>>>();
  const auto v = e["v"].get<std::vector<std::vector<double>>>();
  const int64_t T = q.size(), D = q[0].size(), Dv = v[0].size();
  Tensor tq({1, 1, T, D}), tk({1, 1, T, D}), tv({1, 1, T, Dv}), out({1, 1, T, Dv}), w({1, 1, T, T});
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t d = 0; d < D; ++d) tq.view()(0, 0, i, d) = q[i][d], tk.view()(0, 0, i, d) = k[i][d];
    for (int64_t d = 0; d < Dv; ++d) tv.view()(0, 0, i, d) = v[i][d];
  }
  AttentionArgs a{.q = tq, .k = tk, .v = tv, .out = out};
  a.mask.causal = causal;
  reference::attention(a, w);
  AttentionMaps m;
  m.title = "The worked example: fluffy blue creature";
  m.description = std::string("One head, d_k = 2, the articles' numbers") +
                  (causal ? ", with the causal mask" : ", no mask");
  m.tokens = e["tokens"].get<std::vector<std::string>>();
  m.causal = causal;
  m.weights.push_back(std::move(w));
  m.example_json = steps;
  return m;
}

void run_viz(const VizOptions& o) {
  check(o.example != !o.model.empty(), "give --model FILE with --prompt, or --example");
  check(o.example || !o.prompt.empty() || !o.prompt_ids.empty(), "give a --prompt (or --prompt-ids)");
  const AttentionMaps m = o.example ? maps_of_example(o.causal_example) : maps_of_model(o);
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
  CLI::App* cmd = app.add_subcommand("viz", "Attention patterns as an HTML page (or in the terminal)");
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
