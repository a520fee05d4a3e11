#include "heatmap.h"

#include <algorithm>

namespace qkv::cli {

namespace {

// A label as its UTF-8 characters, so widths count characters rather than bytes.
std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    while (i + n < s.size() && (static_cast<unsigned char>(s[i + n]) & 0xC0) == 0x80) ++n;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace

void print_heatmap(std::ostream& out, const View& w, const std::vector<std::string>& labels) {
  // Eight shades from 0 to 1; a key the query cannot see (weight exactly 0 above the
  // diagonal) prints as a blank.
  static const char* shades[] = {"·", "░", "░", "▒", "▒", "▓", "▓", "█"};
  const int64_t T = w.shape[0];
  std::vector<std::vector<std::string>> chars;
  size_t width = 1;
  for (const auto& l : labels) {
    chars.push_back(characters(l));
    width = std::max(width, chars.back().size());
  }
  for (int64_t i = 0; i < T; ++i) {
    out << "  " << std::string(width - chars[i].size(), ' ') << labels[i] << " ";
    for (int64_t j = 0; j < T; ++j) {
      const float x = w(i, j);
      if (j > i && x == 0) {
        out << "  ";
        continue;
      }
      const int s = std::min(7, static_cast<int>(x * 8));
      out << shades[s] << shades[s];
    }
    out << "\n";
  }
  // Key labels, one character per column pair, written vertically and aligned at the bottom.
  for (size_t row = 0; row < width; ++row) {
    out << "  " << std::string(width, ' ') << " ";
    for (int64_t j = 0; j < T; ++j) {
      const size_t pad = width - chars[j].size();
      out << (row >= pad ? chars[j][row - pad] : " ") << ' ';
    }
    out << "\n";
  }
}

}  // namespace qkv::cli
