// The AMX tile layer (src/simd/amx.h): the stand-in against products worked independently
// (small integers exactly, each sum's rounding in order, denormals, int32 wrap-around), its
// loads and stores byte by byte, its refusals; and, on a CPU with AMX, the instructions against
// the stand-in on random bytes.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention/kernels.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/number_format.h"
#include "qkv/targets.h"
#include "qkv/tensor.h"
#include "qkv/threads.h"
#include "simd/amx.h"
#include "simd/cpu.h"

namespace qkv {
namespace {

uint16_t bf16_bits(float x) {  // x must be a bf16 value (its low 16 bits zero)
  uint32_t u;
  std::memcpy(&u, &x, 4);
  EXPECT_EQ(u & 0xffff, 0u) << x;
  return static_cast<uint16_t>(u >> 16);
}
float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// c [M × N] fp32 += a [M × K] · b [K × N] with bf16 a and b, through `Tiles`: b's rows
// interleaved in pairs as the instruction reads them, K ≤ 32, M, N ≤ 16. The kernel source
// the stand-in and the hardware share.
template <class Tiles>
void bf16_tile_product(int M, int N, int K, const uint16_t* a, const uint16_t* b, float* c) {
  std::vector<uint16_t> pairs(16 * 32, 0);  // b as K/2 rows of N pairs
  for (int k = 0; k < K; ++k)
    for (int n = 0; n < N; ++n) pairs[(k / 2) * 2 * N + 2 * n + k % 2] = b[k * N + n];
  Tiles::configure(amx::Config{}.tile(0, M, 4 * N).tile(1, M, 2 * K).tile(2, K / 2, 4 * N));
  Tiles::template load<0>(c, 4 * N);
  Tiles::template load<1>(a, 2 * K);
  Tiles::template load<2>(pairs.data(), 4 * N);
  Tiles::template dpbf16ps<0, 1, 2>();
  Tiles::template store<0>(c, 4 * N);
  Tiles::release();
}

// c [M × N] int32 += a [M × K] u8 · b [K × N] s8, b's rows interleaved in quads.
template <class Tiles>
void int8_tile_product(int M, int N, int K, const uint8_t* a, const int8_t* b, int32_t* c) {
  std::vector<int8_t> quads(16 * 64, 0);
  for (int k = 0; k < K; ++k)
    for (int n = 0; n < N; ++n) quads[(k / 4) * 4 * N + 4 * n + k % 4] = b[k * N + n];
  Tiles::configure(amx::Config{}.tile(3, M, 4 * N).tile(5, M, K).tile(7, K / 4, 4 * N));
  Tiles::template load<3>(c, 4 * N);
  Tiles::template load<5>(a, K);
  Tiles::template load<7>(quads.data(), 4 * N);
  Tiles::template dpbusd<3, 5, 7>();
  Tiles::template store<3>(c, 4 * N);
  Tiles::release();
}

TEST(AmxStandIn, Bf16ProductsOfSmallIntegersAreExact) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> small(-8, 8);
  const int M = 16, N = 16, K = 32;
  std::vector<uint16_t> a(M * K), b(K * N);
  std::vector<float> av(M * K), bv(K * N), c(M * N);
  for (int i = 0; i < M * K; ++i) av[i] = float(small(rng)), a[i] = bf16_bits(av[i]);
  for (int i = 0; i < K * N; ++i) bv[i] = float(small(rng)), b[i] = bf16_bits(bv[i]);
  for (float& x : c) x = float(small(rng));
  std::vector<float> want = c;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k) want[m * N + n] += av[m * K + k] * bv[k * N + n];
  bf16_tile_product<amx::Emulated>(M, N, K, a.data(), b.data(), c.data());
  EXPECT_EQ(c, want);
}

// The order of Intel's manual. A pair's two products go to two sums that start at zero, added
// to c at the end: 1 + (2^-24 + 2^-24) = 1 + 2^-23, where adding each to c would round twice
// back to 1. Within one of the sums, k in order, each sum rounded: 1 + 2^-24 + 2^-24 stays 1.
TEST(AmxStandIn, Bf16SumsFollowTheManualsOrder) {
  const float tiny = std::ldexp(1.0f, -24);
  const uint16_t a[2] = {bf16_bits(tiny), bf16_bits(tiny)}, b[2] = {bf16_bits(1), bf16_bits(1)};
  float c = 1.0f;
  bf16_tile_product<amx::Emulated>(1, 1, 2, a, b, &c);
  EXPECT_EQ(c, 1.0f + std::ldexp(1.0f, -23));
  const uint16_t one = bf16_bits(1), small = bf16_bits(tiny);
  const uint16_t a3[6] = {one, 0, small, 0, small, 0}, b3[6] = {one, one, one, one, one, one};
  float c3 = 0.0f;
  bf16_tile_product<amx::Emulated>(1, 1, 6, a3, b3, &c3);
  EXPECT_EQ(c3, 1.0f);
  // Against a float64 product on random values: within K fp32 roundings of Σ|terms|.
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  const int M = 9, N = 13, K = 30;
  std::vector<uint16_t> av(M * K), bv(K * N);
  for (uint16_t& x : av) x = static_cast<uint16_t>(std::bit_cast<uint32_t>(normal(rng)) >> 16);
  for (uint16_t& x : bv) x = static_cast<uint16_t>(std::bit_cast<uint32_t>(normal(rng)) >> 16);
  std::vector<float> out(M * N, 0.5f);
  bf16_tile_product<amx::Emulated>(M, N, K, av.data(), bv.data(), out.data());
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double exact = 0.5, magnitude = 0.5;
      for (int k = 0; k < K; ++k) {
        const double t = double(float_of(uint32_t{av[m * K + k]} << 16)) *
                         float_of(uint32_t{bv[k * N + n]} << 16);
        exact += t, magnitude += std::abs(t);
      }
      EXPECT_NEAR(out[m * N + n], exact, K * std::ldexp(magnitude, -24)) << m << "," << n;
    }
}

TEST(AmxStandIn, Bf16DenormalsReadAsZeroAndSumsFlush) {
  const uint16_t denormal = 0x0001, big = bf16_bits(std::ldexp(1.0f, 100));
  const uint16_t a[2] = {denormal, bf16_bits(std::ldexp(1.0f, -70))};
  const uint16_t b[2] = {big, bf16_bits(std::ldexp(1.0f, -60))};
  // The denormal × 2^100 would be 2^-33; read as zero it adds nothing. 2^-70 · 2^-60 = 2^-130,
  // a denormal sum: flushed to zero. c's denormal is read as zero too.
  float c = std::numeric_limits<float>::denorm_min();
  bf16_tile_product<amx::Emulated>(1, 1, 2, a, b, &c);
  EXPECT_EQ(c, 0.0f);
}

TEST(AmxStandIn, Int8ProductsWrapAround) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> byte(0, 255);
  const int M = 16, N = 16, K = 64;
  std::vector<uint8_t> a(M * K);
  std::vector<int8_t> b(K * N);
  std::vector<int32_t> c(M * N);
  for (uint8_t& x : a) x = static_cast<uint8_t>(byte(rng));
  for (int8_t& x : b) x = static_cast<int8_t>(byte(rng) - 128);
  for (int32_t& x : c) x = std::numeric_limits<int32_t>::max() - byte(rng);  // sums wrap
  std::vector<int32_t> want(M * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      int64_t sum = c[m * N + n];
      for (int k = 0; k < K; ++k) sum += int64_t{a[m * K + k]} * b[k * N + n];
      want[m * N + n] = static_cast<int32_t>(static_cast<uint32_t>(sum));
    }
  int8_tile_product<amx::Emulated>(M, N, K, a.data(), b.data(), c.data());
  EXPECT_EQ(c, want);
}

TEST(AmxStandIn, LoadsAndStoresTouchExactlyTheirBytes) {
  using T = amx::Emulated;
  // A tile of 5 rows × 12 bytes, rows 37 bytes apart: a store writes those bytes only.
  std::vector<uint8_t> from(5 * 37), to(5 * 37 + 8, 0xEE);
  for (size_t i = 0; i < from.size(); ++i) from[i] = static_cast<uint8_t>(i);
  T::configure(amx::Config{}.tile(4, 5, 12));
  T::load<4>(from.data(), 37);
  T::store<4>(to.data(), 37);
  T::release();
  for (size_t i = 0; i < to.size(); ++i) {
    const bool in_tile = i < 5 * 37 && i % 37 < 12;
    EXPECT_EQ(to[i], in_tile ? from[i] : 0xEE) << i;
  }
  // A product over partial tiles (1 × 4 bf16 times 4 × 2, in tiles of 8 bytes a row) loaded
  // from rows of 64 bytes of ones: only the configured bytes count.
  std::vector<uint16_t> ones(16 * 32, bf16_bits(1));
  float c[2] = {0, 0};  // 1 × 2 result
  T::configure(amx::Config{}.tile(0, 1, 8).tile(1, 1, 8).tile(2, 2, 8));
  T::load<0>(c, 8);
  T::load<1>(ones.data(), 64);  // a: 1 row of 4 bf16 (K = 4)
  T::load<2>(ones.data(), 64);  // b: 2 rows of 2 pairs
  T::dpbf16ps<0, 1, 2>();
  T::store<0>(c, 8);
  T::release();
  EXPECT_EQ(c[0], 4.0f);
  EXPECT_EQ(c[1], 4.0f);
}

TEST(AmxStandIn, MisuseIsAnErrorThatSaysWhat) {
  using T = amx::Emulated;
  auto fails = [](auto&& call, const std::string& words) {
    try {
      call();
      ADD_FAILURE() << "no error; wanted one saying " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  fails([] { T::zero<0>(); }, "no tile configuration on this thread");
  T::configure(amx::Config{}.tile(0, 16, 64).tile(1, 16, 64).tile(2, 16, 64).tile(3, 8, 64));
  T::zero<0>();
  fails([] { T::zero<5>(); }, "tile 5 has no rows");
  fails([] { T::dpbf16ps<0, 0, 2>(); }, "three different tiles");
  fails([] { T::dpbf16ps<0, 3, 2>(); }, "has 8 rows but c (tile 0) has 16");
  T::configure(amx::Config{}.tile(0, 16, 64).tile(1, 16, 64).tile(2, 8, 64));
  fails([] { T::dpbusd<0, 1, 2>(); }, "need 16");
  T::configure(amx::Config{}.tile(0, 16, 32).tile(1, 16, 64).tile(2, 16, 64));
  fails([] { T::dpbusd<0, 1, 2>(); }, "has 64 bytes a row but c (tile 0) has 32");
  T::release();
  fails([] { T::zero<0>(); }, "no tile configuration");
  fails([] { T::configure(amx::Config{}.tile(0, 17, 64)); }, "at most 16 rows of 64");
  fails([] { T::configure(amx::Config{}.tile(0, 4, 0)); }, "both or neither");
}

TEST(AmxAvailability, SaysWhyNot) {
  EXPECT_EQ(amx::unavailable_because(true, true, true, 0), nullptr);
  EXPECT_NE(std::string(amx::unavailable_because(false, true, true, 0)).find("no AMX-BF16"),
            std::string::npos);
  EXPECT_NE(std::string(amx::unavailable_because(true, true, false, 1)).find("refused"),
            std::string::npos);
  EXPECT_NE(std::string(amx::unavailable_because(true, true, false, 0)).find("QKV_AMX_REFUSE"),
            std::string::npos);
}

#if defined(__x86_64__)
// The instructions against the stand-in on random bytes: denormals, ±0, Inf and NaN among the
// bf16 values (a NaN must be one on both sides), every int8 byte.
TEST(AmxHardware, MatchesTheStandIn) {
  if (const char* why = amx::unavailable()) GTEST_SKIP() << "no AMX here: " << why;
  std::mt19937 rng(4);
  std::uniform_int_distribution<int> word(0, 0xffff), pick(0, 15);
  const uint16_t special[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x7f80, 0xff80, 0x7fc0, 0x0080};
  auto value = [&] { return pick(rng) < 2 ? special[pick(rng) % 8] : uint16_t(word(rng)); };
  for (int round = 0; round < 20; ++round) {
    const int M = 1 + pick(rng), N = 1 + pick(rng), K = 2 * (1 + pick(rng));
    std::vector<uint16_t> a(M * K), b(K * N);
    for (uint16_t& x : a) x = value();
    for (uint16_t& x : b) x = value();
    std::vector<float> emulated(M * N), hardware;
    for (float& x : emulated) x = float_of(uint32_t(value()) << 16);
    hardware = emulated;
    bf16_tile_product<amx::Emulated>(M, N, K, a.data(), b.data(), emulated.data());
    bf16_tile_product<amx::Hardware>(M, N, K, a.data(), b.data(), hardware.data());
    for (int i = 0; i < M * N; ++i)
      if (std::isnan(emulated[i])) EXPECT_TRUE(std::isnan(hardware[i])) << i;
      else
        EXPECT_EQ(std::bit_cast<uint32_t>(emulated[i]), std::bit_cast<uint32_t>(hardware[i]))
            << i << ": " << emulated[i] << " against " << hardware[i];
    const int K8 = 4 * (1 + pick(rng));
    std::vector<uint8_t> a8(M * K8);
    std::vector<int8_t> b8(K8 * N);
    for (uint8_t& x : a8) x = static_cast<uint8_t>(word(rng));
    for (int8_t& x : b8) x = static_cast<int8_t>(word(rng));
    std::vector<int32_t> e8(M * N), h8;
    for (int32_t& x : e8) x = word(rng) * 65537;
    h8 = e8;
    int8_tile_product<amx::Emulated>(M, N, K8, a8.data(), b8.data(), e8.data());
    int8_tile_product<amx::Hardware>(M, N, K8, a8.data(), b8.data(), h8.data());
    EXPECT_EQ(e8, h8);
  }
}
#endif

// Attention on the AMX tile unit (src/attention/amx_unit-inl.h) through qkv::attention with
// bf16 keys and values forced onto it: what the kernel grid's tiny shapes do not reach (head
// dims of 64 and 128, a value dim unlike the key dim, partial key and query tiles, a group of
// query heads per kv head, fp32 queries as hi + lo, decode's few rows).
struct AmxCase {
  int64_t Hq, Hkv, Tq, Tk, D, Dv;
  bool causal, bf16_queries;
  int window = -1;
};

// out (fp32) of one case on the AMX unit, on the stand-in or the instructions.
std::vector<float> amx_attention(const AmxCase& c, bool stand_in,
                                 std::vector<float>* reference_out) {
  std::mt19937 rng(static_cast<uint32_t>(c.Tq * 131 + c.Tk * 7 + c.D + c.Dv + c.causal));
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<bf16> k(c.Hkv * c.Tk * c.D), v(c.Hkv * c.Tk * c.Dv);
  std::vector<float> kf(k.size()), vf(v.size());
  for (size_t i = 0; i < k.size(); ++i)
    k[i] = {float_to_bf16(u(rng))}, kf[i] = bf16_to_float(k[i].bits);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = {float_to_bf16(u(rng))}, vf[i] = bf16_to_float(v[i].bits);
  Tensor qf({1, c.Hq, c.Tq, c.D}), out({1, c.Hq, c.Tq, c.Dv});
  std::vector<bf16> qb(qf.numel());
  for (int64_t i = 0; i < qf.numel(); ++i) {
    qf.data()[i] = 2 * u(rng);  // (scores of a few units: the softmax is not flat)
    qb[i] = {float_to_bf16(qf.data()[i])};
    if (c.bf16_queries) qf.data()[i] = bf16_to_float(qb[i].bits);
  }
  AttentionArgs a{.q = c.bf16_queries ? View(qb.data(), {1, c.Hq, c.Tq, c.D}) : View(qf),
                  .k = View(k.data(), {1, c.Hkv, c.Tk, c.D}),
                  .v = View(v.data(), {1, c.Hkv, c.Tk, c.Dv}),
                  .out = out};
  a.mask.causal = c.causal;
  a.mask.window_left = c.window;
  amx::set_stand_in(stand_in);
  set_units("bf16=amx");
  detail::kernels_reached() = 0;
  attention(a);
  set_units("");
  amx::set_stand_in(false);
  const bool decodes = detail::decodes(c.Tq, c.Tk, c.Hq / c.Hkv);
  EXPECT_EQ(detail::kernels_reached().load(),
            static_cast<uint32_t>(decodes ? detail::Variant::decode_tiled_amx
                                          : detail::Variant::forward_tiles_amx));
  if (reference_out) {
    Tensor want({1, c.Hq, c.Tq, c.Dv});
    AttentionArgs r = a;
    r.q = View(qf), r.k = View(kf.data(), {1, c.Hkv, c.Tk, c.D});
    r.v = View(vf.data(), {1, c.Hkv, c.Tk, c.Dv}), r.out = want;
    reference::attention(r);
    reference_out->assign(want.data(), want.data() + want.numel());
  }
  return std::vector<float>(out.data(), out.data() + out.numel());
}

const AmxCase kAmxCases[] = {
    {2, 1, 70, 77, 128, 64, false, false},      // partial query and key tiles, Dv ≠ D
    {4, 2, 130, 200, 64, 64, true, true},       // causal, two query tiles, bf16 queries
    {2, 2, 65, 300, 96, 48, false, false, 40},  // a window; Dv of 3 × 16
    {32, 8, 1, 333, 128, 128, true, false},     // decode: 4 rows per kv head
    {8, 1, 3, 150, 64, 64, false, true},        // decode: 24 rows per kv head
};

TEST(AmxAttention, StandInMatchesTheReference) {
  for (const AmxCase& c : kAmxCases) {
    SCOPED_TRACE("Hq " + std::to_string(c.Hq) + " Hkv " + std::to_string(c.Hkv) + " Tq " +
                 std::to_string(c.Tq) + " Tk " + std::to_string(c.Tk) + " D " +
                 std::to_string(c.D) + " Dv " + std::to_string(c.Dv));
    std::vector<float> want;
    const std::vector<float> got = amx_attention(c, true, &want);
    // P is rounded to bf16 (an output moves by at most 2^-8 max|v| = 2^-8), q as hi + lo;
    // the products are exact and summed in fp32.
    float worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
    EXPECT_LE(worst, 6e-3f);
    EXPECT_GT(worst, 0.0f) << "P is rounded to bf16 on the tiles: equal bits mean they did not run";
  }
}

// A value the causal mask hides from a query never reaches it, even an Inf in a key block the
// tiles' depth of 32 keys spans: the rows of the first 16 keys' block (which sees none of the
// second's) are the reference's over finite values. (Rows 16–19, whose 16-key block is the
// poisoned key's, get 0 · Inf = NaN on every unit: a block is multiplied whole.)
TEST(AmxAttention, AHiddenKeyNeverReachesTheQueriesItIsHiddenFrom) {
  const int64_t T = 64, D = 64, poisoned = 20;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<bf16> q(T * D), k(T * D), v(T * D);
  std::vector<float> qf(T * D), kf(T * D), vf(T * D);
  for (auto [bits, f] : {std::pair{&q, &qf}, std::pair{&k, &kf}, std::pair{&v, &vf}})
    for (int64_t i = 0; i < T * D; ++i) {
      (*bits)[i] = {float_to_bf16(u(rng))};
      (*f)[i] = bf16_to_float((*bits)[i].bits);
    }
  for (int64_t d = 0; d < D; ++d) v[poisoned * D + d] = {0x7f80};  // +Inf
  Tensor got({1, 1, T, D}), want({1, 1, T, D});
  AttentionArgs a{.q = View(q.data(), {1, 1, T, D}),
                  .k = View(k.data(), {1, 1, T, D}),
                  .v = View(v.data(), {1, 1, T, D}),
                  .out = got};
  a.mask.causal = true;
  amx::set_stand_in(true);
  set_units("bf16=amx");
  attention(a);
  set_units("");
  amx::set_stand_in(false);
  AttentionArgs r = a;  // finite values: the rows before the poisoned key do not see it
  r.q = View(qf.data(), {1, 1, T, D}), r.k = View(kf.data(), {1, 1, T, D});
  r.v = View(vf.data(), {1, 1, T, D}), r.out = want;
  reference::attention(r);
  for (int64_t i = 0; i < 16; ++i)
    for (int64_t d = 0; d < D; ++d)
      ASSERT_NEAR(got.data()[i * D + d], want.data()[i * D + d], 6e-3f) << "row " << i;
}

TEST(AmxAttention, InstructionsGiveTheStandInsBits) {
  if (const char* why = amx::unavailable()) GTEST_SKIP() << "no AMX here: " << why;
  for (const AmxCase& c : kAmxCases) {
    const std::vector<float> emulated = amx_attention(c, true, nullptr);
    const std::vector<float> hardware = amx_attention(c, false, nullptr);
    ASSERT_EQ(emulated.size(), hardware.size());
    EXPECT_EQ(std::memcmp(emulated.data(), hardware.data(), 4 * emulated.size()), 0)
        << "Tq " << c.Tq << " Tk " << c.Tk << " D " << c.D;
  }
}

// The backward on the AMX unit against the reference backward over the same bf16 values: dq,
// dk and dv (fp32 gradients of bf16 inputs), for a causal GQA case with partial tiles, a
// window, and a softcap. On a CPU with AMX, the instructions give the stand-in's bits too.
struct AmxBackwardCase {
  int64_t Hq, Hkv, T, D, Dv;
  bool causal;
  int window;
  float softcap;
  float dropout = 0;
};
const AmxBackwardCase kAmxBackwardCases[] = {
    {4, 2, 150, 64, 64, true, -1, 0},         // GQA, causal, partial query and key tiles
    {2, 2, 70, 128, 64, false, 30, 0, 0.2f},  // a window: masked blocks; dropout
    {2, 1, 90, 32, 32, false, -1, 3},         // a softcap; MQA (the key steps shared out)
};

// dq, dk, dv of one case (fp32 gradients, bf16 q, k, v, dout) on the AMX unit (stand-in or
// instructions), and the reference's in `want` when given.
std::vector<float> amx_backward(const AmxBackwardCase& c, bool stand_in, std::vector<float>* want) {
  std::mt19937 rng(static_cast<uint32_t>(c.T * 17 + c.D + c.Dv));
  std::uniform_real_distribution<float> u(-1, 1);
  auto bf16_tensor = [&](int64_t H, int64_t E, float size, std::vector<bf16>& bits, Tensor& f) {
    f = Tensor({1, H, c.T, E});
    bits.resize(f.numel());
    for (int64_t i = 0; i < f.numel(); ++i) {
      bits[i] = {float_to_bf16(size * u(rng))};
      f.data()[i] = bf16_to_float(bits[i].bits);
    }
    return View(bits.data(), {1, H, c.T, E});
  };
  std::vector<bf16> qb, kb, vb, gb, ob;
  Tensor qf, kf, vf, gf, of;
  AttentionArgs a;
  a.q = bf16_tensor(c.Hq, c.D, 2, qb, qf);
  a.k = bf16_tensor(c.Hkv, c.D, 1, kb, kf);
  a.v = bf16_tensor(c.Hkv, c.Dv, 1, vb, vf);
  const View dout = bf16_tensor(c.Hq, c.Dv, 1, gb, gf);
  a.mask.causal = c.causal;
  a.mask.window_left = c.window;
  a.softcap = c.softcap;
  a.dropout = {.p = c.dropout, .seed = 11};
  Tensor lse({1, c.Hq, c.T});
  ob.resize(c.Hq * c.T * c.Dv);
  a.out = View(ob.data(), {1, c.Hq, c.T, c.Dv});
  a.lse = lse.data();
  Tensor dq({1, c.Hq, c.T, c.D}), dk({1, c.Hkv, c.T, c.D}), dv({1, c.Hkv, c.T, c.Dv});
  amx::set_stand_in(stand_in);
  set_units("bf16=amx");
  attention(a);
  detail::kernels_reached() = 0;
  attention_backward(a, dout, dq, dk, dv);
  EXPECT_EQ(
      detail::kernels_reached().load() & static_cast<uint32_t>(detail::Variant::backward_tiles_amx),
      static_cast<uint32_t>(detail::Variant::backward_tiles_amx));
  set_units("");
  amx::set_stand_in(false);
  std::vector<float> got;
  for (const Tensor* t : {&dq, &dk, &dv}) got.insert(got.end(), t->data(), t->data() + t->numel());
  if (want) {
    AttentionArgs r = a;
    Tensor rout({1, c.Hq, c.T, c.Dv});
    r.q = View(qf), r.k = View(kf), r.v = View(vf), r.out = rout, r.lse = nullptr;
    Tensor rq({1, c.Hq, c.T, c.D}), rk({1, c.Hkv, c.T, c.D}), rv({1, c.Hkv, c.T, c.Dv});
    reference::attention_backward(r, View(gf), rq, rk, rv);
    want->clear();
    for (const Tensor* t : {&rq, &rk, &rv})
      want->insert(want->end(), t->data(), t->data() + t->numel());
  }
  return got;
}

// The targets the stand-in's tests run on: the best, and AVX2's 8 lanes where it is not the
// best (the tiles' columns are a target's lanes; the kernel grid runs the forward on every
// target).
std::vector<std::string> targets_to_test() {
  std::vector<std::string> targets = {"best"};
  for (const std::string& t : supported_targets())
    if (t == "avx2" && supported_targets().front() != "avx2") targets.push_back(t);
  return targets;
}

TEST(AmxAttention, BackwardOnTheStandInMatchesTheReference) {
  for (const std::string& target : targets_to_test())
    for (const AmxBackwardCase& c : kAmxBackwardCases) {
      set_target(target);
      SCOPED_TRACE(target + ": T " + std::to_string(c.T) + " D " + std::to_string(c.D));
      std::vector<float> want;
      const std::vector<float> got = amx_backward(c, true, &want);
      ASSERT_EQ(got.size(), want.size());
      // P and dS rounded to bf16 (2^-9 relative), the forward's output and lse from the tiles
      // too, against the reference on the same bf16 inputs.
      float worst = 0, size = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::abs(got[i] - want[i]));
        size = std::max(size, std::abs(want[i]));
      }
      EXPECT_LE(worst, 3e-3f * size) << "largest gradient " << size;  // (seen: 1e-3 · size)
      EXPECT_GT(worst, 0.0f);
    }
  set_target("best");
}

TEST(AmxAttention, BackwardGivesTheSameBitsForAnyThreadCount) {
  const int threads = num_threads();
  for (const AmxBackwardCase& c : kAmxBackwardCases) {
    set_num_threads(1);
    const std::vector<float> one = amx_backward(c, true, nullptr);
    set_num_threads(3);  // (MQA and GQA at batch 1 share each query tile's key steps out)
    const std::vector<float> three = amx_backward(c, true, nullptr);
    EXPECT_EQ(std::memcmp(one.data(), three.data(), 4 * one.size()), 0) << "T " << c.T;
  }
  set_num_threads(threads);
}

TEST(AmxAttention, BackwardInstructionsGiveTheStandInsBits) {
  if (const char* why = amx::unavailable()) GTEST_SKIP() << "no AMX here: " << why;
  for (const AmxBackwardCase& c : kAmxBackwardCases) {
    const std::vector<float> emulated = amx_backward(c, true, nullptr);
    const std::vector<float> hardware = amx_backward(c, false, nullptr);
    EXPECT_EQ(std::memcmp(emulated.data(), hardware.data(), 4 * emulated.size()), 0) << "T " << c.T;
  }
}

TEST(AmxAttention, OffUnlessForced) {
  // No rule of the registry chooses AMX: it is forced or it does not run.
  EXPECT_NE(simd::unit_for(simd::Work::bf16).unit, simd::Unit::amx);
  EXPECT_NE(simd::unit_for(simd::Work::int8).unit, simd::Unit::amx);
  amx::set_stand_in(false);
  if (const char* why = amx::unavailable()) {
    for (const char* spec : {"bf16=amx", "int8=amx"}) {
      try {
        set_units(spec);
        FAIL() << "forcing " << spec << " on a CPU without AMX was accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("amx"), std::string::npos) << e.what();
      }
    }
    (void)why;
  }
}

}  // namespace
}  // namespace qkv
