// Tokenizer::from_gguf: the tokenizer.ggml.* metadata of a GGUF file (see
// include/qkv/tokenizer.h for the two algorithms it selects between).
#include <string>

#include "qkv/error.h"
#include "qkv/gguf.h"
#include "qkv/tokenizer.h"

namespace qkv {

Tokenizer Tokenizer::from_gguf(const gguf::File& f) {
  const std::string where = f.name() + ": ";
  auto text = [&](const std::string& key) -> const std::string& {
    return f.at(key).as_string(key);
  };
  auto id_or = [&](const std::string& key, int64_t fallback) {
    const gguf::Value* v = f.find(key);
    return v ? v->as_int(key) : fallback;
  };
  auto flag_or = [&](const std::string& key, bool fallback) {
    const gguf::Value* v = f.find(key);
    return v ? v->as_bool(key) : fallback;
  };
  const std::string model = text("tokenizer.ggml.model");
  check(model == "llama" || model == "gpt2", where, "tokenizer.ggml.model \"", model,
        "\" is not supported (qkv reads \"llama\", SentencePiece-style, and \"gpt2\", byte-level "
        "BPE)");

  Tokenizer t;
  const auto& tokens = f.at("tokenizer.ggml.tokens").as_array("tokenizer.ggml.tokens");
  check(!tokens.empty() && tokens.size() <= (1u << 24), where, "tokenizer.ggml.tokens holds ",
        tokens.size(), " tokens (need 1 to 2^24)");
  t.pieces_.reserve(tokens.size());
  for (const gguf::Value& v : tokens) t.pieces_.push_back(v.as_string("tokenizer.ggml.tokens[]"));
  const size_t n = t.pieces_.size();
  auto per_token = [&](const std::string& key) -> const std::vector<gguf::Value>* {
    const gguf::Value* v = f.find(key);
    if (!v) return nullptr;
    const auto& a = v->as_array(key);
    check(a.size() == n, where, key, " has ", a.size(), " entries for ", n, " tokens");
    return &a;
  };
  t.scores_.assign(n, 0.0f);
  if (const auto* scores = per_token("tokenizer.ggml.scores"))
    for (size_t i = 0; i < n; ++i)
      t.scores_[i] = static_cast<float>((*scores)[i].as_float("tokenizer.ggml.scores[]"));
  t.types_.assign(n, 1);
  if (const auto* types = per_token("tokenizer.ggml.token_type"))
    for (size_t i = 0; i < n; ++i) {
      const int64_t type = (*types)[i].as_int("tokenizer.ggml.token_type[]");
      check(type >= 1 && type <= 6, where, "token ", i, " has type ", type, " (GGUF's are 1 to 6)");
      t.types_[i] = static_cast<uint8_t>(type);
    }
  auto token = [&](const std::string& key, int64_t fallback) {
    const int64_t id = id_or(key, fallback);
    check(id >= -1 && id < static_cast<int64_t>(n), where, key, " = ", id,
          " is not a token id (vocabulary of ", n, ")");
    return static_cast<int32_t>(id);
  };
  for (size_t i = 0; i < n; ++i)
    if (t.types_[i] == 3 || t.types_[i] == 4) {
      check(!t.pieces_[i].empty(), where, "special token ", i, " is empty");
      t.specials_.push_back(static_cast<int32_t>(i));
    }

  if (model == "llama") {
    // SentencePiece writes a space as "▁" (U+2581); qkv's SentencePiece code, as llama2.c's
    // tokenizer.bin, uses a plain space.
    // (Built anew rather than replaced in place: GCC 12 warns falsely on string::replace.)
    for (std::string& p : t.pieces_) {
      std::string plain;
      for (size_t i = 0; i < p.size();)
        if (p.compare(i, 3, "\xE2\x96\x81") == 0) plain += ' ', i += 3;
        else plain += p[i++];
      p = std::move(plain);
    }
    t.kind_ = Kind::sentencepiece;
    t.bos_ = token("tokenizer.ggml.bos_token_id", 1);
    t.eos_ = token("tokenizer.ggml.eos_token_id", 2);
    t.add_bos_ = flag_or("tokenizer.ggml.add_bos_token", true);
    t.add_space_prefix_ = flag_or("tokenizer.ggml.add_space_prefix", true);
    t.index_pieces();
    const int32_t zero = t.find("<0x00>");
    if (zero >= 0 && zero + 256 <= static_cast<int32_t>(n) && t.pieces_[zero + 255] == "<0xFF>")
      t.byte_base_ = zero;
    return t;
  }
  const std::string pre = f.find("tokenizer.ggml.pre") ? text("tokenizer.ggml.pre") : "default";
  check(pre == "default" || pre == "gpt2" || pre == "smollm", where, "tokenizer.ggml.pre \"", pre,
        "\" is not supported (qkv reads \"default\", \"gpt2\" and \"smollm\")");
  t.kind_ = Kind::byte_bpe;
  t.split_digits_ = pre == "smollm";
  t.bos_ = token("tokenizer.ggml.bos_token_id", -1);
  t.eos_ = token("tokenizer.ggml.eos_token_id", -1);
  t.add_bos_ = flag_or("tokenizer.ggml.add_bos_token", false);
  t.add_space_prefix_ = false;
  t.index_pieces();
  std::vector<std::string> merges;
  const auto& m = f.at("tokenizer.ggml.merges").as_array("tokenizer.ggml.merges");
  merges.reserve(m.size());
  for (const gguf::Value& v : m) merges.push_back(v.as_string("tokenizer.ggml.merges[]"));
  try {
    t.init_byte_bpe(merges);
  } catch (const Error& e) {
    fail(where, e.what());
  }
  return t;
}

}  // namespace qkv
