// A Llama model from a GGUF file: the config from the `llama.*` metadata, every weight
// dequantized into the model's fp32 buffer by the reference dequantizer (qkv/quant.h).
#include <string>

#include "qkv/error.h"
#include "qkv/gguf.h"
#include "qkv/io.h"
#include "qkv/quant.h"

namespace qkv {

ModelConfig gguf_model_config(const gguf::File& f) {
  const std::string& arch = f.at("general.architecture").as_string("general.architecture");
  check(arch == "llama", f.name(), ": architecture \"", arch, "\" is not supported (qkv reads \"llama\")");
  auto integer = [&](const std::string& key) { return f.at(key).as_int(key); };
  auto integer_or = [&](const std::string& key, int64_t fallback) {
    const gguf::Value* v = f.find(key);
    return v ? v->as_int(key) : fallback;
  };
  const int64_t C = integer("llama.embedding_length"), heads = integer("llama.attention.head_count");
  const int64_t vocab = f.find("llama.vocab_size") ? integer("llama.vocab_size")
                        : f.find("tokenizer.ggml.tokens")
                            ? static_cast<int64_t>(f.at("tokenizer.ggml.tokens").as_array("tokenizer.ggml.tokens").size())
                            : 0;
  check(heads >= 1 && C % heads == 0, f.name(), ": embedding length ", C, " is not a multiple of ", heads, " heads");
  ModelConfig c = llama_config(integer("llama.block_count"), C, heads,
                               integer_or("llama.attention.head_count_kv", heads),
                               integer("llama.feed_forward_length"), vocab, integer("llama.context_length"),
                               /*tied=*/f.find_tensor("output.weight") == nullptr);
  const int64_t rope_dims = integer_or("llama.rope.dimension_count", c.d_head);
  check(rope_dims == c.d_head, f.name(), ": rotary on ", rope_dims, " of ", c.d_head,
        " head dims is not supported (qkv rotates whole heads)");
  const int64_t key_length = integer_or("llama.attention.key_length", c.d_head);
  check(key_length == c.d_head, f.name(), ": head dim ", key_length, " differs from embedding / heads = ", c.d_head);
  c.norm_eps = static_cast<float>(
      f.find("llama.attention.layer_norm_rms_epsilon") ? f.at("llama.attention.layer_norm_rms_epsilon").as_float("eps") : 1e-5);
  c.rope_theta = static_cast<float>(f.find("llama.rope.freq_base") ? f.at("llama.rope.freq_base").as_float("freq_base") : 10000.0);
  c.rope_halves = false;  // llama.cpp's converter stores q and k for rotation of adjacent pairs
  validate(c);
  return c;
}

std::unique_ptr<Model> load_gguf(const std::string& path) { return load_gguf(gguf::File::open(path)); }

std::unique_ptr<Model> load_gguf(const gguf::File& f) {
  const std::string& path = f.name();
  const ModelConfig c = gguf_model_config(f);
  auto model = std::make_unique<Model>(c, Model::InferenceOnly{});
  const int64_t A = c.n_heads * c.d_head, KV = c.n_kv_heads * c.d_head;
  size_t used = 0;
  // Tensor `name` ([rows, cols] in qkv's terms: dims {cols, rows} in GGUF's) into rows
  // [row0, row0 + rows) of parameter `param`.
  auto take = [&](const std::string& name, const std::string& param, int64_t row0, int64_t rows) {
    const gguf::TensorInfo* t = f.find_tensor(name);
    check(t != nullptr, path, ": tensor \"", name, "\" is missing");
    const View w = model->weight(param);
    const int64_t cols = w.ndim == 2 ? w.shape[1] : 1;
    const bool fits = cols == 1 ? t->dims == std::vector<int64_t>{rows}
                                : t->dims == std::vector<int64_t>{cols, rows};
    check(fits, path, ": tensor \"", name, "\" has dims [", t->dims[0], t->dims.size() > 1 ? ", …" : "",
          "] but the model needs ", rows, " × ", cols);
    check(quant::supported(t->type), path, ": tensor \"", name, "\" is ", gguf::to_string(t->type),
          ", which qkv does not read");
    quant::dequantize(t->type, t->data, rows * cols, &w.data[row0 * cols]);
    ++used;
  };
  take("token_embd.weight", "embedding.token", 0, c.vocab_size);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string g = "blk." + std::to_string(l) + ".", q = "layers." + std::to_string(l) + ".";
    take(g + "attn_norm.weight", q + "norm1.weight", 0, c.d_model);
    take(g + "attn_q.weight", q + "attn.qkv.weight", 0, A);
    take(g + "attn_k.weight", q + "attn.qkv.weight", A, KV);
    take(g + "attn_v.weight", q + "attn.qkv.weight", A + KV, KV);
    take(g + "attn_output.weight", q + "attn.out.weight", 0, c.d_model);
    take(g + "ffn_norm.weight", q + "norm2.weight", 0, c.d_model);
    take(g + "ffn_gate.weight", q + "mlp.gate.weight", 0, c.d_ff);
    take(g + "ffn_up.weight", q + "mlp.up.weight", 0, c.d_ff);
    take(g + "ffn_down.weight", q + "mlp.proj.weight", 0, c.d_model);
  }
  take("output_norm.weight", "norm.weight", 0, c.d_model);
  if (!c.tied_embeddings) take("output.weight", "lm_head.weight", 0, c.vocab_size);
  // A tensor qkv did not place would change the model (rope_freqs: scaled rotary, biases, …).
  if (used != f.tensors().size())
    for (const gguf::TensorInfo& t : f.tensors()) {
      const std::string& n = t.name;
      const bool known = n == "token_embd.weight" || n == "output_norm.weight" || n == "output.weight" ||
                         (n.rfind("blk.", 0) == 0);
      check(known, path, ": tensor \"", n, "\" is not supported (qkv reads the Llama architecture's tensors)");
    }
  check(used == f.tensors().size(), path, ": holds ", f.tensors().size(), " tensors, of which qkv read ", used,
        " (an unsupported tensor in a block?)");
  return model;
}

}  // namespace qkv
