// ParallelJob over MPI: `mpirun -np P qkv train …` trains data-parallel (or, with
// --context-parallel, context-parallel) on P ranks; rank 0 prints and writes checkpoints.
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "parallel_job.h"
#include "qkv/dist.h"
#include "qkv/error.h"

namespace qkv::cli {
namespace {

// Launchers say so in the environment: Open MPI's mpirun, PMI (MPICH, Slurm), PMIx.
bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(name)) return true;
  return false;
}

class MpiJob : public ParallelJob {
 public:
  explicit MpiJob(const ParallelOptions& options) : options_(options) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;  // OpenMP threads run the kernels; only the main thread calls MPI
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      owns_mpi_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &ranks_per_node_);
    MPI_Comm_free(&node);
  }
  ~MpiJob() override {
    runner_ = nullptr, context_ = nullptr;
    if (owns_mpi_) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int default_threads() const override {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return std::max(1, cores / ranks_per_node_);
  }
  std::unique_ptr<StepRunner> runner(Model& model, AdamW& optimizer, int64_t seq_len) override {
    if (options_.context_parallel) {
      auto r = std::make_unique<dist::ContextParallel>(MPI_COMM_WORLD, model, optimizer, seq_len,
                                                       options_.zero1);
      context_ = r.get();
      runner_ = &r->exchange();
      return r;
    }
    auto r = std::make_unique<dist::DataParallel>(MPI_COMM_WORLD, model, optimizer, options_.zero1);
    runner_ = r.get();
    return r;
  }
  const AdamW& optimizer_for_checkpoint(const AdamW& mine) override {
    if (!runner_ || !runner_->zero1()) return mine;
    if (!gathered_) gathered_ = std::make_unique<AdamW>(mine);  // resized by the gather
    runner_->gather_optimizer(mine, *gathered_);
    return *gathered_;
  }
  bool any(bool flag) override {
    int mine = flag, all = 0;
    dist::check_mpi(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD),
                    "MPI_Allreduce");
    return all != 0;
  }
  double sum(double x) override { return dist::sum_over_ranks(MPI_COMM_WORLD, x); }
  int64_t state_bytes(const Model& model, const AdamW& optimizer) const override {
    return runner_ ? runner_->state_bytes(model, optimizer)
                   : ParallelJob::state_bytes(model, optimizer);
  }
  [[noreturn]] void fail_job(const std::string& message) override {
    dist::abort_job(MPI_COMM_WORLD, message.c_str());
  }
  std::vector<std::pair<std::string, double>> communication() const override {
    if (!runner_) return {};
    std::vector<std::pair<std::string, double>> c = {
        {"exchange_seconds", runner_->exchange_seconds},
        {"exchange_bytes", static_cast<double>(runner_->exchange_bytes)}};
    if (const dist::ContextParallel* cp = context_) {
      c.emplace_back("ring_seconds", cp->ring_stats.seconds);
      c.emplace_back("ring_compute_seconds", cp->ring_stats.compute_seconds);
      c.emplace_back("ring_wait_seconds", cp->ring_stats.wait_seconds);
      c.emplace_back("ring_progress_seconds", cp->ring_stats.progress_seconds);
      c.emplace_back("ring_bytes", static_cast<double>(cp->ring_stats.bytes_sent));
    }
    return c;
  }
  std::string describe() const override {
    std::string s = std::to_string(size_) + (size_ == 1 ? " rank" : " ranks") + ", ";
    s += options_.context_parallel ? "context-parallel (ring attention, zigzag)" : "data-parallel";
    if (options_.zero1) s += ", ZeRO-1";
    return s;
  }

 private:
  ParallelOptions options_;
  bool owns_mpi_ = false;
  int rank_ = 0, size_ = 1, ranks_per_node_ = 1;
  // Owned by the caller of runner(): the gradient exchange, and the context-parallel runner
  // around it when there is one.
  dist::DataParallel* runner_ = nullptr;
  const dist::ContextParallel* context_ = nullptr;
  std::unique_ptr<AdamW> gathered_;
};

}  // namespace

std::unique_ptr<ParallelJob> ParallelJob::start(const ParallelOptions& options) {
  if (launched_by_mpi() || options.context_parallel || options.zero1)
    return std::make_unique<MpiJob>(options);
  return std::make_unique<ParallelJob>();
}

}  // namespace qkv::cli
