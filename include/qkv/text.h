// Numbers as people read them, for what the tool and the library print.
#pragma once

#include <cstdint>
#include <string>

namespace qkv {

std::string with_commas(int64_t n);   // 1234567 -> "1,234,567"
std::string short_count(double n);    // 174591057920 -> "174.6B"; 1572864 -> "1.6M"
std::string bytes_str(double bytes);  // 4718592 -> "4.5 MiB"

}  // namespace qkv
