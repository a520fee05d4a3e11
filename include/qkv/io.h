// Checkpoints as safetensors files: the model's parameters as named F32 tensors, the
// optimizer's moments, and in the header's __metadata__ the model config, the step and
// anything else the caller adds (all strings, as the format wants).
//
// Layout (https://github.com/huggingface/safetensors): 8-byte little-endian header size,
// a JSON header {name: {dtype, shape, data_offsets}}, then the raw little-endian data.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "qkv/model.h"
#include "qkv/train.h"

namespace qkv {

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

std::string config_to_json(const ModelConfig& config);
ModelConfig config_from_json(const std::string& json);

}  // namespace qkv
