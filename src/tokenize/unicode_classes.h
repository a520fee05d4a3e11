// The Unicode character classes that byte-level BPE pre-tokenizers split text on.
#pragma once

namespace qkv::unicode {

// \p{L} (Lu, Ll, Lt, Lm, Lo) and \p{N} (Nd, Nl, No), from the generated tables.
bool is_letter(char32_t c);
bool is_number(char32_t c);
// \s as regex engines read it: the White_Space property.
inline bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}
const char* version();  // of the tables

}  // namespace qkv::unicode
