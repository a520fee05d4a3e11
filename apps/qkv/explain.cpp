// `qkv explain`: attention worked by hand, every intermediate number shown (the engine is
// the library's, qkv/explain.h).
#include <iostream>

#include "cli.h"
#include "qkv/explain.h"

namespace qkv::cli {

void add_explain(CLI::App& app) {
  struct Options {
    bool causal = false, json = false;
    std::string input;
    int digits = 3;
    std::vector<double> scores;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "explain", "Attention worked by hand: scores, scaling, softmax, weights, output.");
  cmd->add_flag("--causal", opt->causal, "Apply the causal mask (later keys get -inf)");
  cmd->add_option("--input", opt->input,
                  "JSON file with your own q, k, v: {\"q\": [[1,0],..], \"k\": .., \"v\": .., "
                  "\"tokens\": [..]}");
  cmd->add_flag("--json", opt->json, "Print the steps as JSON");
  cmd->add_option("--digits", opt->digits, "Decimals to print")->check(CLI::Range(0, 12));

  CLI::App* softmax = cmd->add_subcommand("softmax", "Softmax of the given scores, step by step");
  softmax->add_option("scores", opt->scores, "The scores (numbers)")->required();
  softmax->add_flag("--json", opt->json, "Print as JSON");
  softmax->add_option("--digits", opt->digits, "Decimals to print")->check(CLI::Range(0, 12));
  softmax->callback(
      [opt] { explain::print_softmax(std::cout, opt->scores, opt->json, opt->digits); });

  cmd->callback([opt, softmax] {
    if (softmax->parsed()) return;
    const explain::Example e = opt->input.empty() ? explain::article_example(opt->causal)
                                                  : explain::read_example(opt->input, opt->causal);
    if (opt->json) std::cout << explain::example_json(e, 2) << "\n";
    else explain::print_example(std::cout, e, opt->digits);
  });
}

}  // namespace qkv::cli
