// save_gguf (include/qkv/io.h): a Llama-style model as a GGUF file of llama.cpp's "llama"
// architecture, its matrices in a block format, with its tokenizer.
#include <cstring>

#include "qkv/error.h"
#include "qkv/gguf.h"
#include "qkv/io.h"
#include "qkv/quant.h"
#include "qkv/tokenizer.h"

namespace qkv {

namespace {

using qkv::TensorType;

// The tokenizer as tokenizer.ggml.* metadata: SentencePiece pieces as "llama" (a space
// written "▁"; byte, control and unknown tokens typed), qkv's byte vocabulary as "gpt2" with
// no merges (each byte its own token, spelled in GPT-2's byte alphabet).
void add_tokenizer(gguf::Writer& w, const Tokenizer& t) {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  if (t.kind() == Tokenizer::Kind::bytes) {
    for (int b = 0; b < 256; ++b)
      tokens.push_back(gpt2_byte_letter(static_cast<uint8_t>(b))), types.push_back(1);
    w.add("tokenizer.ggml.model", gguf::string_value("gpt2"));
    w.add("tokenizer.ggml.pre", gguf::string_value("default"));
    w.add("tokenizer.ggml.tokens", gguf::string_array(tokens));
    w.add("tokenizer.ggml.token_type", gguf::i32_array(types));
    w.add("tokenizer.ggml.merges", gguf::string_array({}));
    w.add("tokenizer.ggml.add_bos_token", gguf::bool_value(false));
    return;
  }
  check(t.kind() == Tokenizer::Kind::sentencepiece,
        "save_gguf: writes SentencePiece and byte tokenizers");
  std::vector<float> scores;
  for (int32_t i = 0; i < t.vocab_size(); ++i) {
    std::string p = t.piece(i);
    const bool byte = p.size() == 6 && p.rfind("<0x", 0) == 0 && p[5] == '>';
    for (size_t at; (at = p.find(' ')) != std::string::npos;) p.replace(at, 1, "\xE2\x96\x81");
    tokens.push_back(p);
    scores.push_back(t.score(i));
    types.push_back(byte ? 6 : i == t.bos() || i == t.eos() ? 3 : i == 0 ? 2 : 1);
  }
  w.add("tokenizer.ggml.model", gguf::string_value("llama"));
  w.add("tokenizer.ggml.tokens", gguf::string_array(tokens));
  w.add("tokenizer.ggml.scores", gguf::f32_array(scores));
  w.add("tokenizer.ggml.token_type", gguf::i32_array(types));
  if (t.bos() >= 0)
    w.add("tokenizer.ggml.bos_token_id", gguf::u32_value(static_cast<uint32_t>(t.bos())));
  if (t.eos() >= 0)
    w.add("tokenizer.ggml.eos_token_id", gguf::u32_value(static_cast<uint32_t>(t.eos())));
  w.add("tokenizer.ggml.unknown_token_id", gguf::u32_value(0));
  w.add("tokenizer.ggml.add_bos_token", gguf::bool_value(true));
}

}  // namespace

GgufSaveStats save_gguf(const std::string& path, const Model& model, const Tokenizer* tokenizer,
                        TensorType type) {
  const ModelConfig& c = model.config();
  check(quant::can_quantize(type),
        "save_gguf: the matrices can be Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, F16 or F32, not ",
        to_string(type));
  check(c.norm == NormKind::rms_norm && c.mlp == MlpKind::swiglu &&
            c.positions == PositionKind::rotary && !c.bias && c.causal && c.window == 0 && !c.sinks,
        "save_gguf: GGUF's llama architecture is RMSNorm, SwiGLU, rotary positions, no biases, "
        "causal, no window, no sinks; this model has ",
        to_string(c.norm), ", ", to_string(c.mlp), ", ", to_string(c.positions), " positions",
        c.bias ? ", biases" : "", c.window ? ", a window" : "", c.sinks ? ", sinks" : "");
  check(!model.has_external_weights(),
        "save_gguf: the model's weights are already in a block format");
  if (tokenizer)
    check(tokenizer->vocab_size() == c.vocab_size, "save_gguf: the tokenizer has ",
          tokenizer->vocab_size(), " tokens, the model ", c.vocab_size);
  gguf::Writer w;
  w.add("general.architecture", gguf::string_value("llama"));
  w.add("general.name", gguf::string_value("qkv model"));
  const uint32_t file_type = type == TensorType::q8_0   ? 7
                             : type == TensorType::q4_0 ? 2
                             : type == TensorType::f16  ? 1
                                                        : 0;
  w.add("general.file_type", gguf::u32_value(file_type));
  w.add("general.quantization_version", gguf::u32_value(2));
  w.add("llama.context_length", gguf::u32_value(static_cast<uint32_t>(c.context)));
  w.add("llama.embedding_length", gguf::u32_value(static_cast<uint32_t>(c.d_model)));
  w.add("llama.block_count", gguf::u32_value(static_cast<uint32_t>(c.n_layers)));
  w.add("llama.feed_forward_length", gguf::u32_value(static_cast<uint32_t>(c.d_ff)));
  w.add("llama.attention.head_count", gguf::u32_value(static_cast<uint32_t>(c.n_heads)));
  w.add("llama.attention.head_count_kv", gguf::u32_value(static_cast<uint32_t>(c.n_kv_heads)));
  w.add("llama.attention.key_length", gguf::u32_value(static_cast<uint32_t>(c.d_head)));
  w.add("llama.attention.value_length", gguf::u32_value(static_cast<uint32_t>(c.d_head)));
  w.add("llama.attention.layer_norm_rms_epsilon", gguf::f32_value(c.norm_eps));
  w.add("llama.rope.freq_base", gguf::f32_value(c.rope_theta));
  w.add("llama.rope.dimension_count", gguf::u32_value(static_cast<uint32_t>(c.d_head)));
  w.add("llama.vocab_size", gguf::u32_value(static_cast<uint32_t>(c.vocab_size)));
  if (tokenizer) add_tokenizer(w, *tokenizer);

  GgufSaveStats stats;
  // Rows [row0, row0 + rows) of a parameter as one tensor; `heads` > 0 marks q or k rows, which
  // GGUF rotates in adjacent pairs: a model that rotates halves has its rows reordered so.
  auto matrix = [&](const std::string& name, const std::string& param, int64_t row0, int64_t rows,
                    int64_t heads) {
    const View v = model.weight(param);
    const int64_t cols = v.ndim == 2 ? v.shape[1] : 1;
    std::vector<float> x(&v.data[row0 * cols], &v.data[(row0 + rows) * cols]);
    if (heads > 0 && c.rope_halves) {
      const int64_t D = c.d_head;
      std::vector<float> y(x.size());
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < D / 2; ++j) {
          std::memcpy(&y[(h * D + 2 * j) * cols], &x[(h * D + j) * cols], 4 * cols);
          std::memcpy(&y[(h * D + 2 * j + 1) * cols], &x[(h * D + j + D / 2) * cols], 4 * cols);
        }
      x.swap(y);
    }
    const BlockSize b = block_of(type);
    const TensorType t = cols == 1                ? TensorType::f32
                         : cols % b.elements == 0 ? type
                                                  : TensorType::f32;
    if (cols > 1 && t != type) ++stats.kept_f32;
    if (cols > 1 && t == type) ++stats.quantized;
    std::vector<uint8_t> bytes = quant::quantize(t, x.data(), static_cast<int64_t>(x.size()));
    stats.bytes += bytes.size();
    w.add_tensor(name, t, cols == 1 ? std::vector<int64_t>{rows} : std::vector<int64_t>{cols, rows},
                 std::move(bytes));
  };
  const int64_t A = c.n_heads * c.d_head, KV = c.n_kv_heads * c.d_head;
  matrix("token_embd.weight", "embedding.token", 0, c.vocab_size, 0);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string g = "blk." + std::to_string(l) + ".", q = "layers." + std::to_string(l) + ".";
    matrix(g + "attn_norm.weight", q + "norm1.weight", 0, c.d_model, 0);
    matrix(g + "attn_q.weight", q + "attn.qkv.weight", 0, A, c.n_heads);
    matrix(g + "attn_k.weight", q + "attn.qkv.weight", A, KV, c.n_kv_heads);
    matrix(g + "attn_v.weight", q + "attn.qkv.weight", A + KV, KV, 0);
    matrix(g + "attn_output.weight", q + "attn.out.weight", 0, c.d_model, 0);
    matrix(g + "ffn_norm.weight", q + "norm2.weight", 0, c.d_model, 0);
    matrix(g + "ffn_gate.weight", q + "mlp.gate.weight", 0, c.d_ff, 0);
    matrix(g + "ffn_up.weight", q + "mlp.up.weight", 0, c.d_ff, 0);
    matrix(g + "ffn_down.weight", q + "mlp.proj.weight", 0, c.d_model, 0);
  }
  matrix("output_norm.weight", "norm.weight", 0, c.d_model, 0);
  if (!c.tied_embeddings) matrix("output.weight", "lm_head.weight", 0, c.vocab_size, 0);
  w.write(path);
  return stats;
}

}  // namespace qkv
