// A model file of any format qkv reads, with its tokenizer: a llama2.c checkpoint (.bin) with
// its tokenizer, one of qkv's own checkpoints (.safetensors from `qkv train`), or a GGUF file
// (llama.cpp's, its tokenizer and chat template inside). The one place for the rules of
// formats and tokenizers: the CLI, the Python package and the examples open models here.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qkv/gguf.h"
#include "qkv/io.h"
#include "qkv/model.h"
#include "qkv/tokenizer.h"

namespace qkv {

struct ModelFile {
  std::unique_ptr<Model> model;
  std::optional<Tokenizer> tokenizer;  // none: a synthetic-task model, prompts are token ids
  std::string format;                  // "llama2.c", "qkv" or "gguf"
  std::string tokenizer_path;          // where the tokenizer came from ("bytes" for qkv's)
  std::string chat_template;           // GGUF's tokenizer.chat_template, when it has one
};

// The format is told by the file's first bytes. A GGUF file's tokenizer is its own. A llama2.c
// model's tokenizer is `tokenizer_path`, else tokenizer.bin or tok<vocab>.bin beside the model. A
// qkv checkpoint with a 256-token vocabulary was trained on bytes and gets the byte tokenizer.
// Without need_tokenizer, a llama2.c model with no tokenizer to be found loads without one. A GGUF
// model's matrices stay in their block format (every forward runs them; training does not)
// unless `gguf` says fp32.
ModelFile load_model_file(const std::string& model_path, const std::string& tokenizer_path,
                          bool need_tokenizer = true, GgufWeights gguf = GgufWeights::in_place);

ModelFile load_gguf_file(const gguf::File& file, bool need_tokenizer, GgufWeights weights);

// One of qkv's own checkpoints (safetensors): with the byte tokenizer when its vocabulary has
// 256 tokens (it was trained on bytes), else with none.
ModelFile load_checkpoint_file(const std::string& path);

// The prompt as token ids: `prompt_ids` ("3 7 1", the CLI's --prompt-ids) when given, else `prompt`
// through the model file's tokenizer. Errors name the flag: a word that is not an id, a
// synthetic-task model given text, an empty prompt with no BOS to start from.
std::vector<int32_t> prompt_tokens(const ModelFile& f, const std::string& prompt,
                                   const std::string& prompt_ids);

// The tokens that end generation: llama2.c models end a story with BOS (it separates the
// training stories); GGUF models end with EOS.
std::vector<int32_t> stop_tokens(const ModelFile& f);

}  // namespace qkv
