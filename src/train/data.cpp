// Training data: synthetic tasks that need attention, and byte-level text.
#include <algorithm>
#include <fstream>
#include <numeric>

#include "qkv/error.h"
#include "qkv/ops.h"
#include "qkv/train.h"

namespace qkv {

// Questions per recall sequence: half the pairs, at least one.
int64_t recall_queries(int64_t items) { return std::max<int64_t>(1, items / 2); }

TaskData::TaskData(Task task, int64_t items, int64_t symbols)
    : task_(task), items_(items), symbols_(symbols) {
  check(task != Task::text, "TaskData: text needs a file");
  check(items >= 1 && symbols >= 2, "TaskData: need items >= 1 and symbols >= 2");
  check(task != Task::recall || items <= symbols,
        "TaskData: recall needs distinct keys, so items (", items, ") <= symbols (", symbols, ")");
}

TaskData::TaskData(const std::string& text_file, int64_t seq_len)
    : task_(Task::text), text_seq_(seq_len) {
  std::ifstream in(text_file, std::ios::binary);
  check(in.good(), "cannot open text file \"", text_file, "\"");
  text_.assign(std::istreambuf_iterator<char>(in), {});
  check(seq_len >= 1, "text: seq_len must be >= 1");
  check(static_cast<int64_t>(text_.size()) >= 10 * (seq_len + 1), "text file \"", text_file,
        "\" has ", text_.size(), " bytes; it needs at least ", 10 * (seq_len + 1),
        " for training windows of ", seq_len, " plus a held-out tenth");
}

// Vocabulary: recall uses keys [0, s), values [s, 2s), '?' = 2s; copy/reverse use symbols
// [0, s) and '|' = s.
int64_t TaskData::vocab_size() const {
  switch (task_) {
    case Task::recall:
      return 2 * symbols_ + 1;
    case Task::copy:
    case Task::reverse:
      return symbols_ + 1;
    case Task::text:
      return 256;
  }
  return 0;
}

int64_t TaskData::seq_len() const {
  switch (task_) {
    case Task::recall:
      return 2 * items_ + 1 + 2 * recall_queries(items_);
    case Task::copy:
    case Task::reverse:
      return 2 * items_;  // x1..xn | y1..y(n-1): n answers
    case Task::text:
      return text_seq_;
  }
  return 0;
}

std::string TaskData::describe() const {
  switch (task_) {
    case Task::recall:
      return "associative recall: " + std::to_string(items_) + " key-value pairs, then " +
             std::to_string(recall_queries(items_)) + " of the keys; answer each one's value";
    case Task::copy:
      return "copy " + std::to_string(items_) + " symbols";
    case Task::reverse:
      return "reverse " + std::to_string(items_) + " symbols";
    case Task::text:
      return "bytes of text, " + std::to_string(text_.size()) + " bytes";
  }
  return "";
}

namespace {

Batch text_batch(const std::vector<uint8_t>& text, size_t begin, size_t end, int64_t B, int64_t T,
                 std::mt19937_64& rng) {
  Batch batch{B, T, std::vector<int32_t>(B * T), std::vector<int32_t>(B * T)};
  std::uniform_int_distribution<size_t> start(begin, end - T - 1);
  for (int64_t b = 0; b < B; ++b) {
    const size_t s = start(rng);
    for (int64_t t = 0; t < T; ++t) {
      batch.tokens[b * T + t] = text[s + t];
      batch.targets[b * T + t] = text[s + t + 1];
    }
  }
  return batch;
}

}  // namespace

Batch TaskData::sample(int64_t B, std::mt19937_64& rng) const {
  const int64_t T = seq_len();
  if (task_ == Task::text) return text_batch(text_, 0, text_.size() * 9 / 10, B, T, rng);
  Batch batch{B, T, std::vector<int32_t>(B * T), std::vector<int32_t>(B * T, kIgnoreIndex)};
  std::uniform_int_distribution<int32_t> symbol(0, static_cast<int32_t>(symbols_ - 1));
  std::vector<int32_t> keys(symbols_);
  for (int64_t b = 0; b < B; ++b) {
    int32_t* x = batch.tokens.data() + b * T;
    int32_t* y = batch.targets.data() + b * T;
    if (task_ == Task::recall) {
      std::iota(keys.begin(), keys.end(), 0);
      std::shuffle(keys.begin(), keys.end(), rng);
      std::vector<int32_t> values(items_);
      for (int64_t i = 0; i < items_; ++i) {
        values[i] = static_cast<int32_t>(symbols_) + symbol(rng);
        x[2 * i] = keys[i];
        x[2 * i + 1] = values[i];
      }
      // '?', then keys asked in random order, each followed by its value: the position of
      // each asked key predicts the value (several questions per sequence, so that every
      // sequence carries more than one answer to learn from).
      x[2 * items_] = static_cast<int32_t>(2 * symbols_);
      std::vector<int64_t> order(items_);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      for (int64_t q = 0; q < recall_queries(items_); ++q) {
        const int64_t at = 2 * items_ + 1 + 2 * q;
        x[at] = keys[order[q]];
        y[at] = values[order[q]];
        if (at + 1 < T) x[at + 1] = values[order[q]];
      }
    } else {
      for (int64_t i = 0; i < items_; ++i) x[i] = symbol(rng);
      x[items_] = static_cast<int32_t>(symbols_);  // '|'
      for (int64_t i = 0; i < items_; ++i) {
        const int32_t want = task_ == Task::copy ? x[i] : x[items_ - 1 - i];
        // Position items_ + i predicts output symbol i; the next input is that symbol.
        y[items_ + i] = want;
        if (items_ + 1 + i < T) x[items_ + 1 + i] = want;
      }
    }
  }
  return batch;
}

Batch TaskData::sample_eval(int64_t B, std::mt19937_64& rng) const {
  if (task_ == Task::text)
    return text_batch(text_, text_.size() * 9 / 10, text_.size(), B, seq_len(), rng);
  return sample(B, rng);  // fresh random sequences are held out by construction
}

double answer_accuracy(Model& model, const Batch& batch) {
  const std::vector<uint8_t> right = answers_right(model, batch);
  return double(std::count(right.begin(), right.end(), 1)) / batch.B;
}

std::vector<uint8_t> answers_right(Model& model, const Batch& batch) {
  model.forward(batch.tokens.data(), nullptr, batch.B, batch.T);
  const View logits = model.logits();
  std::vector<uint8_t> right(batch.B);
  for (int64_t b = 0; b < batch.B; ++b) {
    bool all = true;
    for (int64_t t = 0; t < batch.T; ++t) {
      const int32_t want = batch.targets[b * batch.T + t];
      if (want == kIgnoreIndex) continue;
      const int64_t n = b * batch.T + t;
      int64_t best = 0;
      for (int64_t v = 1; v < logits.shape[1]; ++v)
        if (logits(n, v) > logits(n, best)) best = v;
      all = all && best == want;
    }
    right[b] = all;
  }
  return right;
}

}  // namespace qkv
