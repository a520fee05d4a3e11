// `qkv quantize`: a llama2.c model or a qkv checkpoint (Llama style) as a GGUF file with its
// matrices in Q8_0, Q4_0, Q4_1, Q4_K or Q6_K (or F16, F32), its tokenizer inside: what llama.cpp
// and `qkv generate --model X.gguf` run.
#include <cstdio>
#include <map>

#include "cli.h"
#include "qkv/model_file.h"
#include "qkv/error.h"
#include "qkv/gguf.h"
#include "qkv/io.h"

namespace qkv::cli {
namespace {

constexpr const char* kTypes = "q8_0, q4_0, q4_1, q4_k, q6_k, f16 or f32";

struct QuantizeOptions {
  std::string model, tokenizer, out, type = "q8_0";
};

void run_quantize(const QuantizeOptions& o) {
  const std::map<std::string, gguf::TensorType> types{
      {"q8_0", gguf::TensorType::q8_0}, {"q4_0", gguf::TensorType::q4_0},
      {"q4_1", gguf::TensorType::q4_1}, {"q4_k", gguf::TensorType::q4_k},
      {"q6_k", gguf::TensorType::q6_k}, {"f16", gguf::TensorType::f16},
      {"f32", gguf::TensorType::f32}};
  const auto type = types.find(o.type);
  check(type != types.end(), "--type must be ", kTypes, ", got \"", o.type, "\"");
  ModelFile f = load_model_file(o.model, o.tokenizer, /*need_tokenizer=*/false, GgufWeights::fp32);
  check(f.format != "gguf", "--model: \"", o.model, "\" is a GGUF file already");
  const GgufSaveStats s =
      save_gguf(o.out, *f.model, f.tokenizer ? &*f.tokenizer : nullptr, type->second);
  std::printf("%s: %ld matrices in %s", o.out.c_str(), static_cast<long>(s.quantized),
              gguf::to_string(type->second).c_str());
  if (s.kept_f32)
    std::printf(", %ld kept in F32 (rows not whole blocks)", static_cast<long>(s.kept_f32));
  std::printf(", %s of tensors (fp32: %s)%s\n", bytes_str(static_cast<double>(s.bytes)).c_str(),
              bytes_str(4.0 * static_cast<double>(f.model->num_params())).c_str(),
              f.tokenizer ? ", with its tokenizer" : ", no tokenizer (prompts as --prompt-ids)");
}

}  // namespace

void add_quantize(CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "quantize", "Write a Llama-style model as GGUF, its matrices in a block format");
  cmd->add_option("--model", o->model,
                  "llama2.c checkpoint (.bin) or qkv checkpoint (.safetensors)")
      ->required();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "llama2.c tokenizer; default: beside the model (a qkv byte model: its bytes)");
  cmd->add_option("--out", o->out, "The GGUF file to write")->required();
  cmd->add_option("--type", o->type, kTypes)->capture_default_str();
  cmd->callback([o] { run_quantize(*o); });
}

}  // namespace qkv::cli
