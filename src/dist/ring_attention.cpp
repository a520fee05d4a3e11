// Ring attention, forward and backward (see include/qkv/dist.h).
//
// Step s of P: rank r holds the key/value block of rank (r − s) mod P. While it computes its
// queries against that block, the block moves on to rank r + 1 and the next one arrives from
// rank r − 1 (MPI_Isend / MPI_Irecv, double-buffered). Each (query chunk, key chunk) pair is
// one call of the single-process kernels on views of the chunks, with the global mask
// rewritten in the chunks' own coordinates (plan_block); pairs the mask hides entirely are
// skipped. Forward partials are merged by their log-sum-exp. The backward runs the same ring
// with the global out and lse (so each block's P is already normalised) and sends each
// block's dK, dV accumulator along behind it: after P hops it is back at its owner.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include "attention/masks.h"
#include "attention/merge.h"
#include "qkv/dist.h"
#include "qkv/error.h"
#include "qkv/threads.h"
#include "qkv/clock.h"
#include "util/parallel.h"
#include "util/scratch.h"

namespace qkv::dist {

namespace {

constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max() / 4;
constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
constexpr int kTagKV = 17, kTagGrad = 18;

// One kernel call: queries [q0, q1) of a query chunk against keys [k0, k1) of a key chunk,
// under a mask in the sliced views' own (bottom-right aligned) coordinates.
struct BlockCall {
  int64_t q0, q1, k0, k1;
  int window_left, window_right;
};

// The global mask says: the query at global position p sees the key at global position j when
//   p − left ≤ j ≤ p + right   (right = 0 when causal; an absent bound is unbounded).
// In chunk coordinates (query i at qc.begin + i, key j at kc.begin + j, d = qc.begin − kc.begin)
// that is the band i + d + lo ≤ j ≤ i + d + hi. Keep the queries whose band meets the key
// chunk and the keys some kept query sees; the kernel places the last kept query at the last
// kept key (shift e = k1 − q1), so its window becomes [e − d − lo, d + hi − e] around that
// diagonal, both ≥ 0 by the choice of q1 and k1.
std::optional<BlockCall> plan_block(const Chunk& qc, const Chunk& kc, const Mask& m) {
  int64_t hi = kUnbounded, lo = -kUnbounded;
  if (m.causal) hi = 0;
  if (m.window_right >= 0) hi = std::min<int64_t>(hi, m.window_right);
  if (m.window_left >= 0) lo = -m.window_left;
  const int64_t d = qc.begin - kc.begin;
  const int64_t q0 = std::max<int64_t>(0, -d - hi);
  const int64_t q1 = std::min<int64_t>(qc.length, kc.length - d - lo);
  if (q0 >= q1) return std::nullopt;
  const int64_t k0 = std::max<int64_t>(0, q0 + d + lo);
  const int64_t k1 = std::min<int64_t>(kc.length, q1 + d + hi);
  if (k0 >= k1) return std::nullopt;
  const int64_t e = k1 - q1;
  const int right = hi == kUnbounded ? -1 : static_cast<int>(d + hi - e);
  const int left = lo == -kUnbounded ? -1 : static_cast<int>(e - d - lo);
  return BlockCall{q0, q1, k0, k1, left, right};
}

void check_shard(const AttentionArgs& a, const Sharding& s, const char* where) {
  s.validate(where);
  AttentionArgs local = a;
  local.mask.kv_len = nullptr;  // global positions: checked below
  validate(local, where);
  check(a.q.shape[2] == s.local_len() && a.k.shape[2] == s.local_len(), where, ": q ",
        shape_of(a.q), " and k ", shape_of(a.k), " must hold this rank's ", s.local_len(),
        " of the ", s.seq_len, " positions");
  check(a.mask.bias.empty(), where, ": an additive bias is not supported across ranks");
  check(a.mask.alibi == nullptr, where, ": ALiBi is not supported across ranks");
  check(a.packed.num_seqs == 0, where, ": packed sequences are not supported across ranks");
  check(a.block_mask == nullptr, where,
        ": a block_mask (mask function) is not supported across ranks");
  check(a.sinks == nullptr, where, ": attention sinks are not supported across ranks");
  check(a.dropout.p == 0, where, ": dropout is not supported across ranks");
  check(a.score_mod == nullptr, where,
        ": a score_mod (score function) is not supported across ranks");
  if (a.mask.kv_len)
    for (int64_t b = 0; b < a.q.shape[0]; ++b)
      check(a.mask.kv_len[b] >= 0 && a.mask.kv_len[b] <= s.seq_len, where, ": kv_len[", b,
            "] = ", a.mask.kv_len[b], " is outside [0, ", s.seq_len, "] (global positions)");
}

// Every rank checks its own arguments (`check_local`), then all compare what they were given:
// a rank that throws alone would leave the others waiting on the ring, and a mismatch would
// deadlock or corrupt. So every rank throws when any rank's arguments are wrong.
template <typename Check>
void check_agreement(const AttentionArgs& a, const Sharding& s, MPI_Comm comm, const char* where,
                     Check check_local) {
  std::string problem;
  try {
    check_local();
    int size = 0;
    check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
    check(size == s.ranks, where, ": the sharding is for ", s.ranks,
          " ranks, the communicator has ", size);
  } catch (const Error& e) {
    problem = e.what();
  }
  int rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  int64_t mine[] = {problem.empty() ? -1 : rank,
                    a.q.shape[0],
                    a.q.shape[1],
                    a.k.shape[1],
                    a.q.shape[3],
                    a.v.shape[3],
                    s.seq_len,
                    static_cast<int64_t>(s.layout),
                    a.mask.causal,
                    a.mask.window_left,
                    a.mask.window_right};
  constexpr int n = sizeof mine / sizeof mine[0];
  int64_t low[n], high[n];
  check_mpi(MPI_Allreduce(mine, low, n, MPI_INT64_T, MPI_MIN, comm), "MPI_Allreduce");
  check_mpi(MPI_Allreduce(mine, high, n, MPI_INT64_T, MPI_MAX, comm), "MPI_Allreduce");
  if (!problem.empty()) throw Error(problem);
  check(high[0] < 0, where, ": rank ", high[0], " rejected its arguments (its error says why)");
  static const char* names[n] = {"",        "B",      "Hq",     "Hkv",         "D",           "Dv",
                                 "seq_len", "layout", "causal", "window_left", "window_right"};
  for (int i = 1; i < n; ++i)
    check(low[i] == high[i], where, ": the ranks disagree on ", names[i], " (from ", low[i], " to ",
          high[i], ")");
}

// The ring: this rank's neighbours and the double-buffered transfers of one step.
struct Ring {
  MPI_Comm comm;
  int rank = 0, size = 1, next = 0, prev = 0;
  RingStats* stats;

  Ring(MPI_Comm c, RingStats* st) : comm(c), stats(st) {
    check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
    next = (rank + 1) % size;
    prev = (rank + size - 1) % size;
  }
  // Sends `out` to the next rank and receives the previous rank's into `in`.
  void start(float* out, float* in, int64_t count, int tag, MPI_Request req[2]) {
    check(count <= std::numeric_limits<int>::max(), "ring attention: a block of ", count,
          " floats is larger than one MPI message (2^31 − 1 elements)");
    check_mpi(MPI_Irecv(in, static_cast<int>(count), MPI_FLOAT, prev, tag, comm, &req[0]),
              "MPI_Irecv");
    check_mpi(MPI_Isend(out, static_cast<int>(count), MPI_FLOAT, next, tag, comm, &req[1]),
              "MPI_Isend");
    if (stats) stats->bytes_sent += count * static_cast<int64_t>(sizeof(float));
  }
  // Lets MPI move pending transfers along between kernel calls (Open MPI progresses large
  // messages only inside MPI calls; on one machine the copy itself may run in here).
  void poke(MPI_Request req[2]) {
    if (req[0] == MPI_REQUEST_NULL) return;
    const double t = now_seconds();
    int done = 0;
    MPI_Testall(2, req, &done, MPI_STATUSES_IGNORE);
    if (stats) stats->progress_seconds += now_seconds() - t;
  }
  void wait(MPI_Request req[2]) {
    const double t = now_seconds();
    check_mpi(MPI_Waitall(2, req, MPI_STATUSES_IGNORE), "MPI_Waitall");
    if (stats) stats->wait_seconds += now_seconds() - t;
  }
};

// Buffers kept from call to call by the thread that calls the ring (the shared scratch, in
// the ring's own slots: attention's kernels run while they are held): a fresh page costs
// ~11 µs to touch here, so allocating two 16 MB key/value blocks per call cost 90 ms of a
// 830 ms forward. Contents are not kept.
using Slot = detail::RingSlot;
float* workspace(Slot slot, int64_t floats) {
  return detail::thread_scratch(slot, static_cast<size_t>(std::max<int64_t>(floats, 1)));
}

// A rank's key/value block (or its gradient) packed as one message: K [B, Hkv, Tl, D] then
// V [B, Hkv, Tl, Dv], contiguous, in a workspace slot.
struct KVBlock {
  int64_t B, H, T, D, Dv;
  float* data;
  KVBlock(Slot slot, int64_t B, int64_t H, int64_t T, int64_t D, int64_t Dv)
      : B(B), H(H), T(T), D(D), Dv(Dv), data(workspace(slot, B * H * T * (D + Dv))) {}
  int64_t count() const { return B * H * T * (D + Dv); }
  void zero() const { std::fill(data, data + count(), 0.0f); }
  float* ptr() const { return data; }
  View k() const { return View(ptr(), {B, H, T, D}); }
  View v() const { return View(ptr() + B * H * T * D, {B, H, T, Dv}); }
};

// dst += src for views of the same 4-dim shape; dst = src when `assign`.
void add_into(const View& dst, const View& src, bool assign = false) {
  const int64_t rows = dst.shape[0] * dst.shape[1] * dst.shape[2], n = dst.shape[3];
  detail::parallel_for(rows, detail::threads_for(rows * n), [&](int64_t r) {
    const int64_t i2 = r % dst.shape[2], i1 = (r / dst.shape[2]) % dst.shape[1],
                  i0 = r / (dst.shape[2] * dst.shape[1]);
    float* d = &dst(i0, i1, i2, 0);
    const float* s = &src(i0, i1, i2, 0);
    for (int64_t j = 0; j < n; ++j)
      d[j * dst.stride[3]] =
          assign ? s[j * src.stride[3]] : d[j * dst.stride[3]] + s[j * src.stride[3]];
  });
}

// What the forward and the backward start from: the ring, the shapes, this rank's chunks, and
// the two blocks K and V travel in, block 0 holding this rank's own.
struct RingPass {
  Ring ring;
  int64_t B, Hq, Tl, Hkv, D, Dv;
  std::vector<Chunk> mine;
  KVBlock blocks[2];
  RingPass(const AttentionArgs& a, const Sharding& s, MPI_Comm comm, RingStats* stats)
      : ring(comm, stats),
        B(a.q.shape[0]),
        Hq(a.q.shape[1]),
        Tl(s.local_len()),
        Hkv(a.k.shape[1]),
        D(a.k.shape[3]),
        Dv(a.v.shape[3]),
        mine(s.chunks(ring.rank)),
        blocks{KVBlock(Slot::block0, B, Hkv, Tl, D, Dv), KVBlock(Slot::block1, B, Hkv, Tl, D, Dv)} {
    add_into(blocks[0].k(), a.k, true);
    add_into(blocks[0].v(), a.v, true);
  }
};

// The kernel arguments of one block call: the rows of the query chunk at row qrow of a.q and of
// the key chunk kc at row krow of `block` that the call takes, its mask, and kv_len moved into the
// key slice's coordinates (`kv_len` is the caller's storage, [B]).
AttentionArgs block_args(const AttentionArgs& a, const KVBlock& block, int64_t qrow, int64_t krow,
                         const Chunk& kc, const BlockCall& c, std::vector<int32_t>& kv_len) {
  const int64_t key_begin = kc.begin;
  AttentionArgs x;
  x.q = a.q.slice(2, qrow + c.q0, qrow + c.q1);
  x.k = block.k().slice(2, krow + c.k0, krow + c.k1);
  x.v = block.v().slice(2, krow + c.k0, krow + c.k1);
  x.scale = a.scale;
  x.softcap = a.softcap;
  x.mask.window_left = c.window_left;
  x.mask.window_right = c.window_right;
  if (a.mask.kv_len) {
    kv_len.resize(a.q.shape[0]);
    for (int64_t b = 0; b < a.q.shape[0]; ++b)
      kv_len[b] = static_cast<int32_t>(
          std::clamp<int64_t>(a.mask.kv_len[b] - (key_begin + c.k0), 0, c.k1 - c.k0));
    x.mask.kv_len = kv_len.data();
  }
  return x;
}

// Calls f(query chunk's first local row, its chunk, key chunk's first block row, its chunk,
// the call) for every pair the mask does not hide entirely.
template <typename F>
void for_each_block(const std::vector<Chunk>& qchunks, const std::vector<Chunk>& kchunks,
                    const Mask& mask, RingStats* stats, F f) {
  int64_t qrow = 0;
  for (const Chunk& qc : qchunks) {
    int64_t krow = 0;
    for (const Chunk& kc : kchunks) {
      const std::optional<BlockCall> call = plan_block(qc, kc, mask);
      if (call) f(qrow, qc, krow, kc, *call);
      if (stats) ++(call ? stats->blocks_computed : stats->blocks_skipped);
      krow += kc.length;
    }
    qrow += qc.length;
  }
}

}  // namespace

void ring_attention(const AttentionArgs& a, const Sharding& s, MPI_Comm comm, RingStats* stats) {
  const char* where = "ring_attention";
  check_agreement(a, s, comm, where, [&] { check_shard(a, s, where); });
  const double start = now_seconds();
  RingPass pass(a, s, comm, stats);
  Ring& ring = pass.ring;
  const int64_t B = pass.B, Hq = pass.Hq, Tl = pass.Tl, Dv = pass.Dv;
  const std::vector<Chunk>& mine = pass.mine;
  const KVBlock(&blocks)[2] = pass.blocks;
  // The merged result so far: out [B, Hq, Tl, Dv] and lse [B, Hq, Tl] (-inf: nothing yet;
  // out is written where lse first becomes finite).
  const View out(workspace(Slot::out, B * Hq * Tl * Dv), {B, Hq, Tl, Dv});
  const View lse(workspace(Slot::lse, B * Hq * Tl), {B, Hq, Tl});
  std::fill(lse.data, lse.data + B * Hq * Tl, kMinusInf);
  float* const part_out = workspace(Slot::part_out, B * Hq * Tl * Dv);
  float* const part_lse = workspace(Slot::part_lse, B * Hq * Tl);
  std::vector<int32_t> kv_len;

  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  for (int step = 0; step < ring.size; ++step) {
    const KVBlock& cur = blocks[step % 2];
    const KVBlock& incoming = blocks[(step + 1) % 2];
    if (step + 1 < ring.size) ring.start(cur.ptr(), incoming.ptr(), cur.count(), kTagKV, req);
    const int owner = (ring.rank - step + ring.size) % ring.size;
    const double t = now_seconds(), progress0 = stats ? stats->progress_seconds : 0;
    for_each_block(
        mine, s.chunks(owner), a.mask, stats,
        [&](int64_t qrow, const Chunk& qc, int64_t krow, const Chunk& kc, const BlockCall& c) {
          AttentionArgs x = block_args(a, cur, qrow, krow, kc, c, kv_len);
          const int64_t n = c.q1 - c.q0;
          x.out = View(part_out, {B, Hq, n, Dv});
          x.lse = part_lse;
          attention(x);
          ring.poke(req);
          // Merge rows [qrow + q0, qrow + q1) with their log-sum-exps (this block's hid every key
          // of a row when its lse is −inf; nothing merged yet when the row's is).
          detail::parallel_for(B * Hq * n, detail::threads_for(B * Hq * n * Dv), [&](int64_t r) {
            const int64_t i = r % n, bh = r / n;
            float& l = lse.data[bh * Tl + qrow + c.q0 + i];
            float* o = out.data + (bh * Tl + qrow + c.q0 + i) * Dv;
            const detail::PartialRow parts[2] = {{l, 1, o}, {part_lse[r], 1, part_out + r * Dv}};
            detail::merge_partials(
                2, [&](int64_t c) { return parts[c]; }, Dv, o, 1, &l);
          });
        });
    if (stats) stats->compute_seconds += now_seconds() - t - (stats->progress_seconds - progress0);
    if (step + 1 < ring.size) ring.wait(req);
  }
  // Rows that saw no key anywhere are 0 (the workspace holds an earlier call's values there).
  for (int64_t r = 0; r < B * Hq * Tl; ++r)
    if (lse.data[r] == kMinusInf) std::fill(out.data + r * Dv, out.data + (r + 1) * Dv, 0.0f);
  add_into(a.out, out, true);
  if (a.lse) std::memcpy(a.lse, lse.data, B * Hq * Tl * sizeof(float));
  if (stats) stats->seconds += now_seconds() - start;
}

void ring_attention_backward(const AttentionArgs& a, View dout, View dq, View dk, View dv,
                             const Sharding& s, MPI_Comm comm, RingStats* stats) {
  const char* where = "ring_attention_backward";
  check_agreement(a, s, comm, where, [&] {
    check_shard(a, s, where);
    check(a.lse != nullptr, where, ": needs the forward's lse (AttentionArgs::lse)");
    AttentionArgs unpadded = a;
    unpadded.mask.kv_len = nullptr;  // global positions: checked by check_shard
    validate_backward(unpadded, dout, dq, dk, dv, where);
  });
  const double start = now_seconds();
  RingPass pass(a, s, comm, stats);
  Ring& ring = pass.ring;
  const int64_t B = pass.B, Hq = pass.Hq, Tl = pass.Tl, Hkv = pass.Hkv, D = pass.D, Dv = pass.Dv;
  const std::vector<Chunk>& mine = pass.mine;
  const KVBlock(&blocks)[2] = pass.blocks;
  // This step's gradient for the block held (partial), the accumulator that arrived with it
  // (incoming) and the sum sent on (outgoing).
  const KVBlock partial(Slot::partial, B, Hkv, Tl, D, Dv),
      incoming(Slot::incoming, B, Hkv, Tl, D, Dv), outgoing(Slot::outgoing, B, Hkv, Tl, D, Dv);
  const View dq_sum(workspace(Slot::out, B * Hq * Tl * D), {B, Hq, Tl, D});
  std::fill(dq_sum.data, dq_sum.data + B * Hq * Tl * D, 0.0f);
  float* const part_dq = workspace(Slot::part_dq, B * Hq * Tl * D);
  float* const part_dk = workspace(Slot::part_dk, B * Hkv * Tl * D);
  float* const part_dv = workspace(Slot::part_dv, B * Hkv * Tl * Dv);
  float* const part_lse = workspace(Slot::part_lse, B * Hq * Tl);
  std::vector<int32_t> kv_len;

  MPI_Request kv_req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  MPI_Request grad_req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  for (int step = 0; step < ring.size; ++step) {
    const KVBlock& cur = blocks[step % 2];
    if (step + 1 < ring.size)
      ring.start(cur.ptr(), blocks[(step + 1) % 2].ptr(), cur.count(), kTagKV, kv_req);
    const int owner = (ring.rank - step + ring.size) % ring.size;
    const double t = now_seconds(), progress0 = stats ? stats->progress_seconds : 0;
    partial.zero();
    for_each_block(
        mine, s.chunks(owner), a.mask, stats,
        [&](int64_t qrow, const Chunk& qc, int64_t krow, const Chunk& kc, const BlockCall& c) {
          AttentionArgs x = block_args(a, cur, qrow, krow, kc, c, kv_len);
          const int64_t n = c.q1 - c.q0, nk = c.k1 - c.k0;
          x.out = a.out.slice(2, qrow + c.q0, qrow + c.q1);
          for (int64_t bh = 0; bh < B * Hq; ++bh)
            std::memcpy(part_lse + bh * n, a.lse + bh * Tl + qrow + c.q0, n * sizeof(float));
          x.lse = part_lse;
          const View pdq(part_dq, {B, Hq, n, D});
          const View pdk(part_dk, {B, Hkv, nk, D});
          const View pdv(part_dv, {B, Hkv, nk, Dv});
          attention_backward(x, dout.slice(2, qrow + c.q0, qrow + c.q1), pdq, pdk, pdv);
          ring.poke(kv_req);
          ring.poke(grad_req);
          add_into(dq_sum.slice(2, qrow + c.q0, qrow + c.q1), pdq);
          add_into(partial.k().slice(2, krow + c.k0, krow + c.k1), pdk);
          add_into(partial.v().slice(2, krow + c.k0, krow + c.k1), pdv);
        });
    if (stats) stats->compute_seconds += now_seconds() - t - (stats->progress_seconds - progress0);
    // The block's accumulator: what came with it (nothing at its owner, step 0) plus this
    // rank's part, sent on behind the block; the last hop takes it home.
    if (step == 0) {
      std::memcpy(outgoing.ptr(), partial.ptr(), partial.count() * sizeof(float));
    } else {
      ring.wait(grad_req);
      const float* in = incoming.ptr();
      const float* p = partial.ptr();
      float* o = outgoing.ptr();
      detail::parallel_for(partial.count(), detail::threads_for(partial.count()),
                           [&](int64_t i) { o[i] = in[i] + p[i]; });
    }
    ring.start(outgoing.ptr(), incoming.ptr(), outgoing.count(), kTagGrad, grad_req);
    if (step + 1 < ring.size) ring.wait(kv_req);
  }
  ring.wait(grad_req);  // incoming now holds this rank's own block's gradient, summed over all
  add_into(dq, dq_sum, true);
  add_into(dk, incoming.k(), true);
  add_into(dv, incoming.v(), true);
  if (stats) stats->seconds += now_seconds() - start;
}

}  // namespace qkv::dist
