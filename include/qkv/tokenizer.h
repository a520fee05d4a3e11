// Tokenizers: text ↔ token ids.
//
// - SentencePiece-style BPE (llama2.c's tokenizer.bin, and GGUF's tokenizer.ggml.model
//   "llama"): encoding puts BOS, then a leading space piece for non-empty text (the "dummy
//   prefix"), then one piece per UTF-8 character (its byte tokens <0x..> when the vocabulary
//   has no such piece), then repeatedly merges the adjacent pair whose merged piece has the
//   highest score (leftmost on ties). Decoding drops the leading space of the piece right
//   after BOS, and byte tokens stand for their byte. These are llama2.c's run.c conventions,
//   so ids match it exactly.
// - Byte-level BPE (GPT-2's, GGUF's "gpt2": SmolLM2, Qwen, …; src/tokenize/byte_bpe.cpp):
//   special tokens are cut out of the text first, the rest split into words by the
//   pre-tokenizer's rules (GPT-2's regex; "smollm" first isolates every digit), each word's
//   UTF-8 bytes spelled with GPT-2's byte alphabet, then merged by the ranked merge list
//   (lowest rank first, leftmost on ties). Decoding maps the alphabet back to bytes.
// - bytes: qkv's own byte-level vocabulary (id = byte value, 256 ids, no BOS), the one
//   `qkv train --text` trains with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace qkv {

namespace gguf {
class File;
}

// How GPT-2's byte-level vocabularies spell byte b (UTF-8): the printable Latin-1 bytes as
// themselves, the others as U+0100 + their rank ("Ġ" for a space).
std::string gpt2_byte_letter(uint8_t b);

class Tokenizer {
 public:
  enum class Kind { sentencepiece, byte_bpe, bytes };

  // Reads llama2.c's tokenizer.bin for a model of `vocab_size` tokens. Every length is checked
  // against the file: a truncated or corrupt file is a qkv::Error naming what is wrong.
  static Tokenizer load_llama2c(const std::string& path, int64_t vocab_size);
  static Tokenizer from_llama2c_bytes(const uint8_t* data, size_t size, int64_t vocab_size);
  // The tokenizer a GGUF file's tokenizer.ggml.* metadata describes ("llama" or "gpt2"; the
  // pre-tokenizers "default", "gpt2" and "smollm"). Anything else is a qkv::Error naming it.
  static Tokenizer from_gguf(const gguf::File& file);
  static Tokenizer bytes();

  Kind kind() const { return kind_; }
  int64_t vocab_size() const { return static_cast<int64_t>(pieces_.size()); }
  int32_t bos() const { return bos_; }  // −1: the vocabulary has none
  int32_t eos() const { return eos_; }
  // Whether encode() puts BOS first by default (GGUF's tokenizer.ggml.add_bos_token).
  bool adds_bos() const { return add_bos_ && bos_ >= 0; }
  const std::string& piece(int32_t id) const;  // as stored (GPT-2's alphabet for byte_bpe)
  float score(int32_t id) const { return scores_.at(id); }
  // Control tokens (<|im_start|>, BOS, …) print nothing and are only matched in text that
  // encode() is told may hold them.
  bool is_control(int32_t id) const;
  int32_t token_id(std::string_view piece) const;  // −1 when not in the vocabulary

  // Token ids of `text`, with BOS first when `bos` and adds_bos(). With `special`,
  // control tokens written out in the text ("<|im_end|>") become their ids; without, they are
  // plain text. (User-defined tokens are always matched.)
  std::vector<int32_t> encode(std::string_view text, bool bos = true, bool special = false) const;
  // The bytes `token` prints as, when it follows `prev` (−1: none): byte tokens become their
  // byte, the piece right after BOS loses its leading space, control tokens and lone control
  // bytes print nothing.
  std::string decode(int32_t prev, int32_t token) const;

 private:
  int32_t find(std::string_view piece) const;  // −1 when not in the vocabulary
  int32_t byte_token(uint8_t byte) const;      // the id of <0xXX>, or −1
  void index_pieces();                         // fills ids_ from pieces_
  std::vector<int32_t> encode_sentencepiece(std::string_view text, bool space_prefix) const;
  // Byte-level BPE (byte_bpe.cpp).
  void init_byte_bpe(const std::vector<std::string>& merges);
  void encode_byte_bpe(std::string_view text, std::vector<int32_t>& ids) const;
  void encode_word(std::string_view word, std::vector<int32_t>& ids) const;
  std::string decode_byte_bpe(int32_t token) const;

  Kind kind_ = Kind::sentencepiece;
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<uint8_t> types_;  // GGUF token types (1 normal, 3 control, 4 user-defined, 6 byte)
  std::unordered_map<std::string, int32_t> ids_;
  int32_t bos_ = -1, eos_ = -1;
  bool add_bos_ = true, add_space_prefix_ = true;
  int32_t byte_base_ = -1;  // sentencepiece: id of <0x00>; byte b is byte_base_ + b
  // byte_bpe: (left id << 32 | right id) → (rank, merged id); the id of each byte's letter in
  // GPT-2's alphabet; the tokens cut out of text before pre-tokenizing; digits isolated.
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  std::vector<int32_t> byte_ids_;
  std::vector<int32_t> specials_;
  bool split_digits_ = false;
};

}  // namespace qkv
