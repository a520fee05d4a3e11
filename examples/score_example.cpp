// docs/api.md's score function example: T5's learnable relative-position bias and a sink per
// head, written as an expression, one training step's forward and backward: the gradients of
// q, k, v, of the bias table and of the sinks.
#include <qkv/attention.h>
#include <qkv/score_function.h>
#include <qkv/tensor.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  using namespace qkv::score_args;  // score, b, h, q_idx, kv_idx
  const int64_t H = 4, T = 256, D = 64, buckets = 32;
  // Each distance q_idx − kv_idx (index d + T − 1) in a bucket: exact up to 8, then
  // logarithmic up to 128, as T5 (bidirectional) buckets them.
  std::vector<int32_t> bucket_of;
  for (int64_t d = -(T - 1); d <= T - 1; ++d) {
    const int64_t n = std::abs(d);
    const int64_t far = 8 + static_cast<int64_t>(std::log(n / 8.0) / std::log(16.0) * 8);
    bucket_of.push_back(
        static_cast<int32_t>((n < 8 ? n : std::min<int64_t>(far, 15)) + (d > 0 ? 16 : 0)));
  }
  const qkv::MaskTensor bucket("bucket", {2 * T - 1}, bucket_of);
  std::vector<float> table(H * buckets, 0.0f), table_grad(H * buckets);
  for (int64_t i = 0; i < H * buckets; ++i) table[i] = 0.05f * static_cast<float>(i % 7);
  const qkv::ScoreTensor bias("bias", {H, buckets}, table.data(), table_grad.data());
  // The bias depends on (h, q_idx − kv_idx) alone: one table per call, not T × T floats.
  const qkv::ScoreFunction t5(score +
                              bias.at({h, bucket[q_idx - kv_idx + static_cast<int>(T - 1)]}));

  std::vector<float> sinks = {0.0f, 0.5f, 1.0f, -1.0f}, sinks_grad(H);
  qkv::Tensor q({1, H, T, D}), k({1, H, T, D}), v({1, H, T, D}), out({1, H, T, D});
  qkv::Tensor lse({1, H, T});
  for (int64_t i = 0; i < q.numel(); ++i) {
    q.data()[i] = 0.02f * static_cast<float>(i % 89) - 0.8f;
    k.data()[i] = 0.02f * static_cast<float>(i % 83) - 0.8f;
    v.data()[i] = 0.01f * static_cast<float>(i % 97);
  }
  qkv::AttentionArgs args{.q = q, .k = k, .v = v, .out = out, .lse = lse.data()};
  args.mask.causal = true;
  args.score_mod = &t5;
  args.sinks = sinks.data();
  qkv::attention(args);

  qkv::Tensor dout({1, H, T, D}), dq({1, H, T, D}), dk({1, H, T, D}), dv({1, H, T, D});
  dout.fill(1.0f);
  // The bias table's gradient goes where its ScoreTensor points; the sinks' where grads says.
  qkv::attention_backward(args, dout, dq, dk, dv, {.sinks = sinks_grad.data()});
  std::printf("%s: %lld relative table(s)\n", qkv::to_string(t5.expr()).c_str(),
              static_cast<long long>(t5.tables()));
  // The first query sees its own key (distance 0: bucket 0) and head 0's sink: its weight is
  // exp(s) / (exp(sink) + exp(s)), its output that weight times v's first row.
  float s = table[bucket_of[T - 1]];
  for (int64_t i = 0; i < D; ++i) s += q.data()[i] * k.data()[i] / std::sqrt(float(D));
  const float weight = 1.0f / (1.0f + std::exp(sinks[0] - s));
  std::printf(
      "out[0, 0, 0, 1] = %.5f; by hand, weight %.5f (score %.4f, sink %.1f) x v %.2f = %.5f\n",
      out.view()(0, 0, 0, 1), weight, s, sinks[0], v.data()[1], weight * v.data()[1]);
  std::printf("d bias[0, 0] = %.4f, d sinks = %.4f %.4f %.4f %.4f\n", table_grad[0], sinks_grad[0],
              sinks_grad[1], sinks_grad[2], sinks_grad[3]);
}
