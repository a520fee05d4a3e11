// The MPI job `qkv train` runs in when started by mpirun (apps/qkv/parallel_job_mpi.cpp), or
// a job of one process (parallel_job_none.cpp, also what a build without QKV_MPI has).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "qkv/train.h"

namespace qkv::cli {

struct ParallelOptions {
  bool context_parallel = false;  // split each sequence's positions across ranks (ring attention)
  bool zero1 = false;             // shard the optimizer state across ranks
};

class ParallelJob {
 public:
  // Joins the MPI job this process was launched into (mpirun, srun: found from the
  // launcher's environment); a job of one process when there is none. Throws when parallel
  // training is asked of a build without MPI, or under mpirun with more than one rank.
  static std::unique_ptr<ParallelJob> start(const ParallelOptions& options);
  virtual ~ParallelJob() = default;

  virtual int rank() const { return 0; }
  virtual int size() const { return 1; }
  // Threads per rank when --threads is not given: the cores shared by the ranks on one node.
  virtual int default_threads() const;
  // The train() runner for this job (null for one process). Shards `optimizer` with ZeRO-1.
  virtual std::unique_ptr<StepRunner> runner(Model& model, AdamW& optimizer, int64_t seq_len) {
    return nullptr;
  }
  // The whole optimizer state on rank 0 (it may be sharded); every rank calls it.
  virtual const AdamW& optimizer_for_checkpoint(const AdamW& mine) { return mine; }
  // True on every rank when `flag` is true on any (an interrupt seen by one rank).
  virtual bool any(bool flag) { return flag; }
  virtual double sum(double x) { return x; }
  // Bytes of training state a rank holds (weights, gradients, optimizer; not activations).
  virtual int64_t state_bytes(const Model& model, const AdamW& optimizer) const;
  // Ends every rank of the job with `message` (one rank's error must not leave the others
  // waiting); in one process, throws it as a qkv::Error.
  [[noreturn]] virtual void fail_job(const std::string& message);
  // What the job's communication cost so far, for the summary: name → value (seconds, bytes).
  virtual std::vector<std::pair<std::string, double>> communication() const { return {}; }
  // A line for the summary: "2 ranks, data-parallel, ZeRO-1"; empty for one process.
  virtual std::string describe() const { return ""; }
};

}  // namespace qkv::cli
