// ParallelJob for one process, and start() of a build without MPI.
#include <cstdlib>
#include <thread>

#include "parallel_job.h"
#include "qkv/error.h"

namespace qkv::cli {

int ParallelJob::default_threads() const { return 0; }  // every core

int64_t ParallelJob::state_bytes(const Model& model, const AdamW& optimizer) const {
  return static_cast<int64_t>(sizeof(float)) *
         (2 * model.num_params() + static_cast<int64_t>(optimizer.m.size() + optimizer.v.size()));
}

void ParallelJob::fail_job(const std::string& message) { throw Error(message); }

#ifndef QKV_HAVE_MPI
std::unique_ptr<ParallelJob> ParallelJob::start(const ParallelOptions& options) {
  check(!options.context_parallel && !options.zero1,
        "train: --context-parallel and --zero1 need "
        "qkv built with MPI (QKV_MPI; Debian: libopenmpi-dev)");
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* size = std::getenv(name);
    check(!size || std::atoi(size) <= 1, "train: started as one of ", size,
          " MPI ranks, but this "
          "qkv was built without MPI (QKV_MPI): each rank would train alone. Rebuild with "
          "libopenmpi-dev installed");
  }
  return std::make_unique<ParallelJob>();
}
#endif

}  // namespace qkv::cli
