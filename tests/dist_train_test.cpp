// Data-parallel training against one process: every rank also trains the same model alone on
// the whole of the same global batches, and the two runs' losses and weights are compared.
// TrainedRun under mpirun with 1 to 4 ranks (tests/CMakeLists.txt).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "qkv/dist.h"
#include "qkv/error.h"

namespace qkv::dist {
namespace {

int rank_of() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int size_of() {
  int p = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}

ModelConfig tiny_config(const TaskData& data, bool llama) {
  ModelConfig c;
  c.vocab_size = data.vocab_size();
  c.context = data.seq_len();
  c.d_model = 32, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 4, c.d_head = 8, c.d_ff = 64;
  c.init_std = 0.15f;
  if (llama) use_llama_style(c), c.n_kv_heads = 2;
  return c;
}

TrainConfig config_of(int64_t steps, int64_t accum) {
  TrainConfig t;
  t.steps = steps, t.batch = 8, t.grad_accum = accum, t.warmup = 5, t.eval_every = 0;
  t.lr = 3e-3f, t.min_lr = 3e-4f, t.clip = 0.5f;  // a clip that bites: the norm is global
  return t;
}

struct TrainedRun {
  std::vector<float> losses, norms, weights;
};

enum Mode { alone_mode, dp_mode, zero1_mode, context_mode, context_zero1_mode };

// Trains a fresh model in one process, data-parallel or context-parallel (with ZeRO-1 or not).
TrainedRun train_run(const TaskData& data, const ModelConfig& mc, const TrainConfig& tc,
                     Mode mode) {
  Model model(mc, 7);
  AdamW opt(model);
  std::unique_ptr<StepRunner> dp;
  const bool zero1 = mode == zero1_mode || mode == context_zero1_mode;
  if (mode == dp_mode || mode == zero1_mode)
    dp = std::make_unique<DataParallel>(MPI_COMM_WORLD, model, opt, zero1);
  if (mode == context_mode || mode == context_zero1_mode)
    dp = std::make_unique<ContextParallel>(MPI_COMM_WORLD, model, opt, data.seq_len(), zero1);
  TrainedRun run;
  train(
      model, opt, data, tc, 0,
      [&](const TrainProgress& p) {
        run.losses.push_back(p.loss);
        run.norms.push_back(p.grad_norm);
        return true;
      },
      dp.get());
  run.weights.assign(model.weights(), model.weights() + model.num_params());
  return run;
}

double max_relative(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - b[i]) / std::max(1e-3, std::abs(double(b[i]))));
  return worst;
}

struct DPCase {
  const char* name;
  bool llama;
  int64_t accum;
  float dropout = 0;  // attention dropout: each rank draws its own rows' masks
};

void PrintTo(const DPCase& c, std::ostream* os) { *os << c.name; }

class DataParallelTraining : public ::testing::TestWithParam<DPCase> {};

TEST_P(DataParallelTraining, MatchesOneProcessAndRepeatsBitForBit) {
  const DPCase& c = GetParam();
  const TaskData data(Task::recall, 4, 12);
  ModelConfig mc = tiny_config(data, c.llama);
  mc.attn_dropout = c.dropout;
  const TrainConfig tc = config_of(50, c.accum);
  const TrainedRun alone = train_run(data, mc, tc, alone_mode);
  const TrainedRun dp = train_run(data, mc, tc, dp_mode);
  const TrainedRun again = train_run(data, mc, tc, dp_mode);
  const TrainedRun zero1 = train_run(data, mc, tc, zero1_mode);
  ASSERT_EQ(dp.losses.size(), 50u);
  // The losses, step by step, against one process on the whole batches.
  EXPECT_LE(max_relative(dp.losses, alone.losses), 1e-5) << "rank " << rank_of();
  EXPECT_LE(max_relative(dp.norms, alone.norms), 1e-4) << "rank " << rank_of();
  EXPECT_LT(alone.losses.back(), alone.losses.front());  // it learned something
  // The same bits on a second run with the same number of ranks.
  EXPECT_EQ(0, std::memcmp(dp.weights.data(), again.weights.data(), dp.weights.size() * 4));
  EXPECT_EQ(dp.losses, again.losses);
  // ZeRO-1 against plain data parallelism.
  EXPECT_LE(max_relative(zero1.losses, dp.losses), 1e-5);
  double dw = 0;
  for (size_t i = 0; i < dp.weights.size(); ++i)
    dw = std::max(dw, std::abs(double(zero1.weights[i]) - dp.weights[i]));
  EXPECT_LE(dw, 1e-4);
  // Every rank ends with the same weights.
  std::vector<float> first(dp.weights);
  MPI_Bcast(first.data(), static_cast<int>(first.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  EXPECT_EQ(0, std::memcmp(first.data(), dp.weights.data(), first.size() * 4));
}

INSTANTIATE_TEST_SUITE_P(Models, DataParallelTraining,
                         ::testing::Values(DPCase{"gpt2", false, 1}, DPCase{"llama_gqa", true, 1},
                                           DPCase{"accumulate", false, 2},
                                           DPCase{"dropout", false, 2, 0.1f}),
                         [](const auto& info) { return std::string(info.param.name); });

struct CPCase {
  const char* name;
  bool llama;
  PositionKind positions;
  int64_t window;
};

void PrintTo(const CPCase& c, std::ostream* os) { *os << c.name; }

class ContextParallelTraining : public ::testing::TestWithParam<CPCase> {};

// Each rank runs its zigzag positions of every sequence (copy: only the second half is
// scored, so the ranks' shares of the loss differ) with attention through the ring.
TEST_P(ContextParallelTraining, MatchesOneProcess) {
  const CPCase& c = GetParam();
  const TaskData data(Task::copy, 12, 10);  // 24 positions: 2P chunks for P = 1 … 4
  ModelConfig mc = tiny_config(data, c.llama);
  mc.positions = c.positions;
  mc.window = c.window;
  const TrainConfig tc = config_of(50, 1);
  const TrainedRun alone = train_run(data, mc, tc, alone_mode);
  const TrainedRun cp = train_run(data, mc, tc, context_mode);
  const TrainedRun again = train_run(data, mc, tc, context_mode);
  ASSERT_EQ(cp.losses.size(), 50u);
  EXPECT_LE(max_relative(cp.losses, alone.losses), 1e-5) << "rank " << rank_of();
  EXPECT_LE(max_relative(cp.norms, alone.norms), 1e-4) << "rank " << rank_of();
  EXPECT_LT(alone.losses.back(), alone.losses.front());
  EXPECT_EQ(0, std::memcmp(cp.weights.data(), again.weights.data(), cp.weights.size() * 4));
  const TrainedRun zero1 = train_run(data, mc, tc, context_zero1_mode);
  EXPECT_LE(max_relative(zero1.losses, alone.losses), 1e-5) << "rank " << rank_of();
}

INSTANTIATE_TEST_SUITE_P(
    Models, ContextParallelTraining,
    ::testing::Values(CPCase{"gpt2_learned", false, PositionKind::learned, 0},
                      CPCase{"llama_rotary_gqa", true, PositionKind::rotary, 0},
                      CPCase{"sinusoidal_window", false, PositionKind::sinusoidal, 5}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(ContextParallelErrors, SequenceThatDoesNotSplit) {
  const int P = size_of();
  const TaskData data(Task::copy, 12, 10);
  Model model(tiny_config(data, false), 3);
  AdamW opt(model);
  EXPECT_THROW(ContextParallel(MPI_COMM_WORLD, model, opt, 2 * P + 1, false), Error);
  ModelConfig alibi = tiny_config(data, false);
  alibi.positions = PositionKind::alibi;
  Model alibi_model(alibi, 3);
  AdamW alibi_opt(alibi_model);
  EXPECT_THROW(ContextParallel(MPI_COMM_WORLD, alibi_model, alibi_opt, 24, false), Error);
}

// ZeRO-1 keeps a 1/P slice of m and v on each rank, and gathers the whole state for a
// checkpoint: the same state as plain data parallelism's.
TEST(Zero1, ShardsTheStateAndGathersItWhole) {
  const int P = size_of();
  const TaskData data(Task::copy, 6, 10);
  const ModelConfig mc = tiny_config(data, false);
  const TrainConfig tc = config_of(6, 1);
  Model plain_model(mc, 3), zero_model(mc, 3);
  AdamW plain_opt(plain_model), zero_opt(zero_model);
  DataParallel plain(MPI_COMM_WORLD, plain_model, plain_opt, false);
  DataParallel zero(MPI_COMM_WORLD, zero_model, zero_opt, true);
  const auto [first, last] = zero.slice();
  EXPECT_EQ(static_cast<int64_t>(zero_opt.m.size()), last - first);
  EXPECT_NEAR(static_cast<double>(last - first), double(zero_model.num_params()) / P, 1.0);
  if (P > 1) {
    EXPECT_LT(zero.state_bytes(zero_model, zero_opt), plain.state_bytes(plain_model, plain_opt));
  }
  train(plain_model, plain_opt, data, tc, 0, nullptr, &plain);
  train(zero_model, zero_opt, data, tc, 0, nullptr, &zero);
  AdamW gathered(zero_model);
  zero.gather_optimizer(zero_opt, gathered);
  if (rank_of() == 0) {
    ASSERT_EQ(gathered.m.size(), plain_opt.m.size());
    EXPECT_EQ(gathered.step, plain_opt.step);
    double dm = 0, dv = 0;
    for (size_t i = 0; i < gathered.m.size(); ++i) {
      dm = std::max(dm, std::abs(double(gathered.m[i]) - plain_opt.m[i]));
      dv = std::max(dv, std::abs(double(gathered.v[i]) - plain_opt.v[i]));
    }
    EXPECT_LE(dm, 1e-6);
    EXPECT_LE(dv, 1e-8);
  }
}

TEST(DataParallelErrors, BatchSmallerThanRanks) {
  const int P = size_of();
  const TaskData data(Task::copy, 6, 10);
  Model model(tiny_config(data, false), 3);
  AdamW opt(model);
  DataParallel dp(MPI_COMM_WORLD, model, opt, false);
  if (P > 1) {
    try {
      Batch small;
      small.B = P - 1, small.T = 4;
      small.tokens.assign(small.B * 4, 0), small.targets.assign(small.B * 4, 0);
      dp.local(small);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--batch >= " + std::to_string(P)), std::string::npos)
          << e.what();
    }
  }
  Model inference(tiny_config(data, false), Model::InferenceOnly{});
  EXPECT_THROW(DataParallel(MPI_COMM_WORLD, inference, opt, false), Error);
}

}  // namespace
}  // namespace qkv::dist
