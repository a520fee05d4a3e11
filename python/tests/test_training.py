"""A small GPT written in PyTorch, trained 20 steps with qkv's attention and with PyTorch's:
the same losses, step by step."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import qkv.torch as qt


def torch_attention(q, k, v):
    """PyTorch's own causal attention: its SDPA where this torch has one, else the math form."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    return torch.softmax(s, -1) @ v


class Block(nn.Module):
    def __init__(self, d, heads, attend):
        super().__init__()
        self.heads, self.attend = heads, attend
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, C // self.heads).unbind(2)
        y = self.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # [B, H, T, D] views
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, attend, vocab=64, d=64, heads=4, layers=2, context=32):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads, attend) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def train_losses(attend, steps=20, dtype=torch.float32):
    torch.manual_seed(0)
    model = GPT(attend).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        # Arithmetic sequences: the next token follows from the two before it, through attention.
        start = torch.randint(0, 64, (8, 1), generator=data)
        stride = torch.randint(1, 4, (8, 1), generator=data)
        idx = (start + stride * torch.arange(33)) % 64
        logits = model(idx[:, :-1]).float()
        loss = F.cross_entropy(logits.reshape(-1, 64), idx[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name,attend", [
    ("qkv.torch.attention", lambda q, k, v: qt.attention(q, k, v, causal=True)),
    ("qkv.torch.scaled_dot_product_attention", lambda q, k, v: qt.scaled_dot_product_attention(q, k, v, is_causal=True)),
    ("qkv.torch.flash_attn_func", lambda q, k, v: qt.flash_attn_func(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True).transpose(1, 2)),
])
def test_a_gpt_trains_the_same_with_qkvs_attention(name, attend):
    theirs = train_losses(torch_attention)
    mine = train_losses(attend)
    assert theirs[-1] < theirs[0] - 0.3, "the model should learn something in 20 steps"
    for step, (a, b) in enumerate(zip(mine, theirs)):
        assert abs(a - b) <= 1e-4, f"{name}: step {step}: loss {a} against PyTorch's {b}"


def test_a_gpt_trains_in_bfloat16_the_same_with_qkvs_attention():
    """The whole model in bfloat16, attention read and written in bfloat16 in place: losses
    within bfloat16's resolution (2e-2) of PyTorch's after 20 steps."""
    attend = lambda q, k, v: qt.attention(q, k, v, causal=True)
    theirs = train_losses(torch_attention, dtype=torch.bfloat16)
    mine = train_losses(attend, dtype=torch.bfloat16)
    assert theirs[-1] < theirs[0] - 0.3, "the model should learn something in 20 steps"
    assert abs(mine[-1] - theirs[-1]) <= 2e-2, f"loss after 20 steps {mine[-1]} against PyTorch's {theirs[-1]}"
