// parallel_for: a loop split over threads, with no OpenMP region at all when it runs on one
// thread. libgomp builds and wakes a team for every parallel region, even a one-thread one (a
// memalign and a futex wake each): a small model's decoding step, ~50 regions per token, spent
// a third of its time there.
//
// A team already running (run_team) is the shape for one region per token: every thread of
// the team runs the same code, and each parallel_for it reaches splits its loop over the team
// (a worksharing loop: no region opened, one barrier at its end); team_serial runs a piece on
// one thread of it, and team_scratch gives the team one buffer. Outside a team each behaves as
// it always has. Inside one, every thread must make the same calls in the same order, and
// nothing may throw (an exception cannot leave an OpenMP region): validate before the team.
// The kernels that are ready for a team: the weight products (quant::linear_forward, the fp32
// gemv and GEMM), attention's forward and split-KV decoding (over views or a stored cache;
// packed sequences run on one thread of the team), the norms, rotary positions and activations.
// A decoded token's layers run in one team (src/model/inference.cpp, decode_in_team).
#pragma once

#include <omp.h>

#include <atomic>
#include <cstdint>

namespace qkv::detail {

// How often the threads synchronise (`qkv bench generate` reports both per token): regions
// opened (each a fork and a join), and barriers, a region's join among them, counted once per
// barrier by the thread that opened the region or by a team's first thread.
struct SyncCounts {
  std::atomic<int64_t> regions{0}, barriers{0};
};
inline SyncCounts sync_counts;
inline void count_region() {
  sync_counts.regions.fetch_add(1, std::memory_order_relaxed);
  sync_counts.barriers.fetch_add(1, std::memory_order_relaxed);
}
inline void count_team_barrier() {
  if (omp_get_thread_num() == 0) sync_counts.barriers.fetch_add(1, std::memory_order_relaxed);
}

// Whether this thread runs inside a team's code (and not inside one of its loops' bodies).
inline thread_local bool tl_in_team = false;
inline bool in_team() { return tl_in_team; }
// Which team this thread runs in (each run_team a new number): the team's shared buffers
// (team_scratch, util/scratch.h) are remembered per team.
inline std::atomic<uint64_t> team_count{0};
inline thread_local uint64_t tl_team = 0;

// Clears in_team while a loop body runs: calls the body makes run on its thread alone, as a
// nested region would.
struct OutsideTeam {
  bool was = tl_in_team;
  OutsideTeam() { tl_in_team = false; }
  ~OutsideTeam() { tl_in_team = was; }
};

// body() on this thread by itself; inside a team on every thread of it, each writing buffers
// of its own (a row's norm or activation: cheaper done by each thread than shared through a
// barrier). Outside a team it is body(), its loops split as usual.
template <class Body>
inline void alone(Body&& body) {
  OutsideTeam outside;
  body();
}

// body() on each of `threads` threads of one region, as a team (inside a team: on each thread
// of that one, which every one of them calls this from).
template <class Body>
inline void run_team(int threads, Body&& body) {
  if (in_team()) return body();
  count_region();
  const uint64_t team = team_count.fetch_add(1, std::memory_order_relaxed) + 1;
#pragma omp parallel num_threads(threads)
  {
    tl_team = team;
    tl_in_team = true;
    body();
    tl_in_team = false;
  }
}

// body() once: inside a team on one of its threads, the others waiting at its end.
template <class Body>
inline void team_serial(Body&& body) {
  if (!in_team()) return body();
  count_team_barrier();
#pragma omp single
  {
    OutsideTeam outside;
    body();
  }
}

enum class Schedule { even, dynamic };  // equal shares in order, or one index at a time

// body(i) for i in [0, n) on `threads` threads (inside a team: on the team, whatever `threads`
// says but 1). Each index runs on one thread, so what a body writes alone does not depend on
// the thread count.
template <Schedule kSchedule = Schedule::even, class Body>
inline void parallel_for(int64_t n, int threads, Body&& body) {
  if (in_team()) {
    if (threads <= 1 || n <= 1)
      return team_serial([&] {
        for (int64_t i = 0; i < n; ++i) body(i);
      });
    count_team_barrier();
    OutsideTeam outside;
    if constexpr (kSchedule == Schedule::even) {
#pragma omp for schedule(static)
      for (int64_t i = 0; i < n; ++i) body(i);
    } else {
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < n; ++i) body(i);
    }
    return;
  }
  if (threads <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  count_region();
  if constexpr (kSchedule == Schedule::even) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; ++i) body(i);
  } else {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t i = 0; i < n; ++i) body(i);
  }
}

}  // namespace qkv::detail
