// The qkv command line, run as a user runs it: output, --json, exit codes, error messages.
#include <gtest/gtest.h>
#include <unistd.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/gguf.h"
#include "qkv/version.h"

namespace {

using nlohmann::json;

struct Result {
  int status;
  std::string output;  // stdout, or stdout and stderr together when asked
};

// Runs qkv with `args` (in directory `cwd` when given, with `env`'s VAR=value settings).
Result run(const std::string& args, bool with_stderr = false, const std::string& cwd = "",
           const std::string& env = "") {
  const std::string command = (cwd.empty() ? "" : "cd " + cwd + " && ") + env + " " +
                              std::string(QKV_BINARY) + " " + args +
                              (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string output;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) output.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

json run_json(const std::string& args, const std::string& env = "") {
  const Result r = run(args, false, "", env);
  EXPECT_EQ(r.status, 0) << args;
  return json::parse(r.output);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string data(const char* name) { return std::string(QKV_TEST_DATA) + "/" + name; }

TEST(CliExplain, ArticleNumbersForCreature) {
  const json j = run_json("explain --json");
  const json& creature = j["queries"][2];
  EXPECT_EQ(creature["token"], "creature");
  const double raw[] = {3, 2, 4}, scaled[] = {2.121, 1.414, 2.828}, w[] = {0.284, 0.140, 0.576};
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(creature["raw_scores"][i].get<double>(), raw[i]);
    EXPECT_NEAR(creature["scaled_scores"][i].get<double>(), scaled[i], 5e-4);
    EXPECT_NEAR(creature["weights"][i].get<double>(), w[i], 5e-4);
  }
  EXPECT_NEAR(creature["output"][0].get<double>(), 2.012, 5e-4);
  EXPECT_NEAR(creature["output"][1].get<double>(), 0.856, 5e-4);
  // The true values where the article rounds loosely (4.095, 29.354), and a note saying so.
  EXPECT_NEAR(creature["exp"][1].get<double>(), 4.113, 5e-4);
  EXPECT_NEAR(creature["z"].get<double>(), 29.374, 5e-4);
  ASSERT_EQ(j["notes"].size(), 1u);
  EXPECT_NE(j["notes"][0].get<std::string>().find("29.354"), std::string::npos);
  EXPECT_NE(j["convention"].get<std::string>().find("K^T Q"), std::string::npos);
}

// explain works the steps out on its own, in double; the reference kernel must agree.
TEST(CliExplain, StepsAgreeWithTheReferenceKernel) {
  for (const char* flags : {"", " --causal"}) {
    const json j = run_json(std::string("explain --json") + flags);
    float q[6] = {1, 0, 0, 1, 2, 1}, k[6] = {1, 1, 0, 2, 2, 0}, v[6] = {1, 0, 0, 2, 3, 1};
    float out[6], weights[9];
    qkv::AttentionArgs a;
    a.q = qkv::View(q, {1, 1, 3, 2});
    a.k = qkv::View(k, {1, 1, 3, 2});
    a.v = qkv::View(v, {1, 1, 3, 2});
    a.out = qkv::View(out, {1, 1, 3, 2});
    a.mask.causal = j["causal"];
    qkv::reference::attention(a, qkv::View(weights, {1, 1, 3, 3}));
    for (int i = 0; i < 3; ++i) {
      for (int jj = 0; jj < 3; ++jj)
        EXPECT_NEAR(j["queries"][i]["weights"][jj].get<double>(), weights[i * 3 + jj], 1e-6);
      for (int d = 0; d < 2; ++d)
        EXPECT_NEAR(j["queries"][i]["output"][d].get<double>(), out[i * 2 + d], 1e-6);
    }
  }
}

TEST(CliExplain, CausalMaskShowsMinusInfinityAndZeroWeights) {
  const json j = run_json("explain --causal --json");
  const json& fluffy = j["queries"][0];
  EXPECT_EQ(fluffy["masked"], json({false, true, true}));
  EXPECT_TRUE(fluffy["masked_scores"][1].is_null());
  EXPECT_EQ(fluffy["weights"], json({1.0, 0.0, 0.0}));
  const Result text = run("explain --causal");
  EXPECT_NE(text.output.find("-inf"), std::string::npos);
  EXPECT_NE(text.output.find("Causal mask"), std::string::npos);
}

TEST(CliExplain, TextShowsEveryStepAndTheConvention) {
  const Result r = run("explain");
  ASSERT_EQ(r.status, 0);
  for (const char* expected :
       {"Raw scores", "Scaled scores", "Exponentials", "Z = ", "Weights", "0.284", "0.140", "0.576",
        "[2.012, 0.856]", "29.374", "column form", "row form"})
    EXPECT_NE(r.output.find(expected), std::string::npos) << expected;
}

TEST(CliExplain, Softmax) {
  const json j = run_json("explain softmax 2 1 0 --json");
  const double w[] = {0.665, 0.245, 0.090};
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(j["weights"][i].get<double>(), w[i], 5e-4);
  // Scores large enough to overflow e^s still give the right weights.
  const json big = run_json("explain softmax 1000 999 --json");
  EXPECT_NEAR(big["weights"][0].get<double>(), 1 / (1 + std::exp(-1.0)), 1e-12);
  // Negative scores are numbers, not flags.
  const json neg = run_json("explain softmax -1 2 --json");
  EXPECT_NEAR(neg["weights"][1].get<double>(), 1 / (1 + std::exp(-3.0)), 1e-12);
}

TEST(CliExplain, UserInputForCrossAttention) {
  const json j = run_json("explain --json --input " + data("cross_example.json"));
  EXPECT_EQ(j["example"], "input");
  EXPECT_EQ(j["tokens"], json({"le", "chat"}));
  EXPECT_EQ(j["key_tokens"], json({"the", "black", "cat"}));
  EXPECT_TRUE(j["notes"].empty());
  // "chat" = [0, 2, 0.5] against the keys: 2, 2.5, 0.25, scaled by 1/√3.
  const json& chat = j["queries"][1];
  const double s[] = {2 / std::sqrt(3.0), 2.5 / std::sqrt(3.0), 0.25 / std::sqrt(3.0)};
  const double z = std::exp(s[0]) + std::exp(s[1]) + std::exp(s[2]);
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(chat["weights"][i].get<double>(), std::exp(s[i]) / z, 1e-12);
}

TEST(CliErrors, BadInputGivesAClearErrorAndStatusTwo) {
  const struct {
    std::string args, message;
  } cases[] = {
      {"explain --input /no/such/file.json", "cannot open --input file"},
      {"explain --input " + data("truncated.json"), "not valid JSON"},
      {"explain --input " + data("bad_widths.json"), "q·k needs the same width"},
      {"explain --frobnicate", "frobnicate"},
      {"explain softmax", "scores"},
      {"explain softmax 1 abc", "abc"},
      {"params --preset gpt7", "unknown preset \"gpt7\""},
      {"params --heads 7", "not divisible"},
      {"params --heads 12 --kv-heads 5", "multiple of n_kv_heads"},
      {"params --layers 0", "n_layers must be >= 1"},
      {"params --mlp relu", "--mlp: unknown value \"relu\""},
      {"bench attention --seq 8 --threads -1", "--threads: Value -1 not in range"},
      {"train --steps 1 --threads 5000", "--threads: Value 5000 not in range"},
      {"train --steps -1", "steps must be >= 0, got -1"},
      {"train --lr nan", "lr must be > 0, got nan"},
      {"train --heads 0", "is not divisible by --heads 0"},
      {"train --layers 99999999999", "parameters, more than qkv counts"},
      {"params --seq 99999999999", "is too long to count"},
      {"bench train --steps 0", "--steps must be >= 1, got 0"},
      {"bench train --heads 0", "must be a multiple of --heads 0"},
      {"bench train --style nope", "--style: nope not in {gpt2,llama}"},
      {"train --style nope", "--style: nope not in {gpt2,llama}"},
      {"viz --example --layer 1", "--layer requires --terminal"},
      {"info --target avx1024", "--target: unknown SIMD target 'avx1024'"},
      {"nonsense", "unknown command \"nonsense\""},
      {"", "subcommand"},
  };
  for (const auto& c : cases) {
    const Result r = run(c.args, /*with_stderr=*/true);
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.rfind("qkv: error: ", 0), 0u) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}

TEST(CliErrors, UnknownQkvTargetIsAClearError) {
  const Result r = run("params --preset gpt2", /*with_stderr=*/true, "", "QKV_TARGET=avx1024");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_EQ(r.output.rfind("qkv: error: QKV_TARGET: unknown SIMD target 'avx1024'", 0), 0u)
      << r.output;
}

TEST(CliErrors, ForcingAUnitIsCheckedAgainstTheCpu) {
  const Result r = run("info --json --threads 1", /*with_stderr=*/true, "", "QKV_UNITS=bf16=sdot");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_EQ(r.output.rfind("qkv: error: QKV_UNITS: 'sdot' is not a unit for bf16", 0), 0u)
      << r.output;
  const json info = run_json("info --json --threads 1", "QKV_UNITS=bf16=fma");
  bool listed = false;
  for (const json& u : info["units"])
    if (u["data"] == "bf16") {
      listed = true;
      EXPECT_EQ(u["unit"], "fma");
    }
  EXPECT_TRUE(listed);
  EXPECT_NE(info["target"], "avx512_bf16");
  EXPECT_NE(info["cpu_id"].get<std::string>().find(" family "), std::string::npos);
}

// qkv info names the GEMM library of fp32 and bf16 products; QKV_GEMM forces the fp32 one, and
// an unknown name is a clear error.
TEST(CliInfo, GemmLibrariesAndQkvGemm) {
  const Result bad = run("info --json --threads 1", /*with_stderr=*/true, "", "QKV_GEMM=mkl");
  EXPECT_EQ(bad.status, 2) << bad.output;
  EXPECT_EQ(bad.output.rfind("qkv: error: QKV_GEMM=mkl: the choices are openblas", 0), 0u)
      << bad.output;
  const json info = run_json("info --json --threads 1", "QKV_GEMM=openblas");
  ASSERT_EQ(info["gemm"].size(), 2u) << info.dump();
  EXPECT_EQ(info["gemm"][0]["products"], "fp32");
  EXPECT_EQ(info["gemm"][0]["library"], "OpenBLAS");
  EXPECT_EQ(info["gemm"][0]["why"], "forced by QKV_GEMM");
  EXPECT_EQ(info["gemm"][1]["products"], "bf16");
}

// The version is CMakeLists.txt's project version, in qkv --version, qkv info and the library,
// with the commit it was built from (12 hex digits in a checkout).
TEST(CliInfo, VersionAndCommit) {
  std::ifstream cmake(std::string(QKV_SOURCE_DIR) + "/CMakeLists.txt");
  const std::string text{std::istreambuf_iterator<char>(cmake), std::istreambuf_iterator<char>()};
  const auto at = text.find("project(qkv VERSION ");
  ASSERT_NE(at, std::string::npos);
  const std::string expected = text.substr(at + 20, text.find_first_of(" )", at + 20) - at - 20);
  EXPECT_EQ(std::string(qkv::version()), expected);
  const std::string commit = qkv::build_commit();
  EXPECT_TRUE(
      commit == "unknown" ||
      (commit.size() == 12 && commit.find_first_not_of("0123456789abcdef") == std::string::npos))
      << commit;
  const Result r = run("--version");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.output, "qkv " + expected + " (commit " + commit + ")\n");
  const json info = run_json("info --json --threads 1");
  EXPECT_EQ(info["version"], expected);
  EXPECT_EQ(info["commit"], commit);
}

// qkv info names a supported target and agrees with --target; bench reports the target that ran.
TEST(CliInfo, TargetsAndYardsticks) {
  const json info = run_json("info --json --threads 1");
  const auto supported = info["targets_supported"].get<std::vector<std::string>>();
  ASSERT_FALSE(supported.empty());
  // The best target, but for the bf16 units where the registry widens bf16 (Intel).
  std::string bf16_unit;
  for (const json& u : info["units"])
    if (u["data"] == "bf16") bf16_unit = u["unit"];
  const bool units_target = supported.front() == "avx512_bf16" || supported.front() == "neon_bf16";
  EXPECT_EQ(info["target"],
            units_target && bf16_unit != "bf16_dot" ? supported.at(1) : supported.front());
  EXPECT_GT(info["fma_peak_gflops"].get<double>(), 0);
  EXPECT_GT(info["read_gbps"].get<double>(), 0);
  EXPECT_FALSE(info["cpu"].get<std::string>().empty());
  for (const std::string& t : supported) {
    SCOPED_TRACE(t);
    const json forced = run_json("info --json --threads 1 --target " + t);
    EXPECT_EQ(forced["target"], t);
    const json bench = run_json("--target " + t +
                                " bench attention --seq 64 --dim 16 --heads 1 "
                                "--min-time 0.01 --no-reference --json");
    EXPECT_EQ(bench["target"], t);
    EXPECT_LT(bench["max_abs_err"].get<double>(), 1e-5);
  }
}

TEST(CliParams, Gpt3_175b) {
  const json j = run_json("params --preset gpt3-175b --json");
  EXPECT_EQ(j["per_head"]["w_q"], 1572864);
  EXPECT_EQ(j["per_head"]["w_k"], 1572864);
  EXPECT_EQ(j["per_head"]["value_down"], 1572864);
  EXPECT_EQ(j["per_head"]["value_up"], 1572864);
  EXPECT_EQ(j["per_head"]["total"], 6291456);
  EXPECT_EQ(j["per_layer"]["attention_weights"], 603979776);
  EXPECT_NEAR(j["total"].get<double>() / 175.0e9, 1.0, 0.005);
  EXPECT_EQ(j["costs"]["score_grid_entries"], 2048 * 2048);
  EXPECT_EQ(j["config"]["d_model"], 12288);
}

TEST(CliParams, FlagsOverrideAPreset) {
  // GPT-3 175B with 8 key/value heads: W_K and value-down shrink 12-fold.
  const json j = run_json("params --preset gpt3-175b --kv-heads 8 --seq 4096 --json");
  EXPECT_EQ(j["per_layer"]["attention_weights"], 96 * 2 * 1572864 + 8 * 2 * 1572864);
  EXPECT_EQ(j["costs"]["context"], 4096);
  EXPECT_EQ(j["costs"]["kv_cache_bytes_per_token_bf16"], 2 * 96 * 8 * 128 * 2);
  // A config from flags alone: d_head and d_ff follow from d_model and heads.
  const json small = run_json(
      "params --d-model 256 --layers 4 --heads 4 --vocab 256 "
      "--context 256 --json");
  EXPECT_EQ(small["config"]["d_head"], 64);
  EXPECT_EQ(small["config"]["d_ff"], 1024);
}

TEST(CliParams, TableAndList) {
  const Result table = run("params --preset gpt3-175b");
  EXPECT_EQ(table.status, 0);
  for (const char* expected : {"1,572,864", "6,291,456", "603,979,776", "4,194,304", "174.6B"})
    EXPECT_NE(table.output.find(expected), std::string::npos) << expected;
  const Result list = run("params --list");
  EXPECT_NE(list.output.find("llama2-70b"), std::string::npos);
  // Llama 3 8B's cache per token: 2 x 32 layers x 8 kv heads x 128 = 65,536 values, 4 bytes
  // each in fp32, 34 per 32 in q8_0 (68 KiB), 18 per 32 in q4_0 (36 KiB).
  const Result llama = run("params --preset llama3-8b");
  EXPECT_NE(llama.output.find("256.0 KiB  fp32 (128.0 KiB bf16/f16, 68.0 KiB q8_0, 36.0 KiB q4_0)"),
            std::string::npos)
      << llama.output;
}

TEST(CliDemo, TellsTheWorkedExample) {
  // The training half of the demo is the recall test of learning_test.cpp.
  const Result r = run("demo --no-training");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.output.find("[2.012, 0.856]"), std::string::npos);
  EXPECT_NE(r.output.find("-inf"), std::string::npos);
}

// The whole story on a short budget: training, the terminal heatmap, the page, answers by
// generation with the KV cache (wrong ones, after 30 steps), and what to open next.
TEST(CliDemo, WholeStoryWritesThePage) {
  const std::string dir = ::testing::TempDir() + "qkv_demo";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const Result r = run("demo --steps 30", false, dir);
  EXPECT_EQ(r.status, 0);
  for (const char* part : {"[2.012, 0.856]", "step   30", "Layer 1 (the last), head",
                           "demo/attention.html", "(prefill)", " of 4 right", "What to open"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << " missing from:\n" << r.output;
  const std::string page = read_file(dir + "/demo/attention.html");
  EXPECT_NE(page.find("The recall model of qkv demo"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(CliTrain, CopyTaskSummaryAsJson) {
  const std::string path = ::testing::TempDir() + "cli_train.safetensors";
  const json j = run_json(
      "train --task copy --items 4 --symbols 6 --d-model 32 --steps 60 "
      "--batch 16 --lr 3e-3 --eval-every 30 --quiet --json --checkpoint " +
      path);
  EXPECT_EQ(j["steps"], 60);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  EXPECT_LT(j["final_loss"].get<double>(), std::log(6.0));  // better than chance
  EXPECT_TRUE(j["final_accuracy"].is_number());
  // Resuming to 80 steps continues from step 60.
  const json resumed = run_json(
      "train --task copy --items 4 --symbols 6 --steps 80 --batch 16 "
      "--quiet --json --checkpoint " +
      path + " --resume " + path);
  EXPECT_EQ(resumed["steps"], 80);
  const json sized = run_json(
      "train --task copy --size small --steps 2 --batch 2 --quiet --json "
      "--checkpoint " +
      path);
  EXPECT_GT(sized["parameters"].get<int64_t>(), 700000);  // 4 layers of width 128
  const Result bad_size = run("train --size huge", /*with_stderr=*/true);
  EXPECT_EQ(bad_size.status, 2);
  EXPECT_NE(bad_size.output.find("unknown --size"), std::string::npos);
  const Result bad = run("train --task nope", /*with_stderr=*/true);
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.output.find("unknown --task"), std::string::npos);
  std::remove(path.c_str());
}

// ---- qkv generate ------------------------------------------------------------------------

std::string stories_dir() {
  const char* env = std::getenv("QKV_MODELS");
  return (env ? std::string(env) : std::string(QKV_MODELS_DIR)) + "/stories260K";
}

TEST(CliGenerate, Stories260KGreedyIsExactlyTheReferenceText) {
  const std::string dir = stories_dir();
  ASSERT_TRUE(std::filesystem::exists(dir + "/stories260K.bin"))
      << "stories260K not found in " << dir;
  const Result r = run("generate --model " + dir +
                       "/stories260K.bin --prompt \"Once upon a time\" "
                       "-n 200 --temperature 0");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.output, read_file(dir + "/greedy_once_upon_a_time.txt"));  // stdout: only the text
  const Result both = run("generate --model " + dir +
                              "/stories260K.bin --prompt Hi -n 20 "
                              "--top-p 0.9 --top-k 40 --seed 5 --cache bf16",
                          /*with_stderr=*/true);
  EXPECT_EQ(both.status, 0);
  EXPECT_NE(both.output.find("prefill: "), std::string::npos);
  EXPECT_NE(both.output.find("tokens/s"), std::string::npos);
  EXPECT_NE(both.output.find("bf16 cache (rotation off), seed 5"), std::string::npos);
  // A prompt that fills -n is echoed with a warning, and no rate is printed for work not done.
  const Result full = run("generate --model " + dir +
                              "/stories260K.bin --prompt \"Once upon a time there was a big dog\" "
                              "-n 4 --temperature 0",
                          /*with_stderr=*/true);
  EXPECT_EQ(full.status, 0);
  EXPECT_NE(full.output.find("qkv: warning: the prompt is "), std::string::npos) << full.output;
  EXPECT_NE(full.output.find("-n allows 4 positions: nothing is generated, and the prompt's last "),
            std::string::npos)
      << full.output;
  EXPECT_NE(full.output.find("prefill: none"), std::string::npos) << full.output;
  EXPECT_NE(full.output.find("decode: none"), std::string::npos) << full.output;
  EXPECT_EQ(full.output.find("tokens/s"), std::string::npos) << full.output;
  // Same seed, same text.
  const std::string seeded =
      "generate --model " + dir + "/stories260K.bin --prompt Hi -n 30 --seed 9";
  EXPECT_EQ(run(seeded).output, run(seeded).output);
  // A truncated copy is a clear error.
  const std::string cut = ::testing::TempDir() + "cut.bin";
  const std::string bytes = read_file(dir + "/stories260K.bin");
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  const Result bad =
      run("generate --model " + cut + " --tokenizer " + dir + "/tok512.bin --prompt Hi",
          /*with_stderr=*/true);
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.output.find("truncated"), std::string::npos) << bad.output;
  std::remove(cut.c_str());
}

// qkv quantize, then the GGUF file it wrote through qkv generate: the Q8_0 story is the fp32
// model's (the first 60 positions; Q8_0's rounding parts them later), and a bad type or a
// GPT-2-style model are clear errors.
TEST(CliQuantize, Stories260KAsGgufGeneratesTheSameStory) {
  const std::string dir = stories_dir(),
                    out = ::testing::TempDir() + "s260_" + std::to_string(getpid()) + ".gguf";
  const Result q =
      run("quantize --model " + dir + "/stories260K.bin --out " + out + " --type q8_0");
  EXPECT_EQ(q.status, 0);
  EXPECT_NE(q.output.find("in Q8_0"), std::string::npos) << q.output;
  EXPECT_NE(q.output.find("with its tokenizer"), std::string::npos) << q.output;
  const Result g =
      run("generate --model " + out + " --prompt \"Once upon a time\" -n 60 --temperature 0");
  EXPECT_EQ(g.status, 0);
  const std::string reference = read_file(dir + "/greedy_once_upon_a_time.txt");
  const Result fp32 = run("generate --model " + dir +
                          "/stories260K.bin --prompt \"Once upon a time\" -n 60 --temperature 0");
  EXPECT_EQ(g.output, fp32.output);
  ASSERT_GT(fp32.output.size(), 100u);
  EXPECT_EQ(reference.rfind(fp32.output.substr(0, fp32.output.size() - 1), 0),
            0u);  // its beginning
  const Result bad =
      run("quantize --model " + dir + "/stories260K.bin --out " + out + " --type q5_k", true);
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.output.find("--type must be"), std::string::npos) << bad.output;
  const Result again = run("quantize --model " + out + " --out " + out + "2", true);
  EXPECT_EQ(again.status, 2);
  EXPECT_NE(again.output.find("GGUF file already"), std::string::npos) << again.output;
  std::remove(out.c_str());
}

// qkv quantize of a random Llama (width 256: whole K-quant super-blocks) in each block type:
// every tensor's bytes those of llama.cpp's own quantizer (llama_model_quantize) on the same
// model, by their checksums (tests/golden/make_quant_llama.py).
TEST(CliQuantize, EveryTypeIsLlamaCppsBytes) {
  std::ifstream in(std::string(QKV_TEST_DATA) + "/quant_llama.json");
  const json golden = json::parse(in);
  const std::string dir = ::testing::TempDir(), tag = std::to_string(getpid());
  const std::string model = dir + "quant_llama_" + tag + ".bin";
  std::string args;
  for (const auto& a : golden["random_model"]) args.append(" ").append(a.get<std::string>());
  ASSERT_EQ(run("random-model -o " + model + args).status, 0);
  auto fnv1a = [](const uint8_t* p, uint64_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (uint64_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return std::string(buf);
  };
  for (const auto& [type, sums] : golden["checksums"].items()) {
    const std::string out = dir + "quant_llama_" + tag + "." + type + ".gguf";
    const Result q = run("quantize --model " + model + " --out " + out + " --type " + type, true);
    ASSERT_EQ(q.status, 0) << q.output;
    EXPECT_EQ(q.output.find("kept in F32"), std::string::npos) << q.output;
    const qkv::gguf::File f = qkv::gguf::File::open(out);
    EXPECT_EQ(f.tensors().size(), sums.size()) << type;
    for (const auto& [name, sum] : sums.items()) {
      const qkv::gguf::TensorInfo* t = f.find_tensor(name);
      ASSERT_NE(t, nullptr) << type << " " << name;
      EXPECT_EQ(fnv1a(t->data, t->bytes), sum.get<std::string>()) << type << " " << name;
    }
    std::remove(out.c_str());
  }
  std::remove(model.c_str());
}

// qkv chat with SmolLM2 as a user types it: two turns on stdin, greedy; the second answer
// needs the first turn (the cache kept); a non-chat model and a missing file are clear errors.
TEST(CliChat, SmolLM2AnswersTurnByTurn) {
  const char* env = std::getenv("QKV_MODELS");
  const std::string model = (env ? std::string(env) : std::string(QKV_MODELS_DIR)) +
                            "/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
  ASSERT_TRUE(std::filesystem::exists(model)) << model << " not found: run scripts/get-models";
  const std::string input = ::testing::TempDir() + "chat_input.txt";
  std::ofstream(input) << "What is the capital of France?\nAnd of Germany?\n/exit\nnot read\n";
  const Result r = run("chat --model " + model + " --temperature 0 --max-reply 40 < " + input);
  EXPECT_EQ(r.status, 0);
  const size_t paris = r.output.find("Paris"), berlin = r.output.find("Berlin");
  EXPECT_NE(paris, std::string::npos) << r.output;
  EXPECT_NE(berlin, std::string::npos) << r.output;
  EXPECT_LT(paris, berlin);
  const Result stats =
      run("chat --model " + model +
              " --temperature 0 --max-reply 8 --system \"Answer in French.\" < " + input,
          true);
  EXPECT_NE(stats.output.find("prompt tokens"), std::string::npos) << stats.output;
  // llama.cpp's arithmetic (int8 activations) runs the same conversation (its first answer's
  // first token is a near tie, 24.74 against 24.65 in llama.cpp's own logits, and goes the
  // other way there: the text is not compared); a mode it does not have is a clear error.
  const Result int8 =
      run("chat --model " + model + " --temperature 0 --max-reply 8 --matmul int8 < " + input);
  EXPECT_EQ(int8.status, 0);
  EXPECT_GT(int8.output.size(), 8u) << int8.output;
  const Result bad = run("chat --model " + model + " --matmul fp8 < " + input, true);
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.output.find("--matmul"), std::string::npos) << bad.output;
  // qkv perplexity on a text of its own (llama-perplexity's windows; the library function is
  // tested against the training forward): JSON fields, the running values, clear errors.
  const std::string text = ::testing::TempDir() + "perplexity_text.txt";
  {
    std::ofstream out(text);
    for (int i = 0; i < 30; ++i) out << "The cat sat on the mat, and the dog slept by the door. ";
  }
  const Result ppl =
      run("perplexity --model " + model + " --text " + text + " --ctx 64 --matmul int8 --json");
  ASSERT_EQ(ppl.status, 0) << ppl.output;
  const json pj = json::parse(ppl.output);
  EXPECT_EQ(pj["ctx"], 64);
  EXPECT_GE(pj["chunks"].get<int>(), 3);
  EXPECT_EQ(pj["scored"].get<int>(), pj["chunks"].get<int>() * 31);
  EXPECT_EQ(pj["matmul"], "int8");
  EXPECT_GT(pj["perplexity"].get<double>(), 1.0);  // a repeated sentence: low, never below 1
  EXPECT_NEAR(std::log(pj["perplexity"].get<double>()), pj["nll"].get<double>(), 1e-9);
  // The same through a q8_0 cache: keys and values in 8 bits, the perplexity barely moves. The
  // caches are compared under the exact products, so that the cache's rounding is the only
  // difference: with int8 activations (rounded at every layer, as llama.cpp does) a value at a
  // rounding boundary goes either way with the SIMD target's fp32 sums, and this repeated
  // sentence's mean NLL moves by up to 1.6% from one unit to another on the f32 cache alone.
  // q8_0 moves each key and value by at most 1/254 of its block's largest: measured 0.1-0.4%
  // of the NLL on SSE4 and AVX2 (AMD Zen 3), bounded at 1%.
  const std::string exact = "perplexity --model " + model + " --text " + text + " --ctx 64 --json";
  const Result pe = run(exact);
  ASSERT_EQ(pe.status, 0) << pe.output;
  const double nll = json::parse(pe.output)["nll"].get<double>();
  const Result ppl8 = run(exact + " --cache q8_0");
  ASSERT_EQ(ppl8.status, 0) << ppl8.output;
  const json p8 = json::parse(ppl8.output);
  EXPECT_EQ(p8["cache"], "q8_0");
  EXPECT_EQ(p8["matmul"], "exact");
  EXPECT_NEAR(p8["nll"].get<double>(), nll, 0.01 * nll);
  // A block cache rotates unless told not to; the result says which it did.
  EXPECT_EQ(p8["cache_rotation"], "on");
  EXPECT_EQ(pj["cache_rotation"], "off");
  const Result unrotated = run(exact + " --cache q8_0 --cache-rotation off");
  ASSERT_EQ(unrotated.status, 0) << unrotated.output;
  const json pu = json::parse(unrotated.output);
  EXPECT_EQ(pu["cache_rotation"], "off");
  EXPECT_NEAR(pu["nll"].get<double>(), nll, 0.01 * nll);
  EXPECT_EQ(
      run("perplexity --model " + model + " --text " + text + " --cache-rotation yes", true).status,
      2);
  EXPECT_EQ(run("perplexity --model " + model + " --text " + text + " --cache q4_1", true).status,
            2);
  const Result short_text =
      run("perplexity --model " + model + " --text " + text + " --ctx 4096", true);
  EXPECT_EQ(short_text.status, 2);
  EXPECT_NE(short_text.output.find("fewer than one chunk"), std::string::npos) << short_text.output;
  EXPECT_EQ(run("perplexity --model " + model + " --text /nonexistent.txt", true).status, 2);
  std::remove(text.c_str());
  const Result no_chat = run("chat --model " + stories_dir() + "/stories260K.bin < " + input, true);
  EXPECT_EQ(no_chat.status, 2);
  EXPECT_NE(no_chat.output.find("GGUF"), std::string::npos) << no_chat.output;
  std::remove(input.c_str());
}

TEST(CliGenerate, QkvCheckpointsOfTextAndOfSyntheticTasks) {
  const std::string text = ::testing::TempDir() + "gen_text.txt";
  std::ofstream(text) << std::string(2000, 'a') + "the cat sat on the mat. ";
  const std::string ckpt = ::testing::TempDir() + "gen_text.safetensors";
  ASSERT_EQ(run("train --text " + text +
                " --seq 32 --d-model 32 --steps 5 --batch 4 --quiet "
                "--checkpoint " +
                ckpt)
                .status,
            0);
  // Byte-level: the prompt is text; -n 10 from a 2-byte prompt adds 9 bytes.
  const Result r = run("generate --model " + ckpt + " --prompt ab -n 10 --seed 3");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.output.substr(0, 2), "ab");
  EXPECT_EQ(r.output.back(), '\n');
  const std::string recall = ::testing::TempDir() + "gen_recall.safetensors";
  ASSERT_EQ(
      run("train --task recall --d-model 32 --steps 3 --batch 4 --quiet --checkpoint " + recall)
          .status,
      0);
  const Result text_prompt = run("generate --model " + recall + " --prompt hello", true);
  EXPECT_EQ(text_prompt.status, 2);
  EXPECT_NE(text_prompt.output.find("--prompt-ids"), std::string::npos);
  const Result ids = run("generate --model " + recall + " --prompt-ids \"1 2 3\" -n 6 --seed 2");
  EXPECT_EQ(ids.status, 0);
  std::istringstream words(ids.output);
  std::vector<int> tokens{std::istream_iterator<int>(words), {}};
  EXPECT_EQ(tokens.size(), 7u);  // 3 prompt ids, then 4 drawn
  EXPECT_EQ(run("generate --model " + recall + " --prompt-ids \"1 x\"").status, 2);
  EXPECT_EQ(run("generate --model /nonexistent.bin --prompt hi").status, 2);
  for (const auto& f : {text, ckpt, recall}) std::remove(f.c_str());
}

TEST(CliGenerate, RandomModelAndItsBenchmark) {
  const std::string model = ::testing::TempDir() + "random_tiny.bin";
  ASSERT_EQ(run("random-model -o " + model +
                " --dim 32 --hidden 64 --layers 2 --heads 4 "
                "--kv-heads 2 --vocab 50 --seq-len 64")
                .status,
            0);
  const json j = json::parse(run("bench generate --model " + model +
                                 " --prompt 16 "
                                 "--cache-lengths 8,100 --decode 4 --json")
                                 .output);
  EXPECT_EQ(j["parameters"],
            50 * 32 + 2 * (32 + 32 * 32 + 2 * 16 * 32 + 32 * 32 + 32 + 3 * 64 * 32) + 32);
  EXPECT_GT(j["prefill_tokens_per_s"].get<double>(), 0);
  ASSERT_EQ(j["decode"].size(), 2u);
  EXPECT_EQ(j["decode"][1]["cache_length"], 60);  // cut to fit the 64 positions with 4 decoded
  EXPECT_GT(j["decode"][0]["fraction_of_read"].get<double>(), 0);
  const Result ids =
      run("generate --model " + model + " --prompt-ids \"1 2\" -n 5 --temperature 0");
  EXPECT_EQ(ids.status, 0);
  // Several thread counts: one JSON line each, with the synchronisations per decoded token (none
  // at all on one thread: a one-thread loop opens no region).
  const Result counts = run("bench generate --model " + model +
                            " --prompt 4 --cache-lengths 8 --decode 2 --repeats 1 --threads 1,2 "
                            "--json");
  ASSERT_EQ(counts.status, 0);
  std::istringstream lines(counts.output);
  std::vector<json> runs;
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') runs.push_back(json::parse(line));
  ASSERT_EQ(runs.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(runs[i]["threads"], i + 1);
    const json& d = runs[i]["decode"][0];
    EXPECT_GE(d["barriers_per_token"].get<double>(), d["regions_per_token"].get<double>());
    if (i == 0) {
      EXPECT_EQ(d["barriers_per_token"].get<double>(), 0);
    }
  }
  EXPECT_EQ(run("bench generate --model " + model + " --threads 1,-2").status, 2);
  std::remove(model.c_str());
}

// `qkv bench attention --json`: the fields the docs list, the error against the reference,
// and the yardsticks (values checked for sense only: tests hold no timing thresholds).
TEST(CliBench, AttentionJsonHasEveryField) {
  for (const std::string shape :
       {"--queries 40 --causal", "--queries 1", "--queries 40 --backward"}) {
    SCOPED_TRACE(shape);
    const Result r = run("bench attention --heads 4 --kv-heads 2 --seq 100 --dim 32 " + shape +
                         " --min-time 0.01 --threads 2 --json");
    ASSERT_EQ(r.status, 0);
    const json j = json::parse(r.output.substr(r.output.rfind('{')));
    for (const char* key : {"gflops", "ms", "gbps", "peak_gflops", "fraction_of_peak", "read_gbps",
                            "fraction_of_read", "reference_ms", "peak_rss_mb"}) {
      ASSERT_TRUE(j[key].is_number()) << key;
      EXPECT_GT(j[key].get<double>(), 0) << key;
    }
    EXPECT_LT(j["max_abs_err"].get<double>(), 1e-5);
    EXPECT_EQ(j["kv_heads"], 2);
    EXPECT_EQ(j["queries"], shape.find("--queries 1") == std::string::npos ? 40 : 1);
  }
  // A K and V smaller than one vector block still get a read loop over their bytes.
  const json tiny = json::parse(run("bench attention --heads 1 --seq 1 --dim 16 --min-time 0.01 "
                                    "--json")
                                    .output);
  EXPECT_GT(tiny["read_gbps"].get<double>(), 0);
  EXPECT_EQ(run("bench attention --heads 3 --kv-heads 2 --seq 8 --dim 16").status, 2);
}

}  // namespace
