"""qkv.torch: the autograd Function and the SDPA / flash-attn drop-ins, against float64 math
attention (and against PyTorch's own SDPA where this torch has it)."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import qkv
import qkv.torch as qt
from conftest import reference

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def randn(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


def grads_of(fn, *tensors, dout):
    ts = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*ts)
    out.backward(dout)
    return out.detach(), [t.grad for t in ts]


@pytest.mark.parametrize("opts", [{}, {"causal": True}, {"window": (2, 3)}, {"softcap": 4.0},
                                  {"alibi": [0.5, 0.25, 0.1, 0.05]}, {"kv_len": [17, 6]}],
                         ids=["plain", "causal", "window", "softcap", "alibi", "kv_len"])
def test_autograd_against_float64_autograd(opts):
    q, k, v = randn(2, 4, 15, 8, seed=1), randn(2, 2, 17, 8, seed=2), randn(2, 2, 17, 8, seed=3)
    dout = randn(2, 4, 15, 8, seed=4)
    out, (dq, dk, dv) = grads_of(lambda a, b, c: qt.attention(a, b, c, **opts), q, k, v, dout=dout)
    ref, (rq, rk, rv) = grads_of(lambda a, b, c: reference(a, b, c, **opts)[0], q.double(), k.double(),
                                 v.double(), dout=dout.double())
    torch.testing.assert_close(out, ref.float(), rtol=2e-5, atol=2e-5)
    for mine, theirs in ((dq, rq), (dk, rk), (dv, rv)):
        torch.testing.assert_close(mine, theirs.float(), rtol=1e-4, atol=1e-4)


def test_autograd_through_strided_views():
    # A fused QKV projection's output [B, T, 3, H, D], read as three strided views.
    qkv_out = randn(2, 9, 3, 2, 4, seed=5).requires_grad_()
    q, k, v = (qkv_out[:, :, i] for i in range(3))
    out = qt.attention(q, k, v, layout="bthd", causal=True)
    out.square().sum().backward()
    ref_in = qkv_out.detach().double().requires_grad_()
    rq, rk, rv = (ref_in[:, :, i].transpose(1, 2) for i in range(3))
    reference(rq, rk, rv, causal=True)[0].transpose(1, 2).square().sum().backward()
    torch.testing.assert_close(qkv_out.grad, ref_in.grad.float(), rtol=1e-4, atol=1e-4)


def math_sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """torch's documented SDPA (top-left causal), in float64."""
    q, k, v = q.double(), k.double(), v.double()
    if k.shape[-3:-2] != q.shape[-3:-2] and q.dim() == 4:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    L, S = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if is_causal:
        s = s.masked_fill(torch.ones(L, S, dtype=torch.bool).triu(1), -math.inf)
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else s + attn_mask.double()
    return torch.softmax(s, -1) @ v


SDPA_CASES = [
    dict(L=12, S=12), dict(L=12, S=12, is_causal=True), dict(L=16, S=9, is_causal=True),
    dict(L=5, S=14, is_causal=True), dict(L=7, S=10, mask="bool"), dict(L=7, S=10, mask="float"),
    dict(L=7, S=10, mask="bool2d"), dict(L=8, S=8, scale=0.2), dict(L=6, S=6, gqa=True),
    dict(L=6, S=8, three_dims=True, is_causal=True),
]


@pytest.mark.parametrize("case", SDPA_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_sdpa_drop_in(case):
    L, S = case["L"], case["S"]
    hq, hkv = (4, 2) if case.get("gqa") else (4, 4)
    if case.get("three_dims"):
        q, k, v = randn(3, L, 8, seed=1), randn(3, S, 8, seed=2), randn(3, S, 8, seed=3)
    else:
        q, k, v = randn(2, hq, L, 8, seed=1), randn(2, hkv, S, 8, seed=2), randn(2, hkv, S, 8, seed=3)
    mask = None
    if case.get("mask") == "bool":
        mask = randn(2, 1, L, S, seed=9) > -0.5
    elif case.get("mask") == "bool2d":
        mask = randn(L, S, seed=9) > 0
    elif case.get("mask") == "float":
        mask = randn(1, hq, L, S, seed=9)
    kw = dict(attn_mask=mask, is_causal=case.get("is_causal", False), scale=case.get("scale"))
    gqa = {"enable_gqa": True} if case.get("gqa") else {}
    dout = randn(*q.shape[:-1], 8, seed=4)
    out, grads = grads_of(lambda a, b, c: qt.scaled_dot_product_attention(a, b, c, **kw, **gqa), q, k, v, dout=dout)
    ref, ref_grads = grads_of(lambda a, b, c: math_sdpa(a, b, c, **kw), q.double(), k.double(), v.double(),
                              dout=dout.double())
    torch.testing.assert_close(out, ref.float(), rtol=2e-5, atol=2e-5)
    for mine, theirs in zip(grads, ref_grads):
        torch.testing.assert_close(mine, theirs.float(), rtol=1e-4, atol=1e-4)
    if HAS_SDPA and (not gqa or "enable_gqa" in F.scaled_dot_product_attention.__doc__):
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, **kw, **gqa), rtol=1e-5, atol=1e-5)


def test_sdpa_drop_in_takes_other_float_dtypes_and_refuses_what_it_cannot_do():
    q = randn(1, 2, 6, 8, seed=1)
    ref = qt.scaled_dot_product_attention(q, q, q, is_causal=True)
    for dt in (torch.float64, torch.bfloat16, torch.float16):
        out = qt.scaled_dot_product_attention(q.to(dt), q.to(dt), q.to(dt), is_causal=True)
        assert out.dtype == dt
        torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="dropout_p must be in"):
        qt.scaled_dot_product_attention(q, q, q, dropout_p=1.1)
    with pytest.raises(ValueError, match="attn_mask must be None when is_causal"):
        qt.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(6, 6, dtype=torch.bool), is_causal=True)
    with pytest.raises(ValueError, match="enable_gqa"):
        qt.scaled_dot_product_attention(q, q[:, :1], q[:, :1])
    with pytest.raises(TypeError, match="floating-point"):
        qt.scaled_dot_product_attention(q.long(), q.long(), q.long())
    with pytest.raises(TypeError, match="q must be float32, bfloat16 or float16, got float64"):
        qt.attention(q.double(), q.double(), q.double())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_sixteen_bit_tensors_in_place_and_back_in_their_dtype(dtype):
    """bfloat16 and float16 tensors are read where they lie (strided views too), outputs and
    gradients come back in their dtype, within the rounding bound of float64 math over the same
    16-bit inputs: the float32 kernel's error plus half an ulp of the output."""
    u = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]
    base = randn(1, 24, 2, 16, seed=4).to(dtype)  # [B, T, H, D] storage, read as [B, H, T, D]
    q = base.transpose(1, 2).requires_grad_()
    k = randn(1, 2, 24, 16, seed=5).to(dtype).requires_grad_()
    v = randn(1, 2, 24, 16, seed=6).to(dtype).requires_grad_()
    out = qt.attention(q, k, v, causal=True)
    assert out.dtype == dtype
    ref, _ = reference(q.detach().double(), k.detach().double(), v.detach().double(), causal=True)
    assert (out.double() - ref).abs().max() <= 1e-5 + u * ref.abs().max()
    out.backward(torch.ones_like(out))
    assert q.grad.dtype == k.grad.dtype == v.grad.dtype == dtype
    # The drop-ins too, in place and in the dtype.
    sdpa = qt.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), is_causal=True)
    assert sdpa.dtype == dtype
    torch.testing.assert_close(sdpa, out.detach(), rtol=0, atol=0)


def test_sixteen_bit_tensors_take_no_conversion_copies():
    """No float32 copy of a bfloat16 or float16 q, k, v, out or dout, in the autograd Function
    and the drop-ins, forward and backward: PyTorch's profiler sees no conversion or copy."""
    for dtype in (torch.bfloat16, torch.float16):
        q, k, v = (randn(1, 4, 64, 32, seed=s).to(dtype).requires_grad_() for s in (1, 2, 3))
        calls = [lambda: qt.attention(q, k, v, causal=True),
                 lambda: qt.scaled_dot_product_attention(q, k, v, is_causal=True),
                 lambda: qt.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                            causal=True)]
        for call in calls:
            with torch.autograd.profiler.profile() as prof:
                out = call()
                out.backward(torch.ones_like(out))
            copies = [e.name for e in prof.function_events
                      if e.name in ("aten::to", "aten::_to_copy", "aten::copy_", "aten::contiguous")]
            assert out.dtype == dtype and not copies, f"{dtype}: {copies}"
            q.grad = k.grad = v.grad = None


def flash_reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, alibi=None, scale=None):
    """flash-attn's semantics ([B, S, H, D], bottom-right causal) from the float64 reference."""
    out, lse = reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal, window=window,
                         softcap=softcap, alibi=alibi, scale=scale)
    return out.transpose(1, 2), lse


@pytest.mark.parametrize("opts", [{}, {"causal": True}, {"window_size": (3, 0)}, {"softcap": 5.0},
                                  {"softmax_scale": 0.4}, {"alibi_slopes": torch.tensor([0.3, 0.2, 0.1, 0.05])}],
                         ids=["plain", "causal", "window", "softcap", "scale", "alibi"])
def test_flash_attn_func(opts):
    q, k, v = randn(2, 10, 4, 16, seed=1), randn(2, 14, 2, 16, seed=2), randn(2, 14, 2, 16, seed=3)
    ref_opts = {"causal": opts.get("causal", False), "window": opts.get("window_size", (-1, -1)),
                "softcap": opts.get("softcap", 0.0), "scale": opts.get("softmax_scale"),
                "alibi": None if "alibi_slopes" not in opts else opts["alibi_slopes"].numpy()}
    dout = randn(2, 10, 4, 16, seed=4)
    out, grads = grads_of(lambda a, b, c: qt.flash_attn_func(a, b, c, **opts), q, k, v, dout=dout)
    ref, ref_grads = grads_of(lambda a, b, c: flash_reference(a, b, c, **ref_opts)[0], q.double(), k.double(),
                              v.double(), dout=dout.double())
    torch.testing.assert_close(out, ref.float(), rtol=2e-5, atol=2e-5)
    for mine, theirs in zip(grads, ref_grads):
        torch.testing.assert_close(mine, theirs.float(), rtol=1e-4, atol=1e-4)
    out2, lse, probs = qt.flash_attn_func(q, k, v, return_attn_probs=True, **opts)
    assert probs is None and lse.shape == (2, 4, 10)
    torch.testing.assert_close(lse, flash_reference(q, k, v, **ref_opts)[1].float(), rtol=2e-5, atol=2e-5)
    with pytest.raises(ValueError, match="dropout"):
        qt.flash_attn_func(q, k, v, dropout_p=-0.1)


def test_flash_attn_varlen_func_matches_each_sequence():
    cu_q = torch.tensor([0, 4, 11, 12], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 11, 20], dtype=torch.int32)
    q, k, v = randn(12, 4, 8, seed=1), randn(20, 2, 8, seed=2), randn(20, 2, 8, seed=3)
    dout = randn(12, 4, 8, seed=4)
    fn = lambda a, b, c: qt.flash_attn_varlen_func(a, b, c, cu_q, cu_k, 7, 9, causal=True)
    out, (dq, dk, dv) = grads_of(fn, q, k, v, dout=dout)
    _, lse, _ = qt.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 9, causal=True, return_attn_probs=True)
    assert lse.shape == (4, 12)
    for s in range(3):
        a, b, c, d = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        ref, (rq, rk, rv) = grads_of(lambda x, y, z: flash_reference(x, y, z, causal=True)[0],
                                     q[None, a:b].double(), k[None, c:d].double(), v[None, c:d].double(),
                                     dout=dout[None, a:b].double())
        torch.testing.assert_close(out[a:b], ref[0].float(), rtol=2e-5, atol=2e-5)
        torch.testing.assert_close(dq[a:b], rq[0].float(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(dk[c:d], rk[0].float(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(dv[c:d], rv[0].float(), rtol=1e-4, atol=1e-4)


def test_the_output_is_a_torch_tensor_in_qkvs_numpy_api_too():
    q = randn(1, 2, 5, 4)
    out = torch.empty(1, 2, 5, 4)
    got = qkv.attention(q, q, q, out=out)
    assert got is out and out.abs().sum() > 0
    assert torch.is_tensor(qkv.attention(q, q, q))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_sixteen_bit_error_no_larger_than_pytorchs(dtype):
    """On the same 16-bit inputs, qkv's error against float64 math over them is no larger than
    PyTorch's own attention in that dtype (its SDPA where it has one, else the math form), in
    the median and the worst over a grid of shapes."""
    def torch_attention16(q, k, v, causal):
        if HAS_SDPA:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]))
        if causal:
            T = q.shape[-2]
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
        return torch.softmax(s, -1) @ v

    ours, theirs = [], []
    for seed, (T, D, causal) in enumerate([(64, 32, False), (64, 32, True), (200, 64, True),
                                           (300, 128, False), (129, 16, True), (512, 64, False)]):
        q, k, v = (randn(2, 4, T, D, seed=10 * seed + i).to(dtype) for i in range(3))
        ref, _ = reference(q, k, v, causal=causal)
        try:
            t_out = torch_attention16(q, k, v, causal)
        except RuntimeError as e:  # PyTorch 1.13 has no float16 matmul on the CPU
            pytest.skip(f"this PyTorch ({torch.__version__}) cannot compute {dtype} attention on "
                        f"the CPU: {e}")
        ours.append((qt.attention(q, k, v, causal=causal).double() - ref).abs().max().item())
        theirs.append((t_out.double() - ref).abs().max().item())
    median = lambda x: sorted(x)[len(x) // 2]
    assert median(ours) <= median(theirs), (ours, theirs)
    assert max(ours) <= max(theirs), (ours, theirs)
