// Ring attention against single-process qkv::attention on the same full inputs: every rank
// builds the whole problem from one seed, runs the one-process kernels on it, then runs the
// ring on its shard and compares its rows of out, lse, dq, dk and dv. Run under mpirun with
// 2, 3 and 4 ranks (tests/CMakeLists.txt).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "qkv/dist.h"
#include "qkv/error.h"

namespace qkv::dist {
namespace {

struct RingCase {
  std::string name;
  int64_t B = 1, Hq = 4, Hkv = 4, T = 48, D = 16, Dv = 16;
  bool causal = false;
  int window_left = -1, window_right = -1;
  bool padding = false;    // kv_len random for batch rows after the first
  bool empty_row = false;  // the last batch row sees no key at all (out 0, lse −inf)
  float softcap = 0;
  bool seq_major = false;  // q, k, v, out stored [B, T, H, D] and passed as transposed views
  Layout layout = Layout::zigzag;
};

void PrintTo(const RingCase& c, std::ostream* os) { *os << c.name; }

int rank_of(MPI_Comm comm = MPI_COMM_WORLD) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}
int size_of(MPI_Comm comm = MPI_COMM_WORLD) {
  int p = 0;
  MPI_Comm_size(comm, &p);
  return p;
}

Tensor random_tensor(std::initializer_list<int64_t> shape, std::mt19937& rng) {
  Tensor t(shape);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = u(rng);
  return t;
}

// [B, H, T, X] storage, or [B, T, H, X] storage seen as [B, H, T, X].
struct Heads {
  Tensor storage;
  View view;
  Heads(int64_t B, int64_t H, int64_t T, int64_t X, bool seq_major, std::mt19937* rng = nullptr) {
    if (seq_major) {
      storage = rng ? random_tensor({B, T, H, X}, *rng) : Tensor({B, T, H, X});
      view = storage.view().transpose(1, 2);
    } else {
      storage = rng ? random_tensor({B, H, T, X}, *rng) : Tensor({B, H, T, X});
      view = storage.view();
    }
  }
};

// max |got − want| over max |want|, for two views of one shape.
double relative_error(const View& got, const View& want) {
  double diff = 0, scale = 0;
  for (int64_t a = 0; a < want.shape[0]; ++a)
    for (int64_t b = 0; b < want.shape[1]; ++b)
      for (int64_t c = 0; c < want.shape[2]; ++c)
        for (int64_t d = 0; d < want.shape[3]; ++d) {
          const double w = want(a, b, c, d), g = got(a, b, c, d);
          if (std::isinf(w) && g == w) continue;  // lse of a row that sees no key
          diff = std::max(diff, std::abs(g - w));
          if (std::isfinite(w)) scale = std::max(scale, std::abs(w));
        }
  return diff / std::max(scale, 1e-30);
}

class RingAttention : public ::testing::TestWithParam<RingCase> {};

TEST_P(RingAttention, MatchesOneProcessForwardAndBackward) {
  const RingCase& c = GetParam();
  const int P = size_of(), rank = rank_of();
  const Sharding s{c.T, P, c.layout};
  std::mt19937 rng(1234);
  // The whole problem, the same on every rank.
  Heads q(c.B, c.Hq, c.T, c.D, c.seq_major, &rng), k(c.B, c.Hkv, c.T, c.D, c.seq_major, &rng),
      v(c.B, c.Hkv, c.T, c.Dv, c.seq_major, &rng), dout(c.B, c.Hq, c.T, c.Dv, false, &rng);
  Tensor out({c.B, c.Hq, c.T, c.Dv}), lse({c.B, c.Hq, c.T, 1});
  Tensor dq({c.B, c.Hq, c.T, c.D}), dk({c.B, c.Hkv, c.T, c.D}), dv({c.B, c.Hkv, c.T, c.Dv});
  std::vector<int32_t> kv_len(c.B, static_cast<int32_t>(c.T));
  if (c.padding)
    for (int64_t b = 1; b < c.B; ++b) kv_len[b] = static_cast<int32_t>(rng() % (c.T + 1));
  if (c.empty_row) kv_len[c.B - 1] = 0;
  AttentionArgs full{.q = q.view, .k = k.view, .v = v.view, .out = out, .lse = lse.data()};
  full.softcap = c.softcap;
  full.mask.causal = c.causal;
  full.mask.window_left = c.window_left;
  full.mask.window_right = c.window_right;
  if (c.padding) full.mask.kv_len = kv_len.data();
  attention(full);
  attention_backward(full, dout.view, dq, dk, dv);

  // This rank's shard, through the ring.
  const int64_t Tl = s.local_len();
  Heads lq(c.B, c.Hq, Tl, c.D, c.seq_major), lk(c.B, c.Hkv, Tl, c.D, c.seq_major),
      lv(c.B, c.Hkv, Tl, c.Dv, c.seq_major), lout(c.B, c.Hq, Tl, c.Dv, c.seq_major);
  Tensor ldout({c.B, c.Hq, Tl, c.Dv}), llse({c.B, c.Hq, Tl, 1});
  Tensor ldq({c.B, c.Hq, Tl, c.D}), ldk({c.B, c.Hkv, Tl, c.D}), ldv({c.B, c.Hkv, Tl, c.Dv});
  shard(q.view, lq.view, 2, s, rank);
  shard(k.view, lk.view, 2, s, rank);
  shard(v.view, lv.view, 2, s, rank);
  shard(dout.view, ldout, 2, s, rank);
  AttentionArgs local = full;
  local.q = lq.view, local.k = lk.view, local.v = lv.view, local.out = lout.view;
  local.lse = llse.data();
  RingStats stats;
  ring_attention(local, s, MPI_COMM_WORLD, &stats);
  ring_attention_backward(local, ldout, ldq, ldk, ldv, s, MPI_COMM_WORLD, &stats);

  // The one-process answers at this rank's rows.
  Tensor want_out({c.B, c.Hq, Tl, c.Dv}), want_lse({c.B, c.Hq, Tl, 1});
  Tensor want_dq({c.B, c.Hq, Tl, c.D}), want_dk({c.B, c.Hkv, Tl, c.D}),
      want_dv({c.B, c.Hkv, Tl, c.Dv});
  shard(out, want_out, 2, s, rank);
  shard(lse, want_lse, 2, s, rank);
  shard(dq, want_dq, 2, s, rank);
  shard(dk, want_dk, 2, s, rank);
  shard(dv, want_dv, 2, s, rank);
  const double tol = 1e-5;
  EXPECT_LE(relative_error(lout.view, want_out), tol) << "out, rank " << rank << " of " << P;
  EXPECT_LE(relative_error(llse, want_lse), tol) << "lse, rank " << rank << " of " << P;
  EXPECT_LE(relative_error(ldq, want_dq), tol) << "dq, rank " << rank << " of " << P;
  EXPECT_LE(relative_error(ldk, want_dk), tol) << "dk, rank " << rank << " of " << P;
  EXPECT_LE(relative_error(ldv, want_dv), tol) << "dv, rank " << rank << " of " << P;
  // Under a causal mask the zigzag ring skips, on every rank, the (chunk, chunk) pairs the mask
  // hides entirely.
  if (c.causal && c.layout == Layout::zigzag && P > 1) {
    EXPECT_GT(stats.blocks_skipped, 0);
  }
}

std::vector<RingCase> cases() {
  std::vector<RingCase> v;
  auto add = [&](std::string name, auto edit) {
    RingCase c;
    c.name = std::move(name);
    edit(c);
    v.push_back(c);
  };
  add("full_zigzag", [](RingCase&) {});
  add("full_contiguous", [](RingCase& c) { c.layout = Layout::contiguous; });
  add("causal_zigzag", [](RingCase& c) { c.causal = true; });
  add("causal_contiguous", [](RingCase& c) { c.causal = true, c.layout = Layout::contiguous; });
  add("causal_gqa", [](RingCase& c) { c.causal = true, c.Hkv = 2; });
  add("causal_mqa_dv", [](RingCase& c) { c.causal = true, c.Hkv = 1, c.Dv = 24; });
  add("causal_window_5", [](RingCase& c) { c.causal = true, c.window_left = 5; });
  add("causal_window_17", [](RingCase& c) { c.causal = true, c.window_left = 17; });
  add("window_both_sides", [](RingCase& c) { c.window_left = 9, c.window_right = 3; });
  add("window_right_only", [](RingCase& c) { c.window_right = 11, c.layout = Layout::contiguous; });
  add("padding", [](RingCase& c) { c.B = 3, c.padding = true; });
  add("causal_padding", [](RingCase& c) { c.B = 3, c.causal = true, c.padding = true; });
  add("padding_empty_row", [](RingCase& c) { c.B = 2, c.padding = true, c.empty_row = true; });
  add("softcap", [](RingCase& c) { c.causal = true, c.softcap = 5; });
  add("seq_major", [](RingCase& c) { c.causal = true, c.seq_major = true, c.Hkv = 2; });
  add("long_causal", [](RingCase& c) { c.T = 264, c.D = 32, c.Dv = 32, c.causal = true; });
  add("long_window", [](RingCase& c) { c.T = 264, c.causal = true, c.window_left = 70; });
  add("long_full", [](RingCase& c) { c.T = 264, c.B = 2, c.Hkv = 2; });
  return v;
}

INSTANTIATE_TEST_SUITE_P(Grid, RingAttention, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

TEST(Sharding, ZigzagChunksAndRoundTrip) {
  const Sharding s{24, 3, Layout::zigzag};
  EXPECT_EQ(s.positions(0), (std::vector<int64_t>{0, 1, 2, 3, 20, 21, 22, 23}));
  EXPECT_EQ(s.positions(2), (std::vector<int64_t>{8, 9, 10, 11, 12, 13, 14, 15}));
  Tensor full({2, 24, 3}), back({2, 24, 3});
  for (int64_t i = 0; i < full.numel(); ++i) full.data()[i] = static_cast<float>(i);
  for (int r = 0; r < 3; ++r) {
    Tensor local({2, 8, 3});
    shard(full, local, 1, s, r);
    unshard(local, back, 1, s, r);
  }
  for (int64_t i = 0; i < full.numel(); ++i) ASSERT_EQ(back.data()[i], full.data()[i]);
  EXPECT_THROW((Sharding{25, 3, Layout::zigzag}.validate("test")), Error);
  EXPECT_THROW((Sharding{12, 4, Layout::zigzag}.validate("test")), Error);
  EXPECT_NO_THROW((Sharding{12, 4, Layout::contiguous}.validate("test")));
}

// A rank whose arguments differ from the others' gets an error on every rank, not a hang.
TEST(RingErrors, RanksThatDisagreeAllThrow) {
  const int P = size_of(), rank = rank_of();
  const Sharding s{8 * P, P, Layout::zigzag};
  Tensor q({1, 2, 8, 8}), k({1, 2, 8, 8}), v({1, 2, 8, 8}), out({1, 2, 8, 8});
  AttentionArgs a{.q = q, .k = k, .v = v, .out = out};
  a.mask.causal = true;
  if (rank == P - 1) a.mask.window_left = 3;
  try {
    ring_attention(a, s, MPI_COMM_WORLD);
    if (P > 1) ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("disagree on window_left"), std::string::npos) << e.what();
  }
}

// One rank's bad shape: that rank gets its own error, every other rank one naming it.
TEST(RingErrors, OneRankWithABadShapeStopsEveryRank) {
  const int P = size_of(), rank = rank_of();
  const Sharding s{8 * P, P, Layout::zigzag};
  Tensor q({1, 2, 8, 8}), k({1, 2, 8, 8}), v({1, 2, 8, 8}), out({1, 2, 8, 8}),
      short_v({1, 2, 7, 8});
  AttentionArgs a{.q = q, .k = k, .v = v, .out = out};
  if (rank == 0) a.v = short_v;
  try {
    ring_attention(a, s, MPI_COMM_WORLD);
    ADD_FAILURE() << "no error on rank " << rank;
  } catch (const Error& e) {
    const std::string want = rank == 0 ? "must match k" : "rank 0 rejected its arguments";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(RingErrors, UnsupportedOptionsAndShapes) {
  const int P = size_of();
  const Sharding s{8 * P, P, Layout::zigzag};
  Tensor q({1, 2, 8, 8}), k({1, 2, 8, 8}), v({1, 2, 8, 8}), out({1, 2, 8, 8});
  const float slopes[2] = {0.5f, 0.25f};
  AttentionArgs a{.q = q, .k = k, .v = v, .out = out};
  a.mask.alibi = slopes;
  EXPECT_THROW(ring_attention(a, s, MPI_COMM_WORLD), Error);
  a.mask.alibi = nullptr;
  Tensor wq({1, 2, 9, 8}), wk({1, 2, 9, 8}), wv({1, 2, 9, 8}), wout({1, 2, 9, 8});
  a.q = wq, a.k = wk, a.v = wv, a.out = wout;
  try {
    ring_attention(a, s, MPI_COMM_WORLD);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("this rank's 8"), std::string::npos) << e.what();
  }
  a.q = q, a.k = k, a.v = v, a.out = out;
  EXPECT_THROW(ring_attention_backward(a, out, q, k, v, s, MPI_COMM_WORLD), Error);  // no lse
}

}  // namespace
}  // namespace qkv::dist
