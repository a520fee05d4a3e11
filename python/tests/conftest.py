"""The oracle of the Python tests: attention written from its formula in float64 PyTorch
(math attention: the score grid materialised, autograd for the gradients)."""
import math
import os

import numpy as np
import pytest
import torch


def reference(q, k, v, causal=False, window=(-1, -1), kv_len=None, bias=None, alibi=None,
              softcap=0.0, scale=None):
    """q [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv] (torch, any float dtype): out and
    lse in float64, differentiable. Masks aligned bottom-right; a row that sees nothing is 0."""
    q, k, v = q.double(), k.double(), v.double()
    B, Hq, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(Hq // Hkv, dim=1)
    v = v.repeat_interleave(Hq // Hkv, dim=1)
    s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(D) if scale is None else scale)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + torch.as_tensor(np.asarray(bias) if not torch.is_tensor(bias) else bias).double()
    i = torch.arange(Tq).view(-1, 1) + (Tk - Tq)  # each query's position on the key axis
    j = torch.arange(Tk).view(1, -1)
    if alibi is not None:
        slopes = torch.as_tensor(np.asarray(alibi, dtype=np.float64)).view(1, Hq, 1, 1)
        s = s - slopes * (i - j).abs().double()
    visible = torch.ones(B, 1, Tq, Tk, dtype=torch.bool)
    if causal:
        visible &= j <= i
    if window[0] >= 0:
        visible &= j >= i - window[0]
    if window[1] >= 0:
        visible &= j <= i + window[1]
    if kv_len is not None:
        visible &= j.view(1, 1, 1, -1) < torch.as_tensor(np.asarray(kv_len)).view(-1, 1, 1, 1)
    s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse).unsqueeze(-1))
    return p @ v, lse


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def source_dir():
    """The repository (for its model and test files), given by `make test-python`."""
    d = os.environ.get("QKV_SOURCE_DIR")
    if not d:
        pytest.fail("set QKV_SOURCE_DIR to the qkv repository (make test-python does)")
    return d
