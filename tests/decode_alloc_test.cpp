// Decoding a token allocates nothing: after the first tokens have grown the buffers, each
// forward_cached step (fp32 weights, and a GGUF file's block formats in place) runs with no
// call to operator new. Its own program: it replaces the global operator new to count.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <new>

#include "qkv/io.h"
#include "qkv/kv_cache.h"
#include "qkv/threads.h"

namespace {
std::atomic<long> allocations{0};
}

void* operator new(std::size_t n) {
  ++allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace qkv {
namespace {

long allocations_while_decoding(Model& model, int threads) {
  set_num_threads(threads);
  KVCache cache(model.config(), {.max_seq = 64});
  const int32_t prompt[4] = {1, 5, 9, 13};
  model.forward_cached(cache, prompt, 1, 4);
  for (int32_t t = 0; t < 4; ++t) model.forward_cached(cache, &t, 1, 1);  // warm up
  const long before = allocations.load();
  for (int32_t t = 0; t < 32; ++t) model.forward_cached(cache, &t, 1, 1);
  return allocations.load() - before;
}

std::string models_dir() {
  const char* env = std::getenv("QKV_MODELS");
  return env ? env : QKV_MODELS_DIR;
}

TEST(DecodeAllocations, NoneOnStories260K) {
  const auto model = load_llama2c(models_dir() + "/stories260K/stories260K.bin");
  for (int threads : {1, 2})
    EXPECT_EQ(allocations_while_decoding(*model, threads), 0) << threads << " threads";
}

TEST(DecodeAllocations, NoneOnSmolLM2InPlace) {
  const std::string path = models_dir() + "/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " not found: run scripts/get-models";
  const auto model = load_gguf(path);
  for (int threads : {1, 2})
    EXPECT_EQ(allocations_while_decoding(*model, threads), 0) << threads << " threads";
}

}  // namespace
}  // namespace qkv
