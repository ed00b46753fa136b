"""The Python API contract: unique ids, launch paths (explicit, environment, mpiexec,
torchrun, none), async work, split, torch tensors.

The rank bodies (async_and_threads, ...) run in every rank of a test's world (harness.py) and
return a JSON report that the test asserts on; launched_sum runs under mpiexec and torchrun."""

import os
import re
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from harness import rank_command, rank_pythonpath, run_world

import ringtree as rt


def test_unique_id_round_trips_through_its_token():
    uid = rt.UniqueId.create()
    token = str(uid)
    assert token.startswith("rt1:127.0.0.1:") and len(token.split(":")[-1]) == 32
    assert rt.UniqueId.parse(token) == uid
    assert rt.UniqueId.create() != uid  # fresh secret and port


@pytest.mark.parametrize(
    "token,needle",
    [
        ("hello", "wrong prefix"),
        ("rt1:127.0.0.1:99999:" + "0" * 32, "port out of range"),
        ("rt1:127.0.0.1:1234:" + "z" * 32, "bad secret"),
        ("rt1:127.0.0.1:1234:abcd", "bad secret"),
    ],
)
def test_bad_unique_id_tokens_are_explained(token, needle):
    with pytest.raises(rt.InvalidArgument, match=needle):
        rt.UniqueId.parse(token)


def test_world_of_one_without_a_launcher(monkeypatch):
    for var in (
        "RINGTREE_RANK",
        "RINGTREE_WORLD_SIZE",
        "RINGTREE_UNIQUE_ID",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_SIZE",
        "MPI_LOCALNRANKS",
        "RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
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


def test_fast_entry_runs_plain_ndarrays_and_declines_the_rest():
    """comm._fast runs a call on plain ndarrays in one C call and returns NotImplemented
    for whatever the Python route must convert or explain; the public call gives the same answer
    either way, and an error raised through the fast entry keeps its class and the communicator."""
    from ringtree._args import COLL_CODES as _COLL

    ar = _COLL["all_reduce"]
    with rt.init(rank=0, size=1) as comm:
        x = np.arange(6, dtype=np.float32)
        out = np.zeros_like(x)
        assert comm._fast(ar, x, out, "sum", 0, -1, "auto", None, False, False, out, -1) is out
        assert np.array_equal(out, x)
        # async: the core's Work, which the Python layer wraps
        out[:] = 0
        comm._fast(ar, x, out, "sum", 0, -1, "auto", None, False, True, out, -1).wait(30.0)
        assert np.array_equal(out, x)
        declined = {
            "list input": ([1.0, 2.0], out[:2], "sum", 0, "auto", None, False),
            "strided input": (x[::2], out[:3], "sum", 0, "auto", None, False),
            "dtype mismatch": (x, np.zeros(6, np.float64), "sum", 0, "auto", None, False),
            "op enum": (x, out, rt.ReduceOp.MAX, 0, "auto", None, False),
            "premul_sum by name": (x, out, "premul_sum", 0, "auto", None, False),
            "algo in capitals": (x, out, "sum", 0, "AUTO", None, False),
            "zero timeout": (x, out, "sum", 0, "auto", 0.0, False),
            "bool timeout": (x, out, "sum", 0, "auto", True, False),
            "int flag": (x, out, "sum", 0, "auto", None, 1),
            "int async flag": (x, out, "sum", 0, "auto", None, False, 1),
            "bool root": (x, out, "sum", True, "auto", None, False),
            "huge root": (x, out, "sum", 2**40, "auto", None, False),
            # A tuple of ints from the caller is not an address: only the Python layer's tagged
            # views of torch tensors are.
            "tuple of ints": ((x.ctypes.data, 6, 6), out, "sum", 0, "auto", None, False),
            "untagged view": (x, (out.ctypes.data, 6, 6), "sum", 0, "auto", None, False),
        }
        for why, (a, o, op, root, algo, timeout, det, *asy) in declined.items():
            asy = asy[0] if asy else False
            assert comm._fast(ar, a, o, op, root, -1, algo, timeout, det, asy, o, -1) is NotImplemented, why
        tagged = (rt._core.HOST_VIEW_TAG, out.ctypes.data, 6, 6)  # float32's code
        assert comm._fast(ar, x, tagged, "sum", 0, -1, "auto", None, False, False, out, -1) is out
        with pytest.raises(rt.InvalidArgument, match="expected an array"):
            comm.all_reduce((x.ctypes.data, 6, 6))
        # The Python route answers those: converted where it can, explained where it cannot.
        assert np.array_equal(comm.all_reduce(x, out, algo="AUTO", deterministic=1), x)
        assert np.array_equal(comm.all_reduce(x, out, op=rt.ReduceOp.MAX, timeout=5), x)
        with pytest.raises(rt.InvalidArgument, match="timeout must be positive"):
            comm.all_reduce(x, out, timeout=0.0)
        with pytest.raises(rt.InvalidArgument, match="dtypes differ"):
            comm.all_reduce(x, np.zeros(6, np.float64))
        # Errors the core raises come through the fast entry as ringtree's own classes.
        with pytest.raises(rt.InvalidArgument, match="root must be in"):
            comm._fast(_COLL["broadcast"], x, None, "sum", 3, -1, "auto", None, False, False, x, -1)
        with pytest.raises(rt.InvalidArgument, match="output"):
            comm._fast(ar, x, np.zeros(5, np.float32), "sum", 0, -1, "auto", None, False, False, None, -1)
        # sendrecv passes its source as the last argument; a bad one is refused by the core.
        with pytest.raises(rt.InvalidArgument, match="peer must differ from this rank"):
            comm._fast(_COLL["sendrecv"], x, out, "sum", 0, 0, "auto", None, False, False, out, 0)
        assert (
            comm._fast(_COLL["sendrecv"], x, out, "sum", 0, 0, "auto", None, False, False, out, True) is NotImplemented
        )
        assert comm.all_reduce(x, out, timeout=7.5) is out and np.array_equal(out, x)  # still usable
    with pytest.raises(rt.Aborted, match="closed"):
        comm._fast(ar, x, out, "sum", 0, -1, "auto", None, False, False, out, -1)


def test_methods_make_the_fast_call_their_python_code_makes():
    """The collective methods are C method descriptors that bind their arguments and make the
    fast entry's call themselves (no Python frame). Each must make exactly the call the method's
    Python code makes, however the arguments are passed, and leave anything else to that code
    without trying the fast entry first."""
    import inspect
    import pydoc
    import sys

    with rt.init(rank=0, size=1) as comm:
        x, out = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
        seen, answers = [], []

        def entry(*args):  # stands in for comm._fast; says who called it
            seen.append((sys._getframe(1).f_code.co_name, args))
            return answers.pop(0)

        def same(a, b):
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                return a is b
            return type(a) is type(b) and a == b

        comm._fast = entry
        # Values apart from the defaults and from each other, so a recipe that swaps or drops one shows.
        taken = [
            ("all_reduce", (x,), {}),
            ("all_reduce", (x, out), {}),
            ("all_reduce", (x,), dict(out=None, op="max", algo="ring", timeout=3.0, deterministic=True)),
            ("all_reduce", (x, out, "min", "tree", False, 2, True), {}),
            ("reduce_scatter", (x, out), {}),
            ("reduce_scatter", (x,), dict(out=out, op="prod", algo="tree", timeout=9, deterministic=True)),
            ("all_gather", (x, out), dict(algo="ring")),
            ("all_to_all", (x,), dict(out=out, timeout=1, algo="direct")),
            ("broadcast", (x,), {}),
            ("broadcast", (x, 2, "oneshot"), {}),
            ("broadcast", (x,), dict(root=3, timeout=None, async_op=False)),
            ("barrier", (), {}),
            ("barrier", (), dict(timeout=4.0)),
            ("send", (x, 5), {}),
            ("send", (x,), dict(peer=0, timeout=2.0)),
            ("recv", (out, 1), {}),
            ("recv", (), dict(x=out, peer=6)),
            ("sendrecv", (x, 1, out, 0), {}),
            ("sendrecv", (x,), dict(dst=1, out=out, src=2, timeout=5)),
        ]
        for name, args, kwargs in taken:
            seen.clear()
            answers[:] = [NotImplemented, "ran"]  # declined by the C call: the Python code calls again
            assert getattr(comm, name)(*args, **kwargs) == "ran", (name, args, kwargs)
            (caller_c, made), (caller_py, expected) = seen
            assert caller_c != name and caller_py == name, (name, seen)
            assert len(made) == len(expected) == 12 and all(map(same, made, expected)), (name, made, expected)
        left = [
            ("broadcast", ([1.0, 2.0],), {}),  # not an ndarray: the Python code reads it
            ("all_reduce", (x, [0.0] * 4), {}),
            ("all_reduce", (x,), dict(async_op=True)),  # its Work is made in Python
            ("all_gather", (x, out), dict(async_op=1)),
        ]

        class Finished:  # what an async call's Work holds
            def is_completed(self):
                return True

        for name, args, kwargs in left:
            seen.clear()
            answers[:] = [Finished()]
            getattr(comm, name)(*args, **kwargs)
            assert [caller for caller, _ in seen] == [name], (name, seen)
        del comm._fast
        with pytest.raises(AttributeError):
            comm.broadcast(x)  # no entry: the Python code's own error
        comm._fast = comm._plain_fast
        # Argument errors are Python's own, worded for the method.
        with pytest.raises(TypeError, match="missing 1 required positional argument: 'x'"):
            comm.broadcast()
        with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
            comm.broadcast(x, bogus=1)
        with pytest.raises(TypeError, match="multiple values for argument 'root'"):
            comm.broadcast(x, 0, root=0)
        with pytest.raises(TypeError, match="takes from 2 to 6 positional arguments"):
            comm.broadcast(x, 0, "auto", False, None, 1)
        # Read from the class or an instance, a method is documented and introspected as written.
        assert inspect.isfunction(rt.Communicator.broadcast)
        assert comm.broadcast.__doc__ == rt.Communicator.broadcast.__doc__
        assert comm.broadcast.__doc__.startswith("Every rank's x receives root's x.")
        assert list(inspect.signature(comm.broadcast).parameters) == ["x", "root", "algo", "async_op", "timeout"]
        assert comm.all_reduce.__name__ == "all_reduce" and comm.all_reduce.__self__ is comm
        assert "Reduce x over all ranks" in pydoc.render_doc(comm.all_reduce)
        with pytest.raises(TypeError):  # only the package makes them: an empty one has no method to call
            type(rt.Communicator.__dict__["broadcast"])()
        assert type(rt.Communicator.__dict__["broadcast"]).__module__ == "ringtree._core"
        # And the real entry runs them, holding no reference to what it was passed.
        assert comm.broadcast(x) is x and comm.all_reduce(x, out) is out and np.array_equal(out, x)
        timeout = 30.0
        held = [sys.getrefcount(o) for o in (x, out, timeout)]
        for _ in range(1000):
            comm.broadcast(x, root=0, timeout=timeout)
            comm.all_reduce(x, out=None, op="max")
            comm.all_gather(x, out, algo="auto")
            comm.all_reduce(x, async_op=True).wait()  # the Python route
        assert [sys.getrefcount(o) for o in (x, out, timeout)] == held


def async_and_threads():
    """async_op returns Work at once; results arrive in call order; wait() re-raises errors;
    a blocking call releases the GIL (a Python thread keeps running while it waits)."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    report = {}
    xs = [np.full(1000, r + k, np.int64) for k in range(5)]
    works = [comm.all_reduce(x, async_op=True) for x in xs]
    results = [w.wait(timeout=30) for w in works]
    report["async_results"] = all(
        np.array_equal(res, np.full(1000, sum(q + k for q in range(P)))) for k, res in enumerate(results)
    )
    report["is_completed"] = all(w.is_completed() for w in works)
    # GIL: rank 0 arrives late; meanwhile the others' threads must keep counting.
    ticks = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    thread = threading.Thread(target=count)
    thread.start()
    if r == 0:
        time.sleep(0.5)
    before = ticks[0]
    comm.barrier()
    during = ticks[0] - before
    stop.set()
    thread.join()
    report["ticks_during_barrier"] = during if r != 0 else None
    # An async collective whose peer disagrees surfaces the error from wait().
    sub = comm.split(0)
    odd = r == P - 1
    w = sub.all_reduce(np.ones(3 if odd else 4, np.float32), async_op=True)
    try:
        w.wait(timeout=30)
        sub.barrier()
        report["async_error"] = None
    except rt.CollectiveMismatch:
        report["async_error"] = "CollectiveMismatch"
    except rt.Error as exc:
        report["async_error"] = f"{type(exc).__name__}: {exc}"
    sub.close()
    comm.close()
    return report


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 4])
def test_async_work_and_gil_release(nranks):
    world = run_world(nranks, async_and_threads, timeout=100)
    for rank, res in enumerate(world.check_ok()):
        assert res["async_results"] and res["is_completed"], res
        assert res["async_error"] == "CollectiveMismatch", res
        if rank != 0:
            assert res["ticks_during_barrier"] > 50, res  # the thread ran while we waited


def split_groups():
    """split(color, key): even and odd ranks form groups ordered by descending key; a rank
    with no color gets None; each group's collectives involve only its members."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    color = None if r == 0 and P > 2 else r % 2
    sub = comm.split(color, key=-r)
    if sub is None:
        comm.barrier()
        comm.close()
        return {"sub": None}
    members = sorted([q for q in range(P) if (q % 2 == r % 2) and not (q == 0 and P > 2)], reverse=True)
    x = np.array([r], np.int64)
    gathered = np.empty(sub.size, np.int64)
    sub.all_gather(x, gathered)
    total = sub.all_reduce(np.array([r], np.int64))
    out = {
        "sub": [sub.rank, sub.size],
        "expected": [members.index(r), len(members)],
        "gathered": gathered.tolist(),
        "members": members,
        "total": int(total[0]),
    }
    sub.close()
    comm.barrier()
    comm.close()
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 5])
def test_split_forms_ordered_independent_groups(nranks):
    world = run_world(nranks, split_groups, timeout=100)
    for rank, res in enumerate(world.check_ok()):
        if rank == 0 and nranks > 2:
            assert res["sub"] is None
            continue
        assert res["sub"] == res["expected"], res
        assert res["gathered"] == res["members"], res
        assert res["total"] == sum(res["members"]), res


def torch_tensors():
    """torch CPU tensors (bfloat16 included) through the same API, against torch's own math."""
    import torch

    comm = rt.init()
    r, P = comm.rank, comm.size
    report = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8):
        t = torch.arange(1000).remainder(7).to(dtype) + r
        want = sum(torch.arange(1000).remainder(7).to(dtype) + q for q in range(P))
        comm.all_reduce(t)
        report[str(dtype)] = bool(torch.equal(t, want))
    t = torch.full((3, 5), float(r))
    out = torch.empty(3 * P, 5)
    comm.all_gather(t, out)
    report["all_gather_2d"] = bool(torch.equal(out, torch.cat([torch.full((3, 5), float(q)) for q in range(P)])))
    try:
        comm.all_reduce(torch.zeros(4, 4).t())
        report["non_contiguous"] = "no error"
    except rt.InvalidArgument as exc:
        report["non_contiguous"] = "ok" if "contiguous" in str(exc) else str(exc)
    # A view past the storage's start, out of place, and an async call (the general route).
    base = torch.arange(10, dtype=torch.int64) + r
    out = torch.zeros(7, dtype=torch.int64)
    comm.all_reduce(base[3:], out)
    report["offset_view"] = bool(torch.equal(out, sum(torch.arange(3, 10, dtype=torch.int64) + q for q in range(P))))
    async_t = torch.full((4,), float(r + 1))
    comm.all_reduce(async_t, async_op=True).wait(timeout=30)
    report["async"] = bool(torch.equal(async_t, torch.full((4,), float(P * (P + 1) // 2))))
    for name, bad, needle in (
        ("dtype_mismatch", (torch.zeros(4), torch.zeros(4, dtype=torch.float64)), "dtypes differ"),
        ("meta_device", (torch.empty(4, device="meta"), None), "meta"),
    ):
        try:
            comm.all_reduce(*bad)
            report[name] = "no error"
        except rt.InvalidArgument as exc:
            report[name] = "ok" if needle in str(exc) else str(exc)
    comm.close()
    return report


@pytest.mark.timeout(120)
def test_torch_cpu_tensors():
    pytest.importorskip("torch", reason="torch is in the test extra; this environment lacks it")
    world = run_world(3, torch_tensors, timeout=100)
    for res in world.check_ok():
        assert all(v is True or v == "ok" for v in res.values()), res


def launched_sum():
    """Started by mpiexec or torchrun: init from the launcher, check a sum, say which launcher."""
    source = "mpi" if os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") else "torchrun"
    comm = rt.init(timeout=60)
    x = np.full(10, comm.rank + 1, np.int64)
    comm.all_reduce(x)
    assert np.all(x == comm.size * (comm.size + 1) // 2), x
    print(f"rank {comm.rank} of {comm.size} ok via {source}", flush=True)
    comm.close()


@pytest.mark.timeout(120)
def test_mpiexec_launch():
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("mpiexec not found: pip install mpich mpi4py (the test extra installs both)")
    pytest.importorskip("mpi4py", reason="mpi4py missing: the test extra installs it")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGTREE_")}
    env["PYTHONPATH"] = rank_pythonpath(launched_sum, env.get("PYTHONPATH"))
    proc = subprocess.run(
        [mpiexec, "-n", "3", *rank_command(launched_sum)], env=env, capture_output=True, text=True, timeout=100
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = sorted(re.findall(r"rank \d+ of \d+ ok via (?:mpi|torchrun)", proc.stdout))
    assert lines == [f"rank {r} of 3 ok via mpi" for r in range(3)], proc.stdout + proc.stderr


@pytest.mark.timeout(120)
def test_torchrun_launch():
    pytest.importorskip("torch", reason="torch is in the test extra; this environment lacks it")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGTREE_")}
    env["PYTHONPATH"] = rank_pythonpath(launched_sum, env.get("PYTHONPATH"))
    script_and_args = rank_command(launched_sum)[1:]  # torchrun starts the script with its own python
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(_free_port()),
            *script_and_args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
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
