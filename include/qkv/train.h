// Training: AdamW, gradient clipping, warmup + cosine schedule, and the data to train on —
// byte-level text from any file and synthetic tasks that need attention (copy, reverse,
// associative recall), so training works on a fresh machine with no data at all.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "qkv/model.h"

namespace qkv {

// ---- optimizer -----------------------------------------------------------------------------
struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;  // decoupled (Loshchilov & Hutter 2019); matrices only
};

// AdamW over a model's flat buffers. m and v live here; `step` counts updates.
// m and v cover the parameters [shard_begin, shard_begin + m.size()): all of them, or one
// rank's shard when the optimizer state is split across ranks (ZeRO-1, qkv::dist).
struct AdamW {
  AdamWConfig config;
  std::vector<float> m, v;
  int64_t step = 0;
  int64_t shard_begin = 0;
  AdamW(const Model& model, AdamWConfig config = {});
  // Updates the parameters its state covers (all, or its shard).
  void update(Model& model, float lr);
  // Keeps only the state of parameters [begin, end).
  void keep_shard(int64_t begin, int64_t end);
};

// Scales the gradients so their global L2 norm is at most max_norm; returns the norm before.
float clip_grad_norm(Model& model, float max_norm);
// The same over gradients g[0, n) whose squared norm is already known (a shard of them).
float clip_grads(float* g, int64_t n, double squared_norm, float max_norm);

// Linear warmup over `warmup` steps to max_lr, then cosine decay to min_lr at `total`.
float learning_rate(int64_t step, int64_t total, int64_t warmup, float max_lr, float min_lr);

// ---- data ----------------------------------------------------------------------------------
enum class Task { recall, copy, reverse, text };

// A batch [B, T]: tokens, and targets (kIgnoreIndex where a position is not scored).
struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> tokens, targets;
  int64_t first = 0;  // the row of the whole batch that row 0 is (a data-parallel rank's share)
};

// Makes batches for one task. Synthetic tasks:
//   recall:  k1 v1 … kn vn ? q1 a1 … qm am  → predict each answer a = value of key q
//            (n key/value pairs with distinct keys, m = n/2 questions)
//   copy:    x1 … xn | x1 … xn         → predict the second half
//   reverse: x1 … xn | xn … x1         → predict the second half
// text: windows of a byte file (vocab 256), predict the next byte everywhere.
class TaskData {
 public:
  // `items` is n (pairs for recall, symbols for copy/reverse); `symbols` the alphabet size.
  TaskData(Task task, int64_t items = 8, int64_t symbols = 16);
  TaskData(const std::string& text_file, int64_t seq_len);  // Task::text
  Task task() const { return task_; }
  int64_t vocab_size() const;
  int64_t seq_len() const;
  Batch sample(int64_t batch, std::mt19937_64& rng) const;
  // Held-out text: the last 10% of the file is kept for evaluation.
  Batch sample_eval(int64_t batch, std::mt19937_64& rng) const;
  std::string describe() const;

 private:
  Task task_;
  int64_t items_ = 8, symbols_ = 16, text_seq_ = 0;
  std::vector<uint8_t> text_;
};

// Exact-match accuracy of a synthetic task's answers: the fraction of sequences whose every
// scored position is predicted (argmax) right.
double answer_accuracy(Model& model, const Batch& batch);
// Per sequence: 1 when every scored position is predicted right (or none is scored).
std::vector<uint8_t> answers_right(Model& model, const Batch& batch);

// ---- the loop ------------------------------------------------------------------------------
struct TrainConfig {
  int64_t steps = 2000, batch = 32, grad_accum = 1, warmup = 100, eval_every = 200;
  float lr = 1e-3f, min_lr = 1e-4f, clip = 1.0f;
  uint64_t seed = 1;
  AdamWConfig adamw;
};

struct TrainProgress {
  int64_t step = 0, steps = 0;
  float loss = 0, lr = 0, grad_norm = 0;
  double tokens_per_s = 0, seconds = 0;
  double eval_loss = -1, accuracy = -1;  // at evaluation steps (accuracy: synthetic tasks)
};

struct TrainResult {
  float final_loss = 0;
  double final_eval_loss = -1, final_accuracy = -1, tokens_per_s = 0, seconds = 0;
  int64_t steps = 0;
};

// Where each step's work runs: in this process (the default), or split across the ranks of
// an MPI job (qkv::dist: DataParallel gives each rank a share of every batch's sequences,
// ContextParallel a share of every sequence's positions). train() draws the same global
// batches either way; the runner says which part this process runs, sums across processes,
// and makes the optimizer step.
class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // The part of a global batch that this process runs.
  virtual Batch local(const Batch& global) const { return global; }
  // The sum of x over the processes (the step's loss).
  virtual float sum(float x) { return x; }
  // The fraction of a global batch's B sequences answered right, from answers_right() of
  // this process's part.
  virtual double accuracy(const std::vector<uint8_t>& right, int64_t B) {
    return double(std::count(right.begin(), right.end(), 1)) / B;
  }
  // Gradients summed over the processes, clipped to max_norm (0 = off), then the optimizer
  // step at learning rate lr. Returns the norm before clipping.
  virtual float update(Model& model, AdamW& optimizer, float max_norm, float lr);
};

// Throws qkv::Error naming the first field out of range (steps, batch, grad_accum, warmup,
// the learning rates, clip); train() calls it first.
void check_config(const TrainConfig& config);

// Trains `model` on `data`; calls on_step after each step (return false to stop early).
// `runner`: null for one process.
TrainResult train(Model& model, AdamW& optimizer, const TaskData& data, const TrainConfig& config,
                  int64_t first_step, const std::function<bool(const TrainProgress&)>& on_step,
                  StepRunner* runner = nullptr);

}  // namespace qkv
