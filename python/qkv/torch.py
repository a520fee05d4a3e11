"""qkv's attention for PyTorch: an autograd Function and drop-ins for PyTorch's and flash-attn's.

    import qkv.torch
    out = qkv.torch.attention(q, k, v, causal=True)        # differentiable, any strides
    from qkv.torch import scaled_dot_product_attention     # torch.nn.functional's signature
    from qkv.torch import flash_attn_func, flash_attn_varlen_func   # flash-attn's, on a CPU
    from qkv.torch import create_block_mask, flex_attention        # FlexAttention's, with a backward

The kernels read and write float32, bfloat16 and float16 tensors in place (no conversion copy),
computing in float32 and rounding 16-bit outputs to nearest even; outputs and gradients come
back in their inputs' dtype. The drop-ins also take float64, as the originals do (converted to
float32 and back). CPU tensors only. Gradients flow to q, k and v; an additive mask or bias is
a constant (no gradient).
"""
import math

import torch

from . import _attention, _qkv


class AttentionFunction(torch.autograd.Function):
    """out, lse = attention(q, k, v) with qkv's forward, and qkv's backward for dq, dk, dv."""

    @staticmethod
    def forward(ctx, q, k, v, options, lse_shape, keep_alive=None, sinks=None, score_grads=None,
                *score_tensors):
        # (sinks: the tensor options.sinks holds a float32 copy of, for its gradient;
        # score_tensors: the float tensors a score function reads, and score_grads the float32
        # buffers the backward writes their gradients to, None for those without one.)
        out = q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],))
        lse = torch.empty(lse_shape, dtype=torch.float32)
        _qkv._attention(q.detach(), k.detach(), v.detach(), out, lse, options)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = options
        ctx.keep_alive = keep_alive  # what options points at (a BlockMask), until the backward
        ctx.sinks = sinks
        ctx.score_grads = score_grads or ()
        ctx.score_tensors = [(t.shape, t.dtype) for t in score_tensors]
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dsinks = None
        if ctx.sinks is not None and ctx.needs_input_grad[6]:
            dsinks = torch.empty(ctx.sinks.numel(), dtype=torch.float32)
        _qkv._attention_backward(q.detach(), k.detach(), v.detach(), out, lse, dout.detach(), dq, dk, dv,
                                 ctx.options, dsinks)
        if dsinks is not None:
            dsinks = dsinks.view(ctx.sinks.shape).to(ctx.sinks.dtype)
        # (Copies: the buffers are written again if this backward runs again.)
        score = tuple(None if g is None else g.view(shape).to(dtype, copy=True)
                      for g, (shape, dtype) in zip(ctx.score_grads, ctx.score_tensors))
        return (dq, dk, dv, None, None, None, dsinks, None) + score


def _check_cpu(*tensors):
    for t in tensors:
        if t is not None and t.device.type != "cpu":
            raise ValueError(f"qkv runs on the CPU; got a tensor on {t.device}")


def attention(q, k, v, *, causal=False, window=(-1, -1), kv_len=None, bias=None, alibi=None,
              softcap=0.0, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, layout="bhtd",
              return_lse=False, sinks=None):
    """qkv.attention on torch tensors, differentiable in q, k and v (float32, bfloat16 or
    float16; k and v of one dtype; CPU), and in sinks ([Hq] attention-sink logits, gpt-oss's:
    one more term in each row's softmax denominator, with no value) when they are given."""
    _check_cpu(q, k, v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in _KERNEL_DTYPES:
            raise TypeError(f"{name} must be float32, bfloat16 or float16, got "
                            f"{str(t.dtype).replace('torch.', '')}")
    if bias is not None:
        bias = bias.detach()
    if sinks is not None:
        _check_cpu(sinks)
        if not sinks.is_floating_point():
            raise TypeError(f"sinks must be floating-point, got {str(sinks.dtype).replace('torch.', '')}")
    o = _attention._options(q, causal, window, kv_len, bias, alibi, softcap, scale, cu_seqlens_q,
                            cu_seqlens_k, layout, sinks)
    lse_shape = _attention._lse_shape(q, layout, cu_seqlens_q is not None)
    out, lse = AttentionFunction.apply(q, k, v, o, lse_shape, None, sinks)
    return (out, lse) if return_lse else out


_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_FLOATS = _KERNEL_DTYPES + (torch.float64,)


def _as_kernel_dtype(*tensors):
    """The drop-ins take the dtypes the originals take: float32, bfloat16 and float16 as they
    are (read in place), float64 through a float32 copy (the kernels have no float64)."""
    dtype = tensors[0].dtype
    for t in tensors:
        if t.dtype not in _FLOATS:
            raise TypeError(f"attention needs floating-point tensors, got {str(t.dtype).replace('torch.', '')}")
        if t.dtype != dtype:
            raise TypeError(f"q, k and v must have the same dtype, got {tensors[0].dtype}, {t.dtype}")
    return dtype, [t.float() if t.dtype == torch.float64 else t for t in tensors]


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention, computed by qkv.

    query [..., L, E], key [..., S, E], value [..., S, Ev], with 3 or 4 dims (batch, heads);
    attn_mask boolean (True = may attend) or additive, broadcastable to [..., L, S];
    is_causal is PyTorch's top-left causal mask. Differences: dropout is not supported
    (dropout_p > 0 is an error); a query that may attend to nothing gets 0, not NaN.
    """
    if dropout_p > 0:
        raise ValueError("qkv.torch.scaled_dot_product_attention: dropout_p > 0 is not supported "
                         "(qkv has no dropout); use dropout_p=0.0, e.g. in eval mode")
    if attn_mask is not None and is_causal:
        raise ValueError("scaled_dot_product_attention: attn_mask must be None when is_causal=True")
    _check_cpu(query, key, value, attn_mask)
    if query.dim() != key.dim() or query.dim() != value.dim() or query.dim() not in (3, 4):
        raise ValueError(f"query, key and value must all have 3 or 4 dims, got {query.dim()}, {key.dim()}, {value.dim()}")
    dtype, (q, k, v) = _as_kernel_dtype(query, key, value)
    squeeze = q.dim() == 3
    if squeeze:  # [N, L, E]: one head
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
    Hq, Hkv = q.shape[1], k.shape[1]
    if Hq != Hkv and not enable_gqa:
        raise ValueError(f"query has {Hq} heads but key and value {Hkv}: pass enable_gqa=True "
                         "for grouped-query attention")
    L, S = q.shape[2], k.shape[2]
    bias, window = None, (-1, -1)
    if attn_mask is not None:
        m = attn_mask
        if m.dtype == torch.bool:
            m = torch.zeros(m.shape, dtype=torch.float32).masked_fill_(~m, -math.inf)
        elif m.dtype != torch.float32:
            m = m.float()
        while m.dim() < 2:
            m = m.unsqueeze(0)
        if m.dim() == 3 and squeeze:
            m = m.unsqueeze(1)
        bias = m
    elif is_causal:
        # PyTorch's causal mask is top-left (key j visible to query i when j <= i); qkv's is
        # bottom-right (j <= i + S - L). They agree for L == S; for L > S a window moves the
        # diagonal; for L < S the mask is built.
        if L >= S:
            window = (-1, L - S)
        else:
            bias = torch.zeros(L, S).masked_fill_(torch.ones(L, S, dtype=torch.bool).triu_(1), -math.inf)
    out = attention(q, k, v, causal=is_causal and L == S and attn_mask is None, window=window,
                    bias=bias, scale=scale)
    if squeeze:
        out = out.squeeze(1)
    return out if out.dtype == dtype else out.to(dtype)


def _alibi_slopes(alibi_slopes, heads):
    if alibi_slopes is None:
        return None
    s = alibi_slopes.detach().float()
    if s.dim() == 2:  # flash-attn also takes [batch, heads]: qkv has one set of slopes
        if not torch.equal(s, s[:1].expand_as(s)):
            raise ValueError("qkv takes one ALiBi slope per head: the rows of alibi_slopes [batch, heads] must be equal")
        s = s[0]
    if s.shape != (heads,):
        raise ValueError(f"alibi_slopes must be [{heads}] (one per query head), got {tuple(alibi_slopes.shape)}")
    return s.contiguous()


def _flash(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
           return_attn_probs, heads_dim, cu_q=None, cu_k=None):
    if dropout_p > 0:
        raise ValueError("qkv.torch.flash_attn_func: dropout_p > 0 is not supported (qkv has no dropout)")
    _check_cpu(q, k, v)
    dtype, (qk, kk, vk) = _as_kernel_dtype(q, k, v)
    out, lse = attention(qk, kk, vk, causal=causal, window=window_size, softcap=softcap,
                         scale=softmax_scale, alibi=_alibi_slopes(alibi_slopes, q.shape[heads_dim]),
                         cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, layout="bthd", return_lse=True)
    out = out if out.dtype == dtype else out.to(dtype)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn.flash_attn_func on a CPU: q [batch, seq, heads, dim], k and v
    [batch, seq_k, kv_heads, dim]; causal aligned bottom-right, as flash-attn does.
    return_attn_probs gives (out, softmax_lse [batch, heads, seq], None). qkv's backward is
    deterministic whatever `deterministic` says."""
    return _flash(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs, heads_dim=2)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                           block_table=None):
    """flash_attn.flash_attn_varlen_func on a CPU: sequences packed along the first dim,
    q [total_q, heads, dim], k and v [total_k, kv_heads, dim], cu_seqlens_q/k int32
    [num_seqs + 1]. max_seqlen_q/k are accepted and not needed. return_attn_probs gives
    (out, softmax_lse [heads, total_q], None)."""
    if block_table is not None:
        raise ValueError("flash_attn_varlen_func: block_table (a paged KV cache) is not supported")
    cu_q = cu_seqlens_q.detach().cpu() if torch.is_tensor(cu_seqlens_q) else cu_seqlens_q
    cu_k = cu_seqlens_k.detach().cpu() if torch.is_tensor(cu_seqlens_k) else cu_seqlens_k
    return _flash(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs, heads_dim=1, cu_q=cu_q, cu_k=cu_k)


# ---- FlexAttention's mask functions ----------------------------------------------------------

class BlockMask:
    """What create_block_mask made: the mask function as qkv's expression (``text``), and per
    block of BLOCK_SIZE queries the key blocks that are full (every pair visible) and partial
    (the function evaluated pair by pair in the kernel); empty blocks are never read.
    ``shape`` is (B, H, Q_LEN, KV_LEN); ``bytes`` and ``build_seconds`` say what it cost."""

    def __init__(self, blocks, mask_mod):
        self._blocks = blocks
        self.mask_mod = mask_mod

    shape = property(lambda self: tuple(self._blocks.shape))
    BLOCK_SIZE = property(lambda self: self._blocks.block)
    text = property(lambda self: self._blocks.text)
    bytes = property(lambda self: self._blocks.bytes)
    build_seconds = property(lambda self: self._blocks.build_seconds)

    def sparsity(self):
        """The percentage of (query, key) pairs the mask hides, as PyTorch's BlockMask says it
        by blocks (here counted by pairs)."""
        B, H, Q, K = self.shape
        return 100.0 * (1 - self._blocks.visible_pairs / (B * H * Q * K))

    def key_blocks(self, b, h, q_block):
        """(full, partial): the key blocks of query block q_block for batch b and head h,
        ascending."""
        return self._blocks.key_blocks_of(b, h, q_block)

    def __repr__(self):
        return f"BlockMask(shape={self.shape}, BLOCK_SIZE={self.BLOCK_SIZE}, mask={self.text!r})"


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device="cpu", BLOCK_SIZE=128, _compile=False):
    """torch.nn.attention.flex_attention.create_block_mask on a CPU.

    mask_mod(b, h, q_idx, kv_idx) -> bool tensor, as written for PyTorch: traced once with
    torch.fx into qkv's expression form (integer arithmetic with // and %, comparisons, & | ~,
    torch.where, minimum/maximum, abs, indexing captured integer tensors). Python control flow on
    its arguments, .item(), math.* or an operation the form cannot express is a ValueError naming
    it. B or H None: 1, one mask for every batch (head), when the function does not read b (h).
    Indices mean what they mean in PyTorch: q_idx 0 … Q_LEN − 1, kv_idx 0 … KV_LEN − 1. An index
    outside a captured tensor is a ValueError naming it; x // 0 = 0 and x % 0 = x."""
    from . import _mask_trace
    if str(device) != "cpu":
        raise ValueError(f"qkv runs on the CPU; create_block_mask got device={device!r}")
    text, tensors, _ = _mask_trace.trace(mask_mod)
    blocks = _qkv._create_block_mask(text, tensors, 1 if B is None else int(B),
                                      1 if H is None else int(H), int(Q_LEN), int(KV_LEN),
                                      int(BLOCK_SIZE))
    return BlockMask(blocks, mask_mod)


def _score_function(score_mod):
    """score_mod traced into qkv's score function: (the C++ object, the captured float tensors,
    the float32 buffers their gradients go to: one for each that requires grad, else None)."""
    from . import _mask_trace
    text, ints, floats = _mask_trace.trace(score_mod, score=True)
    names, values, tensors, grads = [], [], [], []
    for name, t in floats:
        _check_cpu(t)
        names.append(name)
        values.append(t.detach().to(torch.float32).contiguous())
        grads.append(torch.zeros(values[-1].shape, dtype=torch.float32) if t.requires_grad else None)
        tensors.append(t)
    return _qkv._score_function(text, names, values, grads, ints), tensors, grads


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                   return_lse=False, kernel_options=None, sinks=None):
    """torch.nn.attention.flex_attention.flex_attention on a CPU, forward and backward (through
    autograd) with qkv's tiled kernels; no compilation step.

    query [B, Hq, L, E], key [B, Hkv, S, E], value [B, Hkv, S, Ev] (float32, bfloat16 or float16;
    float64 through float32); block_mask from create_block_mask (None: every pair visible).
    score_mod(score, b, h, q_idx, kv_idx) -> score, as written for PyTorch: traced at each call
    with torch.fx into qkv's expression form (create_block_mask's, with float arithmetic, /,
    exp, log, tanh, sigmoid, sqrt and captured float tensors); captured tensors that require
    grad get their gradients through autograd. An operation the form cannot express is a
    ValueError naming it. return_lse also gives the log-sum-exp [B, Hq, L] (natural log). A
    query that sees no key gets 0 and lse -inf. qkv's own addition: sinks, [Hq] attention-sink
    logits (gpt-oss's), differentiable, as qkv.torch.attention takes them."""
    _check_cpu(query, key, value)
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError(f"flex_attention: query, key and value must have 4 dims [B, H, L, E], "
                         f"got {query.dim()}, {key.dim()}, {value.dim()}")
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError(f"flex_attention: query has {query.shape[1]} heads but key and value "
                         f"{key.shape[1]}: pass enable_gqa=True for grouped-query attention")
    dtype, (q, k, v) = _as_kernel_dtype(query, key, value)
    if sinks is not None:
        _check_cpu(sinks)
        if not sinks.is_floating_point():
            raise TypeError(f"sinks must be floating-point, got {str(sinks.dtype).replace('torch.', '')}")
    o = _attention._options(q, False, (-1, -1), None, None, None, 0.0, scale, None, None, "bhtd",
                            sinks)
    if block_mask is not None:
        if not isinstance(block_mask, BlockMask):
            raise TypeError("flex_attention: block_mask must come from qkv.torch.create_block_mask")
        o.block_mask = block_mask._blocks
    keep_alive, score_grads, score_tensors = block_mask, None, ()
    if score_mod is not None:
        fn, tensors, score_grads = _score_function(score_mod)
        o.score_mod = fn.function
        keep_alive, score_tensors = (block_mask, fn), tuple(tensors)
    lse_shape = _attention._lse_shape(q, "bhtd", False)
    out, lse = AttentionFunction.apply(q, k, v, o, lse_shape, keep_alive, sinks, score_grads,
                                       *score_tensors)
    out = out if out.dtype == dtype else out.to(dtype)
    return (out, lse) if return_lse else out
