// Checkpoints as safetensors files: the model's parameters as named F32 tensors, the
// optimizer's moments, and in the header's __metadata__ the model config, the step and
// anything else the caller adds (all strings, as the format wants).
//
// Layout (https://github.com/huggingface/safetensors): 8-byte little-endian header size,
// a JSON header {name: {dtype, shape, data_offsets}}, then the raw little-endian data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "qkv/model.h"
#include "qkv/number_format.h"
#include "qkv/train.h"

namespace qkv {

namespace gguf {
class File;
}

// Writes atomically (to path + ".tmp", then renamed): a crash never leaves half a file.
void save_checkpoint(const std::string& path, const Model& model, const AdamW* optimizer,
                     int64_t step, const std::map<std::string, std::string>& metadata = {});

struct Checkpoint {
  std::unique_ptr<Model> model;
  std::unique_ptr<AdamW> optimizer;  // null when the file holds no optimizer state
  int64_t step = 0;
  std::map<std::string, std::string> metadata;
};

// Every size is checked against the file before it is read: a truncated or corrupt file is
// a qkv::Error naming what is wrong.
Checkpoint load_checkpoint(const std::string& path);
// The same from bytes in memory (`path` in errors reads "checkpoint bytes").
Checkpoint load_checkpoint_bytes(const uint8_t* data, size_t size);

// llama2.c checkpoints (.bin, version 0 and 1; see src/io/llama2c.cpp for the layout) as a
// Llama-style model for inference (no gradient buffer). The header's sizes are checked, and the
// file's length against them, before any weight is read.
std::unique_ptr<Model> load_llama2c(const std::string& path);
std::unique_ptr<Model> load_llama2c_bytes(const uint8_t* data, size_t size);
// The config of a llama2.c model from its header's numbers: Llama style, RMSNorm eps 1e-5,
// rotary on adjacent pairs, head size dim / heads.
ModelConfig llama2c_config(int64_t dim, int64_t hidden, int64_t layers, int64_t heads,
                           int64_t kv_heads, int64_t vocab, int64_t seq_len,
                           bool shared_classifier);
// Writes a Llama-style model as a version-0 llama2.c checkpoint (what llama2.c's run.c reads).
void save_llama2c(const std::string& path, const Model& model);

// GGUF models (llama.cpp's format, architecture "llama"): the config from the llama.* metadata
// (the head tied to the embedding when output.weight is absent). The weight matrices are
// computed with in place, in the file's block format (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K,
// Q6_K; the file stays mapped while the model lives), and only the norms become fp32: such a
// model generates (forward_cached). `fp32` dequantizes everything by the reference
// dequantizer instead, for the full forward (training, attention maps, explain).
enum class GgufWeights { in_place, fp32 };
ModelConfig gguf_model_config(const gguf::File& file);
std::unique_ptr<Model> load_gguf(const std::string& path,
                                 GgufWeights weights = GgufWeights::in_place);
// From a parsed file (a File::from_bytes one's bytes must outlive the model).
std::unique_ptr<Model> load_gguf(const gguf::File& file,
                                 GgufWeights weights = GgufWeights::in_place);

// Writes a Llama-style model (RMSNorm, SwiGLU, rotary, no biases) as a GGUF file of the "llama"
// architecture that llama.cpp and load_gguf read: the matrices in `type` (Q8_0, Q4_0, Q4_1,
// Q4_K, Q6_K, F16 or F32, as quant::quantize writes them; a matrix whose rows are not whole
// blocks stays F32), the norms F32, rotary q and k rows
// in GGUF's adjacent-pair order, and the tokenizer when given (SentencePiece or qkv's bytes).
// Written atomically.
struct GgufSaveStats {
  int64_t quantized = 0, kept_f32 = 0;  // matrices
  uint64_t bytes = 0;                   // of tensor data
};
class Tokenizer;
GgufSaveStats save_gguf(const std::string& path, const Model& model, const Tokenizer* tokenizer,
                        TensorType type);

std::string config_to_json(const ModelConfig& config);
ModelConfig config_from_json(const std::string& json);

}  // namespace qkv
