// Google Benchmark for the attention kernels: GFLOP/s per shape, with the reference kernel
// timed on the same shapes as the in-process peer (small shapes only: it materialises Tq × Tk).
//   build/release/bench/attention_bench --benchmark_filter=Forward
// `qkv bench attention` and bench/compare_torch.py give the fraction of peak and PyTorch.
#include <benchmark/benchmark.h>

#include <random>

#include "qkv/attention.h"
#include "qkv/tensor.h"

namespace {

struct Shape {
  int64_t heads, queries, seq, dim;
  bool causal;
};

struct Problem {
  qkv::Tensor q, k, v, out, lse, dout, dq, dk, dv;
  qkv::AttentionArgs args;
  explicit Problem(const Shape& s)
      : q({1, s.heads, s.queries, s.dim}),
        k({1, s.heads, s.seq, s.dim}),
        v({1, s.heads, s.seq, s.dim}),
        out({1, s.heads, s.queries, s.dim}),
        lse({1, s.heads, s.queries}),
        dout({1, s.heads, s.queries, s.dim}),
        dq({1, s.heads, s.queries, s.dim}),
        dk({1, s.heads, s.seq, s.dim}),
        dv({1, s.heads, s.seq, s.dim}) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> uniform(-1, 1);
    for (qkv::Tensor* t : {&q, &k, &v, &dout})
      for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = uniform(rng);
    args.q = q, args.k = k, args.v = v, args.out = out, args.lse = lse.data();
    args.mask.causal = s.causal;
  }
};

Shape shape_of(const benchmark::State& state) {
  return {8, state.range(0) == 0 ? state.range(1) : state.range(0), state.range(1), state.range(2),
          state.range(3) != 0};
}

// 4 · H · Tq · Tk · D for a full forward, half of that causal (Tq = Tk), as DESIGN.md counts.
double forward_flops(const Shape& s) {
  return 4.0 * s.heads * s.queries * s.seq * s.dim * (s.causal ? 0.5 : 1.0);
}

void report(benchmark::State& state, double flops) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

void Forward(benchmark::State& state) {
  const Shape s = shape_of(state);
  Problem p(s);
  for (auto _ : state) qkv::attention(p.args);
  report(state, forward_flops(s));
}

void ForwardBackward(benchmark::State& state) {
  const Shape s = shape_of(state);
  Problem p(s);
  for (auto _ : state) {
    qkv::attention(p.args);
    qkv::attention_backward(p.args, p.dout, p.dq, p.dk, p.dv);
  }
  report(state, 3.5 * forward_flops(s));
}

void Reference(benchmark::State& state) {
  const Shape s = shape_of(state);
  Problem p(s);
  for (auto _ : state) qkv::reference::attention(p.args);
  report(state, forward_flops(s));
}

// Args: queries (0 = seq), seq, dim, causal.
void Shapes(benchmark::internal::Benchmark* b) {
  for (int64_t dim : {64, 128})
    for (int64_t seq : {512, 2048})
      for (int64_t causal : {0, 1}) b->Args({0, seq, dim, causal});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(Forward)->Apply(Shapes);
BENCHMARK(ForwardBackward)->Apply(Shapes);
BENCHMARK(Reference)
    ->Args({0, 512, 64, 0})
    ->Args({0, 512, 64, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
// Decoding: one query against caches of 1k to 32k keys.
BENCHMARK(Forward)
    ->Args({1, 1024, 128, 0})
    ->Args({1, 4096, 128, 0})
    ->Args({1, 32768, 128, 0})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
