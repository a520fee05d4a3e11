"""qkv.attention and qkv.attention_backward on NumPy arrays (or torch CPU tensors)."""
import numpy as np

from . import _qkv

_LAYOUTS = ("bhtd", "bthd")


def _empty(like, shape, float32=False):
    """An array of `shape` of the same kind as `like` (NumPy or torch), in like's dtype or
    float32."""
    if not isinstance(like, np.ndarray) and hasattr(like, "new_empty"):
        import torch
        return like.new_empty(shape, dtype=torch.float32 if float32 else like.dtype)
    return np.empty(shape, dtype=np.float32 if float32 else like.dtype)


def _is_numpy_bfloat16(a):
    """ml_dtypes.bfloat16 (JAX's, and others'): NumPy knows it only as a user dtype."""
    return isinstance(a, np.ndarray) and a.dtype.name == "bfloat16" and a.dtype.itemsize == 2


def _arrays(**arrays):
    """q, k, v, … must be arrays (NumPy, torch, anything with DLPack or the buffer protocol)."""
    for name, a in arrays.items():
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            raise TypeError(f"{name} must be a NumPy array or a torch tensor, got {type(a).__name__}")
        # Named before any output is allocated in its dtype. (uint16 is how the binding
        # receives ml_dtypes' bfloat16 bits: refused from callers.)
        dtype = str(a.dtype).replace("torch.", "")
        if dtype not in ("float32", "bfloat16", "float16"):
            raise TypeError(f"{name} must be float32, bfloat16 or float16, got {dtype}")


def _bits(a):
    """What the binding reads: the array itself, or an ml_dtypes bfloat16 array's bits as a
    uint16 view of the same memory (NumPy exports no bfloat16 through DLPack or buffers)."""
    return a.view(np.uint16) if _is_numpy_bfloat16(a) else a


def _writable(a, name):
    """Outputs must be writable arrays (nanobind's own error for a read-only one is vague)."""
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        raise ValueError(f"{name} is read-only: qkv writes its result there")
    return a


def _index_array(x, name):
    """Small index arrays (kv_len, cu_seqlens) as contiguous int32, checked."""
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.size and (a.min() < -2**31 or a.max() >= 2**31):
        raise ValueError(f"{name} holds values outside int32")
    return np.ascontiguousarray(a, dtype=np.int32)


def _options(q, causal, window, kv_len, bias, alibi, softcap, scale, cu_seqlens_q, cu_seqlens_k,
             layout, sinks=None, dropout=(0.0, 0, 0)):
    if layout not in _LAYOUTS:
        raise ValueError(f'layout must be "bhtd" or "bthd", got {layout!r}')
    try:
        left, right = (int(w) for w in window)
    except (TypeError, ValueError):
        raise ValueError(f"window must be a pair (left, right) of ints, -1 for no limit; got {window!r}")
    if scale is not None and float(scale) == 0.0:
        raise ValueError("scale must be nonzero (None means 1/sqrt(head dim))")
    o = _qkv._AttentionOptions()
    o.causal = bool(causal)
    o.window_left, o.window_right = left, right
    o.softcap = float(softcap)
    o.scale = 0.0 if scale is None else float(scale)
    o.layout = layout
    if kv_len is not None:
        o.kv_len = _index_array(kv_len, "kv_len")
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k go together")
    if cu_seqlens_q is not None:
        o.cu_seqlens_q = _index_array(cu_seqlens_q, "cu_seqlens_q")
        o.cu_seqlens_k = _index_array(cu_seqlens_k, "cu_seqlens_k")
    if bias is not None:
        o.bias = bias
    if alibi is not None:
        o.alibi = np.ascontiguousarray(np.asarray(alibi, dtype=np.float32).reshape(-1))
    if sinks is not None:
        if hasattr(sinks, "detach"):  # a torch tensor: its float32 values (no gradient here)
            sinks = sinks.detach().float().contiguous().numpy()
        o.sinks = np.ascontiguousarray(np.asarray(sinks, dtype=np.float32).reshape(-1))
    o.dropout_p, o.dropout_seed, o.dropout_offset = _dropout(*dropout)
    return o


def _dropout(p, seed, offset):
    """(p, seed, offset) checked: p in [0, 1], seed any int (taken mod 2^64; required with
    p > 0), offset in [0, 2^32)."""
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout_p must be in [0, 1], got {p}")
    if seed is None:
        if p > 0:
            raise ValueError("dropout_p > 0 needs dropout_seed (an int; pass attention_backward "
                             "the same seed and offset)")
        seed = 0
    offset = int(offset)
    if not 0 <= offset < 2**32:
        raise ValueError(f"dropout_offset must be in [0, 2^32), got {offset}")
    return p, int(seed) % 2**64, offset


def dropout_mask(shape, p, seed, offset=0, batch_offset=0):
    """The mask attention's dropout applies: a bool array of shape (B, H, Tq, Tk), True where
    weight (b, h, i, j) is kept (then scaled by 1/(1 - p)), False where it is dropped.

    For the same (p, seed, offset) as qkv.attention's dropout_p, dropout_seed and
    dropout_offset: with it, the formula softmax(q kᵀ · scale) ∘ mask / (1 - p) · v can be
    written out elsewhere (a test's float64 autograd, say). batch_offset: batch b draws the mask
    of batch b + batch_offset.
    """
    B, H, Tq, Tk = (int(x) for x in shape)
    p, seed, offset = _dropout(p, seed, offset)
    keep = _qkv._dropout_mask(p, seed, offset, int(batch_offset), B, H, Tq, Tk)
    return np.frombuffer(keep, dtype=np.uint8).reshape(B, H, Tq, Tk).astype(bool)


def _lse_shape(q, layout, packed):
    """[batch, heads, seq] (or [heads, total] for a packed batch) from q's shape."""
    if packed:
        t, h = (q.shape[0], q.shape[1]) if layout == "bthd" else (q.shape[1], q.shape[0])
        return (h, t)
    if len(q.shape) != 4:
        raise ValueError(f"q must have 4 dims, got shape {tuple(q.shape)}")
    b = q.shape[0]
    h, t = (q.shape[2], q.shape[1]) if layout == "bthd" else (q.shape[1], q.shape[2])
    return (b, h, t)


def attention(q, k, v, *, causal=False, window=(-1, -1), kv_len=None, bias=None, alibi=None,
              softcap=0.0, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, layout="bhtd",
              return_lse=False, out=None, lse=None, sinks=None, dropout_p=0.0, dropout_seed=None,
              dropout_offset=0):
    """softmax(q kᵀ · scale + bias, masked) v, with qkv's tiled kernel.

    q [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv] for layout "bhtd" (PyTorch's), or
    [B, T, H, D] for "bthd" (flash-attn's); with cu_seqlens_q/k (a packed batch) each is 3-D,
    [total, H, D] ("bthd") or [H, total, D]. float32 NumPy arrays or torch CPU tensors, any
    strides, read in place. Hq must be a multiple of Hkv (grouped-query attention).
    Element types: float32, bfloat16 (torch.bfloat16, ml_dtypes.bfloat16) or float16; k and v
    share one, q may be any, out is q's dtype (the default) or float32. Sums and the softmax in
    float32, the output rounded to nearest even; where bfloat16 runs on the CPU's bf16 dot unit
    (AMD Zen 4/5, Arm: qkv info), P is rounded to bfloat16 for P·V (an output moves by at most
    2^-8 · max|v|) and subnormal bfloat16 inputs read as zero.

    causal: bottom-right aligned (query i sits at key position i + Tk - Tq), as flash-attn.
    window: (left, right) keys visible around that position, -1 for no limit.
    kv_len: [B] keys per batch row (the rest is padding).   bias: additive, broadcastable to
    [B, Hq, Tq, Tk].   alibi: [Hq] slopes.   softcap: tanh capping of the scores (0 = off).
    scale: default 1/sqrt(D).   out, lse: arrays to write into (lse [B, Hq, Tq] float32).
    sinks: [Hq] attention-sink logits (gpt-oss): one more term exp(sinks[h]) in each row's
    softmax denominator, with no value.
    dropout_p: attention dropout (training): each weight kept with probability 1 - dropout_p
    and scaled by 1/(1 - dropout_p), or dropped, after the softmax (lse is the undropped one).
    The mask is a function of (dropout_seed, dropout_offset, batch, head, query, key) alone
    (qkv.dropout_mask gives it): dropout_seed is required with dropout_p > 0, and
    attention_backward takes the same three.

    Returns out, or (out, lse) with return_lse. A query that sees no key gets 0 and lse -inf
    (lse = sinks[h] with sinks).
    """
    _arrays(q=q, k=k, v=v)
    o = _options(q, causal, window, kv_len, bias, alibi, softcap, scale, cu_seqlens_q,
                 cu_seqlens_k, layout, sinks, (dropout_p, dropout_seed, dropout_offset))
    if out is None:
        out = _empty(q, tuple(q.shape[:-1]) + (v.shape[-1],))
    if lse is None and return_lse:
        lse = _empty(q, _lse_shape(q, layout, cu_seqlens_q is not None), float32=True)
    _writable(out, "out")
    if lse is not None:
        _writable(lse, "lse")
    _qkv._attention(_bits(q), _bits(k), _bits(v), _bits(out), lse, o)
    return (out, lse) if return_lse else out


def attention_plan(q, k, v, *, backward=False, causal=False, window=(-1, -1), kv_len=None,
                   bias=None, alibi=None, softcap=0.0, scale=None, layout="bhtd", sinks=None,
                   dropout_p=0.0, dropout_seed=None, dropout_offset=0):
    """What qkv.attention (with backward=True: qkv.attention_backward) runs for these arrays and
    options on this machine, and why, computing nothing: a dict with "kernel" (the tiled
    forward "forward_tiles", split-KV decoding "decode_rows", "backward_tiles", …), "unit" (of
    the Q·K products: "fma", "bf16_dot", "amx"), "values_unit" (of P·V) and "why". The same
    plan the call follows, from the one place qkv chooses its kernels.

    q, k, v and causal, window, kv_len, bias, alibi, softcap, scale, layout, sinks, dropout_p,
    dropout_seed, dropout_offset: as for qkv.attention (packed sequences each run a plan of
    their own: ask for one sequence's arrays).
    """
    _arrays(q=q, k=k, v=v)
    o = _options(q, causal, window, kv_len, bias, alibi, softcap, scale, None, None, layout,
                 sinks, (dropout_p, dropout_seed, dropout_offset))
    kernel, unit, values_unit, why = _qkv._attention_plan(_bits(q), _bits(k), _bits(v), o,
                                                          backward)
    return {"kernel": kernel, "unit": unit, "values_unit": values_unit, "why": why}


def attention_backward(q, k, v, out, lse, dout, *, causal=False, window=(-1, -1), kv_len=None,
                       bias=None, alibi=None, softcap=0.0, scale=None, cu_seqlens_q=None,
                       cu_seqlens_k=None, layout="bhtd", dq=None, dk=None, dv=None, sinks=None,
                       dropout_p=0.0, dropout_seed=None, dropout_offset=0):
    """Gradients (dq, dk, dv) of attention given dout = ∂L/∂out.

    q, k, v and every option as the forward saw them, with the forward's out and lse
    (``attention(..., return_lse=True)``). dq, dk, dv are written into the arrays given, or into
    new ones of q's, k's and v's shapes and dtypes (a given one may be float32 instead); with
    grouped-query heads dk and dv sum over each group. dout is in out's dtype or float32.
    With sinks, returns (dq, dk, dv, dsinks): dsinks [Hq] float32.
    """
    _arrays(q=q, k=k, v=v, out=out, lse=lse, dout=dout)
    o = _options(q, causal, window, kv_len, bias, alibi, softcap, scale, cu_seqlens_q,
                 cu_seqlens_k, layout, sinks, (dropout_p, dropout_seed, dropout_offset))
    dq = _empty(q, tuple(q.shape)) if dq is None else dq
    dk = _empty(k, tuple(k.shape)) if dk is None else dk
    dv = _empty(v, tuple(v.shape)) if dv is None else dv
    for a, name in ((dq, "dq"), (dk, "dk"), (dv, "dv"), (lse, "lse")):
        _writable(a, name)
    dsinks = None if sinks is None else _empty(q, (len(o.sinks),), float32=True)
    _qkv._attention_backward(_bits(q), _bits(k), _bits(v), _bits(out), lse, _bits(dout),
                             _bits(dq), _bits(dk), _bits(dv), o, dsinks)
    return (dq, dk, dv) if sinks is None else (dq, dk, dv, dsinks)
