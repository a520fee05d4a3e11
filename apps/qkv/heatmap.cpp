#include "heatmap.h"

#include <algorithm>
#include <iomanip>

namespace qkv::cli {

void print_heatmap(std::ostream& out, const View& w, const std::vector<std::string>& labels) {
  // Eight shades from 0 to 1; a key the query cannot see (weight exactly 0 above the
  // diagonal) prints as a blank.
  static const char* shades[] = {"·", "░", "░", "▒", "▒", "▓", "▓", "█"};
  const int64_t T = w.shape[0];
  size_t width = 1;
  for (const auto& l : labels) width = std::max(width, l.size());
  for (int64_t i = 0; i < T; ++i) {
    out << "  " << std::setw(static_cast<int>(width)) << labels[i] << " ";
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
  // Key labels, one character per column pair, written vertically.
  for (size_t row = 0; row < width; ++row) {
    out << "  " << std::string(width, ' ') << " ";
    for (int64_t j = 0; j < T; ++j) {
      const std::string& l = labels[j];
      const size_t pad = width - l.size();
      out << (row >= pad ? l[row - pad] : ' ') << ' ';
    }
    out << "\n";
  }
}

}  // namespace qkv::cli
