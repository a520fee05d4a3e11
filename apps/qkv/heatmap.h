// Attention patterns as a terminal heatmap: rows are queries, columns keys, one shaded
// character per weight; the masked upper triangle prints empty.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "qkv/tensor.h"

namespace qkv::cli {

// weights: [T, T] (one head); labels: T token names.
void print_heatmap(std::ostream& out, const View& weights, const std::vector<std::string>& labels);

}  // namespace qkv::cli
