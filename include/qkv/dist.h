// qkv::dist — attention and training across processes, over MPI (the optional QKV_MPI
// component: link qkv::dist). Every function takes an MPI communicator the caller owns; qkv
// never initialises or finalises MPI itself, except in the `qkv` tool.
//
// Ring attention (Liu et al. 2023) splits one sequence across the P ranks of a communicator.
// Each rank holds the rows of q, k and v at its positions (every head), computes attention of
// its queries against one key/value block at a time, and passes the blocks around a ring
// (P − 1 non-blocking transfers that overlap the next block's compute). Partial results are
// merged by their log-sum-exp, as split-KV decoding merges chunks. The backward sends the
// key/value gradients around a second ring, so each block's dK, dV arrive back at its owner.
//
// Layouts: contiguous (rank r holds positions [r·T/P, (r+1)·T/P)) or zigzag (the sequence in
// 2P chunks, rank r holds chunks r and 2P − 1 − r): under a causal mask the zigzag gives every
// rank the same work, while contiguous leaves the last rank P times the first's.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "qkv/attention.h"
#include "qkv/train.h"

namespace qkv::dist {

enum class Layout { contiguous, zigzag };

// A run of consecutive global positions a rank holds: [begin, begin + length).
struct Chunk {
  int64_t begin = 0, length = 0;
};

// How a sequence of `seq_len` positions is split over `ranks` ranks.
struct Sharding {
  int64_t seq_len = 0;
  int ranks = 1;
  Layout layout = Layout::zigzag;

  // Throws qkv::Error unless seq_len divides into equal chunks (P of them contiguous, 2P zigzag).
  void validate(const char* where) const;
  int64_t local_len() const;                  // positions per rank
  std::vector<Chunk> chunks(int rank) const;  // in local row order
  // The global position of every local row of `rank`.
  std::vector<int64_t> positions(int rank) const;
};

// Copies rank's rows of `full` (any tensor with the sequence along `dim`) into `local`
// (the same shape with local_len() along `dim`), and back.
void shard(const View& full, const View& local, int dim, const Sharding& s, int rank);
void unshard(const View& local, const View& full, int dim, const Sharding& s, int rank);

// Time spent in one call, for benchmarks: kernels (and merging), MPI's progress calls between
// them (on one machine the transfers' copies may run there, on the computing core), and
// waiting for a step's transfers after its compute (what compute did not hide).
struct RingStats {
  double seconds = 0, compute_seconds = 0, progress_seconds = 0, wait_seconds = 0;
  int64_t bytes_sent = 0;
  int64_t blocks_computed = 0, blocks_skipped = 0;  // (q chunk, k chunk) pairs
};

// Forward. `local` holds this rank's shard as an AttentionArgs over local rows:
//   q [B, Hq, Tl, D], k [B, Hkv, Tl, D], v [B, Hkv, Tl, Dv], out [B, Hq, Tl, Dv] (written),
//   lse [B, Hq, Tl] (optional, written), Tl = s.local_len().
// The mask is that of the whole sequence (Tq = Tk = s.seq_len): causal, window_left/right,
// and kv_len padding in global positions. Not supported (an error): bias, ALiBi, packed.
// Every rank of `comm` must call it with the same shapes, options and sharding.
void ring_attention(const AttentionArgs& local, const Sharding& s, MPI_Comm comm,
                    RingStats* stats = nullptr);

// Backward: `local` as the forward saw it, with its out and lse (required: the global
// results for this rank's rows, as ring_attention wrote them); dout [B, Hq, Tl, Dv]. Writes
// this rank's dq, dk and dv (gradients of the whole sequence's loss for its rows).
void ring_attention_backward(const AttentionArgs& local, View dout, View dq, View dk, View dv,
                             const Sharding& s, MPI_Comm comm, RingStats* stats = nullptr);

// ---- data-parallel training ----------------------------------------------------------------
// Each rank runs rows [B·r/P, B·(r+1)/P) of every global batch (all ranks draw the same
// batches), weighs its mean loss by its share of the batch's scored positions, and the
// gradients are summed across ranks in rank order (a reduce-scatter by MPI_Alltoallv, each
// rank summing its slice 0, 1, …, P−1, then an all-gather): the same bits on every run with the
// same P, and within rounding of one process training on the whole batch.
//
// With zero1 (ZeRO stage 1) the AdamW state is sharded: rank r keeps m and v of its slice
// only, updates that slice of the parameters, and the parameters are all-gathered instead of
// the gradients. Pass it to qkv::train() as its StepRunner.
class DataParallel : public StepRunner {
 public:
  // Shards `optimizer` (which must hold the whole state, as a fresh or loaded one does)
  // when zero1.
  DataParallel(MPI_Comm comm, const Model& model, AdamW& optimizer, bool zero1);
  // Rows [B·r/P, B·(r+1)/P) of the global batch (an error when B < P).
  Batch local(const Batch& global) const override;
  float sum(float x) override;
  double accuracy(const std::vector<uint8_t>& right, int64_t B) override;  // of all rows
  float update(Model& model, AdamW& optimizer, float max_norm, float lr) override;

  // The whole optimizer state, gathered on rank `root` (for its checkpoint); on the other
  // ranks, `full` is left as it is. Every rank must call it.
  void gather_optimizer(const AdamW& shard, AdamW& full, int root = 0) const;
  // Parameter slice [first, last) this rank reduces (and, with zero1, updates).
  std::pair<int64_t, int64_t> slice() const { return {begin_[rank_], begin_[rank_ + 1]}; }
  // Bytes this rank holds for training: weights, gradients, optimizer state, and the
  // reduction's receive buffer (activations not counted).
  int64_t state_bytes(const Model& model, const AdamW& optimizer) const;
  int rank() const { return rank_; }
  MPI_Comm comm() const { return comm_; }
  // The gradient (or, with ZeRO-1, parameter) exchange so far: time in MPI calls (nothing
  // overlaps it: it runs after the backward) and bytes this rank sent.
  double exchange_seconds = 0;
  int64_t exchange_bytes = 0;
  int size() const { return size_; }
  bool zero1() const { return zero1_; }

 private:
  void reduce_scatter(float* g);  // summed slice into g[slice]
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  bool zero1_ = false;
  std::vector<int64_t> begin_;   // slice r is [begin_[r], begin_[r+1])
  std::vector<int> counts_;      // the same, as MPI counts
  std::vector<float> received_;  // P × this rank's slice
};

// ---- context-parallel training -------------------------------------------------------------
// Each rank runs every sequence of every global batch, but only its positions of each (the
// sharding's layout: zigzag by default), and the model's attention runs through the ring;
// everything else in a block is per position and stays local. Gradients are summed and the
// optimizer steps through a DataParallel of its own (its `exchange()`). One sequence then needs
// only 1/P of its activations per rank. Attaches itself to `model` (Model::set_sequence_shard)
// until destroyed.
class ContextParallel : public StepRunner {
 public:
  ContextParallel(MPI_Comm comm, Model& model, AdamW& optimizer, int64_t seq_len, bool zero1,
                  Layout layout = Layout::zigzag);
  ~ContextParallel() override;
  ContextParallel(const ContextParallel&) = delete;
  ContextParallel& operator=(const ContextParallel&) = delete;
  Batch local(const Batch& global) const override;
  float sum(float x) override { return exchange_.sum(x); }
  // A sequence is right when it is right at every rank's positions.
  double accuracy(const std::vector<uint8_t>& right, int64_t B) override;
  float update(Model& model, AdamW& optimizer, float max_norm, float lr) override {
    return exchange_.update(model, optimizer, max_norm, lr);
  }
  const Sharding& sharding() const { return sharding_; }
  // The gradient exchange and optimizer step (with its statistics and ZeRO-1 shard).
  DataParallel& exchange() { return exchange_; }
  const DataParallel& exchange() const { return exchange_; }
  RingStats ring_stats;  // the ring's time, summed over every attention call so far

 private:
  DataParallel exchange_;
  Model& model_;
  Sharding sharding_;
  SequenceShard shard_;
};

// x summed over the ranks of `comm` in rank order: the same bits on every rank and every run
// (the losses of data- and context-parallel training, the job's measurements).
float sum_over_ranks(MPI_Comm comm, float x);
double sum_over_ranks(MPI_Comm comm, double x);

// ---- failure -------------------------------------------------------------------------------
// MPI's default error handler aborts with MPI's code; qkv sets MPI_ERRORS_RETURN on the
// communicators it uses and turns a failed call into a qkv::Error naming the call.
void check_mpi(int code, const char* what);

// Ends the whole job (MPI_Abort) after printing `message` as "qkv: rank R: message": what a
// rank does when it catches an error, so that no other rank waits on it forever.
[[noreturn]] void abort_job(MPI_Comm comm, const char* message, int code = 2);

}  // namespace qkv::dist
