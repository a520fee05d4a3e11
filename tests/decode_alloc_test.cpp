// Decoding a token allocates nothing: after the first tokens have grown the buffers, each
// forward_cached step (fp32 weights, and a GGUF file's block formats in place) runs with no
// call to operator new. Its own program: it replaces the global operator new to count.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <new>

#include <vector>

#include "qkv/attention.h"
#include "qkv/io.h"
#include "qkv/kv_cache.h"
#include "qkv/threads.h"

namespace {
std::atomic<long> allocations{0}, allocated_bytes{0};
}

void* operator new(std::size_t n) {
  ++allocations;
  allocated_bytes += static_cast<long>(n);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// The nothrow form too (std::stable_sort's buffer): it is freed by the operator delete below.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  ++allocations;
  allocated_bytes += static_cast<long>(n);
  return std::malloc(n ? n : 1);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace qkv {
namespace {

long allocations_while_decoding(Model& model, int threads, CacheType type = CacheType::f32) {
  set_num_threads(threads);
  KVCache cache(model.config(), {.max_seq = 64, .type = type});
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

// 16-bit caches are read in place: no fp32 copy of their rows, for one token or a chunk.
TEST(DecodeAllocations, NoneWithSixteenBitCaches) {
  const auto model = load_llama2c(models_dir() + "/stories260K/stories260K.bin");
  for (CacheType type : {CacheType::bf16, CacheType::f16})
    for (int threads : {1, 2})
      EXPECT_EQ(allocations_while_decoding(*model, threads, type), 0) << threads << " threads";
}

// Attention over bf16 and fp16 views (the tiled forward, split-KV decoding, the backward):
// after a first call has sized the threads' scratch, a call allocates far less than one input
// would take as an fp32 copy — no converted copy of q, k or v is made.
TEST(DecodeAllocations, SixteenBitAttentionCopiesNoInput) {
  for (TensorType type : {TensorType::bf16, TensorType::f16})
    for (int64_t Tq : {512, 1}) {
      const int64_t H = 4, Tk = 512, D = 64;
      std::vector<uint16_t> q(H * Tq * D, 0x3c00), k(H * Tk * D, 0x3c00), v(H * Tk * D, 0x3c00),
          out(H * Tq * D), dout(H * Tq * D, 0x3c00), dq(q.size()), dk(k.size()), dv(v.size());
      std::vector<float> lse(H * Tq);
      auto view = [&](std::vector<uint16_t>& x, int64_t T) {
        View w(reinterpret_cast<bf16*>(x.data()), {1, H, T, D});
        w.type = type;
        return w;
      };
      AttentionArgs a{.q = view(q, Tq), .k = view(k, Tk), .v = view(v, Tk), .out = view(out, Tq),
                      .lse = lse.data()};
      auto run = [&] {
        attention(a);
        if (Tq > 1) attention_backward(a, view(dout, Tq), view(dq, Tq), view(dk, Tk), view(dv, Tk));
      };
      run();  // sizes the scratch
      const long before = allocated_bytes.load();
      run();
      const long bytes = allocated_bytes.load() - before;
      EXPECT_LT(bytes, H * Tk * D * 4 / 8) << dtype_name(type) << " Tq " << Tq << ": " << bytes
                                            << " bytes allocated";
    }
}

// SmolLM2 (head dim 64) with fp32 caches and every block cache (q8_0, q4_0, q4_1), whose blocks
// are widened in registers as they are read. (Under the sanitizers, which check the memory and
// not the count, on 2 threads only: 2 minutes instead of 4.)
TEST(DecodeAllocations, NoneOnSmolLM2InPlace) {
  const std::string path = models_dir() + "/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " not found: run scripts/get-models";
  const auto model = load_gguf(path);
#if defined(__SANITIZE_ADDRESS__)
  const std::vector<int> thread_counts = {2};
#else
  const std::vector<int> thread_counts = {1, 2};
#endif
  for (CacheType type : {CacheType::f32, CacheType::q8_0, CacheType::q4_0, CacheType::q4_1})
    for (int threads : thread_counts)
      EXPECT_EQ(allocations_while_decoding(*model, threads, type), 0)
          << cache_type_name(type) << ", " << threads << " threads";
}

}  // namespace
}  // namespace qkv
