// docs/api.md's mask function example: causal attention within documents packed into one
// sequence (a document mask), forward and backward, from a mask written as an expression.
#include <qkv/attention.h>
#include <qkv/mask_function.h>
#include <qkv/tensor.h>

#include <cstdio>
#include <vector>

int main() {
  using namespace qkv::mask_args;  // b, h, q_idx, kv_idx
  const int64_t T = 512;
  std::vector<int32_t> document(T);  // three documents: 200, 100 and 212 tokens
  for (int64_t i = 0; i < T; ++i) document[i] = i < 200 ? 0 : i < 300 ? 1 : 2;
  const qkv::MaskTensor doc("doc", {T}, document);
  const qkv::MaskExpr mask = kv_idx <= q_idx && doc[q_idx] == doc[kv_idx];
  // Made once, reused by every layer and call of this shape (B and H of 1: the mask reads
  // neither b nor h).
  const qkv::BlockMask blocks = qkv::create_block_mask(mask, 1, 1, T, T);

  qkv::Tensor q({1, 4, T, 64}), k({1, 4, T, 64}), v({1, 4, T, 64}), out({1, 4, T, 64});
  qkv::Tensor lse({1, 4, T});
  for (int64_t i = 0; i < q.numel(); ++i)
    q.data()[i] = k.data()[i] = v.data()[i] = 0.01f * static_cast<float>(i % 97);
  qkv::AttentionArgs args{.q = q, .k = k, .v = v, .out = out, .lse = lse.data()};
  args.block_mask = &blocks;
  qkv::attention(args);

  qkv::Tensor dout({1, 4, T, 64}), dq({1, 4, T, 64}), dk({1, 4, T, 64}), dv({1, 4, T, 64});
  dout.fill(1.0f);
  qkv::attention_backward(args, dout, dq, dk, dv);
  std::printf("%s: %lld of %lld pairs visible, BlockMask of %lld bytes\n",
              qkv::to_string(mask).c_str(), static_cast<long long>(blocks.visible_pairs()),
              static_cast<long long>(T * T), static_cast<long long>(blocks.bytes()));
  std::printf(
      "out[0, 0, 200, 0] = %.4f (the first token of document 1 sees only itself: v[200, 0] "
      "= %.4f)\n",
      out.view()(0, 0, 200, 0), v.view()(0, 0, 200, 0));
}
