// The training loop: sample, forward, backward (with gradient accumulation), clip, step.
#include <algorithm>
#include <cmath>

#include "qkv/clock.h"
#include "qkv/error.h"
#include "qkv/ops.h"
#include "qkv/train.h"

namespace qkv {

namespace {

// Every step draws from its own generator, seeded by (seed, step): a run resumed at step s
// sees exactly the batches an uninterrupted run would.
std::mt19937_64 step_rng(uint64_t seed, int64_t step, uint64_t stream) {
  std::seed_seq seq{seed, static_cast<uint64_t>(step), stream};
  return std::mt19937_64(seq);
}

// The fraction of a batch's scored positions that are in `part` of it.
float share_of(const Batch& part, const Batch& whole) {
  const auto scored = [](const Batch& b) {
    return std::count_if(b.targets.begin(), b.targets.end(),
                         [](int32_t x) { return x != kIgnoreIndex; });
  };
  const int64_t all = scored(whole);
  if (part.targets.size() == whole.targets.size()) return all ? 1.0f : 0.0f;
  return all ? static_cast<float>(scored(part)) / static_cast<float>(all) : 0.0f;
}

}  // namespace

void check_config(const TrainConfig& c) {
  check(c.steps >= 0, "train: steps must be >= 0, got ", c.steps);
  check(c.batch >= 1, "train: batch must be >= 1, got ", c.batch);
  check(c.grad_accum >= 1, "train: grad_accum must be >= 1, got ", c.grad_accum);
  check(c.warmup >= 0, "train: warmup must be >= 0, got ", c.warmup);
  check(std::isfinite(c.lr) && c.lr > 0, "train: lr must be > 0, got ", c.lr);
  check(std::isfinite(c.min_lr) && c.min_lr >= 0, "train: min_lr must be >= 0, got ", c.min_lr);
  check(std::isfinite(c.clip) && c.clip >= 0, "train: clip must be >= 0 (0 = off), got ", c.clip);
}

float StepRunner::update(Model& model, AdamW& optimizer, float max_norm, float lr) {
  const float norm = clip_grad_norm(model, max_norm);
  optimizer.update(model, lr);
  return norm;
}

TrainResult train(Model& model, AdamW& optimizer, const TaskData& data, const TrainConfig& cfg,
                  int64_t first_step, const std::function<bool(const TrainProgress&)>& on_step,
                  StepRunner* runner) {
  check(data.vocab_size() <= model.config().vocab_size, "train: the data has ", data.vocab_size(),
        " symbols but the model's vocabulary is ", model.config().vocab_size);
  check_config(cfg);
  StepRunner one_process;
  StepRunner& run = runner ? *runner : one_process;
  TrainResult result;
  const double start = now_seconds();
  int64_t tokens = 0;
  const bool was_training = model.training();
  for (int64_t step = first_step; step < cfg.steps; ++step) {
    model.set_training(true);  // (attention dropout, when the model has it)
    model.zero_grad();
    float loss = 0;
    for (int64_t micro = 0; micro < cfg.grad_accum; ++micro) {
      std::mt19937_64 rng = step_rng(cfg.seed, step, micro);
      const Batch batch = data.sample(cfg.batch, rng);
      // This process's part, whose mean loss weighs in by its share of the scored positions.
      // (Every process runs its part even when nothing in it is scored: the forward and
      // backward of a context-parallel model are collective.)
      const Batch part = run.local(batch);
      const float share = share_of(part, batch);
      // (Dropout's masks by step, as the batches: a resumed run draws what the whole run did.)
      model.set_dropout_draws(static_cast<uint32_t>(step * cfg.grad_accum + micro), part.first);
      const float mean = model.forward(part.tokens.data(), part.targets.data(), part.B, part.T);
      loss += (share == 1 ? mean : mean * share) / cfg.grad_accum;
      model.backward(share);
      tokens += batch.B * batch.T;
    }
    loss = run.sum(loss);
    if (cfg.grad_accum > 1) {  // the mean over micro-batches
      float* g = model.grads();
      for (int64_t i = 0; i < model.num_params(); ++i) g[i] /= cfg.grad_accum;
    }
    TrainProgress p;
    p.step = step + 1;
    p.steps = cfg.steps;
    p.loss = loss;
    p.lr = learning_rate(step, cfg.steps, cfg.warmup, cfg.lr, cfg.min_lr);
    p.grad_norm = run.update(model, optimizer, cfg.clip, p.lr);
    p.seconds = now_seconds() - start;
    p.tokens_per_s = tokens / std::max(p.seconds, 1e-9);
    const bool last = step + 1 == cfg.steps;
    if ((cfg.eval_every > 0 && p.step % cfg.eval_every == 0) || last) {
      std::mt19937_64 rng = step_rng(cfg.seed ^ 0x5eedULL, 0, 0);  // the same held-out set
      // 256 sequences, fewer when they are long (at most 64k positions, as 256 × 256), never
      // fewer than a training batch.
      const int64_t eval_batch =
          std::min<int64_t>(256, std::max(65536 / data.seq_len(), cfg.batch));
      const Batch eval = data.sample_eval(eval_batch, rng);
      model.set_training(false);
      const Batch part = run.local(eval);
      const float share = share_of(part, eval);
      const float mean = model.forward(part.tokens.data(), part.targets.data(), part.B, part.T);
      p.eval_loss = run.sum(share == 1 ? mean : mean * share);
      if (data.task() != Task::text) p.accuracy = run.accuracy(answers_right(model, part), eval.B);
      result.final_eval_loss = p.eval_loss;
      result.final_accuracy = p.accuracy;
    }
    result.final_loss = loss;
    result.steps = p.step;
    result.seconds = p.seconds;
    result.tokens_per_s = p.tokens_per_s;
    if (on_step && !on_step(p)) break;
  }
  model.set_training(was_training);
  return result;
}

}  // namespace qkv
