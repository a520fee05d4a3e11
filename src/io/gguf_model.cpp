// A Llama model from a GGUF file: the config from the `llama.*` metadata; loaded in place, its
// matrices stay in the mapped file (ExternalWeights, read by the quantized products) and the
// rest (norms, vectors) is dequantized into the model's fp32 buffer by the reference
// dequantizer (qkv/quant.h); otherwise every weight is dequantized so.
#include <algorithm>
#include <string>

#include "qkv/error.h"
#include "qkv/gguf.h"
#include "qkv/io.h"
#include "qkv/quant.h"

namespace qkv {

ModelConfig gguf_model_config(const gguf::File& f) {
  const std::string& arch = f.at("general.architecture").as_string("general.architecture");
  check(arch == "llama", f.name(), ": architecture \"", arch,
        "\" is not supported (qkv reads \"llama\")");
  auto integer = [&](const std::string& key) { return f.at(key).as_int(key); };
  auto integer_or = [&](const std::string& key, int64_t fallback) {
    const gguf::Value* v = f.find(key);
    return v ? v->as_int(key) : fallback;
  };
  const int64_t C = integer("llama.embedding_length"),
                heads = integer("llama.attention.head_count");
  const int64_t vocab =
      f.find("llama.vocab_size") ? integer("llama.vocab_size")
      : f.find("tokenizer.ggml.tokens")
          ? static_cast<int64_t>(
                f.at("tokenizer.ggml.tokens").as_array("tokenizer.ggml.tokens").size())
          : 0;
  check(heads >= 1 && C % heads == 0, f.name(), ": embedding length ", C, " is not a multiple of ",
        heads, " heads");
  ModelConfig c = llama_config(
      integer("llama.block_count"), C, heads, integer_or("llama.attention.head_count_kv", heads),
      integer("llama.feed_forward_length"), vocab, integer("llama.context_length"),
      /*tied=*/f.find_tensor("output.weight") == nullptr);
  const int64_t rope_dims = integer_or("llama.rope.dimension_count", c.d_head);
  check(rope_dims == c.d_head, f.name(), ": rotary on ", rope_dims, " of ", c.d_head,
        " head dims is not supported (qkv rotates whole heads)");
  const int64_t key_length = integer_or("llama.attention.key_length", c.d_head);
  check(key_length == c.d_head, f.name(), ": head dim ", key_length,
        " differs from embedding / heads = ", c.d_head);
  c.norm_eps =
      static_cast<float>(f.find("llama.attention.layer_norm_rms_epsilon")
                             ? f.at("llama.attention.layer_norm_rms_epsilon").as_float("eps")
                             : 1e-5);
  c.rope_theta = static_cast<float>(f.find("llama.rope.freq_base")
                                        ? f.at("llama.rope.freq_base").as_float("freq_base")
                                        : 10000.0);
  c.rope_halves = false;  // llama.cpp's converter stores q and k for rotation of adjacent pairs
  validate(c);
  return c;
}

std::unique_ptr<Model> load_gguf(const std::string& path, GgufWeights weights) {
  return load_gguf(gguf::File::open(path), weights);
}

std::unique_ptr<Model> load_gguf(const gguf::File& f, GgufWeights weights) {
  const std::string& path = f.name();
  const ModelConfig c = gguf_model_config(f);
  const int64_t A = c.n_heads * c.d_head, KV = c.n_kv_heads * c.d_head;
  const bool in_place = weights == GgufWeights::in_place;
  // Where each tensor goes: parameter, first row, rows, columns (1 for vectors).
  struct Place {
    std::string tensor, param;
    int64_t row0, rows, cols;
  };
  std::vector<Place> places{{"token_embd.weight", "embedding.token", 0, c.vocab_size, c.d_model}};
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string g = "blk." + std::to_string(l) + ".", q = "layers." + std::to_string(l) + ".";
    places.push_back({g + "attn_norm.weight", q + "norm1.weight", 0, c.d_model, 1});
    places.push_back({g + "attn_q.weight", q + "attn.qkv.weight", 0, A, c.d_model});
    places.push_back({g + "attn_k.weight", q + "attn.qkv.weight", A, KV, c.d_model});
    places.push_back({g + "attn_v.weight", q + "attn.qkv.weight", A + KV, KV, c.d_model});
    places.push_back({g + "attn_output.weight", q + "attn.out.weight", 0, c.d_model, A});
    places.push_back({g + "ffn_norm.weight", q + "norm2.weight", 0, c.d_model, 1});
    places.push_back({g + "ffn_gate.weight", q + "mlp.gate.weight", 0, c.d_ff, c.d_model});
    places.push_back({g + "ffn_up.weight", q + "mlp.up.weight", 0, c.d_ff, c.d_model});
    places.push_back({g + "ffn_down.weight", q + "mlp.proj.weight", 0, c.d_model, c.d_ff});
  }
  places.push_back({"output_norm.weight", "norm.weight", 0, c.d_model, 1});
  if (!c.tied_embeddings)
    places.push_back({"output.weight", "lm_head.weight", 0, c.vocab_size, c.d_model});

  // A tensor qkv does not place would change the model (rope_freqs: scaled rotary, biases, …).
  for (const gguf::TensorInfo& t : f.tensors()) {
    const bool known = std::any_of(places.begin(), places.end(),
                                   [&](const Place& p) { return p.tensor == t.name; });
    check(known, path, ": tensor \"", t.name,
          "\" is not supported (qkv reads the Llama architecture's tensors)");
  }
  ExternalWeights external;
  std::vector<std::pair<const Place*, const gguf::TensorInfo*>> fp32;
  for (const Place& p : places) {
    const gguf::TensorInfo* t = f.find_tensor(p.tensor);
    check(t != nullptr, path, ": tensor \"", p.tensor, "\" is missing");
    const bool fits = p.cols == 1 ? t->dims == std::vector<int64_t>{p.rows}
                                  : t->dims == std::vector<int64_t>{p.cols, p.rows};
    check(fits, path, ": tensor \"", p.tensor, "\" has dims [", t->dims[0],
          t->dims.size() > 1 ? ", …" : "", "] but the model needs ", p.rows, " × ", p.cols);
    check(quant::supported(t->type), path, ": tensor \"", p.tensor, "\" is ",
          gguf::to_string(t->type), ", which qkv does not read");
    if (in_place && p.cols > 1)
      external.matrices[p.param].push_back(
          quant::matrix(path + ": " + p.tensor, t->type, t->data, p.rows, p.cols));
    else fp32.emplace_back(&p, t);
  }
  if (in_place) external.owner = f.mapping();  // the tensors' bytes, not the parsed metadata
  auto model = in_place ? std::make_unique<Model>(c, Model::InferenceOnly{}, std::move(external))
                        : std::make_unique<Model>(c, Model::InferenceOnly{});
  for (const auto& [p, t] : fp32) {
    const View w = model->weight(p->param);
    const int64_t cols = w.ndim == 2 ? w.shape[1] : 1;
    quant::dequantize(t->type, t->data, p->rows * cols, &w.data[p->row0 * cols]);
  }
  return model;
}

}  // namespace qkv
