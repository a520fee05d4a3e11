#include <cmath>

#include "qkv/error.h"
#include "qkv/model.h"

namespace qkv {

std::string to_string(NormKind n) { return n == NormKind::layer_norm ? "layernorm" : "rmsnorm"; }
std::string to_string(MlpKind m) { return m == MlpKind::gelu ? "gelu" : "swiglu"; }
std::string to_string(PositionKind p) {
  switch (p) {
    case PositionKind::learned:
      return "learned";
    case PositionKind::sinusoidal:
      return "sinusoidal";
    case PositionKind::rotary:
      return "rotary";
    case PositionKind::alibi:
      return "alibi";
    case PositionKind::none:
      return "none";
  }
  return "?";
}

void use_llama_style(ModelConfig& c) {
  c.norm = NormKind::rms_norm;
  c.mlp = MlpKind::swiglu;
  c.positions = PositionKind::rotary;
  c.bias = false;
  c.tied_embeddings = false;
}

ModelConfig llama_config(int64_t layers, int64_t d_model, int64_t heads, int64_t kv_heads,
                         int64_t d_ff, int64_t vocab, int64_t context, bool tied) {
  ModelConfig c;
  c.vocab_size = vocab;
  c.context = context;
  c.d_model = d_model;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.d_head = heads > 0 ? d_model / heads : 0;
  c.d_ff = d_ff;
  use_llama_style(c);
  c.tied_embeddings = tied;
  return c;
}

void validate(const ModelConfig& c) {
  auto positive = [](int64_t value, const char* name) {
    check(value >= 1, "model config: ", name, " must be >= 1, got ", value);
  };
  positive(c.vocab_size, "vocab_size");
  positive(c.context, "context");
  positive(c.d_model, "d_model");
  positive(c.n_layers, "n_layers");
  positive(c.n_heads, "n_heads");
  positive(c.n_kv_heads, "n_kv_heads");
  positive(c.d_head, "d_head");
  positive(c.d_ff, "d_ff");
  check(c.n_heads % c.n_kv_heads == 0, "model config: n_heads (", c.n_heads,
        ") must be a multiple of n_kv_heads (", c.n_kv_heads, ")");
  check(c.window >= 0, "model config: window must be >= 0 (0 = no window), got ", c.window);
  check(c.window == 0 || c.causal, "model config: a sliding window needs a causal model");
  check(std::isfinite(c.attn_dropout) && c.attn_dropout >= 0 && c.attn_dropout < 1,
        "model config: attn_dropout must be in [0, 1), got ", c.attn_dropout);
  check(c.positions != PositionKind::rotary || c.d_head % 2 == 0,
        "model config: rotary positions need an even d_head, got ", c.d_head);
  // Sizes whose parameter count would overflow the int64 counts and offsets: an upper bound
  // on it (every projection, three FFN matrices, untied embeddings), in double.
  const double C = double(c.d_model), F = double(c.d_ff);
  const double per_layer =
      (2.0 * c.n_heads + 2.0 * c.n_kv_heads) * c.d_head * C + 3 * C * F + 8 * C;
  const double params = c.n_layers * per_layer + (2.0 * c.vocab_size + c.context) * C;
  check(params < 0x1p50, "model config: about ", params,
        " parameters, more than qkv counts (2^50 ≈ 1.1e15)");
}

}  // namespace qkv
