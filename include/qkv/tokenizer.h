// Tokenizers: text ↔ token ids.
//
// - llama2.c's tokenizer.bin (a SentencePiece BPE vocabulary exported with merge scores):
//   encoding puts BOS (id 1), then a leading space piece for non-empty text, then one piece
//   per UTF-8 character (its byte tokens <0x..> when the vocabulary has no such piece), then
//   repeatedly merges the adjacent pair whose merged piece has the highest score (leftmost on
//   ties). Decoding drops the leading space of the piece right after BOS, and byte tokens
//   stand for their byte. These are llama2.c's run.c conventions, so ids match it exactly.
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

class Tokenizer {
 public:
  // Reads llama2.c's tokenizer.bin for a model of `vocab_size` tokens. Every length is checked
  // against the file: a truncated or corrupt file is a qkv::Error naming what is wrong.
  static Tokenizer load_llama2c(const std::string& path, int64_t vocab_size);
  static Tokenizer from_llama2c_bytes(const uint8_t* data, size_t size, int64_t vocab_size);
  static Tokenizer bytes();

  int64_t vocab_size() const { return static_cast<int64_t>(pieces_.size()); }
  int32_t bos() const { return bos_; }  // −1: the vocabulary has none
  int32_t eos() const { return eos_; }
  const std::string& piece(int32_t id) const;
  float score(int32_t id) const { return scores_.at(id); }

  // Token ids of `text`, with BOS first when `bos` and the vocabulary has one.
  std::vector<int32_t> encode(std::string_view text, bool bos = true) const;
  // The bytes `token` prints as, when it follows `prev` (−1: none): byte tokens become their
  // byte, the piece right after BOS loses its leading space, control bytes print nothing.
  std::string decode(int32_t prev, int32_t token) const;

 private:
  int32_t find(std::string_view piece) const;  // −1 when not in the vocabulary
  int32_t byte_token(uint8_t byte) const;       // the id of <0xXX>, or −1

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t> ids_;
  int32_t bos_ = -1, eos_ = -1;
  int32_t byte_base_ = -1;  // id of <0x00>; byte b is byte_base_ + b
  bool byte_level_ = false;
};

}  // namespace qkv
