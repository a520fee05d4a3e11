// The README's example: causal self-attention over 128 tokens, 8 heads of width 64.
#include <qkv/attention.h>
#include <qkv/tensor.h>

#include <cstdio>

int main() {
  qkv::Tensor q({1, 8, 128, 64}), k({1, 8, 128, 64}), v({1, 8, 128, 64}), out({1, 8, 128, 64});
  for (int64_t i = 0; i < q.numel(); ++i)  // stand-ins for the projections of real tokens
    q.data()[i] = k.data()[i] = v.data()[i] = 0.01f * static_cast<float>(i % 97);

  qkv::AttentionArgs args{.q = q, .k = k, .v = v, .out = out};
  args.mask.causal = true;  // each token sees itself and the tokens before it
  qkv::attention(args);     // out = softmax(q kᵀ / √64, causal) v

  std::printf("out[0, 0, 127, 0:4] = %.4f %.4f %.4f %.4f\n", out.view()(0, 0, 127, 0),
              out.view()(0, 0, 127, 1), out.view()(0, 0, 127, 2), out.view()(0, 0, 127, 3));
}
