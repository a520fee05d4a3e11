"""Trains a small attention model with a learnable T5 relative-position bias and attention sinks
through qkv.torch.flex_attention, on the CPU: the score function is PyTorch code, traced into
qkv's expression form at each call; the bias table and the sinks learn through autograd with
qkv's backward.

    python3 examples/score_training.py        # ~10 s on 2 cores; the loss falls below 0.3

The task: each sequence is a random prefix of 32 tokens, then the same tokens again; the
model must copy the token 32 positions back, which a relative bias finds quickly.
"""
import math

import torch

import qkv.torch as qt

V, D, H, T, PERIOD = 32, 64, 4, 64, 32


def t5_buckets(T, buckets=32, max_distance=64):
    """T5's bidirectional bucket of each d = q_idx − kv_idx (at index d + T − 1)."""
    d = torch.arange(-(T - 1), T)
    half, exact = buckets // 2, buckets // 4
    n = d.abs()
    large = exact + (torch.log(n.float().clamp_min(1) / exact) / math.log(max_distance / exact)
                     * (half - exact)).long()
    return torch.where(n < exact, n, large.clamp_max(half - 1)) + (d > 0).long() * half


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(V, D)
        self.qkv = torch.nn.Linear(D, 3 * D)
        self.out = torch.nn.Linear(D, V)
        self.bias = torch.nn.Parameter(torch.zeros(H, 32))  # per head and bucket
        self.sinks = torch.nn.Parameter(torch.zeros(H))
        self.buckets = t5_buckets(T)

    def score_mod(self, score, b, h, q_idx, kv_idx):
        biased = score + self.bias[h, self.buckets[q_idx - kv_idx + (T - 1)]]
        return torch.where(kv_idx <= q_idx, biased, -float("inf"))  # causal, by −∞

    def forward(self, x):
        e = self.embed(x)
        q, k, v = (t.view(x.shape[0], T, H, D // H).transpose(1, 2)
                   for t in self.qkv(e).chunk(3, dim=-1))
        a = qt.flex_attention(q, k, v, score_mod=self.score_mod, sinks=self.sinks)
        return self.out(e + a.transpose(1, 2).reshape(x.shape[0], T, D))


def batch(generator, size=16):
    prefix = torch.randint(0, V, (size, PERIOD), generator=generator)
    tokens = torch.cat([prefix, prefix, prefix[:, :1]], dim=1)  # T + 1 tokens
    return tokens[:, :-1], tokens[:, 1:]


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = Model()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(1, 301):
        x, y = batch(g)
        logits = model(x)
        # Only the second half can be predicted: it repeats the first.
        loss = torch.nn.functional.cross_entropy(logits[:, PERIOD:].reshape(-1, V),
                                                 y[:, PERIOD:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.3f}")
    strongest = model.bias.detach().argmax(dim=1)
    print(f"the bias's strongest bucket per head: {strongest.tolist()} "
          f"(the distance {PERIOD} is bucket {int(t5_buckets(T)[PERIOD + T - 1])}); "
          f"sinks {[round(x, 2) for x in model.sinks.detach().tolist()]}")


if __name__ == "__main__":
    main()
