// Ring attention across the ranks of an MPI job: each rank holds its zigzag shard of one
// causal sequence, and gets its rows of the result. Run: mpirun -np 2 ring_example
#include <mpi.h>
#include <qkv/dist.h>

#include <cmath>
#include <cstdio>
#include <random>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const int64_t T = 256 * ranks;  // the whole sequence
  const qkv::dist::Sharding s{.seq_len = T, .ranks = ranks, .layout = qkv::dist::Layout::zigzag};

  // The whole problem, the same on every rank (a real program would load only its shard).
  qkv::Tensor q({1, 8, T, 64}), k({1, 8, T, 64}), v({1, 8, T, 64}), out({1, 8, T, 64});
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (qkv::Tensor* t : {&q, &k, &v})
    for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = normal(rng);

  // This rank's rows: [1, 8, T/P, 64].
  const int64_t Tl = s.local_len();
  qkv::Tensor lq({1, 8, Tl, 64}), lk({1, 8, Tl, 64}), lv({1, 8, Tl, 64}), lout({1, 8, Tl, 64});
  qkv::Tensor lse({1, 8, Tl});
  qkv::dist::shard(q, lq, 2, s, rank);
  qkv::dist::shard(k, lk, 2, s, rank);
  qkv::dist::shard(v, lv, 2, s, rank);
  qkv::AttentionArgs local{.q = lq, .k = lk, .v = lv, .out = lout, .lse = lse.data()};
  local.mask.causal = true;  // the whole sequence's mask
  qkv::dist::ring_attention(local, s, MPI_COMM_WORLD);

  // The same rows from one process on the whole sequence.
  qkv::AttentionArgs whole{.q = q, .k = k, .v = v, .out = out};
  whole.mask.causal = true;
  qkv::attention(whole);
  qkv::Tensor want({1, 8, Tl, 64});
  qkv::dist::shard(out, want, 2, s, rank);
  double err = 0;
  for (int64_t i = 0; i < want.numel(); ++i)
    err = std::fmax(err, std::fabs(want.data()[i] - lout.data()[i]));
  std::printf("rank %d of %d: positions %ld..%ld and %ld..%ld, max |ring - one process| = %.1e\n",
              rank, ranks, static_cast<long>(s.chunks(rank)[0].begin),
              static_cast<long>(s.chunks(rank)[0].begin + s.chunks(rank)[0].length - 1),
              static_cast<long>(s.chunks(rank)[1].begin),
              static_cast<long>(s.chunks(rank)[1].begin + s.chunks(rank)[1].length - 1), err);
  MPI_Finalize();
  return err < 1e-5 ? 0 : 1;
}
