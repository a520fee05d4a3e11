// Attention patterns as one self-contained HTML page (no network, no external scripts or
// fonts): a grid of every layer × head, a head opened large with the tokens on both axes and
// the weight under the mouse, the "lines" view of the articles' pictures, and, for the worked
// example, the numbers of every step. `qkv viz` writes it; Python's Model.attention_maps
// returns it.
#pragma once

#include <string>
#include <vector>

#include "qkv/model_file.h"
#include "qkv/tensor.h"

namespace qkv {

struct AttentionMaps {
  std::string title;                // what the page shows, e.g. the model file
  std::string description;          // one line under the title
  std::vector<std::string> tokens;  // the T tokens, as printable labels
  bool causal = true;               // a causal model: the upper triangle is masked
  std::vector<Tensor> weights;      // per layer, [1, H, T, T] softmax weights (reference kernel)
  std::string example_json;         // optional: the worked example's steps (qkv/explain.h)
  int64_t open_layer = -1, open_head = -1;  // optional: the head shown large when the page opens
};

// The page. Weights are kept to 3 decimals (integers in thousandths, only the visible
// triangle for causal models), which keeps 64 tokens × 6 layers × 8 heads near 0.4 MB.
std::string attention_html(const AttentionMaps& maps);

// The maps of a model on a prompt (text, or token ids as "3 7 1" in `prompt_ids`): one forward
// over it, every layer's weights from the reference kernel; `name` titles the page. The
// prompt may be at most 256 tokens (a page of every head grows past ~10 MB beyond that).
AttentionMaps maps_of_model(ModelFile& model, const std::string& name, const std::string& prompt,
                            const std::string& prompt_ids);

// The articles' three tokens, weights from the reference kernel on their q, k, v, with the
// worked example's steps.
AttentionMaps maps_of_example(bool causal);

// A token as a label: whitespace made visible (␣ ↵ ⇥), control bytes as \xNN, empty as ∅.
std::string token_label(const std::string& piece);

}  // namespace qkv
