// Context-parallel training: each rank runs its positions of every sequence, the model's
// attention through the ring (see include/qkv/dist.h).
#include <algorithm>

#include "qkv/dist.h"
#include "qkv/error.h"

namespace qkv::dist {

ContextParallel::ContextParallel(MPI_Comm comm, Model& model, AdamW& optimizer, int64_t seq_len,
                                 bool zero1, Layout layout)
    : exchange_(comm, model, optimizer, zero1),
      model_(model),
      sharding_{seq_len, exchange_.size(), layout} {
  sharding_.validate("context-parallel training");
  check(model.config().positions != PositionKind::alibi,
        "context-parallel training: ALiBi positions do not run across ranks");
  shard_.seq_len = seq_len;
  for (const Chunk& c : sharding_.chunks(exchange_.rank()))
    shard_.runs.emplace_back(c.begin, c.length);
  shard_.forward = [this, comm](const AttentionArgs& a) {
    ring_attention(a, sharding_, comm, &ring_stats);
  };
  shard_.backward = [this, comm](const AttentionArgs& a, View dout, View dq, View dk, View dv) {
    ring_attention_backward(a, dout, dq, dk, dv, sharding_, comm, &ring_stats);
  };
  model_.set_sequence_shard(&shard_);
}

ContextParallel::~ContextParallel() { model_.set_sequence_shard(nullptr); }

Batch ContextParallel::local(const Batch& global) const {
  check(global.T == sharding_.seq_len, "context-parallel training: the batch's sequences have ",
        global.T, " positions, the sharding ", sharding_.seq_len);
  const std::vector<int64_t> positions = sharding_.positions(exchange_.rank());
  Batch part;
  part.B = global.B, part.T = static_cast<int64_t>(positions.size());
  for (int64_t b = 0; b < global.B; ++b)
    for (int64_t p : positions) {
      part.tokens.push_back(global.tokens[b * global.T + p]);
      part.targets.push_back(global.targets[b * global.T + p]);
    }
  return part;
}

double ContextParallel::accuracy(const std::vector<uint8_t>& right, int64_t B) {
  std::vector<uint8_t> everywhere(right.size());
  check_mpi(MPI_Allreduce(right.data(), everywhere.data(), static_cast<int>(right.size()),
                          MPI_UINT8_T, MPI_MIN, exchange_.comm()),
            "MPI_Allreduce");
  return double(std::count(everywhere.begin(), everywhere.end(), 1)) / B;
}

}  // namespace qkv::dist
