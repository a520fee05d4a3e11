// Learning, with no timing in it: fixed seeds, a fixed step budget, an accuracy to reach.
// Tens of seconds in Release, so these run in the release build only (label "slow").
#include <gtest/gtest.h>

#include "model_configs.h"
#include "qkv/train.h"

namespace qkv {
namespace {

ModelConfig small(const TaskData& data, bool llama = false) {
  return testing::small_model(data.vocab_size(), data.seq_len(), llama);
}

TEST(Learning, CopyIsLearnedPerfectly) {
  TaskData data(Task::copy, 6, 8);
  ModelConfig c = small(data, /*llama=*/true);
  Model m(c, 1);
  AdamW opt(m);
  const TrainResult r =
      train(m, opt, data, {.steps = 300, .batch = 32, .warmup = 30, .eval_every = 0, .lr = 3e-3f},
            0, nullptr);
  EXPECT_GE(r.final_accuracy, 0.99) << "loss " << r.final_loss;
}

// The articles' point, learned: a 2-layer model answers which value went with a key, which
// needs attention to look the key up (an induction head). 8 pairs over 16 symbols; chance is
// under 10% per answer.
TEST(Learning, RecallReaches99Percent) {
  TaskData data(Task::recall, 8, 16);
  ModelConfig c = small(data);
  c.d_model = 64;
  c.d_head = 16;
  c.d_ff = 256;
  c.init_std = 0.125f;  // 1/sqrt(d_model), as qkv train uses
  Model m(c, 1);
  AdamW opt(m);
  const TrainResult r =
      train(m, opt, data, {.steps = 1500, .batch = 64, .warmup = 100, .eval_every = 0, .lr = 1e-3f},
            0, nullptr);
  EXPECT_GE(r.final_accuracy, 0.99) << "loss " << r.final_loss;
}

}  // namespace
}  // namespace qkv
