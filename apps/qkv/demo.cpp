// `qkv demo`: the story of attention, told with qkv's own numbers.
#include <iostream>

#include "cli.h"

namespace qkv::cli {

void add_demo(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("demo", "A guided tour: attention worked by hand");
  cmd->callback([] {
    auto& out = std::cout;
    out << "qkv demo\n========\n\n"
        << "Attention lets each token gather information from the others. Every token has a\n"
        << "query (what it looks for), a key (what it offers) and a value (what it passes on).\n"
        << "Below, three tokens - fluffy, blue, creature - work through it step by step.\n\n";
    print_worked_example(out, /*causal=*/false);
    out << "\nIn a language model a token may not look ahead. The causal mask sets the scores\n"
        << "of later keys to -inf, so after the softmax they get exactly zero weight:\n\n";
    print_worked_example(out, /*causal=*/true);
    out << "\nWhat next:\n"
        << "  build/release/qkv explain --input my.json   your own q, k, v\n"
        << "  build/release/qkv explain softmax 2 1 0     softmax on its own\n"
        << "  build/release/qkv params --preset gpt3-175b GPT-3's parameters, head by head\n";
  });
}

}  // namespace qkv::cli
