// Tokenizers (see include/qkv/tokenizer.h).
#include "qkv/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <iterator>

#include "qkv/error.h"

namespace qkv {

namespace {

// Reads little-endian values from a byte range, checking each read against its end.
struct Cursor {
  const uint8_t* data;
  size_t size, at = 0;
  template <typename T>
  T next(const char* what) {
    check(size - at >= sizeof(T), "tokenizer: file ends at byte ", size, " while reading ", what);
    T value;
    std::memcpy(&value, data + at, sizeof(T));
    at += sizeof(T);
    return value;
  }
};

}  // namespace

Tokenizer Tokenizer::from_llama2c_bytes(const uint8_t* data, size_t size, int64_t vocab_size) {
  check(vocab_size >= 3 && vocab_size <= (1 << 24), "tokenizer: vocabulary size ", vocab_size,
        " out of range [3, 2^24]");
  Cursor in{data, size};
  const int32_t max_len = in.next<int32_t>("the longest token length");
  check(max_len >= 1 && max_len <= (1 << 16), "tokenizer: longest token length ", max_len,
        " out of range [1, 65536]: not a llama2.c tokenizer file?");
  Tokenizer t;
  t.pieces_.reserve(vocab_size);
  t.scores_.reserve(vocab_size);
  for (int64_t i = 0; i < vocab_size; ++i) {
    const float score = in.next<float>("a token score");
    const int32_t len = in.next<int32_t>("a token length");
    check(len >= 0 && len <= max_len, "tokenizer: token ", i, " has length ", len, ", outside [0, ",
          max_len, "]");
    check(in.size - in.at >= static_cast<size_t>(len), "tokenizer: file ends inside token ", i);
    t.pieces_.emplace_back(reinterpret_cast<const char*>(in.data + in.at), len);
    in.at += len;
    t.scores_.push_back(score);
  }
  check(in.at == in.size, "tokenizer: ", in.size - in.at, " bytes left after ", vocab_size,
        " tokens: the file is for a larger vocabulary than the model's");
  t.index_pieces();
  // llama2.c's fixed ids: 0 <unk>, 1 BOS, 2 EOS, then the 256 byte tokens (found by name).
  t.bos_ = 1;
  t.eos_ = 2;
  const int32_t zero = t.find("<0x00>");
  if (zero >= 0 && zero + 256 <= vocab_size && t.pieces_[zero + 255] == "<0xFF>")
    t.byte_base_ = zero;
  return t;
}

Tokenizer Tokenizer::load_llama2c(const std::string& path, int64_t vocab_size) {
  std::ifstream file(path, std::ios::binary);
  check(file.good(), "tokenizer: cannot open \"", path, "\"");
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)),
                                   std::istreambuf_iterator<char>());
  try {
    return from_llama2c_bytes(bytes.data(), bytes.size(), vocab_size);
  } catch (const Error& e) {
    fail(path, ": ", e.what());
  }
}

Tokenizer Tokenizer::bytes() {
  Tokenizer t;
  t.kind_ = Kind::bytes;
  for (int b = 0; b < 256; ++b) {
    t.pieces_.emplace_back(1, static_cast<char>(b));
    t.scores_.push_back(0);
    t.ids_[t.pieces_.back()] = b;
  }
  return t;
}

const std::string& Tokenizer::piece(int32_t id) const {
  check(id >= 0 && id < vocab_size(), "tokenizer: token id ", id, " out of range [0, ",
        vocab_size(), ")");
  return pieces_[id];
}

bool Tokenizer::is_control(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < types_.size() && types_[id] == 3;
}

int32_t Tokenizer::token_id(std::string_view piece) const { return find(piece); }

int32_t Tokenizer::find(std::string_view piece) const {
  const auto it = ids_.find(std::string(piece));
  return it == ids_.end() ? -1 : it->second;
}

void Tokenizer::index_pieces() {
  ids_.clear();
  ids_.reserve(pieces_.size());
  for (int32_t i = static_cast<int32_t>(pieces_.size()) - 1; i >= 0; --i) ids_[pieces_[i]] = i;
}

int32_t Tokenizer::byte_token(uint8_t byte) const {
  return byte_base_ < 0 ? -1 : byte_base_ + byte;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool bos, bool special) const {
  std::vector<int32_t> ids;
  if (kind_ == Kind::bytes) {
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  if (bos && adds_bos()) ids.push_back(bos_);
  // Cut the special tokens out of the text (the earliest match, the longest there), then
  // encode the text between them.
  bool after_special = true;
  auto plain = [&](std::string_view part) {
    if (part.empty()) return;
    if (kind_ == Kind::byte_bpe) encode_byte_bpe(part, ids);
    else {
      const std::vector<int32_t> p = encode_sentencepiece(part, after_special && add_space_prefix_);
      ids.insert(ids.end(), p.begin(), p.end());
    }
    after_special = false;
  };
  // Each special's next occurrence, searched again only once the text has moved past it:
  // a long text with many special tokens costs length × specials, not more.
  constexpr size_t none = std::string_view::npos;
  std::vector<size_t> next(specials_.size(), none);
  for (size_t k = 0; k < specials_.size(); ++k)
    if (types_[specials_[k]] != 3 || special) next[k] = text.find(pieces_[specials_[k]]);
  size_t at = 0;
  while (at < text.size()) {
    size_t best = none, best_len = 0;
    int32_t best_id = -1;
    for (size_t k = 0; k < specials_.size(); ++k) {
      const std::string& p = pieces_[specials_[k]];
      if (next[k] != none && next[k] < at) next[k] = text.find(p, at);
      if (next[k] == none) continue;
      if (next[k] < best || (next[k] == best && p.size() > best_len))
        best = next[k], best_len = p.size(), best_id = specials_[k];
    }
    if (best_id < 0) break;
    plain(text.substr(at, best - at));
    ids.push_back(best_id);
    after_special = true;
    at = best + best_len;
  }
  plain(text.substr(at));
  return ids;
}

std::vector<int32_t> Tokenizer::encode_sentencepiece(std::string_view text,
                                                     bool space_prefix) const {
  std::vector<int32_t> ids;
  // One piece per UTF-8 character, or its bytes as byte tokens; a leading space first (the
  // SentencePiece "dummy prefix").
  auto add = [&](std::string_view chars) {
    const int32_t id = find(chars);
    if (id >= 0) return ids.push_back(id);
    for (unsigned char c : chars) {
      const int32_t b = byte_token(c);
      check(b >= 0, "tokenizer: byte ", int(c), " has no token and no byte fallback");
      ids.push_back(b);
    }
  };
  if (space_prefix) add(" ");
  for (size_t i = 0; i < text.size();) {
    size_t n = 1;  // a lead byte and at most three continuation bytes
    while (i + n < text.size() && n < 4 && (static_cast<uint8_t>(text[i + n]) & 0xC0) == 0x80) ++n;
    add(text.substr(i, n));
    i += n;
  }
  // Merge the best-scoring adjacent pair until no pair forms a piece of the vocabulary.
  for (;;) {
    float best = -1e10f;
    int64_t at = -1;
    int32_t merged = -1;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const int32_t id = find(pieces_[ids[i]] + pieces_[ids[i + 1]]);
      if (id >= 0 && scores_[id] > best) best = scores_[id], at = i, merged = id;
    }
    if (at < 0) break;
    ids[at] = merged;
    ids.erase(ids.begin() + at + 1);
  }
  return ids;
}

std::string Tokenizer::decode(int32_t prev, int32_t token) const {
  std::string_view p = piece(token);
  if (kind_ == Kind::bytes) return std::string(p);
  if (is_control(token)) return {};
  if (kind_ == Kind::byte_bpe) return decode_byte_bpe(token);
  std::string out;
  if (byte_base_ >= 0 && token >= byte_base_ && token < byte_base_ + 256) {
    out = std::string(1, static_cast<char>(token - byte_base_));
  } else {
    if (prev == bos_ && !p.empty() && p[0] == ' ') p.remove_prefix(1);
    out = p;
  }
  // A lone control byte (not printable, not whitespace) prints nothing, as in llama2.c; bytes
  // of 0x80 and above are kept: they are pieces of UTF-8 characters.
  if (out.size() == 1) {
    const auto c = static_cast<unsigned char>(out[0]);
    if (c < 0x80 && !std::isprint(c) && !std::isspace(c)) return {};
  }
  return out;
}

}  // namespace qkv
