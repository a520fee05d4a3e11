// Attention worked by hand: every intermediate number of softmax(q kᵀ / √d_k) v for an example
// small enough to follow on paper, computed in double precision one step at a time, as a
// learner would. The default is the explainer articles' example: three tokens "fluffy blue
// creature" with 2-d queries, keys and values; your own comes as JSON. `qkv explain` prints
// it; the attention page (qkv/viz.h) and Python's qkv.explain show the same steps.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace qkv::explain {

using Matrix = std::vector<std::vector<double>>;  // one row per token

struct Example {
  std::vector<std::string> query_tokens, key_tokens;
  Matrix q, k, v;
  bool causal = false;
  bool from_article = false;
};

// What a learner computes for one query.
struct QuerySteps {
  std::vector<double> raw;      // k_j · q
  std::vector<double> scaled;   // raw / sqrt(d_k)
  std::vector<bool> masked;     // causal: key j comes after the query
  std::vector<double> exps;     // e^scaled (0 where masked)
  double z = 0;                 // Σ exps
  std::vector<double> weights;  // exps / z
  std::vector<double> output;   // Σ weights_j v_j
};

// The articles' example.
Example article_example(bool causal);
// Your own q, k, v: {"q": [[…]], "k": …, "v": …, "tokens": […]} (at most 64 tokens and 64
// dims); `source` names the text in errors (a qkv::Error naming the field that is wrong).
Example parse_example(const std::string& json_text, bool causal, const std::string& source);
Example read_example(const std::string& file, bool causal);

// The steps of every query. The causal mask is bottom-right aligned, as in qkv::attention.
std::vector<QuerySteps> work_through(const Example& e);

// The steps as text tables (`digits` decimals), or as JSON (tokens, q, k, v and every step per
// query; `indent` as nlohmann::json's dump: −1 for one line).
void print_example(std::ostream& out, const Example& e, int digits);
std::string example_json(const Example& e, int indent = -1);

// Softmax of the given scores, step by step (`qkv explain softmax 2 1 0`).
void print_softmax(std::ostream& out, const std::vector<double>& scores, bool as_json, int digits);

// Shorthands: the articles' example as text and as JSON; your own input's JSON.
void print_worked_example(std::ostream& out, bool causal);
std::string worked_example_json(bool causal);
std::string explain_json(const std::string& json_text, bool causal, const std::string& source);

}  // namespace qkv::explain
