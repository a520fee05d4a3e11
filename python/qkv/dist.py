"""qkv.dist: ring attention across the ranks of an mpi4py communicator.

    from mpi4py import MPI
    import qkv.dist
    # each rank holds its shard of one long sequence: q, k, v [B, H, T/P, D]
    out, lse = qkv.dist.ring_attention(q, k, v, MPI.COMM_WORLD, causal=True)
    dq, dk, dv = qkv.dist.ring_attention_backward(q, k, v, out, lse, dout, MPI.COMM_WORLD,
                                                  causal=True)

Run it under ``mpirun -np P python script.py``. Which positions a rank holds is the sharding:
"zigzag" (the default; the sequence in 2P chunks, rank r holds chunks r and 2P-1-r, which
balances a causal mask) or "contiguous" (rank r holds [r T/P, (r+1) T/P)). ``shard`` cuts a
rank's part out of a whole array, ``positions`` lists its global positions. The mask options
(causal, window, kv_len) are the whole sequence's. Needs qkv built with MPI (libopenmpi-dev)
and mpi4py (Debian: python3-mpi4py) over the same MPI.
"""
import numpy as np

from . import _qkv
from ._attention import _arrays, _empty, _lse_shape, _options, _writable

_SHARDINGS = ("zigzag", "contiguous")


def _check_available():
    if not _qkv._has_dist:
        raise ImportError("qkv.dist needs qkv built with MPI: install libopenmpi-dev, then "
                          "reinstall qkv (pip install .)")


def _comm(comm):
    """The communicator's MPI_Comm handle, and its size and rank."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError("qkv.dist takes an mpi4py communicator: pip install mpi4py "
                          "(Debian: apt install python3-mpi4py)") from e
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm must be an mpi4py communicator, got {type(comm).__name__}")
    return MPI._handleof(comm), comm.Get_size(), comm.Get_rank()


def positions(seq_len, rank, ranks, sharding="zigzag"):
    """The global positions rank `rank` of `ranks` holds, in its local order."""
    if sharding not in _SHARDINGS:
        raise ValueError(f'sharding must be "zigzag" or "contiguous", got {sharding!r}')
    pieces = 2 * ranks if sharding == "zigzag" else ranks
    if seq_len < pieces or seq_len % pieces:
        raise ValueError(f"a sequence of {seq_len} positions does not split into {pieces} equal "
                         f"{sharding} chunks")
    c = seq_len // pieces
    if sharding == "contiguous":
        return np.arange(rank * c, (rank + 1) * c)
    return np.concatenate([np.arange(rank * c, (rank + 1) * c),
                           np.arange((2 * ranks - 1 - rank) * c, (2 * ranks - rank) * c)])


def shard(x, rank, ranks, *, dim=2, sharding="zigzag"):
    """Rank `rank`'s part of a whole array `x` (the sequence along `dim`), as a new array."""
    return np.take(np.asarray(x), positions(x.shape[dim], rank, ranks, sharding), axis=dim)


def _seq_len(q, ranks, seq_len, layout):
    local = q.shape[1] if layout == "bthd" else q.shape[2]
    return local * ranks if seq_len is None else int(seq_len)


def ring_attention(q, k, v, comm, *, causal=False, window=(-1, -1), kv_len=None, softcap=0.0,
                   scale=None, layout="bhtd", sharding="zigzag", seq_len=None, out=None, lse=None):
    """This rank's rows of attention over the whole sequence, across the ranks of `comm`.

    q [B, Hq, T/P, D], k and v [B, Hkv, T/P, D] ("bhtd"; "bthd" as qkv.attention): this rank's
    positions of every head. The mask is the whole sequence's: causal, window (left, right),
    kv_len [B] (global positions). Returns (out, lse), both this rank's rows; pass them to
    ring_attention_backward. Every rank of `comm` must call it with the same options.
    """
    _check_available()
    handle, ranks, _ = _comm(comm)
    _arrays(q=q, k=k, v=v)
    o = _options(q, causal, window, kv_len, None, None, softcap, scale, None, None, layout)
    if out is None:
        out = _empty(q, tuple(q.shape[:-1]) + (v.shape[-1],))
    if lse is None:
        lse = _empty(q, _lse_shape(q, layout, False))
    _writable(out, "out")
    _writable(lse, "lse")
    _qkv._ring_attention(q, k, v, out, lse, o, handle, _seq_len(q, ranks, seq_len, layout), sharding)
    return out, lse


def ring_attention_backward(q, k, v, out, lse, dout, comm, *, causal=False, window=(-1, -1),
                            kv_len=None, softcap=0.0, scale=None, layout="bhtd",
                            sharding="zigzag", seq_len=None, dq=None, dk=None, dv=None):
    """Gradients (dq, dk, dv) of this rank's rows, given the forward's out and lse and
    dout = ∂L/∂out at this rank's rows; options as the forward's."""
    _check_available()
    handle, ranks, _ = _comm(comm)
    _arrays(q=q, k=k, v=v, out=out, lse=lse, dout=dout)
    o = _options(q, causal, window, kv_len, None, None, softcap, scale, None, None, layout)
    dq = _empty(q, tuple(q.shape)) if dq is None else dq
    dk = _empty(k, tuple(k.shape)) if dk is None else dk
    dv = _empty(v, tuple(v.shape)) if dv is None else dv
    for a, name in ((dq, "dq"), (dk, "dk"), (dv, "dv"), (lse, "lse")):
        _writable(a, name)
    _qkv._ring_attention_backward(q, k, v, out, lse, dout, dq, dk, dv, o, handle,
                                  _seq_len(q, ranks, seq_len, layout), sharding)
    return dq, dk, dv
