// `qkv bench train`: training throughput (tokens/s) and model FLOPs utilisation of one
// model shape, the whole step timed: forward, backward, clipping and AdamW.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli.h"
#include "qkv/targets.h"
#include "qkv/error.h"
#include "qkv/model.h"
#include "qkv/params.h"
#include "qkv/threads.h"
#include "qkv/train.h"
#include "yardsticks.h"

namespace qkv::cli {
namespace {

struct BenchTrainOptions {
  int64_t d_model = 256, layers = 4, heads = 4, context = 256, batch = 8, vocab = 50257;
  int64_t steps = 5;
  std::string style = "gpt2", dtype = "fp32";
  int threads = 0;
  bool json = false;
};

// The libraries running the products, e.g. "fp32 OpenBLAS 0.3.21 Cooperlake; bf16 oneDNN 2.6.3
// avx512_core_bf16".
std::string gemm_summary() {
  std::string s;
  for (const GemmLibraryInUse& g : gemm_libraries())
    s += (s.empty() ? "" : "; ") + g.products + " " + g.library + " " + g.version + " " + g.kernels;
  return s;
}

void bench_train(const BenchTrainOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  check(o.steps >= 1, "bench train: --steps must be >= 1, got ", o.steps);
  check(o.batch >= 1, "bench train: --batch must be >= 1, got ", o.batch);
  check(o.heads >= 1 && o.d_model % o.heads == 0, "bench train: --d-model ", o.d_model,
        " must be a multiple of --heads ", o.heads);
  ModelConfig c;
  c.vocab_size = o.vocab;
  c.context = o.context;
  c.d_model = o.d_model;
  c.n_layers = o.layers;
  c.n_heads = c.n_kv_heads = o.heads;
  c.d_head = o.d_model / o.heads;
  c.d_ff = 4 * o.d_model;
  if (o.style == "llama") use_llama_style(c);
  Model model(c, 1);
  const bool bf16 = o.dtype == "bf16";
  model.set_compute_type(bf16 ? TensorType::bf16 : TensorType::f32);
  AdamW optimizer(model);
  const int64_t B = o.batch, T = o.context;
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(o.vocab - 1));
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (auto& t : tokens) t = token(rng);
  for (auto& t : targets) t = token(rng);
  auto step = [&] {
    model.zero_grad();
    model.forward(tokens.data(), targets.data(), B, T);
    model.backward();
    clip_grad_norm(model, 1.0f);
    optimizer.update(model, 1e-4f);
  };
  step();  // warm-up: allocates the activations once
  std::vector<double> times;
  for (int64_t s = 0; s < o.steps; ++s) {
    const double t0 = detail::now_seconds();
    step();
    times.push_back(detail::now_seconds() - t0);
  }
  std::sort(times.begin(), times.end());
  const double seconds = times[times.size() / 2];
  const double rss = detail::peak_rss_mb();
  const double peak = detail::measure_fma_peak_gflops(num_threads());
  const double flops_per_token = training_flops_per_token(c, model.num_params(), T);
  const double tokens_per_s = B * T / seconds;
  const double mfu = tokens_per_s * flops_per_token / (peak * 1e9);
  // bf16 products also as a fraction of the bf16 dot-product peak (vdpbf16ps, bfdot) where
  // the CPU has one.
  const double bf16_peak = bf16 ? detail::measure_bf16_peak_gflops(num_threads()) : 0;
  nlohmann::json r = {{"benchmark", "train"},
                      {"d_model", c.d_model},
                      {"layers", c.n_layers},
                      {"heads", c.n_heads},
                      {"context", T},
                      {"batch", B},
                      {"vocab", c.vocab_size},
                      {"style", o.style},
                      {"dtype", o.dtype},
                      {"gemm", gemm_summary()},
                      {"parameters", model.num_params()},
                      {"threads", num_threads()},
                      {"target", current_target()},
                      {"ms_per_step", seconds * 1e3},
                      {"tokens_per_s", tokens_per_s},
                      {"flops_per_token", flops_per_token},
                      {"peak_gflops", peak},
                      {"mfu", mfu},
                      {"peak_rss_mb", rss}};
  if (bf16_peak > 0) {
    r["bf16_peak_gflops"] = bf16_peak;
    r["mfu_bf16"] = tokens_per_s * flops_per_token / (bf16_peak * 1e9);
  }
  if (!o.json)
    std::cout << "train step, " << model.num_params() << " parameters, batch " << B << " x " << T
              << ": " << seconds * 1e3 << " ms, " << static_cast<int64_t>(tokens_per_s)
              << " tokens/s, MFU " << 100 * mfu << "% of " << peak << " GFLOP/s"
              << (bf16_peak > 0 ? ", " + std::to_string(100 * r["mfu_bf16"].get<double>()) +
                                      "% of the bf16 peak " + std::to_string(bf16_peak)
                                : std::string())
              << "\n";
  std::cout << r.dump() << "\n";
}

}  // namespace

void add_bench_train(CLI::App& bench) {
  auto o = std::make_shared<BenchTrainOptions>();
  CLI::App* cmd = bench.add_subcommand("train", "Time training steps of one model shape");
  cmd->add_option("--d-model", o->d_model, "Width")->capture_default_str();
  cmd->add_option("--layers", o->layers, "Blocks")->capture_default_str();
  cmd->add_option("--heads", o->heads, "Heads")->capture_default_str();
  cmd->add_option("--context", o->context, "Sequence length")->capture_default_str();
  cmd->add_option("--batch", o->batch, "Sequences per step")->capture_default_str();
  cmd->add_option("--vocab", o->vocab, "Vocabulary")->capture_default_str();
  cmd->add_option("--style", o->style, "gpt2 or llama")
      ->capture_default_str()
      ->check(CLI::IsMember({"gpt2", "llama"}));
  cmd->add_option("--steps", o->steps, "Timed steps (median)")->capture_default_str();
  add_threads_option(*cmd, o->threads);
  cmd->add_option("--dtype", o->dtype,
                  "Products: fp32, or bf16 (mixed precision, fp32 weights and sums)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Only the JSON line");
  cmd->callback([o] { bench_train(*o); });
}

}  // namespace qkv::cli
