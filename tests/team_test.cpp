// A thread team already running (util/parallel.h): every kernel that is ready for one, called
// by all the team's threads at once, gives the same bits as the same call outside a team, and
// the team's loops, serial pieces and shared buffers behave as their names say.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <random>
#include <vector>

#include "model_configs.h"
#include "qkv/attention.h"
#include "qkv/io.h"
#include "qkv/kv_cache.h"
#include "qkv/model.h"
#include "qkv/ops.h"
#include "qkv/quant.h"
#include "qkv/tensor.h"
#include "qkv/threads.h"
#include "util/parallel.h"
#include "util/scratch.h"

namespace qkv {
namespace {

std::vector<float> normal_values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// `call` (which writes `out`) outside a team, then by every thread of a team of 2 and of 3:
// the same bits each time. (With 3 threads set, so that the kernels split their loops.)
void same_bits_in_a_team(std::vector<float>& out, const std::function<void()>& call) {
  const int threads_before = num_threads();
  set_num_threads(3);
  std::fill(out.begin(), out.end(), 0.0f);
  call();
  const std::vector<float> alone = out;
  for (int threads : {2, 3}) {
    SCOPED_TRACE(threads);
    std::fill(out.begin(), out.end(), -1.0f);
    detail::run_team(threads, call);
    EXPECT_EQ(std::memcmp(out.data(), alone.data(), out.size() * sizeof(float)), 0);
  }
  set_num_threads(threads_before);
}

TEST(Team, LoopsSplitOverTheTeamAndSerialPiecesRunOnce) {
  constexpr int64_t n = 1000;
  std::vector<std::atomic<int>> visits(n);
  std::atomic<int> serial{0}, bodies_in_team{0};
  std::vector<float*> buffers(3);
  detail::run_team(3, [&] {
    EXPECT_TRUE(detail::in_team());
    EXPECT_EQ(omp_get_num_threads(), 3);
    detail::parallel_for(n, 3, [&](int64_t i) {
      visits[i]++;
      if (detail::in_team()) bodies_in_team++;  // a body's own calls run on its thread alone
    });
    detail::team_serial([&] { serial++; });
    float* shared = detail::team_scratch(detail::QuantSlot::block_sums, 16);
    buffers[omp_get_thread_num()] = shared;
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(visits[i], 1) << i;
  EXPECT_EQ(serial, 1);
  // The synchronisations counted (qkv bench generate reports them per token): the team's region
  // and its join; inside it, the loop's, the serial piece's and the shared buffer's barriers.
  const detail::SyncCount before = detail::sync_count();
  detail::run_team(3, [&] {
    detail::parallel_for(n, 3, [](int64_t) {});
    detail::team_serial([] {});
    (void)detail::team_scratch(detail::QuantSlot::block_sums, 16);
  });
  detail::parallel_for(n, 2, [](int64_t) {});  // a region of its own
  detail::parallel_for(n, 1, [](int64_t) {});  // none
  const detail::SyncCount after = detail::sync_count();
  EXPECT_EQ(after.regions - before.regions, 2);
  EXPECT_EQ(after.barriers - before.barriers, 2 + 3);
  EXPECT_EQ(bodies_in_team, 0);
  EXPECT_EQ(buffers[0], buffers[1]);
  EXPECT_EQ(buffers[1], buffers[2]);
  EXPECT_FALSE(detail::in_team());
}

// A team remembers its shared buffers: a slot's first call (or one that needs it larger than
// the buffer is) is a barrier, later calls are not, and every thread is given the same address
// each time; a new team starts afresh.
TEST(Team, SharedBuffersCostABarrierOnlyWhenTheyAreMadeOrGrow) {
  std::vector<std::vector<float*>> seen(3);
  std::vector<int64_t> barriers;
  for (int team = 0; team < 2; ++team)
    detail::run_team(3, [&] {
      const auto call = [&](size_t floats) {
        const int64_t before = detail::sync_count().barriers;
#pragma omp barrier
        float* p = detail::team_scratch(detail::ForwardSlot::partials, floats);
#pragma omp barrier
        if (omp_get_thread_num() == 0) barriers.push_back(detail::sync_count().barriers - before);
        seen[omp_get_thread_num()].push_back(p);
#pragma omp barrier
      };
      call(100);
      call(50);      // fits: no barrier
      call(100000);  // grows
      call(100000);  // fits
    });
  // (The third call grows the buffer unless the thread that made it had one that large from an
  // earlier team: 1 or 0.)
  ASSERT_EQ(barriers.size(), 8u);
  EXPECT_EQ(barriers[0], 1);
  EXPECT_EQ(barriers[1], 0);
  EXPECT_EQ(barriers[2], 1);
  EXPECT_EQ(barriers[3], 0);
  EXPECT_EQ(barriers[4], 1);  // a new team starts afresh
  EXPECT_EQ(barriers[5], 0);
  EXPECT_LE(barriers[6], 1);
  EXPECT_EQ(barriers[7], 0);
  for (int t = 1; t < 3; ++t) EXPECT_EQ(seen[t], seen[0]) << t;
  EXPECT_EQ(seen[0][0], seen[0][1]);
  EXPECT_EQ(seen[0][2], seen[0][3]);
}

TEST(Team, WeightProductsGiveTheSameBits) {
  const int64_t K = 512, N = 300;
  const std::vector<float> w = normal_values(N * K, 1);
  for (TensorType type : {TensorType::q8_0, TensorType::q4_1, TensorType::q4_k, TensorType::f16})
    for (quant::Matmul mode : {quant::Matmul::exact, quant::Matmul::int8})
      for (int64_t M : {1, 5}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(type) << " " << quant::matmul_name(mode) << " M=" << M);
        const std::vector<uint8_t> bytes = quant::quantize(type, w.data(), N * K);
        const quant::Matrix m = quant::matrix("w", type, bytes.data(), N, K);
        std::vector<float> x = normal_values(M * K, 2), y(M * N), bias = normal_values(N, 3);
        same_bits_in_a_team(y, [&] {
          quant::linear_forward(View(y.data(), {M, N}), View(x.data(), {M, K}), {m}, bias.data(),
                                mode);
        });
      }
  // One row of int8 products in a team: each thread rounds the row for itself, so the product
  // synchronises once, at the end of its loop.
  {
    const std::vector<uint8_t> bytes = quant::quantize(TensorType::q4_1, w.data(), N * K);
    const quant::Matrix m = quant::matrix("w", TensorType::q4_1, bytes.data(), N, K);
    std::vector<float> x = normal_values(K, 8), y(N);
    const int threads_before = num_threads();
    set_num_threads(2);
    int64_t barriers = -1;
    detail::run_team(2, [&] {
      const int64_t before = detail::sync_count().barriers;
#pragma omp barrier
      quant::linear_forward(View(y.data(), {1, N}), View(x.data(), {1, K}), {m}, nullptr,
                            quant::Matmul::int8);
#pragma omp barrier
      if (omp_get_thread_num() == 0) barriers = detail::sync_count().barriers - before;
    });
    set_num_threads(threads_before);
    EXPECT_EQ(barriers, 1);
  }
  // fp32 weights: the gemv (one row) and the GEMM (a prompt's rows), with a bias.
  for (int64_t M : {1, 64}) {
    std::vector<float> x = normal_values(M * K, 4), y(M * N), bias = normal_values(N, 5);
    std::vector<float> wf = w;
    same_bits_in_a_team(y, [&] {
      linear_forward(View(y.data(), {M, N}), View(x.data(), {M, K}), View(wf.data(), {N, K}),
                     bias.data());
    });
  }
}

TEST(Team, NormsAndRotaryPositionsGiveTheSameBits) {
  const int64_t N = 7, C = 256;
  const std::vector<float> x = normal_values(N * C, 6), w = normal_values(C, 7);
  std::vector<float> y(N * C), rstd(N);
  same_bits_in_a_team(y, [&] {
    rmsnorm_forward(View(y.data(), {N, C}), rstd.data(), View(const_cast<float*>(x.data()), {N, C}),
                    w.data(), 1e-5f);
  });
  std::vector<float> r(2 * 5 * 4 * 64);
  const std::vector<float> start = normal_values(r.size(), 8);
  same_bits_in_a_team(r, [&] {
    detail::team_serial([&] { std::copy(start.begin(), start.end(), r.begin()); });
    rope_forward(View(r.data(), {2, 5, 4, 64}), 40, 10000.0f, RopePairs::halves);
  });
}

// Attention over views (split-KV decoding, the tiled forward) and over a rotated q8_0 cache.
TEST(Team, AttentionGivesTheSameBits) {
  const int64_t Hq = 8, Hkv = 2, D = 64;
  for (int64_t Tq : {1, 4, 96}) {
    const int64_t Tk = Tq == 96 ? 96 : 2000;
    SCOPED_TRACE(Tq);
    std::vector<float> q = normal_values(Hq * Tq * D, 9), k = normal_values(Hkv * Tk * D, 10),
                       v = normal_values(Hkv * Tk * D, 11), out(Hq * Tq * D);
    AttentionArgs a{.q = View(q.data(), {1, Hq, Tq, D}),
                    .k = View(k.data(), {1, Hkv, Tk, D}),
                    .v = View(v.data(), {1, Hkv, Tk, D}),
                    .out = View(out.data(), {1, Hq, Tq, D})};
    a.mask.causal = true;
    same_bits_in_a_team(out, [&] { attention(a); });
    // The same keys and values stored rotated in q8_0.
    const int64_t block = rotation_block(D);
    std::vector<float> kr = k, vr = v;
    for (int64_t row = 0; row < Hkv * Tk; ++row) {
      hadamard_rotate(kr.data() + row * D, D, block);
      hadamard_rotate(vr.data() + row * D, D, block);
    }
    const std::vector<uint8_t> kq = quant::quantize(TensorType::q8_0, kr.data(), kr.size()),
                               vq = quant::quantize(TensorType::q8_0, vr.data(), vr.size());
    const StoredKV kv{.type = TensorType::q8_0,
                      .k = kq.data(),
                      .v = vq.data(),
                      .batch_stride = Hkv * Tk * D,
                      .head_stride = Tk * D,
                      .row_stride = D,
                      .heads = Hkv,
                      .dim_k = D,
                      .dim_v = D,
                      .length = Tk,
                      .rotation = block};
    AttentionArgs s{.q = a.q, .out = a.out};
    s.mask.causal = true;
    same_bits_in_a_team(out, [&] { attention(s, kv); });
    // The last 4 positions given as fresh rows: the visible rows gathered into team buffers.
    StoredKV fresh = kv;
    fresh.fresh_k = View(kr.data() + (Tk - 4) * D, {1, Hkv, 4, D}, {Hkv * Tk * D, Tk * D, D, 1});
    fresh.fresh_v = View(vr.data() + (Tk - 4) * D, {1, Hkv, 4, D}, {Hkv * Tk * D, Tk * D, D, 1});
    same_bits_in_a_team(out, [&] { attention(s, fresh); });
  }
}

// A decoded token runs every layer in one parallel region (Model::forward_cached with one new
// position): its logits are the same bits at 1 (no team), 2 and 3 threads, over fp32 and
// block-format weights (int8 and exact products), f32 and rotated q8_0 caches; one region a
// token, and barriers only where the team's data needs them (stated in docs/tuning.md).
TEST(Team, DecodedTokensGiveTheSameBitsAtEveryThreadCount) {
  const std::string gguf = std::string(QKV_GOLDEN_DIR) + "/../data/quant_llama.q4_k.gguf";
  struct Case {
    const char* name;
    std::function<std::unique_ptr<Model>()> make;
    quant::Matmul matmul;
  };
  const Case cases[] = {
      {"llama fp32",
       [] { return std::make_unique<Model>(testing::small_model(50, 64, true, 128), 7); },
       quant::Matmul::exact},
      {"gpt fp32",
       [] { return std::make_unique<Model>(testing::small_model(50, 64, false, 128), 8); },
       quant::Matmul::exact},
      {"q4_k int8", [&] { return load_gguf(gguf); }, quant::Matmul::int8},
      {"q4_k exact", [&] { return load_gguf(gguf); }, quant::Matmul::exact},
  };
  const int threads_before = num_threads();
  for (const Case& c : cases)
    for (CacheType cache_type : {CacheType::f32, CacheType::q8_0}) {
      SCOPED_TRACE(::testing::Message() << c.name << ", cache " << static_cast<int>(cache_type));
      std::unique_ptr<Model> model = c.make();
      model->set_matmul(c.matmul);
      if (cache_type != CacheType::f32 && model->config().d_head % 32 != 0) continue;
      const int64_t V = model->config().vocab_size, prompt = 5, steps = 6;
      std::mt19937 rng(3);
      std::vector<int32_t> tokens(prompt + steps);
      for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % V);
      std::vector<float> first;
      for (int threads : {1, 2, 3}) {
        set_num_threads(threads);
        KVCache cache(model->config(), {.max_seq = prompt + steps, .type = cache_type});
        std::vector<float> logits;
        model->forward_cached(cache, tokens.data(), 1, prompt);
        const detail::SyncCount before = detail::sync_count();
        for (int64_t t = prompt; t < prompt + steps; ++t) {
          const View l = model->forward_cached(cache, tokens.data() + t, 1, 1);
          logits.insert(logits.end(), l.data, l.data + V);
        }
        const detail::SyncCount after = detail::sync_count();
        if (threads == 1) {
          first = logits;
          EXPECT_EQ(after.barriers, before.barriers);
        } else {
          EXPECT_EQ(std::memcmp(logits.data(), first.data(), first.size() * sizeof(float)), 0)
              << threads << " threads";
          EXPECT_EQ(after.regions - before.regions, steps) << "one region a token";
          const double per_layer =
              double(after.barriers - before.barriers) / steps / double(model->config().n_layers);
          std::printf("%s, %d threads: %.1f barriers a layer a token\n", c.name, threads,
                      per_layer);
        }
      }
    }
  set_num_threads(threads_before);
}

}  // namespace
}  // namespace qkv
