"""qkv.attention and qkv.attention_backward on NumPy arrays, every option against float64
math attention (conftest.reference)."""
import threading
import tracemalloc

import numpy as np
import pytest
import torch

import qkv
from conftest import rand, reference

# (name, options for qkv.attention, options for the reference) — each case a C++ feature.
CASES = [
    ("plain", {}),
    ("causal", {"causal": True}),
    ("window", {"window": (5, 0)}),
    ("window both sides", {"window": (3, 2)}),
    ("causal window", {"causal": True, "window": (4, -1)}),
    ("softcap", {"softcap": 2.5}),
    ("scale", {"scale": 0.3}),
    ("alibi", {"alibi": np.array([0.5, 0.25, 0.125, 0.0625], dtype=np.float32), "causal": True}),
]


def to_t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def check_forward(q, k, v, rtol=2e-5, **opts):
    out, lse = qkv.attention(q, k, v, return_lse=True, **opts)
    ref_out, ref_lse = reference(to_t(q), to_t(k), to_t(v), **opts)
    np.testing.assert_allclose(out, ref_out.numpy(), rtol=rtol, atol=rtol)
    finite = np.isfinite(ref_lse.numpy())
    np.testing.assert_allclose(lse[finite], ref_lse.numpy()[finite], rtol=rtol, atol=rtol)
    assert np.all(np.isneginf(lse[~finite]))
    return out


@pytest.mark.parametrize("name,opts", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_forward_options(rng, name, opts, kv_heads):
    q, k, v = rand(rng, 2, 4, 19, 16), rand(rng, 2, kv_heads, 23, 16), rand(rng, 2, kv_heads, 23, 8)
    check_forward(q, k, v, **opts)


def test_padding_and_bias(rng):
    q, k, v = rand(rng, 3, 2, 7, 8), rand(rng, 3, 2, 11, 8), rand(rng, 3, 2, 11, 8)
    check_forward(q, k, v, kv_len=np.array([11, 4, 0]))  # batch row 2: nothing to see, out 0
    for shape in [(3, 2, 7, 11), (1, 2, 1, 11), (7, 11), (3, 1, 7, 11)]:  # broadcast, right-aligned
        check_forward(q, k, v, bias=rand(rng, *shape))


def test_layout_bthd_and_any_strides(rng):
    q, k, v = rand(rng, 2, 9, 4, 8), rand(rng, 2, 13, 2, 8), rand(rng, 2, 13, 2, 8)  # [B, T, H, D]
    out = qkv.attention(q, k, v, layout="bthd", causal=True)
    ref, _ = reference(to_t(q).transpose(1, 2), to_t(k).transpose(1, 2), to_t(v).transpose(1, 2), causal=True)
    np.testing.assert_allclose(out, ref.transpose(1, 2).numpy(), rtol=2e-5, atol=2e-5)
    # Strided views (every other row, a transposed array) are read in place.
    big = rand(rng, 2, 4, 40, 8)
    qs = big[:, :, ::2]
    kt = np.ascontiguousarray(rand(rng, 2, 4, 8, 20)).transpose(0, 1, 3, 2)
    check_forward(qs, kt, kt)


def test_packed_sequences_match_each_sequence_alone(rng):
    cu_q, cu_k = np.array([0, 5, 5, 12], dtype=np.int32), np.array([0, 8, 11, 20], dtype=np.int32)
    q, k, v = rand(rng, 12, 4, 8), rand(rng, 20, 2, 8), rand(rng, 20, 2, 8)  # [total, H, D]
    out, lse = qkv.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True, layout="bthd",
                             return_lse=True)
    assert lse.shape == (4, 12)
    for s in range(3):
        a, b, c, d = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        if a == b:
            continue
        ref, ref_lse = reference(to_t(q[None, a:b]).transpose(1, 2), to_t(k[None, c:d]).transpose(1, 2),
                                 to_t(v[None, c:d]).transpose(1, 2), causal=True)
        np.testing.assert_allclose(out[a:b], ref[0].transpose(0, 1).numpy(), rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(lse[:, a:b], ref_lse[0].numpy(), rtol=2e-5, atol=2e-5)


BACKWARD_CASES = [{}, {"causal": True}, {"window": (3, 1)}, {"softcap": 3.0}, {"kv_len": np.array([9, 3])},
                  {"alibi": np.array([0.3, 0.1], dtype=np.float32)}, {"scale": 0.5}]


@pytest.mark.parametrize("opts", BACKWARD_CASES, ids=lambda o: ",".join(o) or "plain")
def test_backward_against_float64_autograd(rng, opts):
    q, k, v = rand(rng, 2, 2, 10, 8), rand(rng, 2, 1, 13, 8), rand(rng, 2, 1, 13, 6)
    bias = rand(rng, 1, 2, 10, 13) if not opts else None
    dout = rand(rng, 2, 2, 10, 6)
    out, lse = qkv.attention(q, k, v, bias=bias, return_lse=True, **opts)
    dq, dk, dv = qkv.attention_backward(q, k, v, out, lse, dout, bias=bias, **opts)
    tq, tk, tv = (to_t(a).double().requires_grad_() for a in (q, k, v))
    ref, _ = reference(tq, tk, tv, bias=bias, **opts)
    ref.backward(to_t(dout).double())
    for mine, t in ((dq, tq), (dk, tk), (dv, tv)):
        np.testing.assert_allclose(mine, t.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_output_aliases_the_callers_buffer_and_inputs_are_not_copied(rng):
    q, k, v = rand(rng, 1, 8, 512, 64), rand(rng, 1, 8, 512, 64), rand(rng, 1, 8, 512, 64)  # 1 MiB each
    out = np.zeros_like(q)
    lse = np.zeros((1, 8, 512), dtype=np.float32)
    tracemalloc.start()
    got, got_lse = qkv.attention(q, k, v, out=out, lse=lse, return_lse=True)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert got is out and got_lse is lse
    assert peak < 64 * 1024, f"{peak} bytes allocated by Python: an input was copied"
    check = qkv.attention(q, k, v)
    np.testing.assert_array_equal(out, check)
    # An output view writes through to its base.
    base = np.zeros((1, 512, 8, 64), dtype=np.float32)
    qkv.attention(q, k, v, out=base.transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(base.transpose(0, 2, 1, 3), check)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sixteen_bit_numpy_arrays_in_place(rng, dtype):
    """ml_dtypes' bfloat16 (JAX's) and NumPy's float16: read in place (nothing allocated but the
    output), out in the inputs' dtype, within the rounding bound of float64 math over the same
    16-bit inputs (the float32 kernel's error plus half an ulp of the output)."""
    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes (pip) brings NumPy bfloat16")
        dt, u = ml_dtypes.bfloat16, 2.0**-8
    else:
        dt, u = np.float16, 2.0**-11
    q, k, v = (rand(rng, 1, 4, 256, 32).astype(dt) for _ in range(3))
    out = np.zeros_like(q)
    tracemalloc.start()
    got = qkv.attention(q, k, v, causal=True, out=out)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert got is out and out.dtype == dt
    assert peak < 16 * 1024, f"{peak} bytes allocated by Python: an input was copied"
    ref, _ = reference(*(torch.from_numpy(x.astype(np.float64)) for x in (q, k, v)), causal=True)
    err = np.abs(out.astype(np.float64) - ref.numpy()).max()
    assert err <= 1e-5 + u * np.abs(ref.numpy()).max(), err
    # The default output is in q's dtype; lse stays float32.
    o2, lse = qkv.attention(q, k, v, causal=True, return_lse=True)
    assert o2.dtype == dt and lse.dtype == np.float32
    np.testing.assert_array_equal(o2.view(np.uint16), out.view(np.uint16))
    with pytest.raises(TypeError, match="got uint16"):
        qkv.attention(q.view(np.uint16), k, v)


def test_two_threads_at_once(rng):
    problems = [tuple(rand(rng, 2, 4, 256, 32) for _ in range(3)) for _ in range(2)]
    serial = [qkv.attention(*p, causal=True) for p in problems]
    results = [None, None]

    def run(i):
        for _ in range(5):
            results[i] = qkv.attention(*problems[i], causal=True)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r, s in zip(results, serial):
        np.testing.assert_array_equal(r, s)


def test_the_gil_is_released(rng):
    # While one thread runs a long attention, another Python thread keeps running.
    q = rand(rng, 1, 8, 2048, 64)
    ticks = []
    done = threading.Event()

    def count():
        while not done.is_set():
            ticks.append(1)
            done.wait(0.001)

    t = threading.Thread(target=count)
    t.start()
    before = len(ticks)
    qkv.attention(q, q, q, causal=True)
    during = len(ticks) - before
    done.set()
    t.join()
    assert during > 3, "the other thread did not run while the kernel did"


def test_an_output_over_an_input_is_refused(rng):
    # An output over an input would be read after it was overwritten: refused, naming the two
    # arrays (the kernels would read v, say, after writing its first rows); gradients as well.
    q, k, v = (rand(rng, 1, 4, 300, 64) for _ in range(3))
    for name, arr in (("v", v), ("q", q), ("k", k)):
        with pytest.raises(ValueError, match=f"out \\[1, 4, 300, 64\\] overlaps {name} "):
            qkv.attention(q, k, v, causal=True, out=arr)
    out, lse = qkv.attention(q, k, v, causal=True, return_lse=True)
    dout = rand(rng, 1, 4, 300, 64)
    with pytest.raises(ValueError, match="dk .* overlaps dout"):
        qkv.attention_backward(q, k, v, out, lse, dout, causal=True, dk=dout)


def test_bad_input_is_an_exception(rng):
    q, k, v = rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    with pytest.raises(TypeError, match="q must be float32, bfloat16 or float16, got float64"):
        qkv.attention(q.astype(np.float64), k, v)
    with pytest.raises(TypeError, match="v must be float32, bfloat16 or float16, got int32"):
        qkv.attention(q, k, v.astype(np.int32))
    with pytest.raises(ValueError, match="k is fp16 but v is fp32"):
        qkv.attention(q, k.astype(np.float16), v)
    with pytest.raises(ValueError, match="head dim"):
        qkv.attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match="must have 4 dims"):
        qkv.attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="multiple"):
        qkv.attention(rand(rng, 1, 3, 4, 8), k, v)
    with pytest.raises(ValueError, match="kv_len"):
        qkv.attention(q, k, v, kv_len=[9])
    with pytest.raises(ValueError, match="kv_len has 2 entries"):
        qkv.attention(q, k, v, kv_len=[1, 2])
    with pytest.raises(ValueError, match="window"):
        qkv.attention(q, k, v, window=(-3, 0))
    with pytest.raises(ValueError, match="window must be a pair"):
        qkv.attention(q, k, v, window=5)
    with pytest.raises(ValueError, match="layout"):
        qkv.attention(q, k, v, layout="bshd")
    with pytest.raises(ValueError, match="scale must be nonzero"):
        qkv.attention(q, k, v, scale=0)
    with pytest.raises(ValueError, match="bias"):
        qkv.attention(q, k, v, bias=rand(rng, 3, 4))
    with pytest.raises(ValueError, match="alibi"):
        qkv.attention(q, k, v, alibi=[0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="softcap"):
        qkv.attention(q, k, v, softcap=-1.0)
    with pytest.raises(ValueError, match="zero stride"):
        qkv.attention(q, k, v, out=np.lib.stride_tricks.as_strided(np.zeros(8, np.float32), q.shape, (0, 0, 0, 4)))
    with pytest.raises(ValueError, match="lse"):
        qkv.attention(q, k, v, lse=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="cu_seqlens"):
        qkv.attention(q[0, 0], k[0, 0][:, None], v[0, 0][:, None], cu_seqlens_q=[0, 4])
    with pytest.raises(ValueError, match="cu_seqlens"):
        qkv.attention(q[0].transpose(1, 0, 2), k[0].transpose(1, 0, 2), v[0].transpose(1, 0, 2), layout="bthd",
                      cu_seqlens_q=[0, 3, 2, 4], cu_seqlens_k=[0, 1, 2, 4])
    with pytest.raises(ValueError, match="out is read-only"):
        ro = np.zeros_like(q)
        ro.setflags(write=False)
        qkv.attention(q, k, v, out=ro)
    with pytest.raises(TypeError):
        qkv.attention([[1.0]], k, v)
    with pytest.raises(ValueError, match="q has an empty dim"):
        qkv.attention(np.zeros((1, 2, 0, 8), np.float32), k, v)
    # Negative strides (reversed views) are read as they are.
    rq, rk = q[:, :, ::-1], k[:, :, ::-1]
    np.testing.assert_allclose(qkv.attention(rq, rk, rk), qkv.attention(rq.copy(), rk.copy(), rk.copy()),
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="lse"):
        qkv.attention_backward(q, k, v, q, np.zeros(2, np.float32), q)


def test_a_nan_in_the_inputs_is_not_hidden(rng):
    # NaN in one query row: that row is NaN, the others are untouched (never a silent 0).
    q, k, v = rand(rng, 1, 2, 40, 8), rand(rng, 1, 2, 40, 8), rand(rng, 1, 2, 40, 8)
    q[0, 0, 7, 3] = np.nan
    for causal in (False, True):
        out = qkv.attention(q, k, v, causal=causal)
        assert np.isnan(out[0, 0, 7]).all()
        assert np.isfinite(np.delete(out[0, 0], 7, axis=0)).all() and np.isfinite(out[0, 1]).all()


def test_version_is_the_packages_and_the_librarys():
    import importlib.metadata
    import re
    assert qkv.__version__ == qkv.version() == importlib.metadata.version("qkv")
    assert re.fullmatch(r"\d+\.\d+\.\d+", qkv.__version__)
    assert qkv.build_commit() == "unknown" or re.fullmatch(r"[0-9a-f]{12}", qkv.build_commit())


def test_attention_plan_names_the_kernel_the_call_runs(rng):
    """A prompt tiles, one query against a long cache decodes, dropout tiles at any shape, the
    backward tiles; float32 multiplies on the FMAs (as the docs state the choice)."""
    q, k, v = (rand(rng, 1, 4, t, 64) for t in (2048, 2048, 2048))
    plan = qkv.attention_plan(q, k, v, causal=True)
    assert plan["kernel"] == "forward_tiles" and plan["unit"] == "fma", plan
    assert qkv.attention_plan(q, k, v, backward=True)["kernel"] == "backward_tiles"
    one = q[:, :, :1]
    assert qkv.attention_plan(one, k, v)["kernel"] == "decode_rows"
    assert qkv.attention_plan(one, k, v, dropout_p=0.1, dropout_seed=3)["kernel"] == "forward_tiles"
    assert "split-KV" in qkv.attention_plan(one, k, v)["why"]
