// Which positions of a sequence each rank holds (contiguous or zigzag), and copies between a
// full tensor and one rank's shard.
#include <algorithm>
#include <cstring>

#include "qkv/dist.h"
#include "qkv/error.h"

namespace qkv::dist {

void Sharding::validate(const char* where) const {
  check(ranks >= 1, where, ": the sharding needs at least 1 rank, got ", ranks);
  const int64_t pieces = layout == Layout::zigzag ? 2 * int64_t{ranks} : ranks;
  check(seq_len >= pieces && seq_len % pieces == 0, where, ": a sequence of ", seq_len,
        " positions does not split into ", pieces, " equal ",
        layout == Layout::zigzag ? "zigzag chunks (2 per rank)" : "contiguous shards (1 per rank)");
}

int64_t Sharding::local_len() const { return seq_len / ranks; }

std::vector<Chunk> Sharding::chunks(int rank) const {
  check(rank >= 0 && rank < ranks, "Sharding::chunks: rank ", rank, " of ", ranks);
  if (layout == Layout::contiguous) return {{rank * local_len(), local_len()}};
  const int64_t c = seq_len / (2 * int64_t{ranks});
  return {{rank * c, c}, {(2 * int64_t{ranks} - 1 - rank) * c, c}};
}

std::vector<int64_t> Sharding::positions(int rank) const {
  std::vector<int64_t> out;
  for (const Chunk& c : chunks(rank))
    for (int64_t i = 0; i < c.length; ++i) out.push_back(c.begin + i);
  return out;
}

namespace {

// Calls f(full_row, local_row) for every local row along `dim`.
template <typename F>
void for_rows(const View& full, const View& local, int dim, const Sharding& s, int rank,
              const char* where, F f) {
  s.validate(where);
  check(dim >= 0 && dim < full.ndim && full.ndim == local.ndim, where, ": dim ", dim, " of a ",
        full.ndim, "-dim full tensor and a ", local.ndim, "-dim shard");
  check(full.shape[dim] == s.seq_len, where, ": the full tensor ", shape_of(full), " has ",
        full.shape[dim], " positions along dim ", dim, ", the sharding ", s.seq_len);
  check(local.shape[dim] == s.local_len(), where, ": the shard ", shape_of(local), " has ",
        local.shape[dim], " positions along dim ", dim, ", rank ", rank, " holds ", s.local_len());
  for (int d = 0; d < full.ndim; ++d)
    check(d == dim || full.shape[d] == local.shape[d], where, ": full ", shape_of(full),
          " and shard ", shape_of(local), " differ in dim ", d);
  int64_t row = 0;
  for (const Chunk& c : s.chunks(rank))
    for (int64_t i = 0; i < c.length; ++i, ++row)
      f(full.slice(dim, c.begin + i, c.begin + i + 1), local.slice(dim, row, row + 1));
}

// dst = src elementwise, for two views of the same shape (any strides).
void copy_view(const View& dst, const View& src) {
  int64_t shape[kMaxDims] = {1, 1, 1, 1}, ds[kMaxDims] = {0, 0, 0, 0}, ss[kMaxDims] = {0, 0, 0, 0};
  const int off = kMaxDims - src.ndim;
  for (int d = 0; d < src.ndim; ++d)
    shape[off + d] = src.shape[d], ds[off + d] = dst.stride[d], ss[off + d] = src.stride[d];
  for (int64_t a = 0; a < shape[0]; ++a)
    for (int64_t b = 0; b < shape[1]; ++b)
      for (int64_t c = 0; c < shape[2]; ++c)
        for (int64_t e = 0; e < shape[3]; ++e)
          dst.data[a * ds[0] + b * ds[1] + c * ds[2] + e * ds[3]] =
              src.data[a * ss[0] + b * ss[1] + c * ss[2] + e * ss[3]];
}

}  // namespace

void shard(const View& full, const View& local, int dim, const Sharding& s, int rank) {
  for_rows(full, local, dim, s, rank, "dist::shard",
           [](const View& f, const View& l) { copy_view(l, f); });
}

void unshard(const View& local, const View& full, int dim, const Sharding& s, int rank) {
  for_rows(full, local, dim, s, rank, "dist::unshard",
           [](const View& f, const View& l) { copy_view(f, l); });
}

}  // namespace qkv::dist
