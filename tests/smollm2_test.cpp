// SmolLM2-135M-Instruct (models/smollm2/, from scripts/get-models): its byte-level BPE
// tokenizer from the GGUF file against Hugging Face's `tokenizers` (smollm2_tokens.json, from
// tests/golden/make_tokens_smollm2.py).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "qkv/error.h"
#include "qkv/gguf.h"
#include "qkv/tokenizer.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;

std::string smollm2_path() {
  const char* env = std::getenv("QKV_MODELS");
  return (env ? fs::path(env) : fs::path(QKV_MODELS_DIR)) / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf";
}

// The model is a required part of the tests: missing, they fail (run scripts/get-models).
const gguf::File& smollm2() {
  static const gguf::File f = [] {
    const std::string path = smollm2_path();
    if (!fs::exists(path)) throw std::runtime_error(path + " not found: run scripts/get-models");
    return gguf::File::open(path);
  }();
  return f;
}

TEST(ByteBpe, MatchesHuggingFaceTokenizers) {
  const Tokenizer t = Tokenizer::from_gguf(smollm2());
  EXPECT_EQ(t.kind(), Tokenizer::Kind::byte_bpe);
  EXPECT_EQ(t.vocab_size(), 49152);
  EXPECT_FALSE(t.adds_bos());
  std::ifstream in(std::string(QKV_GOLDEN_DIR) + "/../data/smollm2_tokens.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  ASSERT_GE(golden["cases"].size(), 20u);
  for (const nlohmann::json& c : golden["cases"]) {
    const std::string text = c["text"];
    const std::vector<int32_t> want = c["ids"];
    const std::vector<int32_t> got = t.encode(text, /*bos=*/true, c["special"].get<bool>());
    EXPECT_EQ(got, want) << "text: \"" << text << "\"";
    // Decoding gives the text back, less the control tokens (which print nothing).
    std::string back, plain = text;
    for (size_t i = 0; i < got.size(); ++i) back += t.decode(i ? got[i - 1] : -1, got[i]);
    if (c["special"].get<bool>())
      for (const char* s : {"<|im_start|>", "<|im_end|>", "<|endoftext|>"})
        for (size_t at; (at = plain.find(s)) != std::string::npos;) plain.erase(at, std::strlen(s));
    EXPECT_EQ(back, plain);
  }
}

TEST(ByteBpe, ControlTokensOnlyWhenAsked) {
  const Tokenizer t = Tokenizer::from_gguf(smollm2());
  const int32_t start = t.token_id("<|im_start|>"), end = t.token_id("<|im_end|>");
  EXPECT_EQ(start, 1);
  EXPECT_EQ(end, 2);
  EXPECT_TRUE(t.is_control(start));
  EXPECT_FALSE(t.is_control(t.token_id("Paris")));
  EXPECT_EQ(t.encode("<|im_start|>", true, true), std::vector<int32_t>{start});
  const std::vector<int32_t> plain = t.encode("<|im_start|>", true, false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), start), 0);
  EXPECT_EQ(t.decode(-1, start), "");
}

TEST(ByteBpe, InvalidUtf8AndLongWordsAreHandled) {
  const Tokenizer t = Tokenizer::from_gguf(smollm2());
  // Bytes that are not UTF-8 read as U+FFFD, as Python's errors="replace" reads them (one for
  // the longest well-formed prefix: "\xe2\x82" is one; an overlong "\xc0\xaf" two).
  std::string back;
  int32_t prev = -1;
  for (int32_t id : t.encode("ok \xff\xfe \xc3 \xc0\xaf end \xe2\x82")) back += t.decode(prev, id), prev = id;
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(back, "ok " + r + r + " " + r + " " + r + r + " end " + r);
  // A 200,000-byte word merges in n log n (a quadratic merge would take minutes).
  const std::vector<int32_t> ids = t.encode(std::string(200000, 'z'));
  EXPECT_GT(ids.size(), 1000u);
  EXPECT_LT(ids.size(), 200000u);
}

}  // namespace
}  // namespace qkv
