// Numbers as people read them (see include/qkv/text.h).
#include "qkv/text.h"

#include <cmath>
#include <cstdio>

namespace qkv {

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string short_count(double n) {
  const char* suffix[] = {"", "K", "M", "B", "T"};
  int s = 0;
  while (std::fabs(n) >= 1000 && s < 4) n /= 1000, ++s;
  char buf[32];
  std::snprintf(buf, sizeof buf, s == 0 ? "%.0f%s" : "%.1f%s", n, suffix[s]);
  return buf;
}

std::string bytes_str(double bytes) {
  const char* suffix[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int s = 0;
  while (bytes >= 1024 && s < 4) bytes /= 1024, ++s;
  char buf[32];
  std::snprintf(buf, sizeof buf, s == 0 ? "%.0f %s" : "%.1f %s", bytes, suffix[s]);
  return buf;
}

}  // namespace qkv
