"""qkv.dist under mpirun: ring attention over an mpi4py communicator against the float64
oracle on the whole sequence (conftest.reference), forward and backward, on 2 and 3 ranks."""
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qkv
import qkv.dist

# Each rank builds the whole problem from one seed, runs the ring on its shard and compares
# its rows with the oracle's; rank 0 prints "ok" when every rank passed.
SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import torch
    from mpi4py import MPI
    sys.path.insert(0, sys.argv[1])
    from conftest import reference
    import qkv.dist

    comm = MPI.COMM_WORLD
    rank, P = comm.Get_rank(), comm.Get_size()
    failures = []
    cases = [dict(causal=True, Hkv=2, sharding="zigzag", window=(-1, -1)),
             dict(causal=True, Hkv=4, sharding="contiguous", window=(7, -1)),
             dict(causal=False, Hkv=1, sharding="zigzag", window=(-1, -1))]
    for n, c in enumerate(cases):
        rng = np.random.default_rng(n)
        B, H, T, D = 2, 4, 12 * P, 16
        q = rng.standard_normal((B, H, T, D)).astype(np.float32)
        k = rng.standard_normal((B, c["Hkv"], T, D)).astype(np.float32)
        v = rng.standard_normal((B, c["Hkv"], T, D)).astype(np.float32)
        dout = rng.standard_normal((B, H, T, D)).astype(np.float32)
        tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
        ref_out, ref_lse = reference(tq, tk, tv, causal=c["causal"], window=c["window"])
        (ref_out * torch.tensor(dout).double()).sum().backward()
        part = lambda x: qkv.dist.shard(x, rank, P, sharding=c["sharding"])
        opts = dict(causal=c["causal"], window=c["window"], sharding=c["sharding"])
        out, lse = qkv.dist.ring_attention(part(q), part(k), part(v), comm, **opts)
        dq, dk, dv = qkv.dist.ring_attention_backward(part(q), part(k), part(v), out, lse,
                                                      part(dout), comm, **opts)
        for name, got, want in (("out", out, ref_out.detach().numpy()),
                                ("lse", lse, ref_lse.detach().numpy()),
                                ("dq", dq, tq.grad.numpy()), ("dk", dk, tk.grad.numpy()),
                                ("dv", dv, tv.grad.numpy())):
            want = part(want)
            err = np.abs(got - want).max() / np.abs(want).max()
            if not err < 1e-5:
                failures.append(f"case {n} {name}: relative error {err:.2e} on rank {rank}")
    everyone = comm.gather(failures, root=0)
    if rank == 0:
        bad = [f for fs in everyone for f in fs]
        print("\\n".join(bad) if bad else "ok")
""")

HERE = os.path.dirname(os.path.abspath(__file__))


def run_ranks(tmp_path, ranks):
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun not found: scripts/install-deps installs openmpi-bin"
    assert qkv._qkv._has_dist, "qkv was built without MPI (libopenmpi-dev)"
    script = tmp_path / "ring.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               QKV_NUM_THREADS="1", OMP_NUM_THREADS="1")
    return subprocess.run([mpirun, "--oversubscribe", "--mca", "btl", "self,vader", "-np", str(ranks),
                           sys.executable, str(script), HERE], capture_output=True, text=True,
                          env=env, timeout=240)


@pytest.mark.parametrize("ranks", [2, 3])
def test_ring_attention_matches_the_oracle(tmp_path, ranks):
    r = run_ranks(tmp_path, ranks)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "ok", r.stdout + r.stderr


def test_shard_and_positions():
    assert list(qkv.dist.positions(12, 1, 3)) == [2, 3, 8, 9]
    assert list(qkv.dist.positions(12, 1, 3, "contiguous")) == [4, 5, 6, 7]
    x = np.arange(2 * 12).reshape(2, 12)
    assert np.array_equal(qkv.dist.shard(x, 0, 2, dim=1), x[:, [0, 1, 2, 9, 10, 11]])
    whole = np.sort(np.concatenate([qkv.dist.positions(24, r, 4) for r in range(4)]))
    assert np.array_equal(whole, np.arange(24))
    with pytest.raises(ValueError, match="does not split into 6 equal zigzag"):
        qkv.dist.positions(10, 0, 3)
    with pytest.raises(ValueError, match="sharding must be"):
        qkv.dist.positions(12, 0, 3, "striped")


def test_errors_name_the_problem():
    from mpi4py import MPI
    q = np.zeros((1, 2, 8, 4), np.float32)
    with pytest.raises(TypeError, match="mpi4py communicator"):
        qkv.dist.ring_attention(q, q, q, "world")
    with pytest.raises(ValueError, match="does not split into 2 equal zigzag"):
        qkv.dist.ring_attention(q[:, :, :1], q[:, :, :1], q[:, :, :1], MPI.COMM_SELF)
    with pytest.raises(ValueError, match="ALiBi|sharding"):
        qkv.dist.ring_attention(q, q, q, MPI.COMM_SELF, sharding="striped")
