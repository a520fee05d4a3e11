// Byte-level BPE (GPT-2's tokenizer; see include/qkv/tokenizer.h): the pre-tokenizer that
// splits text into words, GPT-2's byte alphabet, and the ranked merges.
#include <queue>

#include "tokenize/unicode_classes.h"
#include "qkv/error.h"
#include "qkv/tokenizer.h"

namespace qkv {

namespace {

// GPT-2 spells every byte as a printable character, so that vocabulary pieces are text: the
// bytes that are printable in Latin-1 ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves, the
// other 68 for U+0100, U+0101, … in byte order. (A space is "Ġ", U+0120.)
char32_t byte_letter(uint8_t b) {
  const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  if (printable) return b;
  int before = 0;  // unprintable bytes below b
  for (int x = 0; x < b; ++x)
    before += !((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE);
  return 0x100 + before;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// The code point starting at s[i] and its length in bytes, by Unicode's table of well-formed
// UTF-8 (no overlong forms, no surrogates). A byte sequence that is not well-formed gives
// U+FFFD for its longest well-formed prefix (at least one byte), as Python's decoder does.
char32_t next_char(std::string_view s, size_t i, size_t& len) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t c = b(0);
  len = 1;
  if (c < 0x80) return c;
  int n = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF)
    n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4)
    n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  if (n == 0) return 0xFFFD;
  char32_t cp = c & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    const bool ok =
        i + k < s.size() && b(k) >= (k == 1 ? lo : 0x80) && b(k) <= (k == 1 ? hi : 0xBF);
    if (!ok) {
      len = k;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b(k) & 0x3F);
  }
  len = n;
  return cp;
}

enum class Class : uint8_t { letter, number, space, other };

struct Char {
  char32_t cp;
  size_t begin, end;  // its bytes in the text
  Class cls;
};

Class class_of(char32_t c) {
  if (unicode::is_letter(c)) return Class::letter;
  if (unicode::is_number(c)) return Class::number;
  if (unicode::is_space(c)) return Class::space;
  return Class::other;
}

// One match of GPT-2's pre-tokenizer regex at chars[i] (chars[i, n) is the text left):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// The alternatives are tried in order, as a backtracking engine does. Returns its end.
size_t match_word(const std::vector<Char>& chars, size_t i, size_t n) {
  const char32_t c = chars[i].cp;
  if (c == '\'' && i + 1 < n) {
    const char32_t a = chars[i + 1].cp;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 < n) {
      const char32_t b = chars[i + 2].cp;
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
  }
  const size_t k = c == ' ' && i + 1 < n ? i + 1 : i;  // the optional leading space
  const Class cls = chars[k].cls;
  if (cls != Class::space) {
    size_t e = k + 1;
    while (e < n && chars[e].cls == cls) ++e;
    return e;
  }
  // Whitespace: all of it at the end of the text; else all but the last character (it may
  // lead the next word), or one character when there is only one.
  size_t e = i;
  while (e < n && chars[e].cls == Class::space) ++e;
  if (e == n) return n;
  return e - i >= 2 ? e - 1 : e;
}

}  // namespace

std::string gpt2_byte_letter(uint8_t b) {
  std::string s;
  append_utf8(s, byte_letter(b));
  return s;
}

void Tokenizer::init_byte_bpe(const std::vector<std::string>& merges) {
  byte_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    std::string letter;
    append_utf8(letter, byte_letter(static_cast<uint8_t>(b)));
    byte_ids_[b] = find(letter);
  }
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    const size_t space = m.find(' ', 1);
    check(space != std::string::npos, "tokenizer: merge ", r, " (\"", m, "\") is not two pieces");
    const std::string left = m.substr(0, space), right = m.substr(space + 1);
    const int32_t a = find(left), b = find(right), ab = find(left + right);
    check(a >= 0 && b >= 0 && ab >= 0, "tokenizer: merge ", r, " (\"", m,
          "\") names a piece that is not in the vocabulary");
    const uint64_t key = (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
    merges_.emplace(key, std::make_pair(static_cast<int32_t>(r), ab));  // the first rank wins
  }
}

void Tokenizer::encode_byte_bpe(std::string_view raw, std::vector<int32_t>& ids) const {
  // Bytes that are not UTF-8 are read as U+FFFD, as Python's errors="replace" does (byte-level
  // vocabularies often lack the bytes UTF-8 never uses, such as 0xFF).
  std::string text;
  std::vector<Char> chars;
  for (size_t i = 0; i < raw.size();) {
    size_t len;
    const char32_t cp = next_char(raw, i, len);
    const size_t begin = text.size();
    if (cp == 0xFFFD) append_utf8(text, cp);
    else text.append(raw, i, len);
    chars.push_back({cp, begin, text.size(), class_of(cp)});
    i += len;
  }
  // With split_digits_, every digit is a segment of its own and the regex runs inside the
  // segments between them (so " 42" is " ", "4", "2").
  auto words = [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi;) {
      const size_t e = match_word(chars, i, hi);
      encode_word(std::string_view(text).substr(chars[i].begin, chars[e - 1].end - chars[i].begin),
                  ids);
      i = e;
    }
  };
  if (!split_digits_) return words(0, chars.size());
  size_t lo = 0;
  for (size_t i = 0; i < chars.size(); ++i)
    if (chars[i].cls == Class::number) {
      words(lo, i);
      words(i, i + 1);
      lo = i + 1;
    }
  words(lo, chars.size());
}

void Tokenizer::encode_word(std::string_view word, std::vector<int32_t>& ids) const {
  // The word as its bytes' letters, then the lowest-ranked adjacent pair merged until none
  // is in the merge list: a heap of candidate pairs, stale entries skipped when popped, so a
  // long word costs n log n, not n².
  struct Symbol {
    int32_t id, prev, next;
  };
  std::vector<Symbol> s;
  s.reserve(word.size());
  for (unsigned char b : word) {
    check(byte_ids_[b] >= 0, "tokenizer: byte ", int(b), " has no token in the vocabulary");
    const int32_t at = static_cast<int32_t>(s.size());
    s.push_back({byte_ids_[b], at - 1, at + 1});
  }
  if (s.empty()) return;
  s.back().next = -1;
  struct Pair {
    int32_t rank, left, left_id, right_id;
    bool operator>(const Pair& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Pair, std::vector<Pair>, std::greater<Pair>> heap;
  auto consider = [&](int32_t left) {
    if (left < 0 || s[left].next < 0) return;
    const int32_t right = s[left].next;
    const uint64_t key =
        (static_cast<uint64_t>(s[left].id) << 32) | static_cast<uint32_t>(s[right].id);
    const auto it = merges_.find(key);
    if (it != merges_.end()) heap.push({it->second.first, left, s[left].id, s[right].id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(s.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Pair p = heap.top();
    heap.pop();
    Symbol& l = s[p.left];
    if (l.id != p.left_id || l.next < 0 || s[l.next].id != p.right_id) continue;  // stale
    const Symbol r = s[l.next];
    l.id = merges_.at((static_cast<uint64_t>(p.left_id) << 32) | static_cast<uint32_t>(p.right_id))
               .second;
    s[l.next].id = -1;  // gone
    l.next = r.next;
    if (r.next >= 0) s[r.next].prev = p.left;
    consider(l.prev);
    consider(p.left);
  }
  for (int32_t i = 0; i >= 0; i = s[i].next) ids.push_back(s[i].id);
}

std::string Tokenizer::decode_byte_bpe(int32_t token) const {
  // User-defined tokens are stored as plain text; the rest in the byte alphabet.
  const std::string& p = pieces_[token];
  if (static_cast<size_t>(token) < types_.size() && types_[token] == 4) return p;
  static const std::vector<int> byte_of = [] {
    std::vector<int> v(0x144, -1);
    for (int b = 0; b < 256; ++b) v[byte_letter(static_cast<uint8_t>(b))] = b;
    return v;
  }();
  std::string out;
  for (size_t i = 0; i < p.size();) {
    size_t len;
    const char32_t cp = next_char(p, i, len);
    if (cp < byte_of.size() && byte_of[cp] >= 0) out += static_cast<char>(byte_of[cp]);
    else out.append(p, i, len);  // not in the alphabet: kept as it is
    i += len;
  }
  return out;
}

}  // namespace qkv
