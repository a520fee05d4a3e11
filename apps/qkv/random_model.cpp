// `qkv random-model`: writes a llama2.c checkpoint with random weights of any shape, for
// benchmarking generation at a size no small pretrained file has. The default shape is
// llama2.c's stories110M (dim 768, 12 layers, 12 heads, vocab 32000, seq_len 1024).
#include <iostream>

#include "cli.h"
#include "qkv/io.h"
#include "qkv/model.h"

namespace qkv::cli {
namespace {

struct RandomModelOptions {
  std::string out;
  int64_t dim = 768, hidden = 2048, layers = 12, heads = 12, kv_heads = 0, vocab = 32000,
          seq_len = 1024;
  uint64_t seed = 1;
};

void run_random_model(const RandomModelOptions& o) {
  const ModelConfig c = llama2c_config(o.dim, o.hidden, o.layers, o.heads,
                                       o.kv_heads > 0 ? o.kv_heads : o.heads, o.vocab, o.seq_len,
                                       /*shared_classifier=*/true);
  const Model model(c, o.seed);  // GPT-2's N(0, 0.02) initialisation
  save_llama2c(o.out, model);
  std::cout << "wrote " << o.out << ": " << short_count(model.num_params()) << " parameters, dim "
            << o.dim << ", " << o.layers << " layers, " << o.heads << " heads, vocab " << o.vocab
            << ", seq_len " << o.seq_len << "\n";
}

}  // namespace

void add_random_model(CLI::App& app) {
  auto o = std::make_shared<RandomModelOptions>();
  CLI::App* cmd = app.add_subcommand(
      "random-model", "Write a llama2.c checkpoint with random weights (for benchmarks)");
  cmd->add_option("-o,--output", o->out, "The .bin file to write")->required();
  cmd->add_option("--dim", o->dim, "Model width")->capture_default_str();
  cmd->add_option("--hidden", o->hidden, "FFN width")->capture_default_str();
  cmd->add_option("--layers", o->layers, "Blocks")->capture_default_str();
  cmd->add_option("--heads", o->heads, "Query heads")->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads, "Key/value heads (default: heads)");
  cmd->add_option("--vocab", o->vocab, "Vocabulary size")->capture_default_str();
  cmd->add_option("--seq-len", o->seq_len, "Context length")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the weights")->capture_default_str();
  cmd->callback([o] { run_random_model(*o); });
}

}  // namespace qkv::cli
