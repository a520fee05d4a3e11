// `qkv train`: train a small model on a synthetic task (the default: associative recall) or
// on the bytes of a text file, with a live progress line, checkpoints and a summary.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "parallel_job.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/params.h"
#include "qkv/threads.h"
#include "qkv/train.h"
#include "yardsticks.h"

namespace qkv::cli {
namespace {

using nlohmann::json;

std::atomic<bool> interrupted{false};
extern "C" void on_sigint(int) { interrupted = true; }

struct TrainOptions {
  std::string task = "recall", text, style = "gpt2", positions,
              checkpoint = "qkv-checkpoint.safetensors";
  std::string resume, size;
  int64_t items = 8, symbols = 16, seq = 128;
  TrainOptions() {
    train.steps = 1500;
    train.batch = 64;
    train.lr = 1e-3f;
  }
  int64_t d_model = 64, layers = 2, heads = 4, kv_heads = 0, d_ff = 0;
  int64_t save_every = 0;
  TrainConfig train;
  float weight_decay = 0.1f, init_std = 0;
  int threads = 0;
  bool json = false, quiet = false, sinks = false;
  float attn_dropout = 0;
  std::string dtype = "fp32";
  ParallelOptions parallel;
};

// Model sizes by name: width, blocks and heads (d_ff is 4 × width).
struct Size {
  const char* name;
  int64_t d_model, layers, heads;
};
constexpr Size kSizes[] = {
    {"tiny", 64, 2, 4},  // the recall model of the demo
    {"small", 128, 4, 4},
    {"medium", 256, 4, 4},  // the first shape of the training benchmark
    {"gpt2-small", 768, 12, 12},
};

// Sets width, layers and heads from --size, except those given by their own flags.
void apply_size(TrainOptions& o, const CLI::App& cmd) {
  if (o.size.empty()) return;
  std::string names;
  for (const Size& s : kSizes) {
    if (o.size == s.name) {
      if (!cmd.count("--d-model")) o.d_model = s.d_model;
      if (!cmd.count("--layers")) o.layers = s.layers;
      if (!cmd.count("--heads")) o.heads = s.heads;
      return;
    }
    names += (names.empty() ? "" : ", ") + std::string(s.name);
  }
  fail("train: unknown --size \"", o.size, "\"; choose ", names);
}

ModelConfig model_config(const TrainOptions& o, const TaskData& data) {
  ModelConfig c;
  c.vocab_size = data.vocab_size();
  c.context = data.seq_len();
  c.d_model = o.d_model;
  c.n_layers = o.layers;
  c.n_heads = o.heads;
  c.n_kv_heads = o.kv_heads > 0 ? o.kv_heads : o.heads;
  check(o.heads >= 1 && o.d_model % o.heads == 0, "train: --d-model ", o.d_model,
        " is not divisible by --heads ", o.heads);
  c.d_head = o.d_model / o.heads;
  c.d_ff = o.d_ff > 0 ? o.d_ff : 4 * o.d_model;
  // Fan-in scaled initial weights. GPT-2's 0.02 (≈ 1/sqrt(2500)) leaves a small model on the
  // plateau before attention learns to look things up: measured, 8-pair recall at d_model 64
  // was still at chance after 12,000 steps with 0.02, and at 99% after 500 with 0.1.
  c.init_std = o.init_std > 0 ? o.init_std : 1.0f / std::sqrt(static_cast<float>(o.d_model));
  if (o.style == "llama") use_llama_style(c);
  if (!o.positions.empty()) {
    bool found = false;
    for (PositionKind p : {PositionKind::learned, PositionKind::sinusoidal, PositionKind::rotary,
                           PositionKind::alibi, PositionKind::none})
      if (to_string(p) == o.positions) c.positions = p, found = true;
    check(found, "train: --positions must be learned, sinusoidal, rotary, alibi or none");
  }
  c.sinks = o.sinks;
  c.attn_dropout = o.attn_dropout;
  return c;
}

TaskData make_data(const TrainOptions& o) {
  if (!o.text.empty()) return TaskData(o.text, o.seq);
  if (o.task == "recall") return TaskData(Task::recall, o.items, o.symbols);
  if (o.task == "copy") return TaskData(Task::copy, o.items, o.symbols);
  if (o.task == "reverse") return TaskData(Task::reverse, o.items, o.symbols);
  fail("train: unknown --task \"", o.task, "\"; choose recall, copy or reverse (or --text FILE)");
}

void run_train(const TrainOptions& o, ParallelJob& job) {
  check_config(o.train);  // before the summary line: a bad option is the only output
  if (o.threads > 0) set_num_threads(o.threads);
  else if (job.default_threads() > 0) set_num_threads(job.default_threads());
  const TaskData data = make_data(o);
  std::unique_ptr<Model> model;
  std::unique_ptr<AdamW> optimizer;
  int64_t first_step = 0;
  if (!o.resume.empty()) {  // every rank reads the checkpoint: it holds the whole state
    Checkpoint ck = load_checkpoint(o.resume);
    check(ck.optimizer != nullptr, "train: ", o.resume, " holds no optimizer state to resume");
    model = std::move(ck.model);
    optimizer = std::move(ck.optimizer);
    first_step = ck.step;
  } else {  // the same seed on every rank: the same initial weights
    model = std::make_unique<Model>(model_config(o, data), o.train.seed);
    AdamWConfig ac = o.train.adamw;
    ac.weight_decay = o.weight_decay;
    optimizer = std::make_unique<AdamW>(*model, ac);
  }
  model->set_compute_type(o.dtype == "bf16" ? TensorType::bf16 : TensorType::f32);
  const std::unique_ptr<StepRunner> runner = job.runner(*model, *optimizer, data.seq_len());
  const bool root = job.rank() == 0;  // rank 0 prints and writes the checkpoints
  const bool quiet = o.quiet || !root;
  const ModelConfig& c = model->config();
  const bool tty = isatty(STDOUT_FILENO) && !o.json;
  std::ostream& log = o.json ? std::cerr : std::cout;
  if (!quiet) {
    log << "qkv train: " << data.describe() << "\n  model: " << c.n_layers << " layers, d_model "
        << c.d_model << ", " << c.n_heads << " heads, " << with_commas(model->num_params())
        << " parameters; batch " << o.train.batch << " x " << data.seq_len() << " tokens, "
        << o.train.steps << " steps" << (o.dtype == "bf16" ? ", bf16 products" : "")
        << (first_step ? ", resumed at step " + std::to_string(first_step) : "") << "\n";
    if (!job.describe().empty())
      log << "  " << job.describe() << ", " << num_threads() << " threads per rank; "
          << bytes_str(static_cast<double>(job.state_bytes(*model, *optimizer)))
          << " of weights, gradients and optimizer state per rank\n";
  }

  interrupted = false;
  std::signal(SIGINT, on_sigint);
  auto save = [&](int64_t step) {  // collective: a sharded optimizer is gathered first
    const AdamW& whole = job.optimizer_for_checkpoint(*optimizer);
    if (root) save_checkpoint(o.checkpoint, *model, &whole, step, {{"task", data.describe()}});
  };
  const TrainResult r = train(
      *model, *optimizer, data, o.train, first_step,
      [&](const TrainProgress& p) {
        if (!quiet && (tty || p.eval_loss >= 0 || p.step == p.steps)) {
          const double eta =
              p.seconds / std::max<int64_t>(1, p.step - first_step) * (p.steps - p.step);
          char line[256];
          std::snprintf(line, sizeof line,
                        "step %5ld/%ld  loss %.4f  lr %.2e  %.0f tok/s  ETA %.0fs",
                        static_cast<long>(p.step), static_cast<long>(p.steps), p.loss, p.lr,
                        p.tokens_per_s, eta);
          std::string text = line;
          if (p.eval_loss >= 0) {
            std::snprintf(line, sizeof line, "  eval loss %.4f", p.eval_loss);
            text += line;
          }
          if (p.accuracy >= 0) {
            std::snprintf(line, sizeof line, "  accuracy %.1f%%", 100 * p.accuracy);
            text += line;
          }
          if (tty) log << "\r\033[K" << text << (p.eval_loss >= 0 ? "\n" : "") << std::flush;
          else log << text << "\n";
        }
        if (o.save_every > 0 && p.step % o.save_every == 0) save(p.step);
        return !job.any(interrupted);  // every rank stops at the same step
      },
      runner.get());
  std::signal(SIGINT, SIG_DFL);
  save(r.steps);

  // MFU: training FLOPs over the fp32 FMA peak measured now (every rank at once, summed).
  const double peak = job.sum(detail::measure_fma_peak_gflops(num_threads(), 0.1));
  const double flops_per_token = training_flops_per_token(c, model->num_params(), data.seq_len());
  const double mfu = r.tokens_per_s * flops_per_token / (peak * 1e9);
  if (!root) return;
  json summary = {{"final_loss", r.final_loss},
                  {"steps", r.steps},
                  {"tokens_per_s", r.tokens_per_s},
                  {"seconds", r.seconds},
                  {"mfu", mfu},
                  {"peak_gflops", peak},
                  {"parameters", model->num_params()},
                  {"dtype", o.dtype},
                  {"checkpoint", o.checkpoint},
                  {"interrupted", interrupted.load()},
                  {"ranks", job.size()},
                  {"state_bytes_per_rank", job.state_bytes(*model, *optimizer)}};
  for (const auto& [name, value] : job.communication()) summary[name] = value;  // rank 0's
  summary["final_eval_loss"] = r.final_eval_loss >= 0 ? json(r.final_eval_loss) : json(nullptr);
  summary["final_accuracy"] = r.final_accuracy >= 0 ? json(r.final_accuracy) : json(nullptr);
  if (!o.quiet) {
    log << (interrupted ? "interrupted: " : "done: ") << r.steps << " steps, final loss "
        << r.final_loss;
    if (r.final_accuracy >= 0)
      log << ", accuracy " << 100 * r.final_accuracy << "% on held-out examples";
    log << ", " << static_cast<int64_t>(r.tokens_per_s) << " tokens/s, MFU " << 100 * mfu
        << "%\n  checkpoint: " << o.checkpoint << "\n";
  }
  if (o.json) std::cout << summary.dump() << "\n";
}

// In an MPI job an error on one rank ends them all, with its message.
void run_train(const TrainOptions& o) {
  const std::unique_ptr<ParallelJob> job = ParallelJob::start(o.parallel);
  if (job->size() == 1 && job->describe().empty()) return run_train(o, *job);
  try {
    run_train(o, *job);
  } catch (const std::exception& e) {
    job->fail_job(e.what());
  }
}

}  // namespace

void add_train(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  CLI::App* cmd =
      app.add_subcommand("train", "Train a small transformer (default: associative recall)");
  cmd->add_option("--task", o->task, "recall, copy or reverse")->capture_default_str();
  cmd->add_option("--text", o->text, "Train on the bytes of this file instead");
  cmd->add_option("--items", o->items, "Key-value pairs (recall) or symbols to copy")
      ->capture_default_str();
  cmd->add_option("--symbols", o->symbols, "Alphabet size of the synthetic tasks")
      ->capture_default_str();
  cmd->add_option("--seq", o->seq, "Sequence length for --text")->capture_default_str();
  cmd->add_option("--style", o->style,
                  "gpt2 (LayerNorm, GELU, learned positions) or llama (RMSNorm, SwiGLU, rotary)")
      ->capture_default_str()
      ->check(CLI::IsMember({"gpt2", "llama"}));
  cmd->add_option("--positions", o->positions,
                  "Override: learned, sinusoidal, rotary, alibi, none");
  cmd->add_flag("--sinks", o->sinks, "A learned attention-sink logit per head and layer (gpt-oss)");
  cmd->add_option("--attn-dropout", o->attn_dropout,
                  "Attention dropout p while training (GPT-2: 0.1); 0 = none")
      ->capture_default_str();
  cmd->add_option("--size", o->size,
                  "tiny, small, medium or gpt2-small (sets width, layers, heads)");
  cmd->add_option("--d-model", o->d_model, "Embedding width")->capture_default_str();
  cmd->add_option("--layers", o->layers, "Blocks")->capture_default_str();
  cmd->add_option("--heads", o->heads, "Query heads")->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads, "Key/value heads (GQA); default = heads");
  cmd->add_option("--d-ff", o->d_ff, "MLP width; default 4 d_model");
  cmd->add_option("--init-std", o->init_std, "Std of the initial weights; default 1/sqrt(d_model)");
  cmd->add_option("--steps", o->train.steps, "Optimizer steps")->capture_default_str();
  cmd->add_option("--batch", o->train.batch, "Sequences per micro-batch")->capture_default_str();
  cmd->add_option("--grad-accum", o->train.grad_accum, "Micro-batches per step")
      ->capture_default_str();
  cmd->add_option("--lr", o->train.lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--min-lr", o->train.min_lr, "Final learning rate (cosine)")
      ->capture_default_str();
  cmd->add_option("--warmup", o->train.warmup, "Warmup steps")->capture_default_str();
  cmd->add_option("--clip", o->train.clip, "Gradient-norm clip (0 = off)")->capture_default_str();
  cmd->add_option("--weight-decay", o->weight_decay, "AdamW weight decay")->capture_default_str();
  cmd->add_option("--seed", o->train.seed, "Seed of weights and data")->capture_default_str();
  cmd->add_option("--eval-every", o->train.eval_every, "Steps between evaluations")
      ->capture_default_str();
  cmd->add_option("--checkpoint", o->checkpoint, "Where to save")->capture_default_str();
  cmd->add_option("--save-every", o->save_every, "Also save every N steps (0 = only at the end)");
  cmd->add_option("--resume", o->resume, "Continue from this checkpoint (same data flags)");
  cmd->add_flag(
      "--context-parallel", o->parallel.context_parallel,
      "Under mpirun: split each sequence across the ranks (ring attention) instead of the batch");
  cmd->add_flag("--zero1", o->parallel.zero1,
                "Under mpirun: shard the optimizer state across the ranks (ZeRO-1)");
  add_threads_option(*cmd, o->threads);
  cmd->add_option("--dtype", o->dtype,
                  "Products: fp32, or bf16 (mixed precision: operands rounded to bf16, sums, "
                  "weights and optimizer state fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_flag("--quiet", o->quiet, "No progress lines");
  cmd->add_flag("--json", o->json, "Summary as one JSON line on stdout (progress to stderr)");
  cmd->callback([o, cmd] {
    apply_size(*o, *cmd);
    run_train(*o);
  });
}

}  // namespace qkv::cli
