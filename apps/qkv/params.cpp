// `qkv params`: how many parameters a transformer has, head by head, and what attention costs.
#include "qkv/params.h"

#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "cli.h"
#include "qkv/error.h"
#include "qkv/number_format.h"

namespace qkv::cli {
namespace {

using nlohmann::json;

struct Overrides {
  std::optional<int64_t> vocab, context, d_model, layers, heads, kv_heads, d_head, d_ff, seq;
  std::optional<std::string> norm, mlp, positions;
  std::optional<bool> bias, tied;
};

template <typename Enum>
Enum parse_kind(const std::string& flag, const std::string& value,
                const std::map<std::string, Enum>& kinds) {
  auto it = kinds.find(value);
  if (it != kinds.end()) return it->second;
  std::string known;
  for (const auto& [name, kind] : kinds) known += (known.empty() ? "" : ", ") + name;
  fail(flag, ": unknown value \"", value, "\"; choose one of ", known);
}

// A preset with the flags applied. Fields that follow from others (d_head = d_model / heads,
// d_ff = 4 d_model, kv_heads = heads) are recomputed when their sources change.
ModelConfig configure(ModelConfig c, const Overrides& o) {
  if (o.vocab) c.vocab_size = *o.vocab;
  if (o.context) c.context = *o.context;
  if (o.layers) c.n_layers = *o.layers;
  if (o.d_model) c.d_model = *o.d_model;
  if (o.heads) c.n_heads = c.n_kv_heads = *o.heads;
  if (o.kv_heads) c.n_kv_heads = *o.kv_heads;
  if (o.norm)
    c.norm = parse_kind<NormKind>(
        "--norm", *o.norm, {{"layernorm", NormKind::layer_norm}, {"rmsnorm", NormKind::rms_norm}});
  if (o.mlp)
    c.mlp = parse_kind<MlpKind>("--mlp", *o.mlp,
                                {{"gelu", MlpKind::gelu}, {"swiglu", MlpKind::swiglu}});
  if (o.positions)
    c.positions = parse_kind<PositionKind>("--positions", *o.positions,
                                           {{"learned", PositionKind::learned},
                                            {"sinusoidal", PositionKind::sinusoidal},
                                            {"rotary", PositionKind::rotary},
                                            {"alibi", PositionKind::alibi},
                                            {"none", PositionKind::none}});
  if (o.bias) c.bias = *o.bias;
  if (o.tied) c.tied_embeddings = *o.tied;
  if (o.d_head) {
    c.d_head = *o.d_head;
  } else if (o.d_model || o.heads) {
    check(c.n_heads > 0 && c.d_model % c.n_heads == 0, "--d-model ", c.d_model,
          " is not divisible by --heads ", c.n_heads, "; give --d-head explicitly");
    c.d_head = c.d_model / c.n_heads;
  }
  if (o.d_ff) {
    c.d_ff = *o.d_ff;
  } else if (o.d_model || o.mlp) {
    // GELU MLPs use 4 d_model; SwiGLU keeps the same weight count with 2/3 of it, rounded
    // up to a multiple of 256 as Llama does.
    c.d_ff = c.mlp == MlpKind::gelu ? 4 * c.d_model : (8 * c.d_model / 3 + 255) / 256 * 256;
  }
  validate(c);
  return c;
}

json config_json(const ModelConfig& c) {
  return {{"vocab_size", c.vocab_size},
          {"context", c.context},
          {"d_model", c.d_model},
          {"n_layers", c.n_layers},
          {"n_heads", c.n_heads},
          {"n_kv_heads", c.n_kv_heads},
          {"d_head", c.d_head},
          {"d_ff", c.d_ff},
          {"norm", to_string(c.norm)},
          {"mlp", to_string(c.mlp)},
          {"positions", to_string(c.positions)},
          {"bias", c.bias},
          {"tied_embeddings", c.tied_embeddings}};
}

json report_json(const std::string& name, const ModelConfig& c, const ParamCounts& p,
                 const CostCounts& k) {
  return {{"preset", name},
          {"config", config_json(c)},
          {"per_head",
           {{"w_q", p.w_q},
            {"w_k", p.w_k},
            {"value_down", p.value_down},
            {"value_up", p.value_up},
            {"total", p.w_q + p.w_k + p.value_down + p.value_up}}},
          {"per_layer",
           {{"attention_weights", p.attention_weights},
            {"attention_biases", p.attention_biases},
            {"mlp", p.mlp},
            {"norms", p.norms},
            {"total", p.layer}}},
          {"token_embedding", p.token_embedding},
          {"position_embedding", p.position_embedding},
          {"lm_head", p.lm_head},
          {"final_norm", p.final_norm},
          {"total", p.total},
          {"non_embedding", p.non_embedding},
          {"costs",
           {{"context", k.context},
            {"score_grid_entries", k.score_grid_entries},
            {"score_grid_entries_all_heads_layers", k.score_grid_entries_all},
            {"kv_cache_bytes_per_token_fp32", k.kv_cache_bytes_per_token_fp32},
            {"kv_cache_bytes_per_token_bf16", k.kv_cache_bytes_per_token_bf16},
            {"kv_cache_bytes_fp32", k.kv_cache_bytes_fp32},
            {"kv_cache_bytes_bf16", k.kv_cache_bytes_bf16},
            {"weight_bytes_fp32", k.weight_bytes_fp32},
            {"forward_flops_matmul", k.forward_flops_matmul},
            {"forward_flops_attention", k.forward_flops_attention},
            {"forward_flops_per_token", k.forward_flops_per_token}}}};
}

void print_report(const std::string& name, const std::string& description, const ModelConfig& c,
                  const ParamCounts& p, const CostCounts& k) {
  auto& out = std::cout;
  auto row = [&](const std::string& label, int64_t n, const std::string& extra = "") {
    out << "    " << std::left << std::setw(42) << label << std::right << std::setw(20)
        << with_commas(n) << "  " << extra << "\n";
  };
  out << name << (description.empty() ? "" : " - " + description) << "\n"
      << "  " << c.n_layers << " layers, d_model " << with_commas(c.d_model) << ", " << c.n_heads
      << " heads x d_head " << c.d_head;
  if (c.n_kv_heads != c.n_heads) out << " (" << c.n_kv_heads << " key/value heads: GQA)";
  out << ", d_ff " << with_commas(c.d_ff) << ", vocab " << with_commas(c.vocab_size) << ", context "
      << with_commas(c.context) << "\n  " << to_string(c.norm) << ", " << to_string(c.mlp)
      << " MLP, " << to_string(c.positions) << " positions, " << (c.bias ? "biases" : "no biases")
      << ", " << (c.tied_embeddings ? "tied" : "untied") << " embeddings\n";

  const std::string dh = std::to_string(c.d_head), dm = with_commas(c.d_model);
  out << "\nParameters of one attention head (the articles' view)\n";
  row("W_Q   query map (" + dh + " x " + dm + ")", p.w_q);
  row("W_K   key map (" + dh + " x " + dm + ")", p.w_k,
      c.n_kv_heads != c.n_heads
          ? "shared by " + std::to_string(c.n_heads / c.n_kv_heads) + " query heads"
          : "");
  row("value-down (" + dh + " x " + dm + ")", p.value_down,
      c.n_kv_heads != c.n_heads ? "shared too" : "");
  row("value-up (" + dm + " x " + dh + ", a slice of W_O)", p.value_up);
  row("one head", p.w_q + p.w_k + p.value_down + p.value_up,
      "(" + short_count(p.w_q + p.w_k + p.value_down + p.value_up) + ")");

  out << "\nParameters of one layer\n";
  row("multi-head attention (" + std::to_string(c.n_heads) + " heads)", p.attention_weights,
      "(" + short_count(p.attention_weights) + ")");
  if (p.attention_biases) row("attention biases", p.attention_biases);
  row(to_string(c.mlp) + " MLP", p.mlp, "(" + short_count(p.mlp) + ")");
  row("two " + to_string(c.norm) + "s", p.norms);
  row("one layer", p.layer, "(" + short_count(p.layer) + ")");

  out << "\nParameters of the model\n";
  row(std::to_string(c.n_layers) + " layers", c.n_layers * p.layer,
      "(" + short_count(c.n_layers * p.layer) + ")");
  row("token embedding (" + with_commas(c.vocab_size) + " x " + dm + ")", p.token_embedding,
      "(" + short_count(p.token_embedding) + ")");
  if (p.position_embedding) row("learned positions", p.position_embedding);
  row("final norm", p.final_norm);
  if (p.lm_head) row("language-model head", p.lm_head, "(" + short_count(p.lm_head) + ")");
  else out << "    language-model head: tied to the token embedding (no extra weights)\n";
  row("total", p.total, "(" + short_count(p.total) + ")");

  out << "\nCost at context " << with_commas(k.context) << "\n";
  row("score grid per head per layer", k.score_grid_entries,
      with_commas(k.context) + "^2 entries: quadratic in the context");
  row("  ... all heads and layers", k.score_grid_entries_all);
  // The cache's other storages (qkv generate --cache), from its fp32 bytes; the block formats
  // where the head dim is whole 32-value blocks.
  const auto cache_line = [&](const char* label, int64_t fp32_bytes) {
    out << "    " << std::left << std::setw(42) << label << std::right << std::setw(20)
        << bytes_str(fp32_bytes) << "  fp32 (" << bytes_str(fp32_bytes / 2) << " bf16/f16";
    if (c.d_head % kKvBlockValues == 0)
      for (auto [t, name] :
           {std::pair{TensorType::q8_0, "q8_0"}, std::pair{TensorType::q4_0, "q4_0"}})
        out << ", " << bytes_str(bytes_of(t, fp32_bytes / 4)) << " " << name;
    out << ")\n";
  };
  cache_line("KV cache per token", k.kv_cache_bytes_per_token_fp32);
  cache_line("KV cache for the context", k.kv_cache_bytes_fp32);
  out << "    " << std::left << std::setw(42) << "weights" << std::right << std::setw(20)
      << bytes_str(k.weight_bytes_fp32) << "  fp32\n";
  row("forward FLOPs per token", k.forward_flops_per_token,
      "(" + short_count(k.forward_flops_per_token) + "; matmuls " +
          short_count(k.forward_flops_matmul) + ", attention " +
          short_count(k.forward_flops_attention) + ")");
}

void list_presets() {
  for (const Preset& p : presets())
    std::cout << "  " << std::left << std::setw(14) << p.name << std::right << std::setw(9)
              << short_count(count_params(p.config).total) << "  " << p.description << "\n";
}

}  // namespace

void add_params(CLI::App& app) {
  auto o = std::make_shared<Overrides>();
  auto preset = std::make_shared<std::string>("gpt3-175b");
  auto flags = std::make_shared<std::pair<bool, bool>>(false, false);  // --json, --list
  CLI::App* cmd = app.add_subcommand(
      "params", "Parameter counts (head by head), KV-cache memory and FLOPs of a transformer");
  cmd->add_option("--preset", *preset, "A known model (see --list); flags below override it")
      ->capture_default_str();
  cmd->add_flag("--list", flags->second, "List the presets");
  cmd->add_option("--vocab", o->vocab, "Vocabulary size");
  cmd->add_option("--context", o->context, "Context length (longest sequence)");
  cmd->add_option("--d-model", o->d_model, "Embedding width");
  cmd->add_option("--layers", o->layers, "Number of blocks");
  cmd->add_option("--heads", o->heads, "Query heads");
  cmd->add_option("--kv-heads", o->kv_heads, "Key/value heads (GQA/MQA); default = heads");
  cmd->add_option("--d-head", o->d_head, "Head width; default d_model / heads");
  cmd->add_option("--d-ff", o->d_ff, "MLP hidden width; default 4 d_model (GELU)");
  cmd->add_option("--norm", o->norm, "layernorm or rmsnorm");
  cmd->add_option("--mlp", o->mlp, "gelu or swiglu");
  cmd->add_option("--positions", o->positions, "learned, sinusoidal, rotary, alibi or none");
  cmd->add_option("--bias", o->bias, "Biases in linear layers (true/false)");
  cmd->add_option("--tied", o->tied, "LM head tied to the token embedding (true/false)");
  cmd->add_option("--seq", o->seq, "Sequence length for the costs; default the context");
  cmd->add_flag("--json", flags->first, "Print as JSON");
  cmd->callback([o, preset, flags] {
    if (flags->second) return list_presets();
    const Preset& base = find_preset(*preset);
    const ModelConfig c = configure(base.config, *o);
    const ParamCounts p = count_params(c);
    const CostCounts k = count_costs(c, o->seq.value_or(c.context));
    if (flags->first) std::cout << report_json(base.name, c, p, k).dump(2) << "\n";
    else print_report(base.name, base.description, c, p, k);
  });
}

}  // namespace qkv::cli
