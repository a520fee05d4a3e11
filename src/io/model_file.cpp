// Opening a model file of any supported format with its tokenizer (see include/qkv/model_file.h).
#include "qkv/model_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "qkv/error.h"
#include "qkv/gguf.h"
#include "qkv/io.h"

namespace qkv {

namespace fs = std::filesystem;

namespace {

// safetensors: an 8-byte little-endian header length, then the JSON header's '{'.
bool is_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[9] = {};
  in.read(head, 9);
  return in.gcount() == 9 && head[8] == '{';
}

bool is_gguf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[4] = {};
  in.read(head, 4);
  return in.gcount() == 4 && std::string(head, 4) == "GGUF";
}

}  // namespace

ModelFile load_gguf_file(const gguf::File& file, bool need_tokenizer, GgufWeights weights) {
  ModelFile f;
  f.format = "gguf";
  f.model = load_gguf(file, weights);
  if (file.find("tokenizer.ggml.model")) {
    f.tokenizer = Tokenizer::from_gguf(file);
    f.tokenizer_path = file.name();
  } else {
    check(!need_tokenizer, file.name(),
          ": the file has no tokenizer (tokenizer.ggml.*): give --prompt-ids");
  }
  if (const gguf::Value* t = file.find("tokenizer.chat_template"))
    f.chat_template = t->as_string("tokenizer.chat_template");
  return f;
}

ModelFile load_checkpoint_file(const std::string& path) {
  ModelFile f;
  f.format = "qkv";
  f.model = std::move(load_checkpoint(path).model);
  if (f.model->config().vocab_size == 256)
    f.tokenizer = Tokenizer::bytes(), f.tokenizer_path = "bytes";
  return f;
}

ModelFile load_model_file(const std::string& model_path, const std::string& tokenizer_path,
                          bool need_tokenizer, GgufWeights gguf) {
  check(fs::exists(model_path), "model file \"", model_path, "\" not found");
  ModelFile f;
  if (is_gguf(model_path)) {
    check(tokenizer_path.empty(), "--tokenizer: a GGUF file has its own tokenizer");
    return load_gguf_file(gguf::File::open(model_path), need_tokenizer, gguf);
  }
  if (is_safetensors(model_path)) {
    if (tokenizer_path.empty()) return load_checkpoint_file(model_path);
    f.format = "qkv";
    f.model = std::move(load_checkpoint(model_path).model);
    f.tokenizer = Tokenizer::load_llama2c(tokenizer_path, f.model->config().vocab_size);
    f.tokenizer_path = tokenizer_path;
    return f;
  }
  f.format = "llama2.c";
  f.model = load_llama2c(model_path);
  const int64_t vocab = f.model->config().vocab_size;
  std::string tok = tokenizer_path;
  if (tok.empty()) {
    const fs::path dir = fs::path(model_path).parent_path();
    for (const fs::path& candidate :
         {dir / "tokenizer.bin", dir / ("tok" + std::to_string(vocab) + ".bin")})
      if (fs::exists(candidate)) {
        tok = candidate.string();
        break;
      }
  }
  if (tok.empty() && !need_tokenizer) return f;
  check(!tok.empty(), "no tokenizer for \"", model_path,
        "\": give --tokenizer FILE (llama2.c's "
        "tokenizer.bin, or tok",
        vocab, ".bin for a ", vocab, "-token vocabulary)");
  f.tokenizer = Tokenizer::load_llama2c(tok, vocab);
  f.tokenizer_path = tok;
  return f;
}

std::vector<int32_t> prompt_tokens(const ModelFile& f, const std::string& prompt,
                                   const std::string& prompt_ids) {
  std::vector<int32_t> ids;
  if (!prompt_ids.empty()) {
    std::istringstream in(prompt_ids);
    for (std::string word; in >> word;) {
      try {
        size_t used = 0;
        ids.push_back(std::stoi(word, &used));
        if (used != word.size()) throw std::invalid_argument(word);
      } catch (const std::exception&) {
        fail("--prompt-ids: \"", word, "\" is not a token id");
      }
    }
  } else {
    check(f.tokenizer.has_value(), "this model was trained on a synthetic task (vocabulary of ",
          f.model->config().vocab_size,
          " symbols, not text): give the prompt as --prompt-ids \"3 7 1\"");
    ids = f.tokenizer->encode(prompt);
  }
  check(!ids.empty(), "the prompt has no tokens (and this model has no BOS token to start from)");
  return ids;
}

std::vector<int32_t> stop_tokens(const ModelFile& f) {
  if (!f.tokenizer) return {};
  const int32_t stop = f.format == "gguf" ? f.tokenizer->eos() : f.tokenizer->bos();
  return stop >= 0 ? std::vector<int32_t>{stop} : std::vector<int32_t>{};
}

}  // namespace qkv
