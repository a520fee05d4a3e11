// The attention maps of a model on a prompt, and of the worked example (see include/qkv/viz.h).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/explain.h"
#include "qkv/text.h"
#include "qkv/viz.h"

namespace qkv {
namespace {

constexpr int64_t kMaxTokens = 256;  // beyond this a page of every head grows past ~10 MB

}  // namespace

std::string token_label(const std::string& piece) {
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

AttentionMaps maps_of_model(ModelFile& f, const std::string& name, const std::string& prompt,
                            const std::string& prompt_ids) {
  Model& model = *f.model;
  const std::vector<int32_t> ids = prompt_tokens(f, prompt, prompt_ids);
  std::vector<std::string> labels;
  for (int32_t id : ids) {
    check(id >= 0 && id < model.config().vocab_size, "token id ", id, " is not in the vocabulary");
    if (!prompt_ids.empty()) labels.push_back(std::to_string(id));
    // The piece as the vocabulary holds it (BOS as <s>), not as it prints.
    else labels.push_back(id == f.tokenizer->bos() ? "<s>" : token_label(f.tokenizer->piece(id)));
  }
  const int64_t T = static_cast<int64_t>(ids.size());
  check(T <= kMaxTokens, "the prompt is ", T, " tokens; attention maps show at most ", kMaxTokens);
  check(T <= model.config().context || model.config().positions != PositionKind::learned,
        "the prompt is ", T, " tokens, longer than the model's context of ",
        model.config().context);
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

AttentionMaps maps_of_example(bool causal) {
  const std::string steps = explain::worked_example_json(causal);
  const nlohmann::json e = nlohmann::json::parse(steps);
  const auto q = e["q"].get<std::vector<std::vector<double>>>();
  const auto k = e["k"].get<std::vector<std::vector<double>>>();
  const auto v = e["v"].get<std::vector<std::vector<double>>>();
  const int64_t T = q.size(), D = q[0].size(), Dv = v[0].size();
  Tensor tq({1, 1, T, D}), tk({1, 1, T, D}), tv({1, 1, T, Dv}), out({1, 1, T, Dv}), w({1, 1, T, T});
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t d = 0; d < D; ++d)
      tq.view()(0, 0, i, d) = q[i][d], tk.view()(0, 0, i, d) = k[i][d];
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

}  // namespace qkv
