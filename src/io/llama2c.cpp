// llama2.c checkpoints (https://github.com/karpathy/llama2.c, its export.py and run.c):
//
// version 0: seven int32 — dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size
//   (negative: a separate classifier follows), seq_len — then float32 tensors, each holding
//   all layers in order, matrices stored [out][in]:
//   token embedding [vocab, dim], attention norms [L, dim], wq [L, dim, dim],
//   wk [L, kv_dim, dim], wv [L, kv_dim, dim], wo [L, dim, dim], FFN norms [L, dim],
//   w1 [L, hidden, dim], w2 [L, dim, hidden], w3 [L, hidden, dim], final norm [dim],
//   two RoPE tables [seq_len, head_size / 2] (skipped), classifier [vocab, dim] if separate.
// version 1: uint32 magic "ak42", int32 version 1, the same seven int32, a uint8 "shared
//   classifier" flag, zeros to byte 256; then norms first (attention norms, FFN norms, final
//   norm), token embedding, wq, wk, wv, wo, w1, w2, w3, classifier if not shared; no RoPE tables.
// kv_dim = n_kv_heads · head_size, head_size = dim / n_heads.
//
// Into qkv's Llama-style model: wq, wk, wv stack into the fused qkv matrix (query heads, then
// key heads, then value heads, as llama2.c's vectors are laid out); w1 is the gate, w3 the up
// projection, w2 the down projection.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv {

namespace {

constexpr uint32_t kMagic = 0x616b3432;  // "ak42"
constexpr int64_t kHeaderV1 = 256;

// Where the bytes come from: a file (read in place, never all at once) or memory (the fuzzer).
class Source {
 public:
  virtual ~Source() = default;
  virtual uint64_t size() const = 0;
  virtual void read(uint64_t offset, void* out, uint64_t n) const = 0;
};

class FileSource : public Source {
 public:
  explicit FileSource(const std::string& path) : file_(std::fopen(path.c_str(), "rb")) {
    check(file_ != nullptr, "llama2.c checkpoint: cannot open \"", path, "\"");
    std::fseek(file_, 0, SEEK_END);
    size_ = static_cast<uint64_t>(std::ftell(file_));
  }
  ~FileSource() override { std::fclose(file_); }
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, void* out, uint64_t n) const override {
    check(std::fseek(file_, static_cast<long>(offset), SEEK_SET) == 0 &&
              std::fread(out, 1, n, file_) == n,
          "llama2.c checkpoint: read of ", n, " bytes at ", offset, " failed");
  }

 private:
  std::FILE* file_;
  uint64_t size_ = 0;
};

class MemorySource : public Source {
 public:
  MemorySource(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, void* out, uint64_t n) const override {
    check(offset <= size_ && n <= size_ - offset, "llama2.c checkpoint: read past the end");
    std::memcpy(out, data_ + offset, n);
  }

 private:
  const uint8_t* data_;
  size_t size_;
};

struct Header {
  int version = 0;
  int32_t dim, hidden, layers, heads, kv_heads, vocab, seq_len;
  bool shared_classifier = true;
  int64_t data_offset = 0;
};

Header read_header(const Source& in) {
  check(in.size() >= 28, "llama2.c checkpoint: ", in.size(),
        " bytes is too short for a header (28 bytes at least)");
  Header h;
  uint32_t magic;
  in.read(0, &magic, 4);
  int32_t fields[7];
  if (magic == kMagic) {
    check(in.size() >= kHeaderV1, "llama2.c checkpoint: version-1 header cut short (", in.size(),
          " of 256 bytes)");
    in.read(4, &h.version, 4);
    check(h.version == 1, "llama2.c checkpoint: version ", h.version,
          " is not supported (only 0 and 1, the float32 formats)");
    in.read(8, fields, sizeof fields);
    uint8_t shared;
    in.read(36, &shared, 1);
    check(shared <= 1, "llama2.c checkpoint: shared-classifier flag is ", int(shared),
          ", not 0 or 1");
    h.shared_classifier = shared == 1;
    h.data_offset = kHeaderV1;
  } else {
    in.read(0, fields, sizeof fields);
    h.data_offset = 28;
  }
  h.dim = fields[0], h.hidden = fields[1], h.layers = fields[2], h.heads = fields[3];
  h.kv_heads = fields[4], h.vocab = fields[5], h.seq_len = fields[6];
  if (h.version == 0) {
    h.shared_classifier = h.vocab > 0;
    h.vocab = h.vocab < 0 ? -h.vocab : h.vocab;
  }
  auto in_range = [](int64_t v, int64_t hi, const char* name) {
    check(v >= 1 && v <= hi, "llama2.c checkpoint: ", name, " = ", v, " is out of range [1, ", hi,
          "]: not a llama2.c checkpoint, or a corrupt one");
  };
  in_range(h.dim, 1 << 16, "dim");
  in_range(h.hidden, 1 << 18, "hidden_dim");
  in_range(h.layers, 1 << 10, "n_layers");
  in_range(h.heads, h.dim, "n_heads");
  in_range(h.kv_heads, h.heads, "n_kv_heads");
  in_range(h.vocab, 1 << 22, "vocab_size");
  in_range(h.seq_len, 1 << 22, "seq_len");
  check(h.dim % h.heads == 0, "llama2.c checkpoint: dim ", h.dim, " is not a multiple of n_heads ",
        h.heads);
  check(h.heads % h.kv_heads == 0, "llama2.c checkpoint: n_heads ", h.heads,
        " is not a multiple of n_kv_heads ", h.kv_heads);
  check((h.dim / h.heads) % 2 == 0, "llama2.c checkpoint: head size ", h.dim / h.heads,
        " is odd (rotary embeddings need pairs)");
  return h;
}

std::unique_ptr<Model> load(const Source& in) {
  const Header h = read_header(in);
  const ModelConfig c = llama2c_config(h.dim, h.hidden, h.layers, h.heads, h.kv_heads, h.vocab,
                                       h.seq_len, h.shared_classifier);
  const int64_t C = c.d_model, L = c.n_layers, F = c.d_ff, V = c.vocab_size;
  const int64_t A = c.n_heads * c.d_head, KV = c.n_kv_heads * c.d_head;
  // Every size is known from the header: check the file length before touching the weights.
  int64_t floats = V * C + 2 * L * C + L * (A * C + 2 * KV * C + C * A + 3 * F * C) + C;
  if (h.version == 0) floats += 2 * int64_t{h.seq_len} * (c.d_head / 2);
  if (!h.shared_classifier) floats += V * C;
  const uint64_t expected = h.data_offset + 4 * static_cast<uint64_t>(floats);
  check(in.size() == expected, "llama2.c checkpoint: the header (dim ", h.dim, ", hidden ",
        h.hidden, ", ", h.layers, " layers, ", h.heads, "/", h.kv_heads, " heads, vocab ", h.vocab,
        ", seq_len ", h.seq_len, ", version ", h.version, ") needs ", expected,
        " bytes but the file has ", in.size(), in.size() < expected ? ": truncated?" : "");

  auto model = std::make_unique<Model>(c, Model::InferenceOnly{});
  uint64_t at = h.data_offset;
  // Reads `rows` × cols floats from the file into parameter `name`, starting at its row `row0`.
  auto take = [&](const std::string& name, int64_t row0, int64_t rows) {
    const View w = model->weight(name);
    in.read(at, &w(row0, 0), 4 * static_cast<uint64_t>(rows * w.shape[1]));
    at += 4 * static_cast<uint64_t>(rows * w.shape[1]);
  };
  auto layer = [](int64_t l, const char* rest) {
    return "layers." + std::to_string(l) + "." + rest;
  };
  auto each = [&](const char* rest, int64_t row0, int64_t rows) {
    for (int64_t l = 0; l < L; ++l) take(layer(l, rest), row0, rows);
  };
  auto weights_after_norms = [&] {
    each("attn.qkv.weight", 0, A);
    each("attn.qkv.weight", A, KV);
    each("attn.qkv.weight", A + KV, KV);
    each("attn.out.weight", 0, C);
  };
  if (h.version == 0) {
    take("embedding.token", 0, V);
    each("norm1.weight", 0, C);
    weights_after_norms();
    each("norm2.weight", 0, C);
    each("mlp.gate.weight", 0, F);
    each("mlp.proj.weight", 0, C);
    each("mlp.up.weight", 0, F);
    take("norm.weight", 0, C);
    at += 8 * static_cast<uint64_t>(h.seq_len) * (c.d_head / 2);  // the RoPE tables
  } else {
    each("norm1.weight", 0, C);
    each("norm2.weight", 0, C);
    take("norm.weight", 0, C);
    take("embedding.token", 0, V);
    weights_after_norms();
    each("mlp.gate.weight", 0, F);
    each("mlp.proj.weight", 0, C);
    each("mlp.up.weight", 0, F);
  }
  if (!h.shared_classifier) take("lm_head.weight", 0, V);
  check(at == in.size(), "llama2.c checkpoint: read ", at, " of ", in.size(), " bytes");
  return model;
}

}  // namespace

ModelConfig llama2c_config(int64_t dim, int64_t hidden, int64_t layers, int64_t heads,
                           int64_t kv_heads, int64_t vocab, int64_t seq_len,
                           bool shared_classifier) {
  check(heads >= 1 && dim % heads == 0, "llama2.c model: dim ", dim,
        " is not a multiple of n_heads ", heads);
  // RMSNorm, SwiGLU, rotary on adjacent pairs (theta 10000), no biases.
  ModelConfig c =
      llama_config(layers, dim, heads, kv_heads, hidden, vocab, seq_len, shared_classifier);
  c.norm_eps = 1e-5f;
  validate(c);
  return c;
}

std::unique_ptr<Model> load_llama2c(const std::string& path) {
  try {
    return load(FileSource(path));
  } catch (const Error& e) {
    fail(path, ": ", e.what());
  }
}

std::unique_ptr<Model> load_llama2c_bytes(const uint8_t* data, size_t size) {
  return load(MemorySource(data, size));
}

void save_llama2c(const std::string& path, const Model& model) {
  const ModelConfig& c = model.config();
  check(c.norm == NormKind::rms_norm && c.mlp == MlpKind::swiglu &&
            c.positions == PositionKind::rotary && !c.bias && !c.rope_halves &&
            c.d_model == c.n_heads * c.d_head && c.window == 0 && !c.sinks,
        "save_llama2c: the model is not in llama2.c's architecture (Llama style, rotary on "
        "adjacent pairs, d_model = n_heads · d_head, no window, no sinks)");
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary);
  check(out.good(), "save_llama2c: cannot write \"", tmp, "\"");
  const int32_t header[7] = {static_cast<int32_t>(c.d_model),
                             static_cast<int32_t>(c.d_ff),
                             static_cast<int32_t>(c.n_layers),
                             static_cast<int32_t>(c.n_heads),
                             static_cast<int32_t>(c.n_kv_heads),
                             static_cast<int32_t>(c.tied_embeddings ? c.vocab_size : -c.vocab_size),
                             static_cast<int32_t>(c.context)};
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  auto put = [&](const std::string& name, int64_t row0, int64_t rows) {
    const View w = model.weight(name);
    out.write(reinterpret_cast<const char*>(&w(row0, 0)), 4 * rows * w.shape[1]);
  };
  const int64_t C = c.d_model, F = c.d_ff, A = c.n_heads * c.d_head, KV = c.n_kv_heads * c.d_head;
  auto each = [&](const char* rest, int64_t row0, int64_t rows) {
    for (int64_t l = 0; l < c.n_layers; ++l)
      put("layers." + std::to_string(l) + "." + rest, row0, rows);
  };
  put("embedding.token", 0, c.vocab_size);
  each("norm1.weight", 0, C);
  each("attn.qkv.weight", 0, A);
  each("attn.qkv.weight", A, KV);
  each("attn.qkv.weight", A + KV, KV);
  each("attn.out.weight", 0, C);
  each("norm2.weight", 0, C);
  each("mlp.gate.weight", 0, F);
  each("mlp.proj.weight", 0, C);
  each("mlp.up.weight", 0, F);
  put("norm.weight", 0, C);
  // The RoPE tables llama2.c's first format carries (readers skip them): cos, then sin.
  const int64_t half = c.d_head / 2;
  std::vector<float> table(c.context * half);
  for (int sine = 0; sine < 2; ++sine) {
    for (int64_t t = 0; t < c.context; ++t)
      for (int64_t j = 0; j < half; ++j) {
        const double angle = t * std::pow(double(c.rope_theta), -2.0 * j / c.d_head);
        table[t * half + j] = static_cast<float>(sine ? std::sin(angle) : std::cos(angle));
      }
    out.write(reinterpret_cast<const char*>(table.data()), 4 * table.size());
  }
  if (!c.tied_embeddings) put("lm_head.weight", 0, c.vocab_size);
  out.close();
  check(out.good(), "save_llama2c: writing \"", tmp, "\" failed");
  check(std::rename(tmp.c_str(), path.c_str()) == 0, "save_llama2c: cannot rename to \"", path,
        "\"");
}

}  // namespace qkv
