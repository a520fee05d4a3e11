// Models, tokenizers, generation, the worked example and attention maps for Python: thin
// wrappers over the library (model files, the worked example, the attention page).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qkv/chat.h"
#include "qkv/error.h"
#include "qkv/explain.h"
#include "qkv/generate.h"
#include "qkv/gguf.h"
#include "qkv/io.h"
#include "qkv/kv_cache.h"
#include "qkv/model.h"
#include "qkv/model_file.h"
#include "qkv/perplexity.h"
#include "qkv/tokenizer.h"
#include "qkv/viz.h"

namespace qkv::python {
namespace nb = nanobind;
namespace {

// A cache_k or cache_v argument: none for "" (the cache's own storage).
std::optional<CacheType> cache_type_or_none(const std::string& name) {
  if (name.empty()) return std::nullopt;
  return cache_type(name);
}


nb::bytes as_bytes(const std::string& s) { return nb::bytes(s.data(), s.size()); }

// A float array of `shape` that owns a copy of `data` (results the library keeps in its own
// buffers, which the next call overwrites).
nb::ndarray<nb::numpy, float> numpy_copy(const float* data, std::vector<size_t> shape) {
  size_t n = 1;
  for (size_t d : shape) n *= d;
  auto* copy = new float[n];
  std::copy(data, data + n, copy);
  nb::capsule owner(copy, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  return nb::ndarray<nb::numpy, float>(copy, shape.size(), shape.data(), owner);
}

nb::dict stats_dict(const ChatTurnStats& s) {
  nb::dict d;
  d["prompt_tokens"] = s.prompt_tokens, d["reply_tokens"] = s.reply_tokens;
  d["prefill_seconds"] = s.prefill_seconds, d["decode_seconds"] = s.decode_seconds;
  d["finished"] = s.finished;
  return d;
}

// A turn's pieces go to `on_piece(bytes) -> bool` with the GIL held; the model runs without it
// (qkv.Chat streams from a thread of its own).
std::function<bool(const std::string&)> piece_callback(nb::callable on_piece) {
  return [on_piece](const std::string& piece) {
    nb::gil_scoped_acquire locked;
    return nb::cast<bool>(on_piece(as_bytes(piece)));
  };
}

nb::dict config_dict(const ModelConfig& c) {
  nb::dict d;
  d["vocab_size"] = c.vocab_size, d["context"] = c.context, d["d_model"] = c.d_model;
  d["n_layers"] = c.n_layers, d["n_heads"] = c.n_heads, d["n_kv_heads"] = c.n_kv_heads;
  d["d_head"] = c.d_head, d["d_ff"] = c.d_ff, d["norm"] = to_string(c.norm);
  d["mlp"] = to_string(c.mlp), d["positions"] = to_string(c.positions), d["bias"] = c.bias;
  d["tied_embeddings"] = c.tied_embeddings, d["norm_eps"] = c.norm_eps,
  d["rope_theta"] = c.rope_theta;
  d["causal"] = c.causal, d["window"] = c.window, d["sinks"] = c.sinks;
  d["attn_dropout"] = c.attn_dropout;
  return d;
}

}  // namespace

void bind_models(nb::module_& m) {
  nb::class_<Tokenizer>(m, "Tokenizer",
                        "A tokenizer: llama2.c's or a GGUF file's (SentencePiece-style or "
                        "byte-level BPE), or plain bytes")
      .def_static("load_llama2c", &Tokenizer::load_llama2c, nb::arg("path"), nb::arg("vocab_size"),
                  "A tokenizer.bin / tok512.bin file for a vocabulary of vocab_size tokens")
      .def_static("bytes", &Tokenizer::bytes, "256 tokens, one per byte")
      .def_prop_ro("vocab_size", &Tokenizer::vocab_size)
      .def_prop_ro("bos", &Tokenizer::bos, "the id of BOS, -1 when none")
      .def_prop_ro("adds_bos", &Tokenizer::adds_bos, "whether encode() puts BOS first by default")
      .def_prop_ro("eos", &Tokenizer::eos, "the id of EOS, -1 when none")
      .def("encode", &Tokenizer::encode, nb::arg("text"), nb::arg("bos") = true,
           nb::arg("special") = false,
           "text -> token ids (special: control tokens written in the text, <|im_end|>, become "
           "their ids)")
      .def(
          "piece", [](const Tokenizer& t, int32_t id) { return as_bytes(t.piece(id)); },
          nb::arg("id"), "the bytes of token `id` as the vocabulary holds them")
      .def(
          "decode_bytes",
          [](const Tokenizer& t, int32_t prev, int32_t token) {
            return as_bytes(t.decode(prev, token));
          },
          nb::arg("prev"), nb::arg("token"), "the bytes `token` prints as after `prev` (-1: none)");

  nb::class_<Generator>(m, "_Generator")
      .def("next",
           [](Generator& g) {
             nb::gil_scoped_release unlocked;
             return g.next();
           })
      .def_prop_ro("tokens", &Generator::tokens);

  nb::class_<ModelFile>(m, "_ModelFile")
      .def_prop_ro("config", [](const ModelFile& f) { return config_dict(f.model->config()); })
      .def_prop_ro("num_params", [](const ModelFile& f) { return f.model->num_params(); })
      .def_prop_ro("format", [](const ModelFile& f) { return f.format; })
      .def_prop_rw(
          "matmul",
          [](const ModelFile& f) { return std::string(quant::matmul_name(f.model->matmul())); },
          [](ModelFile& f, const std::string& mode) {
            f.model->set_matmul(quant::matmul_from_name(mode));
          })
      .def_prop_ro("chat_template", [](const ModelFile& f) { return f.chat_template; })
      .def_prop_ro(
          "tokenizer",
          [](ModelFile& f) -> Tokenizer* { return f.tokenizer ? &*f.tokenizer : nullptr; },
          nb::rv_policy::reference_internal)
      .def(
          "_generator",
          [](ModelFile& f, std::vector<int32_t> prompt, int64_t steps, float temperature,
             float top_p, int64_t top_k, uint64_t seed, const std::string& cache,
             const std::string& cache_k, const std::string& cache_v, const std::string& rotation,
             const std::string& scores) {
            GenerateOptions o{.steps = steps,
                              .sampling = {.temperature = temperature,
                                           .top_k = top_k,
                                           .top_p = top_p,
                                           .seed = seed},
                              .cache = cache_type(cache),
                              .cache_k = cache_type_or_none(cache_k),
                              .cache_v = cache_type_or_none(cache_v),
                              .cache_rotation = cache_rotation(rotation),
                              .cache_scores = cache_scores(scores)};
            o.stop_tokens = stop_tokens(f);
            return Generator(*f.model, std::move(prompt), o);
          },
          nb::keep_alive<0, 1>(), nb::arg("prompt"), nb::arg("steps"), nb::arg("temperature"),
          nb::arg("top_p"), nb::arg("top_k"), nb::arg("seed"), nb::arg("cache"),
          nb::arg("cache_k"), nb::arg("cache_v"), nb::arg("cache_rotation"),
          nb::arg("cache_scores"))
      .def(
          "logits",
          [](ModelFile& f, const std::vector<int32_t>& tokens) {
            const ModelConfig& c = f.model->config();
            check(!tokens.empty(), "logits: give at least one token");
            for (int32_t t : tokens)
              check(t >= 0 && t < c.vocab_size, "logits: token ", t, " is not in the vocabulary");
            const auto T = static_cast<int64_t>(tokens.size());
            check(T <= c.context, "logits: ", T, " tokens, more than the model's context of ",
                  c.context);
            nb::gil_scoped_release unlocked;
            f.model->forward(tokens.data(), nullptr, 1, T);
            nb::gil_scoped_acquire locked;
            return numpy_copy(f.model->logits().data, {size_t(T), size_t(c.vocab_size)});
          },
          nb::arg("tokens"), "The logits [len(tokens), vocab] of one forward over the tokens")
      .def(
          "perplexity",
          [](ModelFile& f, const std::vector<int32_t>& tokens, int64_t ctx, int32_t bos,
             const std::string& cache, const std::string& cache_k, const std::string& cache_v,
             const std::string& rotation, const std::string& scores, bool decode) {
            PerplexityResult r;
            const KVCacheOptions o{.type = cache_type(cache),
                                   .key_type = cache_type_or_none(cache_k),
                                   .value_type = cache_type_or_none(cache_v),
                                   .rotation = cache_rotation(rotation),
                                   .scores = cache_scores(scores)};
            {
              nb::gil_scoped_release unlocked;
              r = perplexity(*f.model, tokens, ctx, bos, o, decode);
            }
            nb::dict d;
            d["perplexity"] = r.perplexity, d["nll"] = r.nll, d["nll_stderr"] = r.nll_stderr;
            d["ctx"] = r.ctx, d["chunks"] = r.chunks, d["scored"] = r.scored;
            d["chunk_perplexity"] = r.chunk_perplexity, d["seconds"] = r.seconds;
            const CacheType k = o.key_type.value_or(o.type), v = o.value_type.value_or(o.type);
            d["cache_k"] = cache_type_name(k), d["cache_v"] = cache_type_name(v);
            d["cache_rotation"] = cache_rotates(k, v, o.rotation) ? "on" : "off";
            d["cache_scores"] = cache_scores_name(o.scores), d["decode"] = decode;
            return d;
          },
          nb::arg("tokens"), nb::arg("ctx"), nb::arg("bos"), nb::arg("cache"), nb::arg("cache_k"),
          nb::arg("cache_v"), nb::arg("cache_rotation"), nb::arg("cache_scores"),
          nb::arg("decode"))
      .def("_attention_maps", [](ModelFile& f, const std::string& name, const std::string& prompt,
                                 const std::string& prompt_ids) {
        AttentionMaps maps;
        {
          nb::gil_scoped_release unlocked;
          maps = maps_of_model(f, name, prompt, prompt_ids);
        }
        std::vector<nb::ndarray<nb::numpy, float>> weights;
        for (const Tensor& w : maps.weights)  // [1, H, T, T] per layer
          weights.push_back(
              numpy_copy(w.data(), {size_t(w.size(1)), size_t(w.size(2)), size_t(w.size(3))}));
        nb::dict d;
        d["tokens"] = maps.tokens;
        d["weights"] = weights;
        d["html"] = attention_html(maps);
        return d;
      });

  nb::class_<Chat>(m, "_Chat")
      .def(
          "__init__",
          [](Chat* chat, ModelFile& f, const std::string& system, int64_t max_reply,
             int64_t context, float temperature, float top_p, int64_t top_k, uint64_t seed,
             const std::string& cache, const std::string& cache_k, const std::string& cache_v,
             const std::string& rotation, const std::string& scores) {
            check(f.tokenizer.has_value(), "Chat: the model has no tokenizer");
            const ChatFormat format = chat_format(f.chat_template);
            ChatOptions o{.system = system,
                          .sampling = {.temperature = temperature,
                                       .top_k = top_k,
                                       .top_p = top_p,
                                       .seed = seed},
                          .max_reply = max_reply,
                          .context = context,
                          .cache = cache_type(cache),
                          .cache_k = cache_type_or_none(cache_k),
                          .cache_v = cache_type_or_none(cache_v),
                          .cache_rotation = cache_rotation(rotation),
                          .cache_scores = cache_scores(scores)};
            new (chat) Chat(*f.model, *f.tokenizer, format, o);
          },
          nb::keep_alive<1, 2>(), nb::arg("file"), nb::arg("system"), nb::arg("max_reply"),
          nb::arg("context"), nb::arg("temperature"), nb::arg("top_p"), nb::arg("top_k"),
          nb::arg("seed"), nb::arg("cache"), nb::arg("cache_k"), nb::arg("cache_v"),
          nb::arg("cache_rotation"), nb::arg("cache_scores"))
      .def("add", &Chat::add, nb::arg("role"), nb::arg("content"))
      .def(
          "respond",
          [](Chat& chat, nb::callable on_piece) {
            auto callback = piece_callback(std::move(on_piece));
            ChatTurnStats s;
            {
              nb::gil_scoped_release unlocked;
              s = chat.respond(callback);
            }
            return stats_dict(s);
          },
          nb::arg("on_piece"))
      .def(
          "reply",
          [](Chat& chat, const std::string& user, nb::callable on_piece) {
            auto callback = piece_callback(std::move(on_piece));
            ChatTurnStats s;
            {
              nb::gil_scoped_release unlocked;
              s = chat.reply(user, callback);
            }
            return stats_dict(s);
          },
          nb::arg("user"), nb::arg("on_piece"))
      .def("reset", &Chat::reset)
      .def_prop_ro("positions", &Chat::positions)
      .def_prop_ro("context", &Chat::context)
      .def_prop_ro("tokens", &Chat::transcript);

  m.def(
      "_load_model",
      [](const std::string& path, const std::string& tokenizer, bool need_tokenizer) {
        nb::gil_scoped_release unlocked;
        return load_model_file(path, tokenizer, need_tokenizer);
      },
      nb::arg("path"), nb::arg("tokenizer"), nb::arg("need_tokenizer"));
  m.def(
      "_load_checkpoint_file",
      [](const std::string& path) {
        nb::gil_scoped_release unlocked;
        return load_checkpoint_file(path);
      },
      nb::arg("path"));
  m.def(
      "_load_gguf_file",
      [](const std::string& path, bool dequantize) {
        nb::gil_scoped_release unlocked;
        return load_gguf_file(gguf::File::open(path), false,
                              dequantize ? GgufWeights::fp32 : GgufWeights::in_place);
      },
      nb::arg("path"), nb::arg("dequantize"));
  m.def("_default_system_prompt", &default_system_prompt, nb::arg("chat_template"));
  m.def("_explain_json", &explain::explain_json, nb::arg("input"), nb::arg("causal"),
        nb::arg("source"));
  m.def("_worked_example_json", &explain::worked_example_json, nb::arg("causal"));
}

}  // namespace qkv::python
