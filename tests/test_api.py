"""The Python API contract: unique ids, launch paths (explicit, environment, mpiexec,
torchrun, none), async work, split, torch tensors."""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import ringtree as rt
from harness import run_world

HERE = os.path.dirname(os.path.abspath(__file__))


def test_unique_id_round_trips_through_its_token():
    uid = rt.UniqueId.create()
    token = str(uid)
    assert token.startswith("rt1:127.0.0.1:") and len(token.split(":")[-1]) == 32
    assert rt.UniqueId.parse(token) == uid
    assert rt.UniqueId.create() != uid  # fresh secret and port


@pytest.mark.parametrize("token,needle", [
    ("hello", "wrong prefix"), ("rt1:127.0.0.1:99999:" + "0" * 32, "port out of range"),
    ("rt1:127.0.0.1:1234:" + "z" * 32, "bad secret"), ("rt1:127.0.0.1:1234:abcd", "bad secret"),
])
def test_bad_unique_id_tokens_are_explained(token, needle):
    with pytest.raises(rt.InvalidArgument, match=needle):
        rt.UniqueId.parse(token)


def test_world_of_one_without_a_launcher(monkeypatch):
    for var in ("RINGTREE_RANK", "RINGTREE_WORLD_SIZE", "RINGTREE_UNIQUE_ID", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                "PMIX_SIZE", "MPI_LOCALNRANKS", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with rt.init() as comm:
        assert (comm.rank, comm.size) == (0, 1)
        x = np.arange(5, dtype=np.float64)
        out = np.empty_like(x)
        assert comm.all_reduce(x, out, op="avg") is out and np.array_equal(out, x)
        g = np.empty(5, np.float64)
        comm.gather(x, g)
        assert np.array_equal(g, x)
        comm.barrier()
    with pytest.raises(rt.Aborted, match="closed"):
        comm.barrier()


def test_init_explains_incomplete_arguments_and_environment(monkeypatch):
    with pytest.raises(rt.InvalidArgument, match="rank and size together"):
        rt.init(rank=0)
    with pytest.raises(rt.InvalidArgument, match="needs unique_id"):
        rt.init(rank=0, size=2)
    monkeypatch.setenv("RINGTREE_RANK", "0")
    monkeypatch.setenv("RINGTREE_WORLD_SIZE", "2")
    monkeypatch.delenv("RINGTREE_UNIQUE_ID", raising=False)
    with pytest.raises(rt.InvalidArgument, match="RINGTREE_UNIQUE_ID not set"):
        rt.init()


def test_reduce_ops_accept_strings_enums_and_premul():
    with rt.init(rank=0, size=1) as comm:
        x = np.array([1.0, 2.0], np.float32)
        assert np.array_equal(comm.all_reduce(x.copy(), op=rt.ReduceOp.MAX), x)
        assert np.array_equal(comm.all_reduce(x.copy(), op=rt.premul_sum(3.0)), x * 3)
        with pytest.raises(rt.InvalidArgument, match="premul_sum"):
            comm.all_reduce(x, op=rt.ReduceOp.PREMUL_SUM)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 4])
def test_async_work_and_gil_release(nranks):
    world = run_world(nranks, "async_and_threads", timeout=100)
    for rank, res in enumerate(world.check_ok()):
        assert res["async_results"] and res["is_completed"], res
        assert res["async_error"] == "CollectiveMismatch", res
        if rank != 0:
            assert res["ticks_during_barrier"] > 50, res  # the thread ran while we waited


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 5])
def test_split_forms_ordered_independent_groups(nranks):
    world = run_world(nranks, "split_groups", timeout=100)
    for rank, res in enumerate(world.check_ok()):
        if rank == 0 and nranks > 2:
            assert res["sub"] is None
            continue
        assert res["sub"] == res["expected"], res
        assert res["gathered"] == res["members"], res
        assert res["total"] == sum(res["members"]), res


@pytest.mark.timeout(120)
def test_torch_cpu_tensors():
    pytest.importorskip("torch", reason="torch is in the test extra; this environment lacks it")
    world = run_world(3, "torch_tensors", timeout=100)
    for res in world.check_ok():
        assert all(v is True or v == "ok" for v in res.values()), res


@pytest.mark.timeout(120)
def test_mpiexec_launch():
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("mpiexec not found: pip install mpich mpi4py (the test extra installs both)")
    pytest.importorskip("mpi4py", reason="mpi4py missing: the test extra installs it")
    script = os.path.join(HERE, "mpi_program.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGTREE_")}
    proc = subprocess.run([mpiexec, "-n", "3", sys.executable, script], env=env, capture_output=True, text=True,
                          timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = sorted(re.findall(r"rank \d+ of \d+ ok via (?:mpi|torchrun)", proc.stdout))
    assert lines == [f"rank {r} of 3 ok via mpi" for r in range(3)], proc.stdout + proc.stderr


@pytest.mark.timeout(120)
def test_torchrun_launch():
    pytest.importorskip("torch", reason="torch is in the test extra; this environment lacks it")
    script = os.path.join(HERE, "mpi_program.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGTREE_")}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", str(_free_port()), script], env=env, capture_output=True, text=True,
                          timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = sorted(re.findall(r"rank \d+ of \d+ ok via (?:mpi|torchrun)", proc.stdout))
    assert lines == [f"rank {r} of 2 ok via torchrun" for r in range(2)], proc.stdout + proc.stderr


def _free_port():
    """A port p with p + 1 also free: torchrun takes p, ringtree's rank 0 takes p + 1."""
    import socket
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")
