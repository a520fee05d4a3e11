// The key/value cache: decoding token by token (and prefilling in chunks) through the cache
// must give the logits of one full forward over the whole sequence, for every model style.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "model_configs.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "qkv/targets.h"
#include "qkv/model.h"
#include "qkv/number_format.h"

namespace qkv {
namespace {

// d_model 32 (head dim 8) unless told; block caches need a head dim of whole 32s (d_model 128).
ModelConfig config_of(const std::string& style, int64_t d_model = 32) {
  ModelConfig c = testing::small_model(37, 64, style == "llama" || style == "window", d_model);
  c.init_std = 0.25f;  // large enough that the logits differ clearly from position to position
  if (style == "sinusoidal") c.positions = PositionKind::sinusoidal;
  if (style == "alibi") c.positions = PositionKind::alibi;
  if (style == "mqa") use_llama_style(c), c.n_kv_heads = 1;
  if (style == "window") c.window = 3;
  if (style == "sinks") use_llama_style(c), c.sinks = true;
  return c;
}

// Sink logits from -1 to 2 (a model starts them at 0), so that each head's differs.
void spread_sinks(Model& m) {
  for (int64_t l = 0; l < m.config().n_layers && m.config().sinks; ++l) {
    const View s = m.weight("layers." + std::to_string(l) + ".attn.sinks");
    for (int64_t h = 0; h < s.shape[0]; ++h)
      s.data[h] = -1.0f + 3.0f * float(h + l) / float(s.shape[0]);
  }
}

std::vector<int32_t> tokens_of(int64_t n, int seed, int64_t vocab) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

// The logits [T, V] of a full forward over one sequence.
std::vector<float> full_logits(Model& m, const std::vector<int32_t>& tokens) {
  const int64_t T = tokens.size();
  m.forward(tokens.data(), nullptr, 1, T);
  const View l = m.logits();
  return std::vector<float>(l.data, l.data + T * m.config().vocab_size);
}

// max |a − b| over max |a|, for logits rows [from, from + rows) of `expected`.
double relative_error(const std::vector<float>& expected, int64_t row, const View got,
                      int64_t got_row, int64_t V) {
  double diff = 0, scale = 0;
  for (int64_t v = 0; v < V; ++v) {
    diff = std::max(diff, std::abs(double(expected[row * V + v]) - got(got_row, v)));
    scale = std::max(scale, std::abs(double(expected[row * V + v])));
  }
  return diff / scale;
}

class CacheMatchesFullForward : public ::testing::TestWithParam<std::string> {};

TEST_P(CacheMatchesFullForward, PrefillThenOneTokenAtATime) {
  const ModelConfig c = config_of(GetParam());
  Model m(c, 3);
  spread_sinks(m);
  const auto tokens = tokens_of(23, 1, c.vocab_size);
  const auto expected = full_logits(m, tokens);
  KVCache cache(c, {.max_seq = 32});
  const int64_t prompt = 9, V = c.vocab_size;
  View l = m.forward_cached(cache, tokens.data(), 1, prompt, nullptr, /*all_logits=*/true);
  for (int64_t t = 0; t < prompt; ++t)
    EXPECT_LE(relative_error(expected, t, l, t, V), 1e-5) << "prefill position " << t;
  for (int64_t t = prompt; t < 23; ++t) {
    l = m.forward_cached(cache, &tokens[t], 1, 1);
    EXPECT_LE(relative_error(expected, t, l, 0, V), 1e-5) << "decoded position " << t;
  }
  EXPECT_EQ(cache.length(0), 23);
}

TEST_P(CacheMatchesFullForward, PrefillInChunks) {
  const ModelConfig c = config_of(GetParam());
  Model m(c, 4);
  spread_sinks(m);
  const auto tokens = tokens_of(20, 2, c.vocab_size);
  const auto expected = full_logits(m, tokens);
  KVCache cache(c, {.max_seq = 20});
  int64_t done = 0;
  for (int64_t chunk : {1, 6, 2, 11}) {
    const View l = m.forward_cached(cache, &tokens[done], 1, chunk, nullptr, true);
    for (int64_t t = 0; t < chunk; ++t)
      EXPECT_LE(relative_error(expected, done + t, l, t, c.vocab_size), 1e-5);
    done += chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Styles, CacheMatchesFullForward,
                         ::testing::Values("gpt2", "llama", "mqa", "sinusoidal", "alibi", "window",
                                           "sinks"));

// Three sequences of different lengths in one cache: prompts prefilled one by one, then
// decoded together, each step one token for every sequence.
// The cache's names and the formats' own table name each storage alike (qkv info and the
// CLI print lower_name; --cache reads cache_type).
TEST(KVCache, TypeNamesAreTheFormatsLowerCaseNames) {
  for (const std::string& name : cache_type_names())
    EXPECT_EQ(lower_name(cache_element_type(cache_type(name))), name);
}

TEST(KVCache, BatchOfDifferentLengths) {
  const ModelConfig c = config_of("llama");
  Model m(c, 5);
  const std::vector<int64_t> prompt = {5, 9, 2};
  const int64_t steps = 6, V = c.vocab_size;
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<float>> expected;
  for (int s = 0; s < 3; ++s) {
    seqs.push_back(tokens_of(prompt[s] + steps, 10 + s, V));
    expected.push_back(full_logits(m, seqs[s]));
  }
  KVCache cache(c, {.batch = 3, .max_seq = 16});
  for (int64_t s = 2; s >= 0; --s) {  // any order
    const View l = m.forward_cached(cache, seqs[s].data(), 1, prompt[s], &s);
    EXPECT_LE(relative_error(expected[s], prompt[s] - 1, l, 0, V), 1e-5);
  }
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<int32_t> next;
    for (int s = 0; s < 3; ++s) next.push_back(seqs[s][prompt[s] + step]);
    const View l = m.forward_cached(cache, next.data(), 3, 1);
    for (int s = 0; s < 3; ++s)
      EXPECT_LE(relative_error(expected[s], prompt[s] + step, l, s, V), 1e-5)
          << "sequence " << s << " step " << step;
  }
  for (int s = 0; s < 3; ++s) EXPECT_EQ(cache.length(s), prompt[s] + steps);
}

// A ring of window + 1 slots against the sliding-window model's full forward, far past the
// ring's size, one token at a time and in chunks larger than the ring.
TEST(KVCache, RingBufferMatchesSlidingWindow) {
  const ModelConfig c = config_of("window");
  Model m(c, 6);
  const auto tokens = tokens_of(40, 3, c.vocab_size);
  const auto expected = full_logits(m, tokens);
  for (int64_t chunk : {1, 7}) {
    KVCache cache(c, {.max_seq = 64, .ring = true});
    EXPECT_EQ(cache.slots(), c.window + 1);
    for (int64_t done = 0; done < 40; done += chunk) {
      const int64_t n = std::min<int64_t>(chunk, 40 - done);
      const View l = m.forward_cached(cache, &tokens[done], 1, n, nullptr, true);
      for (int64_t t = 0; t < n; ++t)
        EXPECT_LE(relative_error(expected, done + t, l, t, c.vocab_size), 1e-5)
            << "chunk " << chunk << " position " << done + t;
    }
  }
  // The window matters: without it the logits differ.
  ModelConfig full = c;
  full.window = 0;
  Model unwindowed(full, 6);
  const auto other = full_logits(unwindowed, tokens);
  EXPECT_GT(std::abs(other[39 * c.vocab_size] - expected[39 * c.vocab_size]), 1e-4);
}

// bf16 and fp16 storage: half the bytes, logits close to fp32's (keys and values carry 8 or 11
// bits of mantissa: ~0.4% or ~0.05% relative each).
TEST(KVCache, SixteenBitStorageHalvesMemoryAndStaysClose) {
  for (const char* style : {"llama", "window"})
    for (CacheType type : {CacheType::bf16, CacheType::f16}) {
      const ModelConfig c = config_of(style);
      Model m(c, 7);
      const auto tokens = tokens_of(30, 4, c.vocab_size);
      const auto expected = full_logits(m, tokens);
      KVCache f32(c, {.max_seq = 30}), half(c, {.max_seq = 30, .type = type});
      EXPECT_EQ(half.bytes() * 2, f32.bytes());
      m.forward_cached(half, tokens.data(), 1, 10);
      double worst = 0;
      for (int64_t t = 10; t < 30; ++t) {
        const View l = m.forward_cached(half, &tokens[t], 1, 1);
        worst = std::max(worst, relative_error(expected, t, l, 0, c.vocab_size));
      }
      // bf16 measured 2.8e-2 (llama), weights of std 0.25; fp16 has 8x finer steps.
      EXPECT_LE(worst, type == CacheType::bf16 ? 5e-2 : 6e-3) << style;
      EXPECT_GT(worst, 0) << style << ": the rounding should show";
    }
}

// One token at a time (split-KV decoding) and a chunk of tokens (the tiled forward) both read
// the bf16 rows in place; a ring's overrun chunk, through an fp32 copy of the same rounded
// rows. All see the same numbers: the same logits up to summation order (the kernels agree to
// ~1e-7, tests/attention_flash_test.cpp; through two layers of these large weights that grew
// to 6.5e-5 at the sliding window's last positions on AVX2 and AVX-512, 2.9e-4 on SSE4's
// 4-lane sums): bounded at 1e-3, half of bf16's rounding (2^-9), which a row read or stored
// differently would show. On the bf16 units (avx512_bf16,
// neon_bf16) the tiled forward and decoding round P differently (attention_dtype_test bounds
// each), so the comparison runs the widening kernels.
TEST(KVCache, Bf16DecodingInPlaceMatchesTheCopiedRows) {
  struct WideningKernels {
    std::string saved = current_target();
    WideningKernels() {
      if (saved == "avx512_bf16") set_target("avx512_dl");
      if (saved == "neon_bf16") set_target("neon");
    }
    ~WideningKernels() { set_target(saved); }
  } widening;
  for (const char* style : {"llama", "alibi", "window"}) {
    const ModelConfig c = config_of(style);
    Model m(c, 12);
    const auto tokens = tokens_of(40, 6, c.vocab_size);
    KVCache one(c, {.max_seq = 40, .type = CacheType::bf16}),
        chunk(c, {.max_seq = 40, .type = CacheType::bf16});
    m.forward_cached(one, tokens.data(), 1, 10);
    m.forward_cached(chunk, tokens.data(), 1, 10);
    const View all = m.forward_cached(chunk, &tokens[10], 1, 30, nullptr, true);
    const std::vector<float> expected(all.data, all.data + 30 * c.vocab_size);
    for (int64_t t = 0; t < 30; ++t) {
      const View l = m.forward_cached(one, &tokens[10 + t], 1, 1);
      EXPECT_LE(relative_error(expected, t, l, 0, c.vocab_size), 1e-3)
          << style << " position " << 10 + t;
    }
  }
}

// Every cache type in blocks (cache_type_names()).
std::vector<CacheType> block_cache_types() {
  std::vector<CacheType> types;
  for (const std::string& name : cache_type_names())
    if (is_kv_block_type(cache_element_type(cache_type(name)))) types.push_back(cache_type(name));
  return types;
}

TEST(KVCache, EveryBlockFormatIsACacheType) {
  std::vector<CacheType> want;
  for (const char* name : {"q8_0", "q4_0", "q4_1"}) want.push_back(cache_type(name));
  EXPECT_EQ(block_cache_types(), want);
  EXPECT_EQ(cache_type_choices(), "f32, bf16, f16, q8_0, q4_0 or q4_1");
  try {
    cache_type("q5_0");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f32, bf16, f16, q8_0, q4_0 or q4_1, got \"q5_0\""),
              std::string::npos)
        << e.what();
  }
}

// q8_0, q4_0 and q4_1 storage: 34, 18 and 20 bytes per 32 values (0.27, 0.14 and 0.16 of
// fp32), each row quantized as it is written; the logits stay close to the full forward's.
TEST(KVCache, BlockStorageIsSmallAndStaysClose) {
  for (const char* style : {"llama", "window"})
    for (CacheType type : block_cache_types()) {
      const ModelConfig c = config_of(style, 128);
      Model m(c, 7);
      const auto tokens = tokens_of(30, 4, c.vocab_size);
      const auto expected = full_logits(m, tokens);
      KVCache f32(c, {.max_seq = 30}), blocks(c, {.max_seq = 30, .type = type});
      const int64_t block_bytes = type == CacheType::q8_0 ? 34 : type == CacheType::q4_0 ? 18 : 20;
      EXPECT_EQ(blocks.bytes() * 128, f32.bytes() * block_bytes) << cache_type_name(type);
      m.forward_cached(blocks, tokens.data(), 1, 10);
      double worst = 0;
      for (int64_t t = 10; t < 30; ++t) {
        const View l = m.forward_cached(blocks, &tokens[t], 1, 1);
        worst = std::max(worst, relative_error(expected, t, l, 0, c.vocab_size));
      }
      // Measured with these weights (std 0.25, which amplify any change): bf16 2.2e-2, q8_0
      // 5.9e-2 and 6.7e-2, q4_0 (16x coarser steps) 0.67 and 0.57, q4_1 0.62 and 0.97.
      // SmolLM2's perplexity is the
      // quality measure that matters (docs/api.md); this bounds the noise to its expected size.
      EXPECT_LE(worst, type == CacheType::q8_0 ? 0.12 : 1.5)
          << cache_type_name(type) << " " << style;
      EXPECT_GT(worst, 0) << style << ": the rounding should show";
    }
}

// Keys and values each in a type of their own: each tensor holds its own type's bytes, rotated
// when either is a block format (automatic), and the logits stay as close to the full forward's
// as the coarser of the two symmetric caches' (BlockStorageIsSmallAndStaysClose).
TEST(KVCache, KeysAndValuesInTypesOfTheirOwn) {
  const ModelConfig c = config_of("llama", 128);
  Model m(c, 7);
  const auto tokens = tokens_of(30, 4, c.vocab_size);
  const auto expected = full_logits(m, tokens);
  KVCache f32(c, {.max_seq = 30});
  KVCache mixed(c, {.max_seq = 30, .key_type = CacheType::q8_0, .value_type = CacheType::q4_0});
  EXPECT_EQ(mixed.key_type(), CacheType::q8_0);
  EXPECT_EQ(mixed.value_type(), CacheType::q4_0);
  EXPECT_EQ(mixed.bytes() * 128 * 2, f32.bytes() * (34 + 18));  // per 32 values: 34 and 18
  EXPECT_GT(mixed.rotation(), 0);
  KVCache half_keys(c, {.max_seq = 30, .type = CacheType::f16, .value_type = CacheType::q8_0});
  EXPECT_EQ(half_keys.bytes() * 128 * 2, f32.bytes() * (64 + 34));
  EXPECT_GT(half_keys.rotation(), 0);
  EXPECT_EQ(KVCache(c, {.max_seq = 30, .type = CacheType::f16, .value_type = CacheType::bf16})
                .rotation(),
            0);
  for (KVCache* cache : {&mixed, &half_keys}) {
    m.forward_cached(*cache, tokens.data(), 1, 10);
    double worst = 0;
    for (int64_t t = 10; t < 30; ++t) {
      const View l = m.forward_cached(*cache, &tokens[t], 1, 1);
      worst = std::max(worst, relative_error(expected, t, l, 0, c.vocab_size));
    }
    EXPECT_LE(worst, cache == &mixed ? 1.5 : 0.12) << cache_type_name(cache->key_type());
    EXPECT_GT(worst, 0) << "the rounding should show";
  }
  try {  // head dim 8: q4_0 values need whole blocks of 32, whatever the keys
    KVCache(config_of("llama"), {.type = CacheType::f16, .value_type = CacheType::q4_0});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q4_0 cache stores rows as blocks of 32"),
              std::string::npos)
        << e.what();
  }
}

// append() stores rows as attend() does (rounded, quantized and rotated alike): attention over
// the two caches' stored rows gives the same bits, and stored() steps from one sequence to
// the next by its batch stride.
TEST(KVCache, AppendStoresWhatAttendStores) {
  const ModelConfig c = config_of("llama", 128);
  const int64_t T = 9, H = c.n_kv_heads, D = c.d_head, Hq = c.n_heads;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> k(T * H * D), v(T * H * D), q(Hq * T * D), o(Hq * T * D);
  for (std::vector<float>* x : {&k, &v, &q})
    for (float& e : *x) e = u(rng);
  const KVCacheOptions options{.batch = 2, .max_seq = 16, .key_type = CacheType::q8_0,
                               .value_type = CacheType::q4_0};
  KVCache attended(c, options), appended(c, options);
  AttentionArgs args{.q = View(q.data(), {1, Hq, T, D}), .out = View(o.data(), {1, Hq, T, D})};
  args.mask.causal = true;
  for (int64_t seq = 0; seq < 2; ++seq) {
    attended.attend(0, seq, args, k.data(), v.data(), H * D);
    attended.advance(seq, T);
    appended.append(0, seq, k.data(), v.data(), H * D, T);
    appended.advance(seq, T);
  }
  std::vector<float> q2(2 * Hq * D), want(2 * Hq * D), got(2 * Hq * D);
  for (float& e : q2) e = u(rng);
  AttentionArgs one{.q = View(q2.data(), {2, Hq, 1, D})};
  one.out = View(want.data(), {2, Hq, 1, D});
  attention(one, attended.stored(0, 0, T));
  one.out = View(got.data(), {2, Hq, 1, D});
  attention(one, appended.stored(0, 0, T));
  EXPECT_EQ(want, got);
  EXPECT_THROW(appended.append(0, 0, k.data(), v.data(), H * D, 8), Error);  // past max_seq
  EXPECT_THROW(appended.append(c.n_layers, 0, k.data(), v.data(), H * D, 1), Error);  // no layer
}

// One token at a time (split-KV decoding), a chunk (the tiled forward), a ring of window + 1
// slots (its overrun chunk through an fp32 copy of the dequantized rows) and a batch of
// sequences of different lengths all read the same quantized rows: each row is quantized
// alone, wherever it is stored. So they agree up to summation order (the bound of the bf16
// test above), and a sequence reset and run again gives its logits again. (Unrotated: a row
// computed one token at a time and in a chunk differs in its last bits, and rotated, that
// moves a value across a rounding boundary of its block often enough to show at this bound;
// the rotated rows' kernels are checked in attention_stored_test.)
TEST(KVCache, BlockCachesAgreeAcrossKernelsRingsAndBatches) {
  for (CacheType type : block_cache_types()) {
    const ModelConfig c = config_of("window", 128);
    const int64_t V = c.vocab_size;
    Model m(c, 12);
    const auto tokens = tokens_of(40, 6, V);
    const CacheRotation off = CacheRotation::off;
    const CacheScores exact = CacheScores::exact;  // (int8 scores: attention_stored_test)
    KVCache one(c, {.max_seq = 40, .type = type, .rotation = off, .scores = exact});
    const View all = m.forward_cached(one, tokens.data(), 1, 40, nullptr, true);
    const std::vector<float> expected(all.data, all.data + 40 * V);
    one.reset();
    m.forward_cached(one, tokens.data(), 1, 10);
    for (int64_t t = 10; t < 40; ++t)
      EXPECT_LE(relative_error(expected, t, m.forward_cached(one, &tokens[t], 1, 1), 0, V), 2e-4)
          << cache_type_name(type) << " one token, position " << t;
    for (int64_t chunk : {1, 7}) {
      KVCache ring(c,
                   {.max_seq = 64, .type = type, .rotation = off, .ring = true, .scores = exact});
      for (int64_t done = 0; done < 40; done += chunk) {
        const int64_t n = std::min<int64_t>(chunk, 40 - done);
        const View l = m.forward_cached(ring, &tokens[done], 1, n, nullptr, true);
        for (int64_t t = 0; t < n; ++t)
          EXPECT_LE(relative_error(expected, done + t, l, t, V), 2e-4)
              << cache_type_name(type) << " ring chunk " << chunk << ", position " << done + t;
      }
    }
    // Three sequences in one cache: the first is `tokens`, the others shorter prefixes of it.
    KVCache batch(c, {.batch = 3, .max_seq = 40, .type = type, .rotation = off, .scores = exact});
    const int64_t prompt[3] = {12, 5, 9};
    for (int64_t s = 0; s < 3; ++s) m.forward_cached(batch, tokens.data(), 1, prompt[s], &s);
    batch.reset(1);  // forgotten, then run again: the same rows again
    const int64_t seq1 = 1;
    m.forward_cached(batch, tokens.data(), 1, prompt[1], &seq1);
    for (int64_t step = 0; step < 20; ++step) {
      int32_t next[3];
      for (int s = 0; s < 3; ++s) next[s] = tokens[prompt[s] + step];
      const View l = m.forward_cached(batch, next, 3, 1);
      for (int s = 0; s < 3; ++s)
        EXPECT_LE(relative_error(expected, prompt[s] + step, l, s, V), 2e-4)
            << cache_type_name(type) << " batch sequence " << s << ", step " << step;
    }
  }
}

// Keys and values in types of their own, over the same rows: the rows a chunk computes differ
// from a token's in their last bits (another product's order), which can move a value across a
// 4-bit rounding boundary, so each comparison computes its rows alike. One token at a time
// (split-KV decoding with the values widened a block at a time)
// in a plain cache and in a ring, and chunks of 7 (the tiled forward) in both, agree up to
// summation order.
TEST(KVCache, CachesWithKeysAndValuesOfTheirOwnAgreeAcrossKernelsAndRings) {
  const ModelConfig c = config_of("window", 128);
  const int64_t V = c.vocab_size;
  Model m(c, 12);
  const auto tokens = tokens_of(40, 6, V);
  for (auto [k, v] : {std::pair{CacheType::q8_0, CacheType::q4_0},
                      std::pair{CacheType::q4_0, CacheType::q8_0},
                      std::pair{CacheType::f16, CacheType::q4_1},
                      std::pair{CacheType::f32, CacheType::q4_1}})
    for (int64_t chunk : {1, 7}) {
      const std::string name = std::string(cache_type_name(k)) + "/" + cache_type_name(v) +
                               " chunk " + std::to_string(chunk);
      // (Unrotated, exact scores, as above: attention_stored_test checks those arithmetics.)
      const KVCacheOptions o{.max_seq = 64,
                             .key_type = k,
                             .value_type = v,
                             .rotation = CacheRotation::off,
                             .scores = CacheScores::exact};
      KVCacheOptions ring_options = o;
      ring_options.ring = true;
      KVCache plain(c, o), ring(c, ring_options);
      for (int64_t done = 0; done < 40; done += chunk) {
        const int64_t n = std::min<int64_t>(chunk, 40 - done);
        const View a = m.forward_cached(plain, &tokens[done], 1, n, nullptr, true);
        const std::vector<float> expected(a.data, a.data + n * V);
        const View b = m.forward_cached(ring, &tokens[done], 1, n, nullptr, true);
        for (int64_t t = 0; t < n; ++t)
          EXPECT_LE(relative_error(expected, t, b, t, V), 2e-4)
              << name << ", ring, position " << done + t;
      }
    }
}

TEST(KVCache, OutgrowingTheCacheIsAClearError) {
  const ModelConfig c = config_of("gpt2");
  Model m(c, 8);
  KVCache cache(c, {.max_seq = 8});
  const auto tokens = tokens_of(8, 5, c.vocab_size);
  m.forward_cached(cache, tokens.data(), 1, 6);
  try {
    m.forward_cached(cache, tokens.data(), 1, 3);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("would grow to 9 positions"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(cache.length(0), 6);  // nothing half-done
  m.forward_cached(cache, tokens.data(), 1, 2);
  EXPECT_EQ(cache.length(0), 8);
  cache.reset(0);
  EXPECT_EQ(cache.length(0), 0);
}

TEST(KVCache, BadArgumentsAreErrors) {
  const ModelConfig c = config_of("gpt2");
  Model m(c, 9);
  const int32_t token = 1;
  KVCache cache(c, {.batch = 2, .max_seq = 8});
  const int64_t twice[] = {1, 1};
  const int32_t two[] = {1, 2};
  EXPECT_THROW(m.forward_cached(cache, two, 2, 1, twice), Error);
  EXPECT_THROW(m.forward_cached(cache, &token, 3, 1), Error);
  EXPECT_THROW(KVCache(c, {.max_seq = 100}), Error);  // past 64 learned positions
  EXPECT_THROW(KVCache(c, {.ring = true}), Error);    // no window in this model
  try {                                               // head dim 8: not whole blocks of 32
    KVCache(c, {.type = CacheType::q8_0});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple of 32"), std::string::npos) << e.what();
  }
  ModelConfig other = c;
  other.n_layers = 3;
  KVCache wrong(other, {.max_seq = 8});
  EXPECT_THROW(m.forward_cached(wrong, &token, 1, 1), Error);
}

}  // namespace
}  // namespace qkv
