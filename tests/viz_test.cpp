// `qkv viz`: the HTML page checked in headless Chromium as a user would use it — it loads
// without console errors, shows every head, a click opens a head large, and the weight under
// the mouse is the reference kernel's — and the terminal view's layout.
// Skips with a message when Chromium is not installed (scripts/install-deps installs it).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <sstream>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "qkv/io.h"
#include "qkv/model.h"
#include "qkv/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Result {
  int status;
  std::string out, err;
};

Result run(const std::string& command) {
  const std::string err_file =
      ::testing::TempDir() + "viz_stderr_" + std::to_string(getpid()) + ".txt";
  FILE* pipe = popen((command + " 2>" + err_file).c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int status = pclose(pipe);
  std::ifstream e(err_file);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out,
          std::string(std::istreambuf_iterator<char>(e), {})};
}

std::string chromium() {
  const char* env = std::getenv("QKV_CHROMIUM");
  for (const char* c : {env, "/usr/bin/chromium", "/usr/bin/chromium-browser"})
    if (c && fs::exists(c)) return c;
  return "";
}

// Headless Chromium with a fresh profile.
Result browse(const std::string& args, const std::string& profile) {
  fs::remove_all(profile);
  return run(chromium() +
             " --headless --no-sandbox --disable-gpu --disable-background-networking "
             "--disable-component-update --disable-sync --no-first-run --user-data-dir=" +
             profile +
             " --enable-logging=stderr --v=0 --allow-file-access-from-files "
             "--virtual-time-budget=10000 --window-size=1280,1000 " +
             args);
}

std::string unescape_html(std::string s) {
  for (auto [from, to] : {std::pair{"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&amp;", "&"}})
    for (size_t at; (at = s.find(from)) != std::string::npos;) s.replace(at, std::strlen(from), to);
  return s;
}

// Console messages Chromium logged (the page itself never logs: any is an error).
std::vector<std::string> console_lines(const std::string& err) {
  std::vector<std::string> lines;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);)
    if (line.find("CONSOLE") != std::string::npos) lines.push_back(line);
  return lines;
}

// The harness opens the page in a frame, clicks a head, hovers one cell and reports.
constexpr const char* kHarness = R"(<!doctype html><html><body>
<iframe id="f" src="PAGE" width="1240" height="960"></iframe><pre id="result">pending</pre>
<script>
const f = document.getElementById("f");
f.onload = () => {
  const w = f.contentWindow, d = f.contentDocument, r = {};
  try {
    r.heads = d.querySelectorAll(".head").length;
    r.hidden_before = d.getElementById("detail").hidden;
    const head = d.querySelector('.head[data-layer="LAYER"][data-head="HEAD"]');
    r.small = head.querySelector("canvas").getBoundingClientRect().width;
    head.click();
    r.hidden_after = d.getElementById("detail").hidden;
    r.title = d.getElementById("detail-title").textContent;
    const big = d.getElementById("big"), box = big.getBoundingClientRect();
    r.big = box.width;
    const x0 = +big.dataset.x0, y0 = +big.dataset.y0, cell = +big.dataset.cell;
    big.dispatchEvent(new w.MouseEvent("mousemove", { bubbles: true,
        clientX: box.left + x0 + (KEY + 0.5) * cell, clientY: box.top + y0 + (QUERY + 0.5) * cell }));
    const tip = d.getElementById("tooltip");
    r.tip_hidden = tip.hidden;
    r.tip = tip.textContent;
    r.query = +tip.dataset.query;
    r.key = +tip.dataset.key;
    r.weight = tip.dataset.weight;
    r.lines = d.querySelectorAll("#lines line").length;
    r.labels = d.querySelectorAll("#lines text").length;
    r.example_hidden = d.getElementById("example").hidden;
    r.example_text = d.getElementById("example").textContent;
  } catch (e) {
    r.error = String(e);
  }
  document.getElementById("result").textContent = JSON.stringify(r);
};
</script></body></html>)";

json open_and_hover(const fs::path& page, int layer, int head, int query, int key,
                    const std::string& screenshot = "") {
  std::string h = kHarness;
  auto put = [&](const std::string& name, const std::string& value) {
    h.replace(h.find(name), name.size(), value);
  };
  put("PAGE", page.filename().string());
  put("LAYER", std::to_string(layer));
  put("HEAD", std::to_string(head));
  put("KEY", std::to_string(key));
  put("QUERY", std::to_string(query));
  const fs::path harness = page.parent_path() / ("harness_" + page.filename().string());
  std::ofstream(harness) << h;
  // A profile per test: ctest -j runs the tests side by side, and Chromium locks its profile.
  const std::string profile = ::testing::TempDir() + "qkv_chromium_profile_" +
                              ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const Result r = browse("--dump-dom file://" + harness.string(), profile);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(console_lines(r.err).empty()) << "console messages:\n" << r.err;
  // The harness's report: the text of <pre id="result">.
  const std::string dom = r.out, open = "<pre id=\"result\">";
  const size_t begin = dom.find(open), end = dom.find("</pre>", begin);
  EXPECT_TRUE(begin != std::string::npos && end != std::string::npos) << dom;
  if (begin == std::string::npos || end == std::string::npos)
    return json::object({{"error", "no result"}});
  if (!screenshot.empty()) {
    const Result shot =
        browse("--screenshot=" + screenshot + " file://" + harness.string(), profile);
    EXPECT_EQ(shot.status, 0) << shot.err;
    EXPECT_GT(fs::file_size(screenshot), 10000u);
  }
  return json::parse(unescape_html(dom.substr(begin + open.size(), end - begin - open.size())));
}

class Viz : public ::testing::Test {
 protected:
  void SetUp() override {
    if (chromium().empty())
      GTEST_SKIP() << "chromium not installed (scripts/install-deps installs it)";
  }
};

TEST_F(Viz, ModelPageInChromium) {
  // A byte-level model with weights large enough that heads differ.
  qkv::ModelConfig c;
  c.vocab_size = 256;
  c.context = 64;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = c.n_kv_heads = 4;
  c.d_head = 8;
  c.d_ff = 64;
  c.init_std = 0.4f;
  qkv::Model model(c, 11);
  const fs::path dir = fs::path(::testing::TempDir()) / "qkv_viz";
  fs::create_directories(dir);
  const fs::path ckpt = dir / "model.safetensors", page = dir / "page.html";
  qkv::save_checkpoint(ckpt, model, nullptr, 0);
  const std::string prompt = "the cat saw the <dog>";
  const Result made = run(std::string(QKV_BINARY) + " viz --model " + ckpt.string() +
                          " --prompt \"" + prompt + "\" -o " + page.string());
  ASSERT_EQ(made.status, 0) << made.err;
  EXPECT_NE(made.out.find("2 layer(s) × 4 head(s), 21 tokens"), std::string::npos) << made.out;

  // The reference kernel's weights, and the cell to hover: query 12 ("t") on its strongest key.
  const int layer = 1, head = 2, query = 12;
  const auto tokens = qkv::Tokenizer::bytes().encode(prompt);
  model.forward(tokens.data(), nullptr, 1, tokens.size());
  const qkv::Tensor w = model.attention_weights(layer);
  int key = 0;
  for (int j = 0; j <= query; ++j)
    if (w.view()(0, head, query, j) > w.view()(0, head, query, key)) key = j;
  const double expected = w.view()(0, head, query, key);
  ASSERT_GT(expected, 0.1);

  const json r =
      open_and_hover(page, layer, head, query, key, std::string(QKV_ARTIFACTS) + "/viz_model.png");
  ASSERT_FALSE(r.contains("error")) << r.dump();
  EXPECT_EQ(r["heads"], 8);
  EXPECT_TRUE(r["hidden_before"].get<bool>());
  EXPECT_FALSE(r["hidden_after"].get<bool>());
  EXPECT_EQ(r["title"], "layer 1, head 2");
  EXPECT_GT(r["big"].get<double>(), 4 * r["small"].get<double>());  // the head, enlarged
  EXPECT_FALSE(r["tip_hidden"].get<bool>());
  EXPECT_EQ(r["query"], query);
  EXPECT_EQ(r["key"], key);
  // The weight shown is the reference kernel's, to 3 decimals.
  EXPECT_NEAR(std::stod(r["weight"].get<std::string>()), expected, 5.01e-4) << r.dump();
  const std::string key_label = prompt[key] == ' ' ? "␣" : std::string(1, prompt[key]);
  EXPECT_NE(r["tip"].get<std::string>().find("query “t” → key “" + key_label + "”"),
            std::string::npos)
      << r.dump();
  EXPECT_GT(r["lines"].get<int>(), 0);
  EXPECT_EQ(r["labels"], 2 * 21 + 2);  // every token on both sides, and the two headings
  // A hover above the diagonal says masked.
  const json masked = open_and_hover(page, 0, 0, 2, 9);
  EXPECT_NE(masked["tip"].get<std::string>().find("masked"), std::string::npos) << masked.dump();
  fs::remove_all(dir);
}

TEST_F(Viz, WorkedExamplePageShowsEveryStep) {
  const fs::path dir = fs::path(::testing::TempDir()) / "qkv_viz_example";
  fs::create_directories(dir);
  const fs::path page = dir / "example.html";
  ASSERT_EQ(run(std::string(QKV_BINARY) + " viz --example -o " + page.string()).status, 0);
  const json r = open_and_hover(page, 0, 0, 2, 0, std::string(QKV_ARTIFACTS) + "/viz_example.png");
  ASSERT_FALSE(r.contains("error")) << r.dump();
  EXPECT_EQ(r["heads"], 1);
  EXPECT_EQ(r["weight"], "0.284");  // creature → fluffy, as in the articles
  EXPECT_FALSE(r["example_hidden"].get<bool>());
  const std::string text = r["example_text"];
  for (const char* number : {"2.121", "4.113", "29.374", "0.576", "2.012", "0.856"})
    EXPECT_NE(text.find(number), std::string::npos) << number << " missing from " << text;
  fs::remove_all(dir);
}

TEST(VizTerminal, HeatmapLayout) {
  const Result r = run(std::string(QKV_BINARY) + " viz --example --causal --terminal");
  ASSERT_EQ(r.status, 0) << r.err;
  // Three rows, labels right-aligned to the longest token; the masked triangle blank.
  // Causal weights: blue 0.330 0.670; creature 0.284 0.140 0.576 (eight shades, two columns each).
  EXPECT_NE(r.out.find("    fluffy ██    \n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("      blue ░░▓▓  \n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  creature ░░░░▒▒\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("           f l u \n"), std::string::npos) << r.out;  // keys, vertical
  EXPECT_EQ(run(std::string(QKV_BINARY) + " viz --example --terminal --head 3").status, 2);
  EXPECT_EQ(run(std::string(QKV_BINARY) + " viz --prompt hi").status, 2);  // no model
}

// The issue's size bound: 64 tokens on a 6-layer, 8-head model stays well under 2 MB.
TEST(VizPage, SizeForSixLayersOfEightHeads) {
  const fs::path dir = fs::path(::testing::TempDir()) / "qkv_viz_size";
  fs::create_directories(dir);
  const std::string model = (dir / "m.bin").string(), page = (dir / "p.html").string();
  ASSERT_EQ(run(std::string(QKV_BINARY) + " random-model -o " + model +
                " --dim 64 --hidden 128 --layers 6 --heads 8 --vocab 100 --seq-len 128")
                .status,
            0);
  std::string ids;
  for (int i = 0; i < 64; ++i) ids += std::to_string((i * 37) % 100) + " ";
  const Result r = run(std::string(QKV_BINARY) + " viz --model " + model + " --prompt-ids \"" +
                       ids + "\" -o " + page);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("6 layer(s) × 8 head(s), 64 tokens"), std::string::npos) << r.out;
  EXPECT_LT(fs::file_size(page), 2u << 20);
  std::ifstream in(page);
  const std::string html(std::istreambuf_iterator<char>(in), {});
  // (The SVG namespace URI is a name, not a fetch.)
  for (const char* external :
       {"<script src", "<link", "src=\"http", "href=\"http", "@import", "url(", "fetch("})
    EXPECT_EQ(html.find(external), std::string::npos)
        << "the page must be self-contained: " << external;
  fs::remove_all(dir);
}

}  // namespace
