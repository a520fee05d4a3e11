"""Property-based: random shapes, strides and masks (hypothesis) against the float64 reference."""
import numpy as np
import torch
from hypothesis import given, settings, strategies as st

import qkv
from conftest import reference


@st.composite
def problems(draw):
    B = draw(st.integers(1, 3))
    Hkv = draw(st.integers(1, 3))
    Hq = Hkv * draw(st.integers(1, 3))
    Tq, Tk = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    D, Dv = draw(st.sampled_from([1, 3, 8, 16, 33, 64])), draw(st.sampled_from([1, 5, 8, 32]))
    seed = draw(st.integers(0, 2**31))
    opts = {"causal": draw(st.booleans())}
    if draw(st.booleans()):
        opts["window"] = (draw(st.integers(-1, 8)), draw(st.integers(-1, 8)))
    if draw(st.booleans()):
        opts["kv_len"] = draw(st.lists(st.integers(0, Tk), min_size=B, max_size=B))
    if draw(st.booleans()):
        opts["softcap"] = draw(st.floats(0.5, 30))
    # How each input is laid out in memory: contiguous, seq and heads swapped, or every other row.
    layouts = [draw(st.sampled_from(["contiguous", "swapped", "strided"])) for _ in range(3)]
    return B, Hq, Hkv, Tq, Tk, D, Dv, seed, opts, layouts


def lay_out(a, how):
    """`a` [B, H, T, D] in a different memory layout, the same values."""
    if how == "swapped":
        return np.ascontiguousarray(a.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    if how == "strided":
        big = np.zeros(a.shape[:2] + (2 * a.shape[2], a.shape[3]), dtype=a.dtype)
        big[:, :, ::2] = a
        return big[:, :, ::2]
    return a


@settings(max_examples=150, deadline=None)
@given(problems())
def test_attention_matches_the_reference(p):
    B, Hq, Hkv, Tq, Tk, D, Dv, seed, opts, layouts = p
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, Tq, D), dtype=np.float32)
    k = rng.standard_normal((B, Hkv, Tk, D), dtype=np.float32)
    v = rng.standard_normal((B, Hkv, Tk, Dv), dtype=np.float32)
    out, lse = qkv.attention(lay_out(q, layouts[0]), lay_out(k, layouts[1]), lay_out(v, layouts[2]),
                             return_lse=True, **opts)
    ref, ref_lse = reference(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), **opts)
    np.testing.assert_allclose(out, ref.numpy(), rtol=5e-5, atol=5e-5)
    np.testing.assert_allclose(lse, ref_lse.numpy(), rtol=5e-5, atol=5e-5)  # -inf where nothing is seen
    # Backward, where something is seen at all.
    dout = rng.standard_normal(out.shape, dtype=np.float32)
    dq, dk, dv = qkv.attention_backward(q, k, v, out, lse, dout, **opts)
    tq, tk, tv = (torch.from_numpy(a).double().requires_grad_() for a in (q, k, v))
    r, _ = reference(tq, tk, tv, **opts)
    r.backward(torch.from_numpy(dout).double())
    for mine, t in ((dq, tq), (dk, tk), (dv, tv)):
        np.testing.assert_allclose(mine, t.grad.numpy(), rtol=2e-4, atol=2e-4)
