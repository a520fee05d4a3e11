// The attention page (see include/qkv/viz.h): the data as JSON, dropped into the page
// template src/viz/attention_page.html (embedded at build time as viz::kPageTemplate).
#include "qkv/viz.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "qkv/error.h"

namespace qkv {

using nlohmann::json;

namespace viz {
extern const char* const kPageTemplate;  // attention_page.html, embedded by CMake
}

std::string attention_html(const AttentionMaps& m) {
  check(!m.weights.empty(), "viz: no attention weights to show");
  const int64_t T = static_cast<int64_t>(m.tokens.size());
  const int64_t H = m.weights[0].size(1);
  json weights = json::array();
  for (const Tensor& w : m.weights) {
    check(w.ndim() == 4 && w.size(0) == 1 && w.size(1) == H && w.size(2) == T && w.size(3) == T,
          "viz: weights of one layer must be [1, ", H, ", ", T, ", ", T, "]");
    for (int64_t h = 0; h < H; ++h) {
      std::vector<int> row;  // thousandths: the 3 decimals the page shows
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < (m.causal ? i + 1 : T); ++j)
          row.push_back(static_cast<int>(std::lround(1000.0 * w.view()(0, h, i, j))));
      weights.push_back(std::move(row));
    }
  }
  json data = {{"title", m.title},
               {"description", m.description},
               {"tokens", m.tokens},
               {"layers", m.weights.size()},
               {"heads", H},
               {"causal", m.causal},
               {"scale", 1000},
               {"weights", std::move(weights)},
               {"example", m.example_json.empty() ? json(nullptr) : json::parse(m.example_json)},
               {"open", m.open_layer >= 0 ? json{m.open_layer, m.open_head} : json(nullptr)}};
  // Invalid UTF-8 in a token becomes U+FFFD; "</" is escaped so no token can end the script.
  std::string text = data.dump(-1, ' ', false, json::error_handler_t::replace);
  for (size_t at = 0; (at = text.find("</", at)) != std::string::npos; at += 3)
    text.replace(at, 2, "<\\/");
  std::string page = viz::kPageTemplate;
  const std::string marker = "/*DATA*/";
  page.replace(page.find(marker), marker.size(), text);
  return page;
}

}  // namespace qkv
