// Data-parallel training over MPI: a share of every batch per rank, gradients summed in a
// fixed order, optionally the optimizer state sharded (ZeRO-1). See include/qkv/dist.h.
#include <algorithm>
#include <cmath>
#include <limits>

#include "qkv/dist.h"
#include "qkv/error.h"
#include "qkv/clock.h"

namespace qkv::dist {

namespace {

template <typename T, MPI_Datatype (*type)()>
T sum_in_rank_order(MPI_Comm comm, T x) {
  int size = 0;
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  std::vector<T> all(size);
  check_mpi(MPI_Allgather(&x, 1, type(), all.data(), 1, type(), comm), "MPI_Allgather");
  T total = 0;
  for (T a : all) total += a;  // rank order: the same bits on every rank
  return total;
}
MPI_Datatype mpi_float() { return MPI_FLOAT; }
MPI_Datatype mpi_double() { return MPI_DOUBLE; }

}  // namespace

float sum_over_ranks(MPI_Comm comm, float x) {
  return sum_in_rank_order<float, mpi_float>(comm, x);
}
double sum_over_ranks(MPI_Comm comm, double x) {
  return sum_in_rank_order<double, mpi_double>(comm, x);
}

DataParallel::DataParallel(MPI_Comm comm, const Model& model, AdamW& optimizer, bool zero1)
    : comm_(comm), zero1_(zero1) {
  check_mpi(MPI_Comm_rank(comm, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &size_), "MPI_Comm_size");
  check(model.trainable(), "DataParallel: the model has no gradients (loaded for inference)");
  const int64_t n = model.num_params();
  check(n / size_ < std::numeric_limits<int>::max(), "DataParallel: ", n, " parameters over ",
        size_, " ranks is more than one MPI message per slice");
  for (int r = 0; r <= size_; ++r) begin_.push_back(n * r / size_);
  for (int r = 0; r < size_; ++r) counts_.push_back(static_cast<int>(begin_[r + 1] - begin_[r]));
  received_.resize(static_cast<size_t>(size_) * counts_[rank_]);
  check(optimizer.shard_begin == 0 && static_cast<int64_t>(optimizer.m.size()) == n,
        "DataParallel: the optimizer must hold the state of all ", n, " parameters");
  if (zero1_) optimizer.keep_shard(begin_[rank_], begin_[rank_ + 1]);
}

Batch DataParallel::local(const Batch& global) const {
  const int64_t B = global.B, T = global.T;
  check(B >= size_, "data-parallel training: a batch of ", B, " sequences cannot give each of ",
        size_, " ranks one; use --batch >= ", size_);
  const int64_t first = B * rank_ / size_, last = B * (rank_ + 1) / size_;
  Batch part;
  part.B = last - first, part.T = T, part.first = global.first + first;
  part.tokens.assign(global.tokens.begin() + first * T, global.tokens.begin() + last * T);
  part.targets.assign(global.targets.begin() + first * T, global.targets.begin() + last * T);
  return part;
}

float DataParallel::sum(float x) { return sum_over_ranks(comm_, x); }

double DataParallel::accuracy(const std::vector<uint8_t>& right, int64_t B) {
  int64_t mine = std::count(right.begin(), right.end(), 1), all = 0;
  check_mpi(MPI_Allreduce(&mine, &all, 1, MPI_INT64_T, MPI_SUM, comm_), "MPI_Allreduce");
  return double(all) / B;
}

// Every rank sends slice r of its gradients to rank r, which sums the P copies in rank order.
void DataParallel::reduce_scatter(float* g) {
  const int mine = counts_[rank_];
  // Point-to-point pairs rather than MPI_Alltoallv, whose int displacements would limit the
  // whole buffer (not just a slice) to 2^31 floats.
  std::vector<MPI_Request> req;
  req.reserve(2 * size_);
  for (int r = 0; r < size_; ++r) {
    req.emplace_back();
    check_mpi(MPI_Irecv(received_.data() + static_cast<int64_t>(r) * mine, mine, MPI_FLOAT, r, 31,
                        comm_, &req.back()),
              "MPI_Irecv");
  }
  for (int r = 0; r < size_; ++r) {
    req.emplace_back();
    check_mpi(MPI_Isend(g + begin_[r], counts_[r], MPI_FLOAT, r, 31, comm_, &req.back()),
              "MPI_Isend");
  }
  check_mpi(MPI_Waitall(static_cast<int>(req.size()), req.data(), MPI_STATUSES_IGNORE),
            "MPI_Waitall");
  float* out = g + begin_[rank_];
  for (int i = 0; i < mine; ++i) {
    float s = received_[i];
    for (int r = 1; r < size_; ++r) s += received_[static_cast<int64_t>(r) * mine + i];
    out[i] = s;
  }
}

float DataParallel::update(Model& model, AdamW& optimizer, float max_norm, float lr) {
  float* g = model.grads();
  float* w = model.weights();
  const double t0 = now_seconds();
  reduce_scatter(g);
  exchange_seconds += now_seconds() - t0;
  const int64_t n = model.num_params(), mine = counts_[rank_];
  // Sent: the other ranks' slices (reduce-scatter), then this slice to each of them (gather).
  exchange_bytes += 4 * ((n - mine) + mine * (size_ - 1));
  const int64_t first = begin_[rank_], count = counts_[rank_];
  auto all_gather = [&](float* base) {
    std::vector<int> displs(size_);
    for (int r = 0; r < size_; ++r) displs[r] = static_cast<int>(begin_[r]);
    const double t = now_seconds();
    check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, base, counts_.data(),
                             displs.data(), MPI_FLOAT, comm_),
              "MPI_Allgatherv");
    exchange_seconds += now_seconds() - t;
  };
  check(model.num_params() < std::numeric_limits<int>::max(),
        "data-parallel training: ", model.num_params(),
        " parameters need 64-bit MPI offsets (not built)");
  if (!zero1_) {
    all_gather(g);  // every rank now holds the same summed gradients
    return StepRunner::update(model, optimizer, max_norm, lr);
  }
  // ZeRO-1: the norm from each slice's squared sum (added in rank order), this slice
  // clipped and updated, then the parameters gathered.
  double sq = 0;
  for (int64_t i = 0; i < count; ++i) sq += double(g[first + i]) * g[first + i];
  std::vector<double> parts(size_);
  check_mpi(MPI_Allgather(&sq, 1, MPI_DOUBLE, parts.data(), 1, MPI_DOUBLE, comm_), "MPI_Allgather");
  double total = 0;
  for (double p : parts) total += p;
  const float norm = clip_grads(g + first, count, total, max_norm);
  optimizer.update(model, lr);
  all_gather(w);
  return norm;
}

void DataParallel::gather_optimizer(const AdamW& shard, AdamW& full, int root) const {
  if (!zero1_) {
    if (rank_ == root) full = shard;
    return;
  }
  std::vector<int> displs(size_);
  for (int r = 0; r < size_; ++r) displs[r] = static_cast<int>(begin_[r]);
  if (rank_ == root) {
    full.config = shard.config;
    full.step = shard.step;
    full.shard_begin = 0;
    full.m.assign(begin_.back(), 0.0f);
    full.v.assign(begin_.back(), 0.0f);
  }
  for (auto member : {&AdamW::m, &AdamW::v})
    check_mpi(MPI_Gatherv((shard.*member).data(), counts_[rank_], MPI_FLOAT,
                          rank_ == root ? (full.*member).data() : nullptr, counts_.data(),
                          displs.data(), MPI_FLOAT, root, comm_),
              "MPI_Gatherv");
}

int64_t DataParallel::state_bytes(const Model& model, const AdamW& optimizer) const {
  const int64_t floats = 2 * model.num_params() + static_cast<int64_t>(optimizer.m.size()) +
                         static_cast<int64_t>(optimizer.v.size()) +
                         static_cast<int64_t>(received_.size());
  return floats * static_cast<int64_t>(sizeof(float));
}

}  // namespace qkv::dist
