"""qkv.torch.flex_attention's score_mod and qkv's attention sinks against float64 autograd of the
materialised formula (the same Python function evaluated by PyTorch on broadcast index grids),
forward and backward, learnable captured tensors included; PyTorch's own flex_attention where it
has one; and a small model trained with a learnable relative bias and sinks."""
import math

import numpy as np
import pytest
import torch

import qkv
import qkv.torch as qt
from conftest import rand


def grids(B, H, L, S):
    return (torch.arange(B).view(-1, 1, 1, 1), torch.arange(H).view(1, -1, 1, 1),
            torch.arange(L).view(1, 1, -1, 1), torch.arange(S).view(1, 1, 1, -1))


def materialised(q, k, v, score_mod=None, sinks=None, scale=None):
    """out and lse in float64 from the scores score_mod gives (any tensors it captures stay
    in the autograd graph); sinks: [H] logits in the denominator."""
    B, H, L, D = q.shape
    S = k.shape[2]
    if k.shape[1] != H:
        k = k.repeat_interleave(H // k.shape[1], dim=1)
        v = v.repeat_interleave(H // v.shape[1], dim=1)
    s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(D) if scale is None else scale)
    if score_mod is not None:
        s = score_mod(s, *grids(B, H, L, S)).expand(B, H, L, S)
    if sinks is not None:
        s = torch.cat([s, sinks.view(1, H, 1, 1).expand(B, H, L, 1).to(s.dtype)], dim=-1)
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(m == -math.inf, torch.zeros_like(m), m)  # (a row of −inf: weights 0)
    p = torch.exp(s - m)
    total = p.sum(dim=-1, keepdim=True)
    w = torch.where(total > 0, p / total, torch.zeros_like(p))
    lse = (m + torch.log(total)).squeeze(-1)
    if sinks is not None:
        w = w[..., :S]
    return w @ v, lse


# The gallery. Learnable tensors are made per test (double copies follow the same formula).
def test_relative_buckets_are_t5s():
    # Worked by hand from T5's definition, r = kv_idx - q_idx. 8 buckets bidirectional, up to
    # 16: halves of 4, distances 0 and 1 exact, then 2 + floor(log(n / 2) / log(8) * 2), so
    # n = 2…5 -> 2 and 6…8 -> 3 (and 3 beyond); r > 0 in the upper half.
    b = qt.relative_buckets(5, 9, 8, 16)
    assert b.dtype == torch.int64 and b.shape == (13,)
    r = lambda q, kv: int(b[q - kv + 8])
    assert [r(4, kv) for kv in range(9)] == [2, 2, 2, 1, 0, 5, 6, 6, 6]
    assert r(0, 8) == 4 + 3 and r(0, 6) == 4 + 3 and r(0, 5) == 4 + 2
    # One-directional, 8 buckets up to 16: 0…3 exact, then 4 + floor(log(n / 4) / log(4) * 4):
    # n = 4, 5 -> 4; 6, 7 -> 5; n >= 16 -> 7; every r > 0 is bucket 0.
    u = qt.relative_buckets(21, 3, 8, 16, bidirectional=False)
    assert [int(u[d + 2]) for d in range(8)] == [0, 1, 2, 3, 4, 4, 5, 5]
    assert int(u[20 + 2]) == 7 and int(u[-1 + 2]) == 0 and int(u[0]) == 0
    # Monotone in the distance, capped at the half's last bucket.
    far = qt.relative_buckets(1000, 1, 32, 128)
    assert torch.all(far[1:] >= far[:-1]) and int(far.max()) == 15 and int(far[200]) == 15
    with pytest.raises(ValueError, match="positive"):
        qt.relative_buckets(0, 4)
    with pytest.raises(ValueError, match="num_buckets"):
        qt.relative_buckets(4, 4, 2, 16)


def gallery(H, L, S, dtype):
    g = torch.Generator().manual_seed(7)
    buckets = qt.relative_buckets(L, S, 16, 64)  # T5's, read as an integer tensor
    # (Drawn as float32, then converted: the same values in either dtype.)
    rel = (torch.randn(H, 16, generator=g) * 0.5).to(dtype)
    slopes = (torch.rand(H, generator=g) * 0.3).to(dtype)
    W = 16  # an image 16 positions wide
    R = (max(L, S) + W - 1) // W
    grid = (torch.randn(H, 2 * R - 1, 2 * W - 1, generator=g) * 0.5).to(dtype)

    def softcap(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / 2.5) * 2.5

    def t5(score, b, h, q_idx, kv_idx):
        return score + rel[h, buckets[q_idx - kv_idx + (S - 1)]]

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()

    def grid_2d(score, b, h, q_idx, kv_idx):
        return score + grid[h, q_idx // W - kv_idx // W + (R - 1), q_idx % W - kv_idx % W + (W - 1)]

    def held_out(score, b, h, q_idx, kv_idx):  # not in the gallery
        near = (q_idx - kv_idx).abs() < 40
        return torch.where(near, score * torch.sigmoid(slopes[h]) * 2, score / 2 - 1.0) + \
            torch.log(1 + (q_idx - kv_idx).abs().float()) * 0.1

    return {"softcap": (softcap, []), "t5": (t5, [rel]), "alibi": (alibi, [slopes]),
            "grid_2d": (grid_2d, [grid]), "held_out": (held_out, [slopes])}


@pytest.mark.parametrize("name", ["softcap", "t5", "alibi", "grid_2d", "held_out"])
def test_forward_and_backward_against_float64(rng, name):
    B, H, Hkv, L, S, D = 2, 4, 2, 150, 170, 16
    q = torch.tensor(rand(rng, B, H, L, D), requires_grad=True)
    k, v = (torch.tensor(rand(rng, B, Hkv, S, D), requires_grad=True) for _ in range(2))
    fn, params = gallery(H, L, S, torch.float32)[name]
    for p in params:
        p.requires_grad_()
    out, lse = qt.flex_attention(q, k, v, score_mod=fn, enable_gqa=True, return_lse=True)
    # The same function over float64 copies of everything.
    fn64, params64 = gallery(H, L, S, torch.float64)[name]
    for p in params64:
        p.requires_grad_()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want, want_lse = materialised(q64, k64, v64, fn64)
    assert torch.allclose(out.double(), want, atol=3e-5), (out.double() - want).abs().max()
    assert torch.allclose(lse.double(), want_lse, atol=3e-5)
    dout = torch.tensor(rand(rng, B, H, L, D))
    out.backward(dout)
    want.backward(dout.double())
    for got, expect, what in [(q.grad, q64.grad, "q"), (k.grad, k64.grad, "k"),
                              (v.grad, v64.grad, "v")] + \
            [(p.grad, p64.grad, "param") for p, p64 in zip(params, params64)]:
        err = (got.double() - expect).abs().max() / expect.abs().max().clamp_min(1)
        assert err < 2e-4, (name, what, float(err))


def test_learnable_gradients_are_the_same_bits_at_any_thread_count(rng):
    B, H, L, D = 1, 4, 200, 16
    q, k, v = (torch.tensor(rand(rng, B, H, L, D)) for _ in range(3))
    fn, (rel,) = gallery(H, L, L, torch.float32)["t5"]
    rel.requires_grad_()
    dout = torch.tensor(rand(rng, B, H, L, D))
    grads = []
    saved = qkv.num_threads()
    for threads in (1, 2, 3):
        qkv.set_num_threads(threads)
        rel.grad = None
        qt.flex_attention(q, k, v, score_mod=fn).backward(dout)
        grads.append(rel.grad.clone())
    qkv.set_num_threads(saved)
    assert all(torch.equal(grads[0], g) for g in grads[1:])


def test_against_pytorchs_flex_attention(rng):
    flex = pytest.importorskip("torch.nn.attention.flex_attention",
                               reason="this torch has no flex_attention (it came in 2.5)")
    B, H, L, D = 1, 4, 256, 16
    q, k, v = (torch.tensor(rand(rng, B, H, L, D)) for _ in range(3))
    for name, (fn, _) in gallery(H, L, L, torch.float32).items():
        ours = qt.flex_attention(q, k, v, score_mod=fn)
        theirs = flex.flex_attention(q, k, v, score_mod=fn)
        assert torch.allclose(ours, theirs, atol=2e-5), name


def test_minus_inf_masks_and_nan_stays_nan(rng):
    B, H, L, D = 1, 2, 70, 8
    q, k, v = (torch.tensor(rand(rng, B, H, L, D)) for _ in range(3))

    def causal(score, b, h, q_idx, kv_idx):
        return torch.where(kv_idx <= q_idx - 5, score, -float("inf"))

    out, lse = qt.flex_attention(q, k, v, score_mod=causal, return_lse=True)
    want, want_lse = materialised(q.double(), k.double(), v.double(), causal)
    assert torch.allclose(out.double(), want, atol=2e-5)
    assert torch.all(out[:, :, :5] == 0) and torch.all(lse[:, :, :5] == -math.inf)

    def poison(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx == 3, score * float("nan"), score)

    out = qt.flex_attention(q, k, v, score_mod=poison)
    assert torch.isnan(out[:, :, 3]).all() and not torch.isnan(out[:, :, 4]).any()


def test_what_cannot_be_traced_is_named():
    q = torch.zeros(1, 1, 8, 4)

    def control_flow(score, b, h, q_idx, kv_idx):
        return score if q_idx > kv_idx else -score

    def truncates(score, b, h, q_idx, kv_idx):
        return score + (score * 2).long()

    def sine(score, b, h, q_idx, kv_idx):
        return torch.sin(score)

    def boolean(score, b, h, q_idx, kv_idx):
        return score > 0

    for fn, what in [(control_flow, "control flow"), (truncates, "float to an integer"),
                     (sine, "sin"), (boolean, "returns a boolean")]:
        with pytest.raises(ValueError, match=what):
            qt.flex_attention(q, q, q, score_mod=fn)
    table = torch.zeros(4)
    with pytest.raises(ValueError, match="outside param0"):
        qt.flex_attention(q, q, q, score_mod=lambda s, b, h, i, j: s + table[i])


def test_a_score_mod_is_traced_once_and_again_when_what_it_reads_changes(monkeypatch):
    from qkv import _mask_trace
    traces = []
    real = _mask_trace.trace
    monkeypatch.setattr(_mask_trace, "trace", lambda *a, **k: traces.append(1) or real(*a, **k))
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)

    def check(fn, expected):
        out = qt.flex_attention(q, k, v, score_mod=fn)
        ref, _ = materialised(q.double(), k.double(), v.double(), expected)
        assert torch.allclose(out.double(), ref, atol=1e-5)

    bias = torch.randn(2, 11)
    shift = torch.arange(11, dtype=torch.int64).flip(0)  # an integer table it indexes by

    def with_bias(score, b, h, q_idx, kv_idx):
        return score + bias[h, shift[q_idx - kv_idx + 6]]

    def formula():
        return lambda s, b, h, i, j: s + bias.double()[h, shift[i - j + 6]]

    check(with_bias, formula())
    check(with_bias, formula())
    assert len(traces) == 1
    bias.mul_(2)  # values changed in place: read at each call, no new trace
    shift[3] = 0  # an integer tensor's too
    check(with_bias, formula())
    assert len(traces) == 1
    bias = torch.randn(2, 11)  # the closure now holds another tensor: traced again
    check(with_bias, formula())
    assert len(traces) == 2

    class Biased(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(2, 11))

    model = Biased()

    def from_model(score, b, h, q_idx, kv_idx):
        return score + model.table[h, q_idx - kv_idx + 6]

    check(from_model, lambda s, b, h, i, j: s + model.table.detach().double()[h, i - j + 6])
    model.table = torch.nn.Parameter(torch.randn(2, 11))  # rebound on the module: traced again
    check(from_model, lambda s, b, h, i, j: s + model.table.detach().double()[h, i - j + 6])
    assert len(traces) == 4
    model.scale = 0.5  # a plain attribute, baked into the trace as a constant

    def scaled(score, b, h, q_idx, kv_idx):
        return score * model.scale

    check(scaled, lambda s, b, h, i, j: s * 0.5)
    model.scale = 0.25
    check(scaled, lambda s, b, h, i, j: s * 0.25)
    assert len(traces) == 6

    # A tensor derived from a captured one is computed while tracing: traced at each call.
    def derived(score, b, h, q_idx, kv_idx):
        return score + (bias * 2)[h, q_idx - kv_idx + 6]

    check(derived, lambda s, b, h, i, j: s + 2 * bias.double()[h, i - j + 6])
    bias.add_(1)
    check(derived, lambda s, b, h, i, j: s + 2 * bias.double()[h, i - j + 6])
    assert len(traces) == 8
    tables = [torch.randn(2, 11)]  # a list's items are looked into

    def from_list(score, b, h, q_idx, kv_idx):
        return score + tables[0][h, q_idx - kv_idx + 6]

    check(from_list, lambda s, b, h, i, j: s + tables[0].double()[h, i - j + 6])
    tables[0] = torch.randn(2, 11)
    check(from_list, lambda s, b, h, i, j: s + tables[0].double()[h, i - j + 6])
    check(from_list, lambda s, b, h, i, j: s + tables[0].double()[h, i - j + 6])
    assert len(traces) == 10


# ---- Attention sinks -------------------------------------------------------------------------

def test_sinks_forward_backward_and_rows_that_see_nothing(rng):
    B, H, Hkv, L, S, D = 2, 4, 2, 90, 60, 16
    q = torch.tensor(rand(rng, B, H, L, D), requires_grad=True)
    k, v = (torch.tensor(rand(rng, B, Hkv, S, D), requires_grad=True) for _ in range(2))
    sinks = torch.tensor([-1.0, 0.5, 2.0, -math.inf], requires_grad=True)
    out, lse = qt.attention(q, k, v, causal=True, window=(20, 0), sinks=sinks, return_lse=True)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    s64 = sinks.detach().double().requires_grad_()
    pos = torch.arange(L).view(-1, 1) + (S - L)
    j = torch.arange(S).view(1, -1)
    visible = (j <= pos) & (j >= pos - 20)

    def mask(score, b, h, q_idx, kv_idx):
        return score.masked_fill(~visible, -math.inf)

    want, want_lse = materialised(q64, k64, v64, mask, sinks=s64)
    assert torch.allclose(out.double(), want, atol=2e-5)
    # Rows that see no key (the first 30): out 0, lse = the sink (−inf without one).
    assert torch.all(out[:, :, :30] == 0)
    assert torch.equal(lse[:, :, :30], sinks.detach().view(1, H, 1).expand(B, H, 30))
    assert torch.allclose(lse[:, :, 30:].double(), want_lse[:, :, 30:], atol=2e-5)
    dout = torch.tensor(rand(rng, B, H, L, D))
    out.backward(dout)
    want.backward(dout.double())
    for got, expect in [(q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad),
                        (sinks.grad[:3], s64.grad[:3])]:
        assert torch.allclose(got.double(), expect, atol=5e-5), (got.double() - expect).abs().max()
    assert sinks.grad[3] == 0


def test_numpy_sinks_gradient():
    rng = np.random.default_rng(3)
    q, k, v = (rand(rng, 1, 2, 40, 8) for _ in range(3))
    sinks = np.array([0.3, -0.7], dtype=np.float32)
    out, lse = qkv.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    dout = rand(rng, 1, 2, 40, 8)
    dq, dk, dv, dsinks = qkv.attention_backward(q, k, v, out, lse, dout, causal=True, sinks=sinks)
    # ∂L/∂sink = −Σ_i p_sink,i (dO_i · O_i)
    p_sink = np.exp(sinks.reshape(1, 2, 1) - lse)
    expect = -(p_sink * (dout * out).sum(-1)).sum(axis=(0, 2))
    assert np.allclose(dsinks, expect, rtol=1e-5, atol=1e-6)


def test_a_small_model_trains_with_a_relative_bias_and_sinks():
    """A one-layer attention model with a learnable T5 relative bias and sinks, trained 30 steps
    through qkv.torch.flex_attention, gives the losses of the same model over PyTorch's math
    path (the materialised formula), and learns."""
    V, D, H, T = 40, 32, 2, 64
    buckets = qt.relative_buckets(T, T, 16, 64)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(V, D)
            self.qkv = torch.nn.Linear(D, 3 * D)
            self.out = torch.nn.Linear(D, V)
            self.rel = torch.nn.Parameter(torch.zeros(H, 16))
            self.sinks = torch.nn.Parameter(torch.zeros(H))

        def score_mod(self, score, b, h, q_idx, kv_idx):
            biased = score + self.rel[h, buckets[q_idx - kv_idx + (T - 1)]]
            return torch.where(kv_idx <= q_idx, biased, -float("inf"))

        def forward(self, x, ours):
            e = self.embed(x)
            q, k, v = (t.view(x.shape[0], T, H, D // H).transpose(1, 2)
                       for t in self.qkv(e).chunk(3, dim=-1))
            if ours:
                a = qt.flex_attention(q, k, v, score_mod=self.score_mod, sinks=self.sinks)
            else:
                a, _ = materialised(q, k, v, self.score_mod, sinks=self.sinks)
                a = a.to(q.dtype)
            return self.out(e + a.transpose(1, 2).reshape(x.shape[0], T, D))

    tokens = torch.randint(0, V, (2, T + 1), generator=torch.Generator().manual_seed(5))

    def train(ours):
        torch.manual_seed(1)
        model = Tiny()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(30):
            logits = model(tokens[:, :-1], ours)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), tokens[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, model

    ours, model = train(True)
    theirs, _ = train(False)
    assert np.allclose(ours, theirs, rtol=5e-4), (ours, theirs)
    assert ours[-1] < 0.5 * ours[0]
    assert model.rel.abs().max() > 0 and model.sinks.abs().max() > 0  # both learned something


def test_method_forms_mean_what_the_functions_mean(rng):
    # x.clamp(lo, hi), x.clip, x.clamp_min/max, x.minimum/maximum, x.where and x.div(…, floor)
    # compute what torch.clamp, torch.minimum, torch.where and // compute: PyTorch's own
    # flex_attention semantics, checked against the eager scores.
    q = torch.tensor(rand(rng, 1, 2, 24, 8))
    k = torch.tensor(rand(rng, 1, 2, 24, 8))
    v = torch.tensor(rand(rng, 1, 2, 24, 8))
    methods = {
        "clamp": lambda s, b, h, i, j: s.clamp(-0.5, 0.5),
        "clip": lambda s, b, h, i, j: s.clip(min=-0.25),
        "clamp_min_max": lambda s, b, h, i, j: s.clamp_min(-0.3).clamp_max(0.4),
        "minimum": lambda s, b, h, i, j: s.minimum(s * 0.5) + (i - j).maximum(j - i) * 0.01,
        "where": lambda s, b, h, i, j: s.where(i >= j, s - 2.0),
        "floor_div": lambda s, b, h, i, j: s + (i - j).div(4, rounding_mode="floor") * 0.1,
    }
    scale = 1 / math.sqrt(8)
    raw = (q @ k.transpose(-1, -2)).double() * scale
    i = torch.arange(24).view(24, 1)
    j = torch.arange(24).view(1, 24)
    for name, fn in methods.items():
        out = qt.flex_attention(q, k, v, score_mod=fn)
        s = fn(raw, None, None, i, j)
        want = torch.softmax(s, dim=-1) @ v.double()
        assert torch.allclose(out.double(), want, atol=1e-5), name
