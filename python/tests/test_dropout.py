"""Attention dropout: qkv's gradients against float64 autograd of the materialised formula with
the same mask (qkv.dropout_mask), through qkv.torch.attention, the SDPA and flash-attn drop-ins
and flex_attention (with a learnable score function); the seed drawn from PyTorch's generator;
the same bits at any thread count; p = 0 unchanged."""
import math

import numpy as np
import pytest
import torch

import qkv
import qkv.torch as qt


def materialised(q, k, v, keep, p, causal=False, score_mod=None):
    """(softmax(q kᵀ / √D, masked) ∘ keep / (1 − p)) v in float64; causal is bottom-right."""
    B, H, L, D = q.shape
    S = k.shape[2]
    k = k.repeat_interleave(H // k.shape[1], dim=1)
    v = v.repeat_interleave(H // v.shape[1], dim=1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    if score_mod is not None:
        s = score_mod(s)
    if causal:
        hidden = torch.ones(L, S, dtype=torch.bool).triu(S - L + 1)
        s = s.masked_fill(hidden, -math.inf)
    w = torch.softmax(s, dim=-1)
    return (w * torch.from_numpy(keep).to(w.dtype) / (1 - p)) @ v


def inputs(B, Hq, Hkv, L, S, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=torch.float64)
            for shape in ((B, Hq, L, D), (B, Hkv, S, D), (B, Hkv, S, D), (B, Hq, L, D))]


def grads_of(fn, tensors, dout):
    xs = [t.detach().clone().requires_grad_(True) for t in tensors]
    out = fn(*xs)
    (out.double() * dout).sum().backward()
    return out.detach().double(), [x.grad.double() for x in xs]


@pytest.mark.parametrize("causal,p", [(False, 0.1), (True, 0.3), (True, 0.9)])
def test_backward_matches_float64_autograd_with_the_same_mask(causal, p):
    B, Hq, Hkv, L, S, D = 2, 4, 2, 37, 70 if not causal else 37, 16
    q, k, v, dout = inputs(B, Hq, Hkv, L, S, D)
    keep = qkv.dropout_mask((B, Hq, L, S), p, seed=123, offset=4)
    assert 0 < keep.mean() < 1
    out, grads = grads_of(lambda q, k, v: qt.attention(q, k, v, causal=causal, dropout_p=p,
                                                       dropout_seed=123, dropout_offset=4),
                          [t.float() for t in (q, k, v)], dout)
    want, want_grads = grads_of(lambda q, k, v: materialised(q, k, v, keep, p, causal), (q, k, v), dout)
    scale = 1 / (1 - p)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=2e-5 * scale)
    for mine, theirs, name in zip(grads, want_grads, "qkv"):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4 * scale, msg=name)


def test_sdpa_drop_in_draws_its_seed_from_torch_and_matches_the_formula():
    q, k, v, dout = inputs(1, 2, 2, 20, 20, 8, seed=1)
    qf, kf, vf = (t.float() for t in (q, k, v))
    torch.manual_seed(5)
    seed = int(torch.empty((), dtype=torch.int64).random_())
    torch.manual_seed(5)
    a = qt.scaled_dot_product_attention(qf, kf, vf, dropout_p=0.2, is_causal=True)
    b = qt.scaled_dot_product_attention(qf, kf, vf, dropout_p=0.2, is_causal=True)
    torch.manual_seed(5)
    again = qt.scaled_dot_product_attention(qf, kf, vf, dropout_p=0.2, is_causal=True)
    assert torch.equal(a, again), "torch.manual_seed makes the mask reproducible"
    assert not torch.equal(a, b), "each call draws a new mask"
    keep = qkv.dropout_mask((1, 2, 20, 20), 0.2, seed)
    torch.testing.assert_close(a.double(), materialised(q, k, v, keep, 0.2, causal=True),
                               rtol=1e-5, atol=1e-5)
    # Without dropout nothing is drawn from the generator, and nothing changes.
    state = torch.get_rng_state()
    plain = qt.scaled_dot_product_attention(qf, kf, vf, is_causal=True)
    assert torch.equal(qt.scaled_dot_product_attention(qf, kf, vf, dropout_p=0.0, is_causal=True), plain)
    assert torch.equal(torch.get_rng_state(), state)


def test_flash_attn_drop_ins_take_dropout():
    q, k, v, dout = inputs(2, 4, 2, 24, 24, 8, seed=2)
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))  # [B, T, H, D]
    torch.manual_seed(9)
    seed = int(torch.empty((), dtype=torch.int64).random_())
    torch.manual_seed(9)
    out = qt.flash_attn_func(qf, kf, vf, dropout_p=0.25, causal=True)
    keep = qkv.dropout_mask((2, 4, 24, 24), 0.25, seed)
    torch.testing.assert_close(out.transpose(1, 2).double(), materialised(q, k, v, keep, 0.25, True),
                               rtol=1e-5, atol=1e-5)
    # Packed: sequence s draws batch s's mask, so the two sequences packed give the same.
    cu = torch.tensor([0, 24, 48], dtype=torch.int32)
    torch.manual_seed(9)
    packed = qt.flash_attn_varlen_func(qf.reshape(48, 4, 8), kf.reshape(48, 2, 8), vf.reshape(48, 2, 8),
                                       cu, cu, 24, 24, dropout_p=0.25, causal=True)
    assert torch.equal(packed, out.reshape(48, 4, 8))


def test_flex_attention_dropout_with_a_learnable_score_function():
    B, H, L, D = 1, 2, 30, 8
    q, k, v, dout = inputs(B, H, H, L, L, D, seed=3)
    bias = torch.tensor([0.5, -1.0], dtype=torch.float64)
    torch.manual_seed(11)
    seed = int(torch.empty((), dtype=torch.int64).random_())
    keep = qkv.dropout_mask((B, H, L, L), 0.4, seed)

    learn = bias.float().clone().requires_grad_(True)
    xs = [t.float().requires_grad_(True) for t in (q, k, v)]
    torch.manual_seed(11)
    out = qt.flex_attention(*xs, score_mod=lambda s, b, h, i, j: s + learn[h] * (i - j).abs(),
                            dropout_p=0.4)
    (out.double() * dout).sum().backward()

    learn64 = bias.clone().requires_grad_(True)
    ys = [t.clone().requires_grad_(True) for t in (q, k, v)]
    d = (torch.arange(L).view(-1, 1) - torch.arange(L).view(1, -1)).abs().double()
    want = materialised(*ys, keep, 0.4, score_mod=lambda s: s + learn64.view(1, H, 1, 1) * d)
    (want * dout).sum().backward()
    torch.testing.assert_close(out.double(), want.detach(), rtol=1e-4, atol=1e-4)
    for x, y in zip(xs, ys):
        torch.testing.assert_close(x.grad.double(), y.grad, rtol=1e-4, atol=2e-4)
    torch.testing.assert_close(learn.grad.double(), learn64.grad, rtol=1e-4, atol=1e-3)


def test_same_bits_at_any_thread_count():
    q, k, v, dout = (t.float() for t in inputs(3, 4, 1, 90, 130, 32, seed=4))
    runs = []
    saved = qkv.num_threads()
    for threads in (1, 2, 3):
        qkv.set_num_threads(threads)
        out, grads = grads_of(lambda q, k, v: qt.attention(q, k, v, causal=True, dropout_p=0.1,
                                                           dropout_seed=7), (q, k, v), dout.double())
        runs.append([out] + grads)
    qkv.set_num_threads(saved)
    for run in runs[1:]:
        for a, b in zip(run, runs[0]):
            assert torch.equal(a, b)


def test_bad_dropout_is_a_clear_error():
    q = torch.randn(1, 1, 4, 8)
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\]"):
            qt.scaled_dot_product_attention(q, q, q, dropout_p=bad)
    with pytest.raises(ValueError, match="needs dropout_seed"):
        qkv.attention(q.numpy(), q.numpy(), q.numpy(), dropout_p=0.1)
    with pytest.raises(ValueError, match="dropout_offset"):
        qkv.dropout_mask((1, 1, 2, 2), 0.1, seed=1, offset=-1)
    mask = qkv.dropout_mask((1, 1, 2, 3), 0.0, seed=1)
    assert mask.dtype == np.bool_ and mask.all()
