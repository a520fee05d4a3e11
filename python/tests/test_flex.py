"""qkv.torch.create_block_mask and flex_attention against float64 math over the mask
materialised from the same Python function (evaluated by PyTorch on broadcast index grids, as
PyTorch's create_mask does), forward and backward; PyTorch's own flex_attention where it has one."""
import math

import numpy as np
import pytest
import torch

import qkv.torch as qt
from conftest import rand, reference


def materialised(mask_mod, B, H, L, S):
    """The mask as PyTorch evaluates it: a boolean [B, H, L, S]."""
    b = torch.arange(B).view(-1, 1, 1, 1)
    h = torch.arange(H).view(1, -1, 1, 1)
    q = torch.arange(L).view(1, 1, -1, 1)
    kv = torch.arange(S).view(1, 1, 1, -1)
    return mask_mod(b, h, q, kv).expand(B, H, L, S)


def as_bias(visible):
    return torch.zeros(visible.shape, dtype=torch.float64).masked_fill(~visible, -math.inf)


DOCS = torch.tensor(sum(([d] * n for d, n in enumerate([37, 120, 5, 90, 48])), []))  # 300
PREFIX = torch.tensor([70, 0])


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < 50)


def documents(b, h, q_idx, kv_idx):
    return (DOCS[q_idx] == DOCS[kv_idx]) & (q_idx >= kv_idx)


def prefix_lm(b, h, q_idx, kv_idx):
    return (kv_idx <= q_idx) | (kv_idx < PREFIX[b])


def dilated(b, h, q_idx, kv_idx):
    return (torch.abs(q_idx - kv_idx) <= 40) & ((q_idx - kv_idx) % 4 == 0)


def longformer(b, h, q_idx, kv_idx):
    return ((q_idx - kv_idx).abs() <= 16) | (kv_idx < 4) | (q_idx < 4)


def neighbourhood(b, h, q_idx, kv_idx):
    return ((q_idx // 20 - kv_idx // 20).abs() <= 1) & ((q_idx % 20 - kv_idx % 20).abs() <= 1)


def per_head_window(b, h, q_idx, kv_idx):  # held out of the gallery
    return torch.where(h == 0, q_idx - kv_idx <= 3, q_idx - kv_idx <= 20) & (kv_idx <= q_idx)


GALLERY = [causal, sliding_window, documents, prefix_lm, dilated, longformer, neighbourhood,
           per_head_window]


@pytest.mark.parametrize("mask_mod", GALLERY, ids=lambda f: f.__name__)
def test_forward_and_backward_against_float64(rng, mask_mod):
    B, H, L, S, D = 2, 2, 300, 300, 16
    q, k, v = (torch.tensor(rand(rng, B, H, n, D), requires_grad=True) for n in (L, S, S))
    bm = qt.create_block_mask(mask_mod, B, H, L, S)
    out, lse = qt.flex_attention(q, k, v, block_mask=bm, return_lse=True)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want, want_lse = reference(q64, k64, v64, bias=as_bias(materialised(mask_mod, B, H, L, S)))
    assert torch.allclose(out.double(), want, atol=2e-5)
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert torch.allclose(lse.double()[finite], want_lse[finite], atol=2e-5)
    dout = torch.tensor(rand(rng, B, H, L, D))
    out.backward(dout)
    want.backward(dout.double())
    for got, ref in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert torch.allclose(got.double(), ref, atol=1e-4)


def test_the_expression_traced(rng):
    bm = qt.create_block_mask(documents, None, None, 300, 300)
    assert bm.text == "captured0[q_idx] == captured0[kv_idx] && q_idx >= kv_idx"
    assert bm.shape == (1, 1, 300, 300) and bm.BLOCK_SIZE == 128
    full, partial = bm.key_blocks(0, 0, 2)
    assert full == [] and partial == [1, 2]  # keys 252-255 (document 4) and the diagonal
    assert 0 < bm.sparsity() < 100 and bm.bytes > 0
    clamp = qt.create_block_mask(lambda b, h, q, kv: torch.clamp(q - kv, min=0, max=5) < 5,
                                 1, 1, 64, 64)
    assert clamp.text == "min(max(q_idx - kv_idx, 0), 5) < 5"


def test_rows_that_see_nothing_and_gqa(rng):
    def some_rows(b, h, q_idx, kv_idx):
        return (q_idx % 5 != 0) & (kv_idx <= q_idx)
    q = torch.tensor(rand(rng, 1, 4, 40, 8), requires_grad=True)
    k = torch.tensor(rand(rng, 1, 2, 40, 8), requires_grad=True)
    v = torch.tensor(rand(rng, 1, 2, 40, 8), requires_grad=True)
    bm = qt.create_block_mask(some_rows, 1, 1, 40, 40, BLOCK_SIZE=16)
    with pytest.raises(ValueError, match="enable_gqa"):
        qt.flex_attention(q, k, v, block_mask=bm)
    out, lse = qt.flex_attention(q, k, v, block_mask=bm, enable_gqa=True, return_lse=True)
    assert torch.all(out[:, :, ::5] == 0) and torch.all(lse[:, :, ::5] == -math.inf)
    out.sum().backward()
    assert torch.all(q.grad[:, :, ::5] == 0) and not torch.isnan(k.grad).any()


def test_bfloat16(rng):
    q, k, v = (torch.tensor(rand(rng, 1, 2, 200, 32)).bfloat16() for _ in range(3))
    bm = qt.create_block_mask(longformer, 1, 2, 200, 200)
    out = qt.flex_attention(q, k, v, block_mask=bm)
    want, _ = reference(q, k, v, bias=as_bias(materialised(longformer, 1, 2, 200, 200)))
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.double(), want, atol=2e-2)


def test_what_cannot_be_traced_is_named():
    def control_flow(b, h, q_idx, kv_idx):
        if q_idx > kv_idx:
            return q_idx > 0
        return kv_idx > 0

    def item(b, h, q_idx, kv_idx):
        return q_idx > kv_idx.item()

    def true_division(b, h, q_idx, kv_idx):
        return q_idx / 2 > kv_idx

    def sine(b, h, q_idx, kv_idx):
        return torch.sin(q_idx) > 0

    def floats(b, h, q_idx, kv_idx):
        return torch.tensor([0.5, 1.5])[q_idx] > 0

    cases = [(control_flow, "control flow"), (item, r"\.item\(\)"), (true_division, "//"),
             (sine, "sin"), (floats, "float32")]
    for fn, what in cases:
        with pytest.raises(ValueError, match=what):
            qt.create_block_mask(fn, 1, 1, 8, 8)
    with pytest.raises(ValueError, match="outside captured0"):
        qt.create_block_mask(lambda b, h, q, kv: DOCS[q + 1] == 0, 1, 1, 300, 300)
    with pytest.raises(ValueError, match="CPU"):
        qt.create_block_mask(causal, 1, 1, 8, 8, device="cuda")
    q = torch.zeros(1, 1, 8, 4)
    with pytest.raises(ValueError, match="KV_LEN 9"):
        qt.flex_attention(q, q, q, block_mask=qt.create_block_mask(causal, 1, 1, 8, 9))


def test_against_pytorchs_flex_attention(rng):
    flex = pytest.importorskip("torch.nn.attention.flex_attention",
                               reason="this torch has no flex_attention (it came in 2.5)")
    B, H, L, D = 1, 2, 256, 16
    q, k, v = (torch.tensor(rand(rng, B, H, L, D)) for _ in range(3))
    for mask_mod in (documents, longformer, neighbourhood):
        ours = qt.flex_attention(q, k, v, block_mask=qt.create_block_mask(mask_mod, B, H, L, L))
        theirs = flex.flex_attention(q, k, v, block_mask=flex.create_block_mask(
            mask_mod, B, H, L, L, device="cpu"))
        assert torch.allclose(ours, theirs, atol=1e-5)


def test_a_small_model_trains_with_a_document_mask():
    """A one-layer attention model trained 30 steps with qkv's flex_attention under a document
    mask gives the losses of the same model over PyTorch's math attention with the mask
    materialised, and learns."""
    V, D, H, T = 40, 32, 2, 96
    docs = torch.tensor([0] * 40 + [1] * 25 + [2] * 31)

    def document_causal(b, h, q_idx, kv_idx):
        return (docs[q_idx] == docs[kv_idx]) & (q_idx >= kv_idx)

    block_mask = qt.create_block_mask(document_causal, None, None, T, T, BLOCK_SIZE=32)
    keep = materialised(document_causal, 1, 1, T, T)

    def math_attention(q, k, v):
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return torch.softmax(s.masked_fill(~keep, -math.inf), dim=-1) @ v

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(V, D)
            self.qkv = torch.nn.Linear(D, 3 * D)
            self.out = torch.nn.Linear(D, V)

        def forward(self, x, attend):
            e = self.embed(x)
            q, k, v = (t.view(x.shape[0], T, H, D // H).transpose(1, 2)
                       for t in self.qkv(e).chunk(3, dim=-1))
            a = attend(q, k, v).transpose(1, 2).reshape(x.shape[0], T, D)
            return self.out(e + a)

    tokens = torch.randint(0, V, (2, T + 1), generator=torch.Generator().manual_seed(5))

    def train(attend):
        torch.manual_seed(1)
        model = Tiny()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(30):
            logits = model(tokens[:, :-1], attend)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), tokens[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    ours = train(lambda q, k, v: qt.flex_attention(q, k, v, block_mask=block_mask))
    theirs = train(math_attention)
    assert np.allclose(ours, theirs, rtol=2e-4), (ours, theirs)
    assert ours[-1] < 0.5 * ours[0]
