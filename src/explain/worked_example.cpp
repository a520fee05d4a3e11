// Attention worked by hand, every intermediate number shown (see include/qkv/explain.h).
//
// The default is the articles' example: three tokens "fluffy blue creature" with 2-d queries,
// keys and values. The steps are computed here in double precision, one at a time, exactly
// as a learner would on paper; tests check them against qkv::reference::attention.
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "qkv/explain.h"
#include "io/json_fields.h"
#include "qkv/error.h"

namespace qkv::explain {
using nlohmann::json;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kMaxTokens = 64;  // a by-hand example; beyond this the tables stop being readable
constexpr int kMaxDim = 64;

const char* kConvention =
    "The articles write the score grid as S = K^T Q: one column per query, and the softmax "
    "runs down each column. qkv's code uses the row form softmax(Q K^T / sqrt(d_k)) V: one row "
    "per query. The numbers are the same, transposed.";

}  // namespace

Example article_example(bool causal) {
  Example e;
  e.query_tokens = e.key_tokens = {"fluffy", "blue", "creature"};
  e.q = {{1, 0}, {0, 1}, {2, 1}};
  e.k = {{1, 1}, {0, 2}, {2, 0}};
  e.v = {{1, 0}, {0, 2}, {3, 1}};
  e.causal = causal;
  e.from_article = true;
  return e;
}

namespace {

Matrix read_matrix(const json& doc, const char* name, const std::string& file) {
  check(doc.contains(name), file, ": missing \"", name, "\" (a list of vectors, one per token)");
  const json& rows = doc[name];
  check(rows.is_array() && !rows.empty(), file, ": \"", name,
        "\" must be a non-empty list of vectors");
  check(rows.size() <= kMaxTokens, file, ": \"", name, "\" has ", rows.size(),
        " vectors; explain is for small examples (at most ", kMaxTokens, ")");
  Matrix m;
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& row = rows[i];
    check(row.is_array() && !row.empty() && row.size() <= kMaxDim, file, ": ", name, "[", i,
          "] must be a list of 1 to ", kMaxDim, " numbers");
    std::vector<double> r;
    for (const json& x : row) {
      check(x.is_number() && std::isfinite(x.get<double>()), file, ": ", name, "[", i, "] holds ",
            json_fields::shown(x), ", not a finite number");
      r.push_back(x.get<double>());
    }
    check(m.empty() || r.size() == m[0].size(), file, ": ", name, "[", i, "] has ", r.size(),
          " numbers but ", name, "[0] has ", m.empty() ? 0 : m[0].size());
    m.push_back(std::move(r));
  }
  return m;
}

std::vector<std::string> read_names(const json& doc, const char* name, size_t count,
                                    const char* fallback, const std::string& file) {
  std::vector<std::string> names;
  if (doc.contains(name)) {
    const json& list = doc[name];
    check(list.is_array() && list.size() == count, file, ": \"", name, "\" must list ", count,
          " names");
    for (const json& n : list) {
      names.push_back(json_fields::utf8_string(n, file + ": a name in \"" + name + "\""));
    }
  } else {
    for (size_t i = 0; i < count; ++i) names.push_back(fallback + std::to_string(i));
  }
  return names;
}

// --input FILE.json: {"q": [[..], ..], "k": [[..], ..], "v": [[..], ..], "tokens": [..]}
// "tokens" names the queries (and the keys, when there are as many); "key_tokens" names the
// keys of a cross-attention example. `file` names the source in errors.
}  // namespace

Example parse_example(const std::string& text, bool causal, const std::string& file) {
  const json doc = json_fields::parse(text, file);
  check(doc.is_object(), file, ": expected a JSON object with \"q\", \"k\" and \"v\"");
  Example e;
  e.q = read_matrix(doc, "q", file);
  e.k = read_matrix(doc, "k", file);
  e.v = read_matrix(doc, "v", file);
  check(e.q[0].size() == e.k[0].size(), file, ": queries have ", e.q[0].size(),
        " numbers but keys have ", e.k[0].size(), "; q·k needs the same width");
  check(e.v.size() == e.k.size(), file, ": ", e.k.size(), " keys but ", e.v.size(),
        " values; each key needs its value");
  e.query_tokens = read_names(doc, "tokens", e.q.size(), "q", file);
  if (doc.contains("key_tokens"))
    e.key_tokens = read_names(doc, "key_tokens", e.k.size(), "k", file);
  else if (e.k.size() == e.q.size()) e.key_tokens = e.query_tokens;
  else e.key_tokens = read_names(json::object(), "", e.k.size(), "k", file);
  e.causal = causal;
  return e;
}

Example read_example(const std::string& file, bool causal) {
  std::ifstream in(file, std::ios::binary);
  check(in.good(), "cannot open --input file \"", file, "\"");
  return parse_example(std::string(std::istreambuf_iterator<char>(in), {}), causal, file);
}

// The steps for every query. The causal mask is bottom-right aligned as in qkv::attention:
// query i sits at key position i + (keys - queries).
std::vector<QuerySteps> work_through(const Example& e) {
  const size_t Tq = e.q.size(), Tk = e.k.size(), D = e.q[0].size(), Dv = e.v[0].size();
  const double scale = 1 / std::sqrt(static_cast<double>(D));
  std::vector<QuerySteps> steps(Tq);
  for (size_t i = 0; i < Tq; ++i) {
    QuerySteps& s = steps[i];
    const long pos = static_cast<long>(i + Tk) - static_cast<long>(Tq);
    for (size_t j = 0; j < Tk; ++j) {
      double dot = 0;
      for (size_t d = 0; d < D; ++d) dot += e.k[j][d] * e.q[i][d];
      s.raw.push_back(dot);
      s.scaled.push_back(dot * scale);
      s.masked.push_back(e.causal && static_cast<long>(j) > pos);
    }
    // Softmax, as on paper: e^x for each visible score, their sum Z, each divided by Z.
    // (Kernels subtract the max first so e^x cannot overflow; the weights are the same.)
    for (size_t j = 0; j < Tk; ++j) s.exps.push_back(s.masked[j] ? 0 : std::exp(s.scaled[j]));
    for (double x : s.exps) s.z += x;
    for (double x : s.exps) s.weights.push_back(s.z > 0 ? x / s.z : 0);
    s.output.assign(Dv, 0.0);
    for (size_t j = 0; j < Tk; ++j)
      for (size_t d = 0; d < Dv; ++d) s.output[d] += s.weights[j] * e.v[j][d];
  }
  return steps;
}

namespace {

std::vector<std::string> article_notes(const Example& e, const std::vector<QuerySteps>& steps) {
  if (!e.from_article) return {};
  const QuerySteps& creature = steps[2];
  std::ostringstream note;
  note << std::fixed << std::setprecision(3) << "The article prints e^1.414 = 4.095 and Z = "
       << "29.354 for creature; the true values are " << creature.exps[1] << " and " << creature.z
       << ". Its weights and outputs agree with the ones here to 3 decimals.";
  return {note.str()};
}

std::string fmt(double x, int digits) {
  if (x == -kInf) return "-inf";
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << x;
  return s.str();
}

// Whole numbers print without decimals: the inputs of a by-hand example usually are.
std::string num(double x, int digits) {
  return x == std::round(x) && std::abs(x) < 1e9 ? std::to_string(static_cast<long>(x))
                                                 : fmt(x, digits);
}

std::string vec_str(const std::vector<double>& v, int digits, bool compact = false) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i)
    s += (i ? ", " : "") + (compact ? num(v[i], digits) : fmt(v[i], digits));
  return s + "]";
}

// Column widths shared by every grid of one example.
struct Layout {
  size_t label = 8;  // key names
  size_t width = 9;  // one column per query
  explicit Layout(const Example& e) {
    for (const auto& t : e.query_tokens) width = std::max(width, t.size() + 2);
    for (const auto& t : e.key_tokens) label = std::max(label, t.size() + 2);
  }
};

// A grid in the articles' column form: one row per key, one column per query.
void print_grid(std::ostream& out, const Example& e, const Layout& l,
                const std::vector<QuerySteps>& steps, const std::string& title, auto value_of) {
  out << "\n" << title << "\n  " << std::string(l.label, ' ');
  for (const auto& t : e.query_tokens) out << std::setw(l.width) << t;
  out << "   <- query\n";
  for (size_t j = 0; j < e.key_tokens.size(); ++j) {
    out << "  " << std::left << std::setw(l.label) << e.key_tokens[j] << std::right;
    for (size_t i = 0; i < steps.size(); ++i) out << std::setw(l.width) << value_of(steps[i], j);
    out << "\n";
  }
}

// Words wrapped to lines of at most `width` characters, each starting with `indent`.
std::string wrap(const std::string& text, const std::string& indent, size_t width = 88) {
  std::istringstream words(text);
  std::string word, line = indent, out;
  while (words >> word) {
    if (line.size() > indent.size() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line = indent;
    }
    line += (line.size() > indent.size() ? " " : "") + word;
  }
  return out + line + "\n";
}

}  // namespace

void print_example(std::ostream& out, const Example& e, int digits) {
  const std::vector<QuerySteps> steps = work_through(e);
  const Layout layout(e);
  const size_t D = e.q[0].size();
  out << "Attention by hand: " << e.query_tokens.size() << " queries, " << e.key_tokens.size()
      << " keys, d_k = " << D << ", scale 1/sqrt(" << D << ") = " << fmt(1 / std::sqrt(D), 6)
      << (e.causal ? ", causal mask" : "") << "\n\n"
      << wrap(std::string("Convention: ") + kConvention +
                  " The grids below are in the articles' column form: one row per key, one "
                  "column per query.",
              "");

  out << "\nInputs\n";
  auto print_vectors = [&](const std::vector<std::string>& names, const Matrix& m,
                           const char* what) {
    for (size_t i = 0; i < m.size(); ++i)
      out << "  " << what << " " << std::left << std::setw(layout.label) << names[i] << std::right
          << vec_str(m[i], digits, /*compact=*/true) << "\n";
  };
  print_vectors(e.query_tokens, e.q, "query");
  print_vectors(e.key_tokens, e.k, "key  ");
  print_vectors(e.key_tokens, e.v, "value");

  int step = 1;
  auto title = [&](const std::string& t) { return std::to_string(step++) + ". " + t; };
  auto grid = [&](const std::string& t, auto value_of) {
    print_grid(out, e, layout, steps, title(t), value_of);
  };
  grid("Raw scores k . q", [&](const QuerySteps& s, size_t j) { return fmt(s.raw[j], digits); });
  grid("Scaled scores (k . q) / sqrt(d_k)",
       [&](const QuerySteps& s, size_t j) { return fmt(s.scaled[j], digits); });
  if (e.causal)
    grid("Causal mask: a query may not look at later keys; their scores become -inf",
         [&](const QuerySteps& s, size_t j) {
           return s.masked[j] ? std::string("-inf") : fmt(s.scaled[j], digits);
         });
  grid(std::string("Exponentials e^score") + (e.causal ? " (e^-inf = 0)" : ""),
       [&](const QuerySteps& s, size_t j) { return fmt(s.exps[j], digits); });
  out << "\n"
      << title("Z = the sum of each column") << "\n  " << std::left << std::setw(layout.label)
      << "Z" << std::right;
  for (const QuerySteps& s : steps) out << std::setw(layout.width) << fmt(s.z, digits);
  out << "\n";
  grid("Weights e^score / Z: each column sums to 1",
       [&](const QuerySteps& s, size_t j) { return fmt(s.weights[j], digits); });

  out << "\n" << title("Output: the weighted sum of the values") << "\n";
  for (size_t i = 0; i < steps.size(); ++i) {
    out << "  " << e.query_tokens[i] << " = ";
    for (size_t j = 0; j < e.key_tokens.size(); ++j)
      out << (j ? " + " : "") << fmt(steps[i].weights[j], digits) << " "
          << vec_str(e.v[j], digits, /*compact=*/true);
    out << "\n  " << std::string(e.query_tokens[i].size(), ' ') << " = "
        << vec_str(steps[i].output, digits) << "\n";
  }
  for (const std::string& note : article_notes(e, steps)) out << "\n" << wrap("Note: " + note, "");
}

namespace {

json example_steps(const Example& e) {
  const std::vector<QuerySteps> steps = work_through(e);
  json queries = json::array();
  for (size_t i = 0; i < steps.size(); ++i) {
    const QuerySteps& s = steps[i];
    json masked_scores = json::array();  // JSON has no -inf: a masked score is null
    for (size_t j = 0; j < s.scaled.size(); ++j)
      masked_scores.push_back(s.masked[j] ? json(nullptr) : json(s.scaled[j]));
    queries.push_back({{"token", e.query_tokens[i]},
                       {"raw_scores", s.raw},
                       {"scaled_scores", s.scaled},
                       {"masked", s.masked},
                       {"masked_scores", masked_scores},
                       {"exp", s.exps},
                       {"z", s.z},
                       {"weights", s.weights},
                       {"output", s.output}});
  }
  const size_t D = e.q[0].size();
  return {{"example", e.from_article ? "article" : "input"},
          {"convention", kConvention},
          {"d_k", D},
          {"scale", 1 / std::sqrt(static_cast<double>(D))},
          {"causal", e.causal},
          {"tokens", e.query_tokens},
          {"key_tokens", e.key_tokens},
          {"q", e.q},
          {"k", e.k},
          {"v", e.v},
          {"queries", queries},
          {"notes", article_notes(e, steps)}};
}

}  // namespace

std::string example_json(const Example& e, int indent) { return example_steps(e).dump(indent); }

void print_softmax(std::ostream& out, const std::vector<double>& scores, bool as_json, int digits) {
  for (double s : scores) check(std::isfinite(s), "softmax: scores must be finite numbers");
  double max = -kInf;
  for (double s : scores) max = std::max(max, s);
  // e^s overflows a double past s ≈ 709; then show e^(s - max), which gives the same weights.
  const double shift = max > 700 ? max : 0;
  std::vector<double> exps, weights;
  double z = 0;
  for (double s : scores) exps.push_back(std::exp(s - shift)), z += exps.back();
  for (double x : exps) weights.push_back(x / z);

  if (as_json) {
    out << json{{"scores", scores}, {"shift", shift}, {"exp", exps}, {"z", z}, {"weights", weights}}
               .dump()
        << "\n";
    return;
  }
  const std::string e = shift ? "e^(s - " + num(shift, digits) + ")" : "e^s";
  out << "softmax(s)_i = e^(s_i) / Z, Z = sum_j e^(s_j): positive weights that sum to 1\n\n"
      << "  " << std::setw(12) << "score s" << std::setw(16) << e << std::setw(12) << "weight"
      << "\n";
  for (size_t i = 0; i < scores.size(); ++i)
    out << "  " << std::setw(12) << fmt(scores[i], digits) << std::setw(16) << fmt(exps[i], digits)
        << std::setw(12) << fmt(weights[i], digits) << "\n";
  out << "  " << std::setw(12) << "Z =" << std::setw(16) << fmt(z, digits) << std::setw(12)
      << fmt(1.0, digits) << "\n";
  if (shift)
    out << "\n(e^s would overflow, so every score is shifted by the largest one first; "
           "the weights are unchanged.)\n";
}

void print_worked_example(std::ostream& out, bool causal) {
  print_example(out, article_example(causal), 3);
}

std::string worked_example_json(bool causal) { return example_json(article_example(causal)); }

std::string explain_json(const std::string& input, bool causal, const std::string& source) {
  return example_json(parse_example(input, causal, source));
}

}  // namespace qkv::explain
