// Checkpoints in the safetensors format.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv {

using nlohmann::json;

namespace {

std::string kind_name(NormKind n) { return to_string(n); }

template <typename Enum>
Enum parse(const std::string& value, std::initializer_list<Enum> all, const char* field) {
  for (Enum e : all)
    if (to_string(e) == value) return e;
  fail("checkpoint: unknown ", field, " \"", value, "\"");
}

}  // namespace

std::string config_to_json(const ModelConfig& c) {
  return json{{"vocab_size", c.vocab_size}, {"context", c.context},
              {"d_model", c.d_model},       {"n_layers", c.n_layers},
              {"n_heads", c.n_heads},       {"n_kv_heads", c.n_kv_heads},
              {"d_head", c.d_head},         {"d_ff", c.d_ff},
              {"norm", kind_name(c.norm)},  {"mlp", to_string(c.mlp)},
              {"positions", to_string(c.positions)}, {"bias", c.bias},
              {"tied_embeddings", c.tied_embeddings}, {"norm_eps", c.norm_eps},
              {"rope_theta", c.rope_theta}, {"rope_halves", c.rope_halves},
              {"causal", c.causal}, {"window", c.window}}
      .dump();
}

ModelConfig config_from_json(const std::string& text) {
  ModelConfig c;
  try {
    const json j = json::parse(text);
    c.vocab_size = j.at("vocab_size");
    c.context = j.at("context");
    c.d_model = j.at("d_model");
    c.n_layers = j.at("n_layers");
    c.n_heads = j.at("n_heads");
    c.n_kv_heads = j.at("n_kv_heads");
    c.d_head = j.at("d_head");
    c.d_ff = j.at("d_ff");
    c.norm = parse(j.at("norm").get<std::string>(), {NormKind::layer_norm, NormKind::rms_norm}, "norm");
    c.mlp = parse(j.at("mlp").get<std::string>(), {MlpKind::gelu, MlpKind::swiglu}, "mlp");
    c.positions = parse(j.at("positions").get<std::string>(),
                        {PositionKind::learned, PositionKind::sinusoidal, PositionKind::rotary,
                         PositionKind::alibi, PositionKind::none},
                        "positions");
    c.bias = j.at("bias");
    c.tied_embeddings = j.at("tied_embeddings");
    c.norm_eps = j.at("norm_eps");
    c.rope_theta = j.at("rope_theta");
    c.rope_halves = j.at("rope_halves");
    c.causal = j.at("causal");
    c.window = j.value("window", int64_t{0});  // absent in checkpoints before windows
  } catch (const json::exception& e) {
    fail("checkpoint: the model config is not valid (", e.what(), ")");
  }
  validate(c);
  return c;
}

void save_checkpoint(const std::string& path, const Model& model, const AdamW* optimizer,
                     int64_t step, const std::map<std::string, std::string>& metadata) {
  json header;
  int64_t offset = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, int64_t floats) {
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, offset + 4 * floats}}};
    offset += 4 * floats;
  };
  for (const ParamInfo& p : model.params())
    add(p.name, p.cols == 1 ? std::vector<int64_t>{p.rows} : std::vector<int64_t>{p.rows, p.cols},
        p.rows * p.cols);
  if (optimizer) {
    add("optimizer.m", {model.num_params()}, model.num_params());
    add("optimizer.v", {model.num_params()}, model.num_params());
  }
  json meta = metadata;
  meta["format"] = "qkv-checkpoint-1";
  meta["config"] = config_to_json(model.config());
  meta["step"] = std::to_string(step);
  if (optimizer) {
    meta["optimizer.step"] = std::to_string(optimizer->step);
    meta["optimizer.config"] = json{{"beta1", optimizer->config.beta1},
                                    {"beta2", optimizer->config.beta2},
                                    {"eps", optimizer->config.eps},
                                    {"weight_decay", optimizer->config.weight_decay}}.dump();
  }
  header["__metadata__"] = meta;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the format pads the header to 8 bytes

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    check(out.good(), "cannot write checkpoint \"", tmp, "\"");
    const uint64_t size = text.size();
    out.write(reinterpret_cast<const char*>(&size), 8);  // little-endian on x86
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const ParamInfo& p : model.params())
      out.write(reinterpret_cast<const char*>(model.weights() + p.offset), 4 * p.rows * p.cols);
    if (optimizer) {
      out.write(reinterpret_cast<const char*>(optimizer->m.data()), 4 * model.num_params());
      out.write(reinterpret_cast<const char*>(optimizer->v.data()), 4 * model.num_params());
    }
    check(out.good(), "writing checkpoint \"", tmp, "\" failed (disk full?)");
  }
  std::filesystem::rename(tmp, path);
}

Checkpoint load_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "cannot open checkpoint \"", path, "\"");
  const auto file_size = static_cast<uint64_t>(std::filesystem::file_size(path));
  uint64_t header_size = 0;
  check(file_size >= 8, path, ": ", file_size, " bytes is too short for a safetensors file");
  in.read(reinterpret_cast<char*>(&header_size), 8);
  check(header_size <= file_size - 8 && header_size < (100u << 20), path,
        ": header size ", header_size, " does not fit in the file (", file_size, " bytes)");
  std::string text(header_size, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_size));
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    fail(path, ": the header is not valid JSON (", e.what(), ")");
  }
  check(header.contains("__metadata__") && header["__metadata__"].contains("config"), path,
        ": not a qkv checkpoint (no model config in __metadata__)");
  Checkpoint ck;
  for (const auto& [k, v] : header["__metadata__"].items())
    if (v.is_string()) ck.metadata[k] = v.get<std::string>();
  ck.model = std::make_unique<Model>(config_from_json(ck.metadata.at("config")), 0);
  ck.step = std::stoll(ck.metadata.count("step") ? ck.metadata["step"] : "0");
  const uint64_t data_start = 8 + header_size, data_size = file_size - data_start;

  auto read_tensor = [&](const std::string& name, float* dst, int64_t floats) {
    check(header.contains(name), path, ": tensor \"", name, "\" is missing");
    const json& t = header[name];
    check(t.value("dtype", "") == "F32", path, ": tensor \"", name, "\" is not F32");
    const uint64_t begin = t["data_offsets"][0], end = t["data_offsets"][1];
    check(begin <= end && end <= data_size && end - begin == 4 * uint64_t(floats), path,
          ": tensor \"", name, "\" has offsets [", begin, ", ", end, ") but needs ", 4 * floats,
          " bytes within the ", data_size, " of data");
    in.seekg(static_cast<std::streamoff>(data_start + begin));
    in.read(reinterpret_cast<char*>(dst), static_cast<std::streamsize>(end - begin));
    check(in.good(), path, ": reading tensor \"", name, "\" failed");
  };
  for (const ParamInfo& p : ck.model->params())
    read_tensor(p.name, ck.model->weights() + p.offset, p.rows * p.cols);
  if (header.contains("optimizer.m")) {
    AdamWConfig oc;
    if (ck.metadata.count("optimizer.config")) {
      const json j = json::parse(ck.metadata["optimizer.config"]);
      oc.beta1 = j.at("beta1"), oc.beta2 = j.at("beta2"), oc.eps = j.at("eps");
      oc.weight_decay = j.at("weight_decay");
    }
    ck.optimizer = std::make_unique<AdamW>(*ck.model, oc);
    ck.optimizer->step = std::stoll(ck.metadata.count("optimizer.step") ? ck.metadata["optimizer.step"] : "0");
    read_tensor("optimizer.m", ck.optimizer->m.data(), ck.model->num_params());
    read_tensor("optimizer.v", ck.optimizer->v.data(), ck.model->num_params());
  }
  return ck;
}

}  // namespace qkv
