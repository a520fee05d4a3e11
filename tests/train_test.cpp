// Training: the optimizer against hand computation, checkpoints that round-trip and resume
// exactly, clear errors on corrupt files, and the synthetic tasks actually being learned.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/ops.h"
#include "model_configs.h"
#include "qkv/train.h"

namespace qkv {
namespace {

ModelConfig small(const TaskData& data, bool llama = false) {
  return testing::small_model(data.vocab_size(), data.seq_len(), llama);
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("qkv_test_" + name)).string();
}

TEST(AdamW, OneStepByHand) {
  TaskData data(Task::copy, 3, 4);
  Model m(small(data), 1);
  AdamW opt(m, {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f});
  const ParamInfo& w = m.param("layers.0.attn.qkv.weight");  // decayed
  const ParamInfo& b = m.param("layers.0.attn.qkv.bias");    // not decayed
  m.zero_grad();
  m.grads()[w.offset] = 0.5f;
  m.grads()[b.offset] = -2.0f;
  const float w0 = m.weights()[w.offset], b0 = m.weights()[b.offset];
  opt.update(m, 0.01f);
  // Step 1: m̂ = g, v̂ = g², so the Adam step is lr · sign(g) (up to eps), plus lr · λ · w.
  EXPECT_NEAR(m.weights()[w.offset], w0 - 0.01f * (1 + 0.1f * w0), 1e-6);
  EXPECT_NEAR(m.weights()[b.offset], b0 + 0.01f, 1e-6);
}

TEST(Schedule, WarmupThenCosine) {
  EXPECT_FLOAT_EQ(learning_rate(0, 100, 10, 1.0f, 0.1f), 0.1f);
  EXPECT_FLOAT_EQ(learning_rate(9, 100, 10, 1.0f, 0.1f), 1.0f);
  EXPECT_NEAR(learning_rate(55, 100, 10, 1.0f, 0.1f), 0.55f, 1e-6);  // halfway: the midpoint
  EXPECT_FLOAT_EQ(learning_rate(100, 100, 10, 1.0f, 0.1f), 0.1f);
}

TEST(TrainConfig, EachFieldOutOfRangeIsNamed) {
  check_config(TrainConfig{});  // the defaults are valid
  check_config(TrainConfig{.steps = 0, .warmup = 0, .clip = 0});
  const struct {
    TrainConfig config;
    const char* message;
  } cases[] = {
      {{.steps = -1}, "steps must be >= 0, got -1"},
      {{.batch = 0}, "batch must be >= 1, got 0"},
      {{.grad_accum = 0}, "grad_accum must be >= 1, got 0"},
      {{.warmup = -5}, "warmup must be >= 0, got -5"},
      {{.lr = 0}, "lr must be > 0, got 0"},
      {{.lr = std::numeric_limits<float>::infinity()}, "lr must be > 0, got inf"},
      {{.min_lr = -1e-4f}, "min_lr must be >= 0"},
      {{.clip = std::nanf("")}, "clip must be >= 0 (0 = off), got nan"},
  };
  for (const auto& c : cases) {
    try {
      check_config(c.config);
      ADD_FAILURE() << "no error, expected " << c.message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
    }
  }
}

TEST(Checkpoint, RoundTripsWeightsOptimizerAndConfig) {
  for (bool llama : {false, true}) {
    TaskData data(Task::recall, 4, 8);
    ModelConfig config = small(data, llama);
    config.sinks = llama;                    // learned sinks travel with the config and the weights
    config.attn_dropout = llama ? 0 : 0.1f;  // … and dropout with the config and the seed
    Model m(config, 3);
    AdamW opt(m);
    TrainConfig cfg{.steps = 3, .batch = 4, .eval_every = 0};
    train(m, opt, data, cfg, 0, nullptr);
    const std::string path = temp_path("roundtrip.safetensors");
    save_checkpoint(path, m, &opt, 3, {{"note", "hello"}});
    const Checkpoint ck = load_checkpoint(path);
    EXPECT_EQ(ck.step, 3);
    EXPECT_EQ(ck.model->seed(), 3u);
    EXPECT_EQ(ck.metadata.at("note"), "hello");
    EXPECT_EQ(config_to_json(ck.model->config()), config_to_json(m.config()));
    ASSERT_EQ(ck.model->num_params(), m.num_params());
    for (int64_t i = 0; i < m.num_params(); ++i) {
      ASSERT_EQ(ck.model->weights()[i], m.weights()[i]);
      ASSERT_EQ(ck.optimizer->m[i], opt.m[i]);
      ASSERT_EQ(ck.optimizer->v[i], opt.v[i]);
    }
    EXPECT_EQ(ck.optimizer->step, opt.step);
    std::filesystem::remove(path);
  }
}

TEST(Checkpoint, ResumedRunGivesTheSameLossesAsAnUninterruptedOne) {
  TaskData data(Task::recall, 4, 8);
  const TrainConfig cfg{.steps = 12, .batch = 8, .grad_accum = 2, .warmup = 3, .eval_every = 0};
  // (With attention dropout: its masks follow the steps, as the batches do.)
  ModelConfig config = small(data);
  config.attn_dropout = 0.1f;
  auto losses_of = [](std::vector<float>& out) {
    return [&out](const TrainProgress& p) {
      out.push_back(p.loss);
      return true;
    };
  };
  std::vector<float> straight, resumed;
  {
    Model m(config, 5);
    AdamW opt(m);
    train(m, opt, data, cfg, 0, losses_of(straight));
  }
  const std::string path = temp_path("resume.safetensors");
  {
    Model m(config, 5);
    AdamW opt(m);
    // Stopped after 5 of the 12 steps (as Ctrl-C does), same schedule.
    const TrainResult r = train(m, opt, data, cfg, 0, [&](const TrainProgress& p) {
      resumed.push_back(p.loss);
      return p.step < 5;
    });
    ASSERT_EQ(r.steps, 5);
    save_checkpoint(path, m, &opt, r.steps);
  }
  Checkpoint ck = load_checkpoint(path);
  train(*ck.model, *ck.optimizer, data, cfg, ck.step, losses_of(resumed));
  ASSERT_EQ(resumed.size(), straight.size());
  for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(resumed[i], straight[i]) << "step " << i;
  std::filesystem::remove(path);
}

TEST(Checkpoint, CorruptAndTruncatedFilesAreClearErrors) {
  TaskData data(Task::copy, 3, 4);
  Model m(small(data), 1);
  const std::string path = temp_path("corrupt.safetensors");
  save_checkpoint(path, m, nullptr, 0);
  const auto size = std::filesystem::file_size(path);
  auto expect_error = [&](const std::string& fragment) {
    try {
      load_checkpoint(path);
      ADD_FAILURE() << "no error, expected " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  std::filesystem::resize_file(path, size - 100);
  expect_error("needs");  // a tensor runs past the end of the data
  std::filesystem::resize_file(path, 4);
  expect_error("too short");
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const uint64_t huge = 1ull << 40;
    out.write(reinterpret_cast<const char*>(&huge), 8);
    out << "{}";
  }
  expect_error("does not fit");
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const std::string header = "{not json";
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header;
  }
  expect_error("not valid JSON");
  EXPECT_THROW(load_checkpoint(temp_path("does_not_exist")), Error);
  std::filesystem::remove(path);
}

// A real checkpoint whose JSON header is edited: every malformed field is a qkv::Error naming
// it (these three were an out-of-bounds read, std::invalid_argument and nlohmann's exception).
TEST(Checkpoint, MalformedHeaderFieldsAreClearErrors) {
  TaskData data(Task::copy, 3, 4);
  Model m(small(data), 1);
  AdamW opt(m);
  const std::string path = temp_path("fields.safetensors");
  save_checkpoint(path, m, &opt, 7);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  const std::string data_bytes = bytes.substr(8 + n);
  auto load_edited = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json h = header;
    edit(h);
    const std::string text = h.dump();
    const uint64_t size = text.size();
    std::string file(reinterpret_cast<const char*>(&size), 8);
    file += text + data_bytes;
    return load_checkpoint_bytes(reinterpret_cast<const uint8_t*>(file.data()), file.size());
  };
  EXPECT_EQ(load_edited([](nlohmann::json&) {}).step, 7);  // the unedited header loads
  const std::string first = m.params()[0].name;
  const struct {
    std::function<void(nlohmann::json&)> edit;
    std::string message;
  } cases[] = {
      {[&](auto& h) { h[first]["data_offsets"] = {0}; }, "\"data_offsets\" must be [begin, end]"},
      {[&](auto& h) { h[first]["data_offsets"] = 12; }, "\"data_offsets\" must be [begin, end]"},
      {[&](auto& h) {
         h[first]["data_offsets"] = {"0", 4};
       },
       "data_offsets[0] must be a whole number"},
      {[&](auto& h) {
         h[first]["data_offsets"] = {-4, 4};
       },
       "data_offsets[0] = -4 is out of range"},
      {[&](auto& h) {
         h[first]["shape"] = {1, 2, 3};
       },
       "\"shape\" must be a list of at most 2 sizes"},
      {[&](auto& h) {
         h[first]["shape"] = {1, 1};
       },
       "has shape [1,1] but the model needs"},
      {[&](auto& h) { h[first] = "F32"; }, "expected a JSON object, found string"},
      {[&](auto& h) { h.erase(first); }, "\"" + first + "\" is missing"},
      {[&](auto& h) { h["__metadata__"]["step"] = "seven"; },
       "\"step\" must be a whole number, found \"seven\""},
      {[&](auto& h) { h["__metadata__"]["step"] = 7; }, "\"step\" must be a string"},
      {[&](auto& h) { h["__metadata__"]["optimizer.step"] = "1e3"; },
       "\"optimizer.step\" must be a whole number"},
      {[&](auto& h) { h["__metadata__"]["optimizer.config"] = "{\"beta1\": \"high\"}"; },
       "\"beta1\" must be a finite number"},
      {[&](auto& h) { h["__metadata__"]["optimizer.config"] = "[1, 2]"; },
       "expected a JSON object, found array"},
      {[&](auto& h) { h["__metadata__"]["optimizer.config"] = "{"; },
       "\"optimizer.config\": not valid JSON"},
      {[&](auto& h) { h["__metadata__"]["config"] = "{\"vocab_size\": 1.5}"; },
       "\"vocab_size\" must be a whole number"},
      {[&](auto& h) { h["__metadata__"]["config"] = 5; }, "\"config\" must be a string"},
      {[&](auto& h) { h["__metadata__"] = "x"; }, "not a qkv checkpoint"},
  };
  for (const auto& c : cases) {
    try {
      load_edited(c.edit);
      ADD_FAILURE() << "no error, expected " << c.message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove(path);
}

TEST(Tasks, RecallSequencesAreWellFormed) {
  TaskData data(Task::recall, 4, 8);
  std::mt19937_64 rng(1);
  const Batch b = data.sample(16, rng);
  for (int64_t s = 0; s < b.B; ++s) {
    const int32_t* x = b.tokens.data() + s * b.T;
    const int32_t* y = b.targets.data() + s * b.T;
    EXPECT_EQ(x[8], 16);  // '?'
    for (int64_t t = 0; t < b.T; ++t) {
      if (y[t] == kIgnoreIndex) continue;
      // The asked key appears once among the pairs, and the answer is the value after it.
      int found = 0;
      for (int64_t i = 0; i < 4; ++i)
        if (x[2 * i] == x[t]) {
          ++found;
          EXPECT_EQ(y[t], x[2 * i + 1]);
        }
      EXPECT_EQ(found, 1);
    }
  }
}

TEST(Tasks, TextTrainingLowersTheHeldOutLoss) {
  // A file with structure to learn (a repeated sentence): the held-out loss must fall well
  // below that of a uniform guess over 256 bytes.
  const std::string path = temp_path("text.txt");
  {
    std::ofstream out(path);
    for (int i = 0; i < 200; ++i) out << "the quick brown fox jumps over the lazy dog. ";
  }
  TaskData data(path, 32);
  EXPECT_EQ(data.vocab_size(), 256);
  Model m(small(data), 2);
  AdamW opt(m);
  const TrainResult r =
      train(m, opt, data, {.steps = 60, .batch = 8, .warmup = 5, .eval_every = 0, .lr = 3e-3f}, 0,
            nullptr);
  EXPECT_LT(r.final_eval_loss, 0.5 * std::log(256.0)) << r.final_eval_loss;
  EXPECT_LT(r.final_accuracy, 0);  // no exact-match accuracy for text
  std::filesystem::remove(path);
  EXPECT_THROW(TaskData(temp_path("missing.txt"), 32), Error);
}

}  // namespace
}  // namespace qkv
