// docs/api.md's generation example: a llama2.c model continues a prompt, greedily, through the
// KV cache, printing each piece as it comes.
//   generate_example MODEL.bin TOKENIZER.bin "Once upon a time"
#include <qkv/error.h>
#include <qkv/generate.h>
#include <qkv/io.h>
#include <qkv/tokenizer.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: generate_example MODEL.bin TOKENIZER.bin PROMPT\n";
    return 2;
  }
  try {
    auto model = qkv::load_llama2c(argv[1]);
    auto tok = qkv::Tokenizer::load_llama2c(argv[2], model->config().vocab_size);
    qkv::GenerateOptions options{.steps = 60, .sampling = {.temperature = 0}};
    options.stop_tokens = {tok.bos()};  // llama2.c ends stories with BOS
    // on_token sees the prompt's tokens first, then each new one: all of it streams.
    const qkv::GenerateStats stats =
        qkv::generate(*model, tok.encode(argv[3]), options, [&](int32_t prev, int32_t token) {
          std::cout << tok.decode(prev, token) << std::flush;
          return true;
        });
    std::cout << "\n(" << stats.generated_tokens << " tokens at " << stats.decode_tokens_per_s
              << " tokens/s)\n";
  } catch (const qkv::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
