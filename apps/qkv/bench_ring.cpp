// `mpirun --bind-to none -np P qkv bench ring`: ring attention over P ranks (1 thread each by
// default) against one process with P threads on the same whole sequence, timed in the same run;
// the fraction of the ring's communication hidden behind compute; GFLOP/s and the fraction of the
// FMA peak of all ranks together, measured in the same run.
//
// Communication alone is timed by the same ring transfers with no compute between them. What
// compute did not hide is the ring's wait (MPI_Waitall after each step's compute) plus the
// time inside MPI's progress calls between kernel calls (on one machine the copies run there,
// on the computing core): hidden = 1 − (wait + progress) / alone.
#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

#include "cli.h"
#include "qkv/dist.h"
#include "qkv/error.h"
#include "qkv/targets.h"
#include "qkv/threads.h"
#include "yardsticks.h"

namespace qkv::cli {
namespace {

using nlohmann::json;

struct RingBenchOptions {
  int64_t batch = 1, heads = 8, kv_heads = 0, seq = 8192, dim = 64;
  bool causal = false, backward = false, json = false, contiguous = false;
  int window = -1, threads = 1;
  int repeats = 5;
  double min_time = 1.0;
};

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

// Waits for every rank without spinning (MPI_Barrier polls, and would take the core from the
// one process timed on rank 0).
void idle_barrier(MPI_Comm comm) {
  MPI_Request r;
  MPI_Ibarrier(comm, &r);
  for (int done = 0;;) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (done) return;
    usleep(500);
  }
}

// The slowest rank's value: the ring is as fast as its slowest rank.
double max_over(double x, MPI_Comm comm) {
  double m = 0;
  MPI_Allreduce(&x, &m, 1, MPI_DOUBLE, MPI_MAX, comm);
  return m;
}

void bench_ring(const RingBenchOptions& o) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) MPI_Init(nullptr, nullptr);
  const MPI_Comm comm = MPI_COMM_WORLD;
  int rank = 0, P = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &P);
  try {
    set_num_threads(o.threads);
    const int64_t B = o.batch, Hq = o.heads, Hkv = o.kv_heads > 0 ? o.kv_heads : o.heads;
    const int64_t T = o.seq, D = o.dim;
    const dist::Sharding s{T, P, o.contiguous ? dist::Layout::contiguous : dist::Layout::zigzag};
    s.validate("bench ring");
    const int64_t Tl = s.local_len();

    // The whole problem on every rank (for the one-process run and the shards).
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> uniform(-1, 1);
    Tensor q({B, Hq, T, D}), k({B, Hkv, T, D}), v({B, Hkv, T, D}), out({B, Hq, T, D});
    Tensor lse({B, Hq, T}), dout({B, Hq, T, D}), dq({B, Hq, T, D}), dk({B, Hkv, T, D}),
        dv({B, Hkv, T, D});
    for (Tensor* t : {&q, &k, &v, &dout})
      for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = uniform(rng);
    AttentionArgs full{.q = q, .k = k, .v = v, .out = out, .lse = lse.data()};
    full.mask.causal = o.causal;
    full.mask.window_left = o.window;

    Tensor lq({B, Hq, Tl, D}), lk({B, Hkv, Tl, D}), lv({B, Hkv, Tl, D}), lout({B, Hq, Tl, D});
    Tensor llse({B, Hq, Tl}), ldout({B, Hq, Tl, D}), ldq({B, Hq, Tl, D}), ldk({B, Hkv, Tl, D}),
        ldv({B, Hkv, Tl, D});
    dist::shard(q, lq, 2, s, rank);
    dist::shard(k, lk, 2, s, rank);
    dist::shard(v, lv, 2, s, rank);
    dist::shard(dout, ldout, 2, s, rank);
    AttentionArgs local = full;
    local.q = lq, local.k = lk, local.v = lv, local.out = lout, local.lse = llse.data();

    // Work: the (query, key) pairs the mask leaves visible in the whole sequence.
    AttentionArgs one = full;  // one sequence's pairs, times B
    one.q = full.q.slice(0, 0, 1), one.k = full.k.slice(0, 0, 1);
    const double pairs = visible_pairs(one);
    const double forward_flops = 4.0 * D * B * Hq * pairs;
    const double flops = o.backward ? 3.5 * forward_flops : forward_flops;

    // 1. The ring, every rank at once.
    auto ring_call = [&](dist::RingStats* st) {
      dist::ring_attention(local, s, comm, st);
      if (o.backward) dist::ring_attention_backward(local, ldout, ldq, ldk, ldv, s, comm, st);
    };
    ring_call(nullptr);  // warm-up
    // At least --repeats calls and --min-time seconds; medians over calls of the slowest
    // rank's time, kernel time, wait and progress (a VM's hiccups stay out of the medians).
    std::vector<double> ring_times, waits, progresses, computes, fastest_computes;
    const double bench_start = detail::now_seconds();
    // Every rank must agree on when to stop: rank 0 decides and tells the others.
    for (int r = 0, more = 1; more; ++r) {
      MPI_Barrier(comm);
      dist::RingStats st;
      const double t0 = detail::now_seconds();
      ring_call(&st);
      ring_times.push_back(max_over(detail::now_seconds() - t0, comm));
      waits.push_back(max_over(st.wait_seconds, comm));
      progresses.push_back(max_over(st.progress_seconds, comm));
      computes.push_back(max_over(st.compute_seconds, comm));
      fastest_computes.push_back(-max_over(-st.compute_seconds, comm));
      more = r + 1 < o.repeats || detail::now_seconds() - bench_start < o.min_time;
      MPI_Bcast(&more, 1, MPI_INT, 0, comm);
    }
    const double ring_s = median(ring_times);
    const double wait_s = median(waits), progress_s = median(progresses);
    const double compute_s = median(computes), min_compute_s = median(fastest_computes);

    // 2. Communication alone: the same transfers (the K/V block P − 1 times forward; with the
    //    backward, the K/V ring again and the gradient ring's P hops), nothing between them.
    const int64_t block = B * Hkv * Tl * 2 * D;
    std::vector<float> send(block, 1.0f), recv(block);
    const int hops = P == 1 ? 0 : (o.backward ? 2 * (P - 1) + P : P - 1);
    std::vector<double> comm_times;
    for (size_t r = 0; r < ring_times.size(); ++r) {
      MPI_Barrier(comm);
      const double t0 = detail::now_seconds();
      for (int h = 0; h < hops; ++h)
        MPI_Sendrecv(send.data(), static_cast<int>(block), MPI_FLOAT, (rank + 1) % P, 5,
                     recv.data(), static_cast<int>(block), MPI_FLOAT, (rank + P - 1) % P, 5, comm,
                     MPI_STATUS_IGNORE);
      comm_times.push_back(max_over(detail::now_seconds() - t0, comm));
    }
    const double comm_s = median(comm_times);
    const double bytes_per_rank = 4.0 * block * hops;

    // 3. FMA peak of every rank's threads at once, summed: the ranks' combined yardstick.
    double peak = detail::measure_fma_peak_gflops(o.threads, 0.2), total_peak = 0;
    MPI_Allreduce(&peak, &total_peak, 1, MPI_DOUBLE, MPI_SUM, comm);

    // 4. One process with P × threads on the whole sequence (rank 0; the others sleep).
    double one_s = 0, one_peak = 0, max_err = 0;
    int rank0_cpus = 0;
    if (rank == 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      if (sched_getaffinity(0, sizeof set, &set) == 0) rank0_cpus = CPU_COUNT(&set);
      if (rank0_cpus > 0 && rank0_cpus < P * o.threads)
        std::cerr << "qkv bench ring: rank 0 may run on " << rank0_cpus << " CPU(s), too few for "
                  << "the one-process run's " << P * o.threads << " threads: Open MPI binds "
                  << "ranks to cores; run mpirun with --bind-to none\n";
      set_num_threads(P * o.threads);
      auto one = [&] {
        attention(full);
        if (o.backward) attention_backward(full, dout, dq, dk, dv);
      };
      one();
      std::vector<double> times;
      for (int r = 0; r < o.repeats; ++r) {
        const double t0 = detail::now_seconds();
        one();
        times.push_back(detail::now_seconds() - t0);
      }
      one_s = median(times);
      one_peak = detail::measure_fma_peak_gflops(P * o.threads, 0.2);
      set_num_threads(o.threads);
    }
    idle_barrier(comm);
    if (rank == 0) {  // the ring's answers against the one process's, at rank 0's rows
      Tensor want({B, Hq, Tl, D});
      dist::shard(out, want, 2, s, rank);
      for (int64_t i = 0; i < want.numel(); ++i)
        max_err = std::max<double>(max_err, std::abs(want.data()[i] - lout.data()[i]));
    }
    MPI_Bcast(&one_s, 1, MPI_DOUBLE, 0, comm);
    MPI_Bcast(&one_peak, 1, MPI_DOUBLE, 0, comm);

    if (rank == 0) {
      const double hidden =
          comm_s > 0 ? std::clamp(1 - (wait_s + progress_s) / comm_s, 0.0, 1.0) : 1.0;
      json result = {{"benchmark", "ring"},
                     {"ranks", P},
                     {"threads_per_rank", o.threads},
                     {"batch", B},
                     {"heads", Hq},
                     {"kv_heads", Hkv},
                     {"seq", T},
                     {"dim", D},
                     {"causal", o.causal},
                     {"window", o.window},
                     {"layout", o.contiguous ? "contiguous" : "zigzag"},
                     {"backward", o.backward},
                     {"target", current_target()},
                     {"ring_ms", ring_s * 1e3},
                     {"ring_gflops", flops / ring_s / 1e9},
                     {"ring_fraction_of_peak", flops / ring_s / 1e9 / total_peak},
                     {"peak_gflops_all_ranks", total_peak},
                     {"one_process_ms", one_s * 1e3},
                     {"rank0_cpus", rank0_cpus},
                     {"one_process_gflops", flops / one_s / 1e9},
                     {"one_process_fraction_of_peak", flops / one_s / 1e9 / one_peak},
                     {"one_process_peak_gflops", one_peak},
                     {"speed_vs_one_process", one_s / ring_s},
                     {"compute_ms_slowest_rank", compute_s * 1e3},
                     {"compute_ms_fastest_rank", min_compute_s * 1e3},
                     {"wait_ms", wait_s * 1e3},
                     {"progress_ms", progress_s * 1e3},
                     {"comm_alone_ms", comm_s * 1e3},
                     {"bytes_sent_per_rank", bytes_per_rank},
                     {"loopback_gbps", comm_s > 0 ? bytes_per_rank / comm_s / 1e9 : 0.0},
                     {"hidden_fraction", hidden},
                     {"max_abs_err_vs_one_process_rank0", max_err}};
      if (!o.json) {
        std::cout << std::fixed << std::setprecision(2) << "ring attention"
                  << (o.backward ? " forward + backward" : "") << ": " << P << " ranks x "
                  << o.threads << " thread(s), B=" << B << " Hq=" << Hq << " Hkv=" << Hkv
                  << " T=" << T << " D=" << D << (o.causal ? " causal" : "") << ", "
                  << (o.contiguous ? "contiguous" : "zigzag") << ", SIMD target "
                  << current_target() << "\n"
                  << "  ring:        " << ring_s * 1e3 << " ms, " << flops / ring_s / 1e9
                  << " GFLOP/s = " << 100 * flops / ring_s / 1e9 / total_peak
                  << "% of the ranks' FMA peak (" << total_peak << " GFLOP/s)\n"
                  << "  one process: " << one_s * 1e3 << " ms with " << P * o.threads
                  << " threads, " << flops / one_s / 1e9 << " GFLOP/s; the ring is "
                  << one_s / ring_s << "x its speed\n"
                  << "  communication: " << comm_s * 1e3 << " ms alone (" << bytes_per_rank / 1e6
                  << " MB per rank); not hidden: " << wait_s * 1e3 << " ms waiting + "
                  << progress_s * 1e3 << " ms in MPI progress calls: " << 100 * hidden
                  << "% hidden behind compute\n"
                  << std::scientific << "  max |out − one process's| (rank 0's rows): " << max_err
                  << std::fixed << "\n";
      }
      std::cout << result.dump() << "\n";
    }
  } catch (const std::exception& e) {
    dist::abort_job(comm, e.what());
  }
  if (!initialized) MPI_Finalize();
}

}  // namespace

void add_bench_ring(CLI::App& bench) {
  auto o = std::make_shared<RingBenchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "ring", "Ring attention under mpirun against one process with as many threads");
  cmd->add_option("--batch", o->batch, "Batch size")->capture_default_str();
  cmd->add_option("--heads", o->heads, "Query heads")->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads, "Key/value heads (GQA/MQA); default = heads");
  cmd->add_option("--seq", o->seq, "Positions of the whole sequence")->capture_default_str();
  cmd->add_option("--dim", o->dim, "Head dim")->capture_default_str();
  cmd->add_flag("--causal", o->causal, "Causal mask");
  cmd->add_option("--window", o->window, "Sliding window: keys at most N positions back");
  cmd->add_flag("--contiguous", o->contiguous, "Contiguous shards instead of zigzag");
  cmd->add_flag("--backward", o->backward, "Time forward + backward (counted as 3.5 forwards)");
  cmd->add_option("--threads", o->threads, "Threads per rank")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--repeats", o->repeats, "At least this many timed calls (medians)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--min-time", o->min_time, "And at least this many seconds of them")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print only the JSON result line");
  cmd->callback([o] { bench_ring(*o); });
}

}  // namespace qkv::cli
