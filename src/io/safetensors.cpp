// Checkpoints in the safetensors format.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "qkv/error.h"
#include "qkv/io.h"
#include "io/json_fields.h"

namespace qkv {

using nlohmann::json;

namespace {

std::string kind_name(NormKind n) { return to_string(n); }

template <typename Enum>
Enum parse_enum(const std::string& value, std::initializer_list<Enum> all, const char* field) {
  for (Enum e : all)
    if (to_string(e) == value) return e;
  fail("checkpoint: unknown ", field, " \"", value, "\"");
}

}  // namespace

std::string config_to_json(const ModelConfig& c) {
  return json{{"vocab_size", c.vocab_size},
              {"context", c.context},
              {"d_model", c.d_model},
              {"n_layers", c.n_layers},
              {"n_heads", c.n_heads},
              {"n_kv_heads", c.n_kv_heads},
              {"d_head", c.d_head},
              {"d_ff", c.d_ff},
              {"norm", kind_name(c.norm)},
              {"mlp", to_string(c.mlp)},
              {"positions", to_string(c.positions)},
              {"bias", c.bias},
              {"tied_embeddings", c.tied_embeddings},
              {"norm_eps", c.norm_eps},
              {"rope_theta", c.rope_theta},
              {"rope_halves", c.rope_halves},
              {"causal", c.causal},
              {"window", c.window},
              {"sinks", c.sinks},
              {"attn_dropout", c.attn_dropout}}
      .dump();
}

ModelConfig config_from_json(const std::string& text) {
  using namespace json_fields;
  const std::string where = "checkpoint: model config";
  const json j = parse(text, where);
  ModelConfig c;
  c.vocab_size = get<int64_t>(j, "vocab_size", where);
  c.context = get<int64_t>(j, "context", where);
  c.d_model = get<int64_t>(j, "d_model", where);
  c.n_layers = get<int64_t>(j, "n_layers", where);
  c.n_heads = get<int64_t>(j, "n_heads", where);
  c.n_kv_heads = get<int64_t>(j, "n_kv_heads", where);
  c.d_head = get<int64_t>(j, "d_head", where);
  c.d_ff = get<int64_t>(j, "d_ff", where);
  c.norm = parse_enum(get<std::string>(j, "norm", where),
                      {NormKind::layer_norm, NormKind::rms_norm}, "norm");
  c.mlp = parse_enum(get<std::string>(j, "mlp", where), {MlpKind::gelu, MlpKind::swiglu}, "mlp");
  c.positions = parse_enum(get<std::string>(j, "positions", where),
                           {PositionKind::learned, PositionKind::sinusoidal, PositionKind::rotary,
                            PositionKind::alibi, PositionKind::none},
                           "positions");
  c.bias = get<bool>(j, "bias", where);
  c.tied_embeddings = get<bool>(j, "tied_embeddings", where);
  c.norm_eps = get<float>(j, "norm_eps", where);
  c.rope_theta = get<float>(j, "rope_theta", where);
  c.rope_halves = get<bool>(j, "rope_halves", where);
  c.causal = get<bool>(j, "causal", where);
  c.window = get_or<int64_t>(j, "window", 0, where);  // absent in checkpoints before windows
  c.sinks = get_or<bool>(j, "sinks", false, where);   // … and before sinks
  c.attn_dropout = get_or<float>(j, "attn_dropout", 0.0f, where);  // … and before dropout
  validate(c);
  return c;
}

void save_checkpoint(const std::string& path, const Model& model, const AdamW* optimizer,
                     int64_t step, const std::map<std::string, std::string>& metadata) {
  check(!model.has_external_weights(),
        "save_checkpoint: the model's matrices are held in a GGUF file's "
        "block formats; load it with GgufWeights::fp32 (Python: dequantize=True) to save it");
  json header;
  int64_t offset = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, int64_t floats) {
    header[name] = {
        {"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, offset + 4 * floats}}};
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
  meta["seed"] = std::to_string(model.seed());  // (attention dropout's masks)
  if (optimizer) {
    meta["optimizer.step"] = std::to_string(optimizer->step);
    meta["optimizer.config"] = json{{"beta1", optimizer->config.beta1},
                                    {"beta2", optimizer->config.beta2},
                                    {"eps", optimizer->config.eps},
                                    {"weight_decay", optimizer->config.weight_decay}}
                                   .dump();
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

namespace {

// Where a checkpoint's bytes come from: a file (read piece by piece, so a large model is not
// held twice) or memory (the fuzz target).
struct Source {
  std::string name;  // for errors
  uint64_t size = 0;
  std::function<bool(uint64_t offset, void* dst, uint64_t bytes)> read;  // false on failure
};

// The tensors' byte ranges, checked against the data section once, before anything is read.
struct TensorRange {
  uint64_t begin = 0, end = 0;
};

TensorRange tensor_range(const json& header, const std::string& name, uint64_t floats,
                         uint64_t data_size, const std::string& file) {
  using namespace json_fields;
  const std::string where = file + ": tensor \"" + name + "\"";
  const json& t = member(header, name, file + ": header");
  check(get<std::string>(t, "dtype", where) == "F32", where, " is not F32");
  const json& shape = member(t, "shape", where);
  check(shape.is_array() && shape.size() <= 2, where,
        ": \"shape\" must be a list of at most 2 sizes");
  uint64_t elements = 1;
  for (const json& n : shape) {
    const auto d = as<uint64_t>(n, where + ": a size in \"shape\"");
    check(d == 0 || elements <= floats / d, where, ": \"shape\" ", shown(shape), " does not hold ",
          floats, " numbers");
    elements *= d;
  }
  check(elements == floats, where, " has shape ", shown(shape), " but the model needs ", floats,
        " numbers");
  const json& offsets = member(t, "data_offsets", where);
  check(offsets.is_array() && offsets.size() == 2, where,
        ": \"data_offsets\" must be [begin, end], found ", shown(offsets));
  const auto begin = as<uint64_t>(offsets[0], where + ": data_offsets[0]");
  const auto end = as<uint64_t>(offsets[1], where + ": data_offsets[1]");
  check(begin <= end && end <= data_size && end - begin == 4 * floats, where, " has offsets [",
        begin, ", ", end, ") but needs ", 4 * floats, " bytes within the ", data_size, " of data");
  return {begin, end};
}

Checkpoint load_checkpoint_from(const Source& src) {
  using namespace json_fields;
  const std::string& path = src.name;
  check(src.size >= 8, path, ": ", src.size, " bytes is too short for a safetensors file");
  uint64_t header_size = 0;
  check(src.read(0, &header_size, 8), path, ": reading the header size failed");
  check(header_size <= src.size - 8 && header_size < (100u << 20), path, ": header size ",
        header_size, " does not fit in the file (", src.size, " bytes)");
  std::string text(header_size, '\0');
  check(src.read(8, text.data(), header_size), path, ": reading the header failed");
  const json header = parse(text, path + ": header");
  check(header.is_object() && header.contains("__metadata__") &&
            header["__metadata__"].is_object() && header["__metadata__"].contains("config"),
        path, ": not a qkv checkpoint (no model config in __metadata__)");
  const std::string meta_where = path + ": __metadata__";
  Checkpoint ck;
  for (const auto& [k, v] : header["__metadata__"].items())
    ck.metadata[k] =
        as<std::string>(v, meta_where + " \"" + k + "\"");  // the format's values are strings

  const ModelConfig config = config_from_json(ck.metadata.at("config"));
  ck.step =
      ck.metadata.count("step") ? parse_int(ck.metadata["step"], meta_where + " \"step\"") : 0;
  const uint64_t data_start = 8 + header_size, data_size = src.size - data_start;
  // Every tensor's range is checked before the model (whose size the config sets) is built.
  const std::vector<ParamInfo> params = Model::param_layout(config);
  std::vector<TensorRange> ranges;
  uint64_t total = 0;
  for (const ParamInfo& p : params) {
    ranges.push_back(tensor_range(header, p.name, uint64_t(p.rows) * p.cols, data_size, path));
    total += uint64_t(p.rows) * p.cols;
  }
  const bool has_optimizer = header.contains("optimizer.m");
  TensorRange m_range, v_range;
  if (has_optimizer) {
    m_range = tensor_range(header, "optimizer.m", total, data_size, path);
    v_range = tensor_range(header, "optimizer.v", total, data_size, path);
  }

  auto read = [&](const std::string& name, const TensorRange& r, float* dst) {
    check(src.read(data_start + r.begin, dst, r.end - r.begin), path, ": reading tensor \"", name,
          "\" failed");
  };
  uint64_t seed = 0;  // (absent in checkpoints before attention dropout)
  if (ck.metadata.count("seed")) {
    const std::string& s = ck.metadata["seed"];
    check(!s.empty() && s.size() <= 20 && s.find_first_not_of("0123456789") == std::string::npos,
          meta_where, " \"seed\": not an unsigned integer: \"", s, "\"");
    seed = std::stoull(s);
  }
  ck.model = std::make_unique<Model>(config, seed);
  for (size_t i = 0; i < params.size(); ++i)
    read(params[i].name, ranges[i], ck.model->weights() + ck.model->params()[i].offset);
  if (has_optimizer) {
    AdamWConfig oc;
    if (ck.metadata.count("optimizer.config")) {
      const std::string where = meta_where + " \"optimizer.config\"";
      const json j = parse(ck.metadata["optimizer.config"], where);
      oc.beta1 = get<float>(j, "beta1", where), oc.beta2 = get<float>(j, "beta2", where);
      oc.eps = get<float>(j, "eps", where), oc.weight_decay = get<float>(j, "weight_decay", where);
    }
    ck.optimizer = std::make_unique<AdamW>(*ck.model, oc);
    ck.optimizer->step =
        ck.metadata.count("optimizer.step")
            ? parse_int(ck.metadata["optimizer.step"], meta_where + " \"optimizer.step\"")
            : 0;
    read("optimizer.m", m_range, ck.optimizer->m.data());
    read("optimizer.v", v_range, ck.optimizer->v.data());
  }
  return ck;
}

}  // namespace

Checkpoint load_checkpoint(const std::string& path) {
  auto in = std::make_shared<std::ifstream>(path, std::ios::binary);
  check(in->good(), "cannot open checkpoint \"", path, "\"");
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  check(!ec, "cannot read the size of checkpoint \"", path, "\" (", ec.message(), ")");
  return load_checkpoint_from({path, size, [in](uint64_t offset, void* dst, uint64_t bytes) {
                                 in->seekg(static_cast<std::streamoff>(offset));
                                 in->read(static_cast<char*>(dst),
                                          static_cast<std::streamsize>(bytes));
                                 return in->good();
                               }});
}

Checkpoint load_checkpoint_bytes(const uint8_t* data, size_t size) {
  return load_checkpoint_from(
      {"checkpoint bytes", size, [=](uint64_t offset, void* dst, uint64_t bytes) {
         if (offset > size || bytes > size - offset) return false;
         std::memcpy(dst, data + offset, bytes);
         return true;
       }});
}

}  // namespace qkv
