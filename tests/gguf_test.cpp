// The GGUF reader against llama.cpp's own Python writer and reader: tests/data/tiny.gguf and
// what the `gguf` package read from it (tiny.gguf.json, both from tests/golden/make_gguf.py).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "qkv/error.h"
#include "qkv/gguf.h"
#include "qkv/io.h"
#include "qkv/tokenizer.h"
#include "qkv/generate.h"
#include "qkv/kv_cache.h"
#include "qkv/model.h"
#include "qkv/quant.h"

namespace qkv::gguf {
namespace {

const std::string kFile = std::string(QKV_GOLDEN_DIR) + "/../data/tiny.gguf";

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

nlohmann::json expected() {
  std::ifstream in(kFile + ".json");
  return nlohmann::json::parse(in);
}

std::string hex(const uint8_t* p, uint64_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint64_t i = 0; i < n; ++i) s += digits[p[i] >> 4], s += digits[p[i] & 15];
  return s;
}

TEST(Gguf, ReadsWhatLlamaCppsWriterWrote) {
  const File f = File::open(kFile);
  const nlohmann::json e = expected();
  EXPECT_EQ(f.version(), e["version"].get<uint32_t>());
  EXPECT_EQ(f.metadata().size(), e["metadata"].size());
  for (const auto& [key, want] : e["metadata"].items()) {
    const Value& v = f.at(key);
    EXPECT_EQ(static_cast<int>(v.type), want["type"].get<int>()) << key;
    const nlohmann::json& x = want["value"];
    if (x.is_boolean()) EXPECT_EQ(v.as_bool(key), x.get<bool>()) << key;
    else if (x.is_string()) EXPECT_EQ(v.as_string(key), x.get<std::string>()) << key;
    else if (x.is_number_unsigned() && v.type == ValueType::u64)
      EXPECT_EQ(std::get<uint64_t>(v.data), x.get<uint64_t>()) << key;
    else if (x.is_number_integer()) EXPECT_EQ(v.as_int(key), x.get<int64_t>()) << key;
    else if (x.is_number_float()) EXPECT_EQ(v.as_float(key), x.get<double>()) << key;
    else if (x.is_array()) {
      const auto& items = v.as_array(key);
      ASSERT_EQ(items.size(), x.size()) << key;
      for (size_t i = 0; i < items.size(); ++i) {
        if (x[i].is_string()) EXPECT_EQ(items[i].as_string(key), x[i].get<std::string>());
        else EXPECT_EQ(items[i].as_int(key), x[i].get<int64_t>());
      }
    }
  }
  ASSERT_EQ(f.tensors().size(), e["tensors"].size());
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const TensorInfo& t = f.tensors()[i];
    const nlohmann::json& w = e["tensors"][i];
    EXPECT_EQ(t.name, w["name"].get<std::string>());
    EXPECT_EQ(t.dims, w["dims"].get<std::vector<int64_t>>()) << t.name;
    EXPECT_EQ(static_cast<int>(t.type), w["type"].get<int>()) << t.name;
    EXPECT_EQ(t.offset, w["offset"].get<uint64_t>()) << t.name;
    EXPECT_EQ(t.bytes, w["bytes"].get<uint64_t>()) << t.name;
    EXPECT_EQ(hex(t.data, t.bytes), w["hex"].get<std::string>()) << t.name;
    EXPECT_EQ(f.find_tensor(t.name), &t);
  }
  EXPECT_EQ(f.find_tensor("absent"), nullptr);
  EXPECT_EQ(f.at("llama.context_length").as_int("llama.context_length"), 512);
}

TEST(Gguf, EveryTruncationIsAClearError) {
  const std::vector<uint8_t> bytes = read_bytes(kFile);
  // The writer pads the file after the last tensor: a cut in that padding loses nothing.
  const File whole = File::from_bytes(bytes.data(), bytes.size());
  const TensorInfo& last = whole.tensors().back();
  const size_t end = static_cast<size_t>(last.data - bytes.data() + last.bytes);
  ASSERT_LE(end, bytes.size());
  for (size_t n = 0; n < end; ++n) {
    try {
      File::from_bytes(bytes.data(), n);
      ADD_FAILURE() << "a file cut to " << n << " of " << bytes.size() << " bytes loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("gguf bytes"), std::string::npos) << e.what();
    }
  }
}

TEST(Gguf, CorruptFieldsAreClearErrors) {
  const std::vector<uint8_t> good = read_bytes(kFile);
  auto with = [&](size_t offset, const void* value, size_t n) {
    std::vector<uint8_t> b = good;
    std::memcpy(b.data() + offset, value, n);
    return b;
  };
  auto expect_error = [](const std::vector<uint8_t>& b, const std::string& fragment) {
    try {
      File::from_bytes(b.data(), b.size());
      ADD_FAILURE() << "no error, expected " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  const uint32_t v1 = 1, bad_magic = 0x12345678;
  const uint64_t huge = uint64_t{1} << 60;
  expect_error(with(0, &bad_magic, 4), "not a GGUF file");
  expect_error(with(4, &v1, 4), "GGUF version 1");
  expect_error(with(8, &huge, 8), "tensors cannot fit");
  expect_error(with(16, &huge, 8), "metadata entries cannot fit");
  expect_error(with(24, &huge, 8), "needs 1152921504606846976 bytes");  // the first key's length
  // The first key is "general.architecture" (20 bytes): its type follows at 24 + 8 + 20.
  const uint32_t bad_type = 77;
  expect_error(with(52, &bad_type, 4), "unknown type 77");
}

TEST(Gguf, MissingFilesAndKeys) {
  EXPECT_THROW(File::open("/nonexistent/x.gguf"), Error);
  const File f = File::open(kFile);
  try {
    f.at("llama.block_count");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"llama.block_count\" is missing"), std::string::npos);
  }
  EXPECT_THROW(f.at("test.string").as_int("test.string"), Error);
  EXPECT_THROW(f.at("test.u32").as_string("test.u32"), Error);
}

// The reference dequantizer against llama.cpp's Python package on random blocks of every type
// it reads (tests/golden/make_quant.py).
TEST(Dequantize, MatchesLlamaCppsPythonDequantizer) {
  std::ifstream in(std::string(QKV_GOLDEN_DIR) + "/../data/quant_blocks.json");
  const nlohmann::json all = nlohmann::json::parse(in);
  ASSERT_EQ(all.size(), 8u);
  for (const auto& [name, c] : all.items()) {
    const std::string h = c["hex"];
    std::vector<uint8_t> raw(h.size() / 2);
    for (size_t i = 0; i < raw.size(); ++i)
      raw[i] = static_cast<uint8_t>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
    const auto want = c["values"].get<std::vector<double>>();
    std::vector<float> got(want.size(), NAN);
    const auto type = static_cast<TensorType>(c["type"].get<int>());
    EXPECT_EQ(to_string(type), name);
    quant::dequantize(type, raw.data(), static_cast<int64_t>(want.size()), got.data());
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-6 * std::abs(want[i]) + 1e-9) << name << " value " << i;
  }
  std::vector<float> out(32);
  const std::vector<uint8_t> block(40);
  EXPECT_THROW(quant::dequantize(TensorType::q4_0, block.data(), 16, out.data()), Error);
  EXPECT_THROW(quant::dequantize(TensorType::q5_0, block.data(), 32, out.data()), Error);
}

TEST(Dequantize, HalfAndBfloat16) {
  EXPECT_EQ(half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_to_float(0xc000), -2.0f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));  // the smallest subnormal
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(half_to_float(0x7c00)));
  EXPECT_TRUE(std::isnan(half_to_float(0x7e00)));
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xc0a0), -5.0f);
}

// A small random Llama written by llama.cpp's writer (quantized matrices of four types):
// qkv's logits against a NumPy forward over the gguf package's dequantized weights.
TEST(GgufModel, LogitsMatchAnIndependentForward) {
  const std::string path = std::string(QKV_GOLDEN_DIR) + "/../data/tiny_llama.gguf";
  std::ifstream in(path + ".json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  const auto model = load_gguf(path, GgufWeights::fp32);
  const ModelConfig& c = model->config();
  EXPECT_EQ(c.d_model, 64);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_TRUE(c.tied_embeddings);
  const auto tokens = golden["tokens"].get<std::vector<int32_t>>();
  const auto T = static_cast<int64_t>(tokens.size());
  model->forward(tokens.data(), nullptr, 1, T);
  const View logits = model->logits();
  double worst = 0, scale = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < c.vocab_size; ++v) {
      const double want = golden["logits"][t][v].get<double>();
      worst = std::max(worst, std::abs(logits(t, v) - want));
      scale = std::max(scale, std::abs(want));
    }
  EXPECT_LE(worst, 1e-4 * scale) << "largest logit " << scale;
  EXPECT_GT(scale, 1.0);
}

// The same model computed in place (its matrices in their block formats; the full forward and
// forward_cached): the same logits, and nothing of the matrices in the fp32 buffer.
TEST(GgufModel, InPlaceWeightsGiveTheSameLogits) {
  const std::string path = std::string(QKV_GOLDEN_DIR) + "/../data/tiny_llama.gguf";
  std::ifstream in(path + ".json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  const auto model = load_gguf(path);
  const ModelConfig& c = model->config();
  EXPECT_TRUE(model->has_external_weights());
  ASSERT_NE(model->external("layers.0.attn.qkv.weight"), nullptr);
  EXPECT_EQ(model->external("layers.0.attn.qkv.weight")->size(), 3u);  // q, k and v in place
  EXPECT_EQ(model->external("layers.0.norm1.weight"), nullptr);
  EXPECT_THROW(model->weight("layers.0.mlp.up.weight"), Error);
  const auto tokens = golden["tokens"].get<std::vector<int32_t>>();
  const auto T = static_cast<int64_t>(tokens.size());
  // The full forward (no cache) runs the block-format weights in place too: the same layers
  // as the cached prefill below, so the same bits.
  model->forward(tokens.data(), nullptr, 1, T);
  const std::vector<float> full(model->logits().data, model->logits().data + T * c.vocab_size);
  model->forward(tokens.data(), tokens.data(), 1, T);  // a loss runs; its backward does not
  EXPECT_THROW(model->backward(), Error);              // inference only
  EXPECT_THROW(save_checkpoint(
                   ::testing::TempDir() + "/in_place_" + std::to_string(getpid()) + ".safetensors",
                   *model, nullptr, 0),
               Error);
  // The prompt at once (the tile path), and token by token (the fused one-row kernels).
  for (bool one_by_one : {false, true}) {
    KVCache cache(c, {.max_seq = T});
    double worst = 0, scale = 0;
    for (int64_t t0 = 0; t0 < T;) {
      const int64_t n = one_by_one ? 1 : T;
      const View logits = model->forward_cached(cache, tokens.data() + t0, 1, n, nullptr, true);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t v = 0; v < c.vocab_size; ++v) {
          const double want = golden["logits"][t0 + t][v].get<double>();
          worst = std::max(worst, std::abs(logits(t, v) - want));
          scale = std::max(scale, std::abs(want));
          if (!one_by_one) {
            ASSERT_EQ(logits(t, v), full[(t0 + t) * c.vocab_size + v]);
          }
        }
      t0 += n;
    }
    EXPECT_LE(worst, 1e-4 * scale) << (one_by_one ? "one token at a time" : "the prompt at once");
  }
}

// Files in the K-quants made by llama.cpp's quantizer (tests/golden/make_quant_llama.py):
// qkv's logits against a NumPy forward over the gguf package's dequantized weights — by the
// reference dequantizer (fp32 weights), in place with fp32 activations (the prompt at once and
// token by token; ~2e-7 of the largest logit off), and with int8 activations, whose rounding
// (per 32 values, about 1/254 of each block's largest) moves these logits by ~3e-3 of the
// largest; the full forward over the block-format weights gives the prefill's bits.
TEST(GgufModel, KQuantFilesMatchAnIndependentForward) {
  const std::string data = std::string(QKV_GOLDEN_DIR) + "/../data/";
  std::ifstream in(data + "quant_llama.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  const auto tokens = golden["tokens"].get<std::vector<int32_t>>();
  const auto T = static_cast<int64_t>(tokens.size());
  for (const std::string type : {"q4_k", "q6_k"}) {
    const std::string path = data + "quant_llama." + type + ".gguf";
    const auto& want = golden["logits"][type];
    auto worst_of = [&](const float* logits, int64_t t0, int64_t n, int64_t V, double& scale) {
      double worst = 0;
      for (int64_t t = 0; t < n; ++t)
        for (int64_t v = 0; v < V; ++v) {
          const double w = want[t0 + t][v].get<double>();
          worst = std::max(worst, std::abs(logits[t * V + v] - w));
          scale = std::max(scale, std::abs(w));
        }
      return worst;
    };
    {
      const auto model = load_gguf(path, GgufWeights::fp32);
      model->forward(tokens.data(), nullptr, 1, T);
      double scale = 0;
      const double worst = worst_of(model->logits().data, 0, T, model->config().vocab_size, scale);
      EXPECT_LE(worst, 1e-5 * scale) << type << " fp32 weights";
      EXPECT_GT(scale, 1.0) << type;
    }
    const auto model = load_gguf(path);
    ASSERT_NE(model->external("layers.0.mlp.proj.weight"), nullptr);
    ASSERT_EQ(model->external("layers.0.mlp.proj.weight")->at(0).type,
              type == "q4_k" ? TensorType::q4_k : TensorType::q6_k);
    const int64_t V = model->config().vocab_size;
    for (quant::Matmul mode : {quant::Matmul::exact, quant::Matmul::int8}) {
      model->set_matmul(mode);
      // The full forward in place: the cached prefill's layers, so its bits.
      model->forward(tokens.data(), nullptr, 1, T);
      const std::vector<float> full(model->logits().data, model->logits().data + T * V);
      for (bool one_by_one : {false, true}) {
        KVCache cache(model->config(), {.max_seq = T});
        double worst = 0, scale = 0;
        for (int64_t t0 = 0; t0 < T;) {
          const int64_t n = one_by_one ? 1 : T;
          const View logits = model->forward_cached(cache, tokens.data() + t0, 1, n, nullptr, true);
          worst = std::max(worst, worst_of(logits.data, t0, n, V, scale));
          if (!one_by_one) {
            ASSERT_TRUE(std::equal(full.begin(), full.end(), logits.data))
                << type << " " << quant::matmul_name(mode) << ": the full forward's logits";
          }
          t0 += n;
        }
        EXPECT_LE(worst, (mode == quant::Matmul::exact ? 1e-5 : 1e-2) * scale)
            << type << " " << quant::matmul_name(mode)
            << (one_by_one ? ", one token at a time" : ", the prompt at once");
      }
    }
  }
}

// save_gguf, read back by load_gguf: stories260K (llama2.c's) in F32 gives the same logits,
// in Q8_0 the same greedy story (llama.cpp's own reader gives the same too; docs/tuning.md);
// the tokenizer survives; a model that rotates halves (GPT-NeoX order) comes back in GGUF's
// adjacent order with the same logits.
TEST(GgufWriter, RoundTripsModelsAndTokenizers) {
  const std::string dir = std::string(QKV_MODELS_DIR) + "/stories260K/";
  const auto model = load_llama2c(dir + "stories260K.bin");
  const Tokenizer tok = Tokenizer::load_llama2c(dir + "tok512.bin", 512);
  // Per process: the test runs once per SIMD target, in parallel.
  const std::string path = ::testing::TempDir() + "/s260_" + std::to_string(getpid()) + ".gguf";
  const std::vector<int32_t> prompt = tok.encode("Once upon a time, a cat");
  auto logits_of = [&](Model& m, const std::vector<int32_t>& ids) {
    KVCache cache(m.config(), {.max_seq = 64});
    const View l =
        m.forward_cached(cache, ids.data(), 1, static_cast<int64_t>(ids.size()), nullptr, true);
    return std::vector<float>(l.data, l.data + l.numel());
  };
  auto greedy = [&](Model& m) {
    GenerateOptions o{.steps = 60, .sampling = {.temperature = 0}};
    return generate(m, prompt, o).tokens;
  };
  const std::vector<float> want = logits_of(*model, prompt);
  const std::vector<int32_t> story = greedy(*model);

  const GgufSaveStats f32 = save_gguf(path, *model, &tok, TensorType::f32);
  EXPECT_EQ(f32.kept_f32, 0);
  const gguf::File file = gguf::File::open(path);
  const auto back = load_gguf(file);
  const std::vector<float> got = logits_of(*back, prompt);
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i])));
  const Tokenizer tok2 = Tokenizer::from_gguf(file);
  for (const char* text :
       {"Once upon a time", "Lily's dog, \"Max\", ran 42 miles!", "  odd   spaces\n"})
    EXPECT_EQ(tok2.encode(text), tok.encode(text)) << text;
  EXPECT_EQ(tok2.decode(tok2.bos(), prompt[1]), tok.decode(tok.bos(), prompt[1]));

  const GgufSaveStats q8 = save_gguf(path, *model, &tok, TensorType::q8_0);
  EXPECT_GT(q8.quantized, 0);
  EXPECT_LT(q8.bytes, f32.bytes / 2);
  EXPECT_EQ(greedy(*load_gguf(path)), story);

  ModelConfig c = llama_config(2, 64, 4, 2, 96, 256, 64, /*tied=*/false);
  c.rope_halves = true;
  Model halves(c, 3);
  save_gguf(path, halves, nullptr, TensorType::f32);
  const std::vector<int32_t> ids{5, 9, 200, 31, 7};
  const std::vector<float> a = logits_of(halves, ids), b = logits_of(*load_gguf(path), ids);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(b[i], a[i], 1e-5 * (1 + std::abs(a[i])));

  ModelConfig gpt2;  // LayerNorm, GELU, learned positions, biases: not GGUF's llama
  gpt2.n_layers = 1, gpt2.d_model = 32, gpt2.n_heads = gpt2.n_kv_heads = 2, gpt2.d_head = 16,
  gpt2.d_ff = 64;
  gpt2.vocab_size = 64, gpt2.context = 16;
  EXPECT_THROW(save_gguf(path, Model(gpt2, 1), nullptr, TensorType::q8_0), Error);
  EXPECT_THROW(save_gguf(path, *model, &tok, TensorType::q5_0), Error);  // not written
}

// Tokenizers from GGUF metadata against llama.cpp's own tokenizer on the same files
// (tests/golden/make_tokenizer_ggufs.py): SentencePiece ("llama") and byte-level BPE ("gpt2",
// SmolLM2's pre-tokenizer).
TEST(GgufTokenizer, MatchesLlamaCpp) {
  std::ifstream in(std::string(QKV_GOLDEN_DIR) + "/../data/tokenizer_ggufs.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  for (const char* name : {"spm_tokenizer.gguf", "bpe_tokenizer.gguf"}) {
    const Tokenizer t =
        Tokenizer::from_gguf(gguf::File::open(std::string(QKV_GOLDEN_DIR) + "/../data/" + name));
    EXPECT_EQ(t.kind(), std::string(name) == "spm_tokenizer.gguf" ? Tokenizer::Kind::sentencepiece
                                                                  : Tokenizer::Kind::byte_bpe);
    ASSERT_GE(golden[name].size(), 8u);
    for (const nlohmann::json& c : golden[name]) {
      const std::string text = c["text"];
      EXPECT_EQ(t.encode(text), c["ids"].get<std::vector<int32_t>>())
          << name << ": \"" << text << "\"";
    }
  }
}

TEST(GgufModel, UnsupportedFilesAreClearErrors) {
  try {
    load_gguf(kFile);  // tiny.gguf: llama, but no model in it
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"llama.attention.head_count\" is missing"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace qkv::gguf
