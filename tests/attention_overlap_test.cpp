// Outputs that share memory with inputs are refused, naming both: forward (out, lse against q,
// k, v, the bias and each other), backward (dq, dk, dv against every input and each other),
// attention over a cache (out against the stored rows). Views that only interleave in one
// buffer (a fused projection's q, k and v) are accepted.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/error.h"

namespace qkv {
namespace {

constexpr int64_t B = 1, H = 2, T = 8, D = 4;

// Expects an error whose message names both arguments.
template <typename F>
void refused(F call, const std::string& written, const std::string& read) {
  try {
    call();
    ADD_FAILURE() << "no error for " << written << " over " << read;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(written + " ["), std::string::npos) << m;
    EXPECT_NE(m.find("overlaps " + read + " ["), std::string::npos) << m;
  }
}

struct Buffers {
  Tensor q{{B, H, T, D}}, k{{B, H, T, D}}, v{{B, H, T, D}}, out{{B, H, T, D}};
  std::vector<float> lse = std::vector<float>(B * H * T);
  AttentionArgs args() { return {.q = q, .k = k, .v = v, .out = out, .lse = lse.data()}; }
};

TEST(Overlap, ForwardOutputsAgainstInputs) {
  Buffers t;
  EXPECT_NO_THROW(attention(t.args()));
  for (const char* input : {"q", "k", "v"}) {
    AttentionArgs a = t.args();
    const View& in = input[0] == 'q' ? a.q : input[0] == 'k' ? a.k : a.v;
    a.out = in;
    refused([&] { attention(a); }, "out", input);
    refused([&] { reference::attention(a); }, "out", input);
    AttentionArgs l = t.args();
    l.lse = (input[0] == 'q' ? t.q : input[0] == 'k' ? t.k : t.v).data() + 3;  // inside it
    refused([&] { attention(l); }, "lse", input);
  }
  AttentionArgs a = t.args();
  a.lse = t.out.data() + 5;
  refused([&] { attention(a); }, "out", "lse");
  Tensor bias({T, T});
  AttentionArgs b = t.args();
  b.mask.bias = bias;
  EXPECT_NO_THROW(attention(b));
  b.out = View(bias.data(), {B, H, T, D});  // the first half of the bias
  refused([&] { attention(b); }, "out", "bias");
  // The same data seen as [B, T, H, D]: still the same memory.
  AttentionArgs p = t.args();
  p.out = View(t.v.data(), {B, T, H, D}).transpose(1, 2);
  refused([&] { attention(p); }, "out", "v");
}

TEST(Overlap, BackwardGradientsAgainstInputsAndEachOther) {
  Buffers t;
  attention(t.args());
  Tensor dout({B, H, T, D}), dq({B, H, T, D}), dk({B, H, T, D}), dv({B, H, T, D});
  EXPECT_NO_THROW(attention_backward(t.args(), dout, dq, dk, dv));
  const struct {
    const char* name;
    View view;
  } inputs[] = {{"q", t.q}, {"k", t.k}, {"v", t.v}, {"out", t.out}, {"dout", dout}};
  for (const auto& in : inputs) {
    refused([&] { attention_backward(t.args(), dout, in.view, dk, dv); }, "dq", in.name);
    refused([&] { attention_backward(t.args(), dout, dq, in.view, dv); }, "dk", in.name);
    refused([&] { attention_backward(t.args(), dout, dq, dk, in.view); }, "dv", in.name);
    refused([&] { reference::attention_backward(t.args(), dout, dq, dk, in.view); }, "dv", in.name);
  }
  refused([&] { attention_backward(t.args(), dout, dq, dq, dv); }, "dq", "dk");
  refused([&] { attention_backward(t.args(), dout, dq, dk, dk); }, "dk", "dv");
  View lse_rows(t.lse.data(), {B, H, T, 1});
  Tensor big({B, H, T, D});
  AttentionArgs a = t.args();
  a.lse = big.data() + 7;
  refused([&] { attention_backward(a, dout, big, dk, dv); }, "dq", "lse");
}

// A fused projection's rows [T, q | k | v]: q, k and v interleave in one buffer, and out may
// live in another part of it without touching them.
TEST(Overlap, InterleavedViewsOfOneBufferAreAccepted) {
  const int64_t W = 4 * H * D;  // q, k, v, then the output's columns
  std::vector<float> rows(T * W, 0.25f);
  auto part = [&](int64_t c) {
    return View(rows.data() + c * H * D, {B, H, T, D}, {T * W, D, W, 1});
  };
  AttentionArgs a{.q = part(0), .k = part(1), .v = part(2), .out = part(3)};
  EXPECT_NO_THROW(attention(a));
}

TEST(Overlap, AttentionOverACacheAgainstItsStorage) {
  std::vector<float> stored(H * T * D, 0.5f);
  Tensor q({B, H, 1, D}), out({B, H, 1, D});
  StoredKV kv{.k = stored.data(),
              .v = stored.data(),
              .batch_stride = H * T * D,
              .head_stride = T * D,
              .row_stride = D,
              .heads = H,
              .dim_k = D,
              .dim_v = D,
              .length = T};
  AttentionArgs a{.q = q, .out = out};
  EXPECT_NO_THROW(attention(a, kv));
  a.out = View(stored.data() + 2 * D, {B, H, 1, D});
  refused([&] { attention(a, kv); }, "out", "stored keys");
  AttentionArgs self{.q = q, .out = q};
  refused([&] { attention(self, kv); }, "out", "q");
}

}  // namespace
}  // namespace qkv
