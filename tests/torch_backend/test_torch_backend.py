"""The "ringtree" torch.distributed backend: every collective against Gloo on the same
inputs in the same processes, the three rendezvous paths, and errors that surface as
exceptions (never hangs).

The rank bodies (collectives_vs_gloo, rendezvous, errors, kill_during_ddp) run in every rank of
a test's world (harness.py) and return a JSON report that the test asserts on. The collective
checks run every torch.distributed call twice in the same processes, once on the ringtree group
and once on a Gloo group, with the same inputs, and compare."""

import datetime
import os
import signal
import socket
import subprocess
import sys
import time
import zlib

import pytest

pytest.importorskip("torch")

from harness import run_world  # noqa: E402
from torch_group import finish_group, init_group  # noqa: E402


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_importing_ringtree_does_not_import_torch():
    code = "import sys, ringtree, ringtree.bucketing; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_importing_ringtree_torch_registers_the_backend():
    code = (
        "import torch.distributed as dist, ringtree.torch; "
        "assert 'ringtree' in dist.Backend.backend_list; "
        "assert dist.Backend.default_device_backend_map.get('cpu') in ('gloo', 'ringtree'); "
        "assert dist.Backend.backend_capability['ringtree'] == ['cpu', 'cuda']"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _error_name(exc):
    return type(exc).__name__


def collectives_vs_gloo(large=1 << 20):
    import torch
    import torch.distributed as dist

    r, P = init_group()
    gloo = dist.new_group(backend="gloo")
    ours = dist.group.WORLD
    failures, checked = [], []

    def inputs(case, n, dtype, low=-3, high=4, rank=None):
        # crc32, not hash(): string hashes differ between processes.
        g = torch.Generator().manual_seed(1000 * (r if rank is None else rank) + zlib.crc32(repr(case).encode()) % 1000)
        if dtype == torch.bool:
            return torch.randint(0, 2, (n,), generator=g).bool()
        if dtype.is_complex:
            return torch.randint(low, high, (n, 2), generator=g).float().view(dtype).reshape(n)
        if not dtype.is_signed and not dtype.is_floating_point:
            low = 0
        return torch.randint(low, high, (n,), generator=g).to(dtype)

    def compare(case, got, want, exact=True):
        checked.append(case)
        got = list(got) if isinstance(got, (list, tuple)) else [got]
        want = list(want) if isinstance(want, (list, tuple)) else [want]
        for a, b in zip(got, want):
            same = torch.equal(a, b) if exact else torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6)
            if not same:
                failures.append(f"{case}: ringtree {a.flatten()[:6].tolist()} vs gloo {b.flatten()[:6].tolist()}")
                return

    def both(case, run, exact=True):
        """run(group) -> output tensor(s); runs on ringtree then gloo and compares."""
        try:
            got = run(ours)
        except Exception as exc:  # noqa: BLE001 - reported
            failures.append(f"{case}: ringtree raised {_error_name(exc)}: {exc}")
            return
        want = run(gloo)
        compare(case, got, want, exact)

    # all_reduce: every op, several dtypes and counts.
    ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8, torch.float16, torch.bfloat16):
        for n in (0, 1, 7, 3 * P + 1, 1000):
            for name, op in ops.items():
                low, high = (-1, 3) if name == "prod" else (-3, 4)

                def run(group, n=n, dtype=dtype, op=op, low=low, high=high, name=name):
                    x = inputs(("ar", name, n), n, dtype, low, high)
                    dist.all_reduce(x, op=op, group=group)
                    return x

                both(f"all_reduce {name} {dtype} n={n}", run)
    for n in (large, 1000):
        both(f"all_reduce sum float32 n={n}", lambda g, n=n: _ar(inputs(("big", n), n, torch.float32), g))
    # Random floats: ring and gloo sum in different orders, so within rounding.
    both(
        "all_reduce sum random float32",
        lambda g: _ar(torch.randn(4099, generator=torch.Generator().manual_seed(r)), g),
        exact=False,
    )

    # avg and premul_sum, which Gloo lacks: against Gloo's sum.
    def avg_ringtree(dtype):
        x = inputs(("avg",), 1001, dtype)
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
        return x

    def avg_from_gloo_sum(dtype):
        x = inputs(("avg",), 1001, dtype)
        dist.all_reduce(x, group=gloo)
        return x / P if dtype.is_floating_point else torch.div(x, P, rounding_mode="trunc")

    for dtype in (torch.float32, torch.int64):
        compare(f"all_reduce avg {dtype}", avg_ringtree(dtype), avg_from_gloo_sum(dtype), exact=False)
    premul = dist._make_nccl_premul_sum(0.5)
    x = inputs(("premul",), 513, torch.float32)
    y = x.clone() * 0.5
    dist.all_reduce(x, op=premul)
    dist.all_reduce(y, group=gloo)
    compare("all_reduce premul_sum(0.5)", x, y)

    # Ops without meaning for a dtype (bitwise ops on floats, as on Gloo) fail clearly and leave
    # the group usable.
    for name in ("BAND", "BOR", "BXOR"):
        try:
            dist.all_reduce(torch.ones(3), op=getattr(dist.ReduceOp, name))
            failures.append(f"ReduceOp.{name} did not raise")
        except ValueError as exc:
            if name not in str(exc):
                failures.append(f"ReduceOp.{name} message: {exc}")
        checked.append(f"ReduceOp.{name} refused")
    both("all_reduce after refused ops", lambda g: _ar(inputs(("after",), 5, torch.int64), g))

    # Non-contiguous tensors, complex numbers, async work.
    # A non-contiguous column (Gloo does not handle these: against a sum of the inputs).
    x = inputs(("strided",), 40, torch.float32).reshape(8, 5)
    dist.all_reduce(x[:, 1])
    want = inputs(("strided",), 40, torch.float32).reshape(8, 5)
    want[:, 1] = sum(inputs(("strided",), 40, torch.float32, rank=q).reshape(8, 5)[:, 1] for q in range(P))
    compare("all_reduce non-contiguous column", x, want)
    both("all_reduce complex64", lambda g: _ar(inputs(("cplx",), 9, torch.complex64), g))

    def async_allreduce(group):
        x = inputs(("async",), 100, torch.int32)
        work = dist.all_reduce(x, async_op=True, group=group)
        value = work.get_future().wait()
        assert work.wait() is True and work.is_completed()
        return [x, value[0]]

    both("all_reduce async_op get_future", async_allreduce)
    both("all_reduce_coalesced", lambda g: _coalesced(inputs, g))

    # broadcast: every root; bool (moved as bytes) and int16, which Gloo refuses, against the
    # root's input.
    for root in range(P):

        def run(group, root=root, dtype=torch.float32):
            x = inputs(("bc", root), 37, dtype)
            dist.broadcast(x, src=root, group=group)
            return x

        both(f"broadcast root={root}", run)
        for dtype in (torch.bool, torch.int16):
            compare(
                f"broadcast root={root} {dtype}", run(ours, dtype=dtype), inputs(("bc", root), 37, dtype, rank=root)
            )

    # reduce: every root.
    for root in range(P):

        def run(group, root=root):
            x = inputs(("red", root), 33, torch.float32)
            dist.reduce(x, dst=root, op=dist.ReduceOp.MAX, group=group)
            return x if r == root else torch.zeros(0)  # elsewhere the contents are unspecified

        both(f"reduce max root={root}", run)

    # all_gather (list and into one tensor), uneven sizes through the list form.
    for dtype in (torch.float32, torch.int64, torch.bool):

        def run(group, dtype=dtype):
            outs = [torch.empty(6, dtype=dtype) for _ in range(P)]
            dist.all_gather(outs, inputs(("ag",), 6, dtype), group=group)
            return outs

        if dtype == torch.bool:
            compare("all_gather bool", run(ours), [inputs(("ag",), 6, dtype, rank=q) for q in range(P)])
        else:
            both(f"all_gather {dtype}", run)

    def gather_into(group):
        out = torch.empty(P * 5, dtype=torch.float64)
        dist.all_gather_into_tensor(out, inputs(("agt",), 5, torch.float64), group=group)
        return out

    both("all_gather_into_tensor", gather_into)

    def uneven_gather():
        outs = [torch.empty(q + 1) for q in range(P)]
        dist.all_gather(outs, torch.full((r + 1,), float(r)))
        return outs

    compare("all_gather uneven sizes", uneven_gather(), [torch.full((q + 1,), float(q)) for q in range(P)])

    # reduce_scatter (list and tensor).
    def rs_list(group):
        out = torch.empty(4, dtype=torch.int64)
        dist.reduce_scatter(out, list(inputs(("rs",), 4 * P, torch.int64).chunk(P)), group=group)
        return out

    def rs_tensor(group):
        out = torch.empty(3, dtype=torch.float32)
        dist.reduce_scatter_tensor(out, inputs(("rst",), 3 * P, torch.float32), group=group)
        return out

    both("reduce_scatter", rs_list)
    both("reduce_scatter_tensor", rs_tensor)

    # all_to_all_single with and without split sizes; all_to_all with lists.
    def a2a_even(group):
        out = torch.empty(2 * P, 3)
        dist.all_to_all_single(out, inputs(("a2a",), 6 * P, torch.float32).reshape(2 * P, 3), group=group)
        return out

    both("all_to_all_single", a2a_even)

    def splits(rank):
        return [1 + (rank + q) % 3 for q in range(P)]  # rows rank sends to q

    def a2a_uneven(group):
        send = splits(r)
        recv = [splits(q)[r] for q in range(P)]
        x = inputs(("a2av",), sum(send) * 2, torch.float32).reshape(sum(send), 2)
        out = torch.empty(sum(recv), 2)
        dist.all_to_all_single(out, x, output_split_sizes=recv, input_split_sizes=send, group=group)
        return out

    def a2a_lists(group):
        send = splits(r)
        recv = [splits(q)[r] for q in range(P)]
        ins = [inputs(("a2al", q), send[q], torch.int64) for q in range(P)]
        outs = [torch.empty(recv[q], dtype=torch.int64) for q in range(P)]
        dist.all_to_all(outs, ins, group=group)
        return outs

    def a2a_even_lists(group):
        outs = [torch.empty(3, dtype=torch.int64) for _ in range(P)]
        dist.all_to_all(outs, [inputs(("a2ae", q), 3, torch.int64) for q in range(P)], group=group)
        return outs

    both("all_to_all_single with split sizes", a2a_uneven)
    both("all_to_all lists", a2a_even_lists)
    # Gloo refuses uneven lists: against the senders' inputs.
    compare(
        "all_to_all lists (uneven)",
        a2a_lists(ours),
        [inputs(("a2al", r), splits(q)[r], torch.int64, rank=q) for q in range(P)],
    )

    # gather / scatter, every root.
    for root in range(P):

        def gather(group, root=root):
            outs = [torch.empty(4) for _ in range(P)] if r == root else None
            dist.gather(inputs(("ga", root), 4, torch.float32), outs, dst=root, group=group)
            return outs if outs is not None else [torch.zeros(0)]

        def scatter(group, root=root):
            out = torch.empty(3, dtype=torch.int32)
            ins = [inputs(("sc", q), 3, torch.int32) for q in range(P)] if r == root else None
            dist.scatter(out, ins, src=root, group=group)
            return out

        both(f"gather root={root}", gather)
        both(f"scatter root={root}", scatter)

    # Objects go through all_gather and broadcast of byte tensors.
    objects = [None] * P
    dist.all_gather_object(objects, {"rank": r, "text": "x" * r})
    compare(
        "all_gather_object",
        [torch.tensor([o["rank"], len(o["text"])]) for o in objects],
        [torch.tensor([q, q]) for q in range(P)],
    )

    # Point to point: a ring of isend/irecv with a large message (more than the shared
    # memory ring) in both directions at once, then blocking send/recv.
    n = 3 << 20
    nxt, prv = (r + 1) % P, (r - 1) % P
    got_next, got_prev = torch.empty(n), torch.empty(n)
    works = [dist.isend(torch.full((n,), float(r)), nxt), dist.irecv(got_prev, prv)]
    if P > 2:
        works += [dist.isend(torch.full((n,), float(r)), prv), dist.irecv(got_next, nxt)]
    for w in works:
        w.wait()
    compare("isend/irecv ring", got_prev, torch.full((n,), float(prv)))
    if P > 2:
        compare("isend/irecv reverse ring", got_next, torch.full((n,), float(nxt)))
    if r == 0:
        for q in range(1, P):
            dist.send(torch.arange(5) * q, dst=q)
    else:
        x = torch.empty(5, dtype=torch.int64)
        dist.recv(x, src=0)
        compare("send/recv", x, torch.arange(5) * r)

    ops = [dist.P2POp(dist.isend, torch.full((4,), float(r)), nxt), dist.P2POp(dist.irecv, got_prev[:4], prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    compare("batch_isend_irecv", got_prev[:4], torch.full((4,), float(prv)))

    # Functional collectives (what torch.compile and DTensor use) and the coalescing manager.
    import torch.distributed._functional_collectives as funcol

    both("functional all_reduce", lambda g: funcol.all_reduce(inputs(("fc",), 6, torch.float32), "sum", g).wait())

    def coalesced_manager(group):
        tensors = [inputs(("cm", i), 3 + i, torch.int64) for i in range(3)]
        with dist._coalescing_manager(group=group, async_ops=True) as cm:
            for t in tensors:
                dist.all_reduce(t, group=group)
        cm.wait()
        return tensors

    both("_coalescing_manager all_reduce", coalesced_manager)

    # Barrier, then subgroups (every rank calls new_group; members use it).
    dist.barrier()
    checked.append("barrier")
    members = list(range(0, P, 2)) if P > 2 else [0, 1]
    sub_ours = dist.new_group(members)
    sub_gloo = dist.new_group(members, backend="gloo")
    if r in members:
        xs = []
        for group in (sub_ours, sub_gloo):
            x = inputs(("sub",), 11, torch.int64)
            dist.all_reduce(x, group=group)
            xs.append(x)
        compare(f"subgroup {members} all_reduce", xs[0], xs[1])
        b = torch.arange(4.0) if r == members[-1] else torch.zeros(4)
        dist.broadcast(b, src=members[-1], group=sub_ours)
        compare(f"subgroup {members} broadcast", b, torch.arange(4.0))

    finish_group()
    return {"failures": failures, "checked": len(checked)}


def _ar(x, group):
    import torch.distributed as dist

    dist.all_reduce(x, group=group)
    return x


def _coalesced(inputs, group):
    import torch
    import torch.distributed as dist

    tensors = [inputs(("coal", i), 3 + i, torch.float32) for i in range(3)]
    dist.all_reduce_coalesced(tensors, group=group)
    return tensors


@pytest.mark.timeout(150)
@pytest.mark.parametrize("nranks", [2, 3])
def test_every_collective_matches_gloo(nranks):
    world = run_world(nranks, collectives_vs_gloo, timeout=140)
    for rank, res in enumerate(world.check_ok()):
        assert not res["failures"], f"rank {rank}: " + "\n".join(res["failures"])
        assert res["checked"] >= 170, res["checked"]


def rendezvous(method, port):
    """init_process_group("ringtree") through env:// or tcp://, then one all_reduce."""
    import torch
    import torch.distributed as dist

    import ringtree.torch  # noqa: F401 - registers the backend

    rank, size = int(os.environ["RINGTREE_RANK"]), int(os.environ["RINGTREE_WORLD_SIZE"])
    if method == "env":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
        dist.init_process_group("ringtree")
    else:
        dist.init_process_group("ringtree", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    x = torch.full((3,), float(rank + 1))
    dist.all_reduce(x)
    backend = dist.get_backend()
    dist.destroy_process_group()
    return {"sum": x.tolist(), "backend": backend}


@pytest.mark.timeout(100)
@pytest.mark.parametrize("method", ["env", "tcp"])
def test_init_process_group_through_env_and_tcp(method):
    world = run_world(2, rendezvous, dict(method=method, port=_free_port()), timeout=90)
    for res in world.check_ok():
        assert res == {"sum": [3.0, 3.0, 3.0], "backend": "ringtree"}


def errors(timeout=3.0):
    """Bad arguments, a mismatched call and a stalled peer, each as a clear typed error.

    After the mismatch the world group is aborted (ringtree aborts on every rank), so the
    stall runs on a fresh group."""
    import torch
    import torch.distributed as dist

    import ringtree as rt

    r, P = init_group(timeout=timeout)
    report = {}

    def expect(name, call, error_type, needle=None):
        started = time.monotonic()
        try:
            call()
            report[name] = {"raised": None}
        except Exception as exc:  # noqa: BLE001 - reported
            report[name] = {
                "raised": _error_name(exc),
                "ok": isinstance(exc, error_type) and (needle is None or needle in str(exc)),
                "message": str(exc)[:300],
                "seconds": time.monotonic() - started,
            }

    expect("BAND", lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND), ValueError, "BAND")
    fnuz = torch.float8_e4m3fnuz  # a float8 variant the core has no type for
    expect("reduction dtype", lambda: dist.all_reduce(torch.ones(2).to(fnuz)), ValueError, "float8_e4m3fnuz")
    expect("negative tag", lambda: dist.send(torch.ones(2), dst=(r + 1) % P, tag=-7), ValueError, "tag must be >= 0")
    expect(
        "all_gather list length",
        lambda: dist.all_gather([torch.ones(2)] * (P + 1), torch.ones(2)),
        ValueError,
        "output tensors",
    )
    expect(
        "all_gather_coalesced list length",
        lambda: dist.all_gather_coalesced([[torch.ones(2)]] * (P + 1), [torch.ones(2)]),
        ValueError,
        "output lists",
    )
    x = torch.ones(3)
    dist.all_reduce(x)
    report["usable after bad arguments"] = {"raised": None, "ok": x.tolist() == [float(P)] * 3}

    # Mismatch: rank 0 reduces 4 elements, the others 5.
    expect("mismatch", lambda: dist.all_reduce(torch.ones(4 if r == 0 else 5)), rt.CollectiveMismatch)

    # Two fresh groups (every rank calls new_group), then rank 1 stalls in each.
    fresh = [dist.new_group(list(range(P)), timeout=datetime.timedelta(seconds=timeout)) for _ in range(2)]
    if r == 1:
        time.sleep(2 * timeout + 2.0)
        return {"report": {"victim": {"raised": None, "ok": True}}}
    expect("stall", lambda: dist.all_reduce(torch.ones(2), group=fresh[0]), rt.Timeout)
    # The async form: wait() and the future raise the typed error.
    work = dist.all_reduce(torch.ones(2), group=fresh[1], async_op=True)
    expect("stall async wait", work.wait, rt.Timeout)
    # Futures carry errors to C++ (DDP) as RuntimeError, named after the ringtree error.
    expect("stall async future", work.get_future().wait, RuntimeError, "Timeout: ")
    return {"report": report}


@pytest.mark.timeout(100)
def test_errors_surface_as_typed_exceptions_within_the_timeout():
    world = run_world(2, errors, dict(timeout=2.0), timeout=90)
    results = world.check_ok()
    report = results[0]["report"]
    expected = [
        "BAND",
        "reduction dtype",
        "negative tag",
        "all_gather list length",
        "all_gather_coalesced list length",
        "usable after bad arguments",
        "mismatch",
        "stall",
        "stall async wait",
        "stall async future",
    ]
    assert sorted(report) == sorted(expected)
    bad = {name: case for name, case in report.items() if not case.get("ok")}
    assert not bad, bad
    for name in ("stall", "stall async wait"):
        assert report[name]["seconds"] > 1.5 and report[name]["seconds"] < 8, report[name]
        assert "all_reduce #" in report[name]["message"] and "rank 1" in report[name]["message"]
    # The mismatch is reported on the other rank too; it names both calls.
    assert "count=4" in report["mismatch"]["message"] and "count=5" in report["mismatch"]["message"]


def kill_during_ddp(victim=1):
    """The victim SIGKILLs itself between steps; the survivors' next step must raise."""
    import train_ddp

    import ringtree as rt

    r, P = init_group(timeout=60)
    ddp = train_ddp.wrap(train_ddp.make_model(32))
    train_ddp.train(ddp, 2, 16, 0.05, log=None)
    if r == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    started = time.monotonic()
    try:
        train_ddp.train(ddp, 3, 16, 0.05, log=None)
        return {"raised": None}
    except Exception as exc:  # noqa: BLE001 - reported
        # Through DDP's C++ reducer the error arrives as a RuntimeError that names it.
        return {
            "raised": _error_name(exc),
            "peer_failure": isinstance(exc, rt.PeerFailure) or "PeerFailure: " in str(exc),
            "message": str(exc)[:500],
            "seconds": time.monotonic() - started,
        }


@pytest.mark.timeout(100)
def test_a_killed_rank_makes_ddp_raise_on_the_survivor():
    world = run_world(2, kill_during_ddp, dict(victim=1), timeout=90)
    assert world.returncodes[1] == -9, world.failure_report()
    res = world.results[0]
    assert res is not None and world.returncodes[0] == 0, world.failure_report()
    assert res["peer_failure"], res
    assert res["seconds"] < 15, res  # far below the 60 s collective timeout
    assert "rank 1" in res["message"], res["message"]


def bool_flags_vs_gloo():
    """all_reduce of bool flags with MIN, MAX, BAND and BOR, on ringtree and on Gloo, in the
    same processes with the same flags (BXOR: test_torch_clients.py's bitwise test)."""
    import torch
    import torch.distributed as dist

    r, P = init_group()
    gloo = dist.new_group(backend="gloo")
    report = {}
    for name in ("MIN", "MAX", "BAND", "BOR"):
        op = getattr(dist.ReduceOp, name)
        flags = torch.tensor([r == 0, True, r == 1, False, r % 2 == 0] * 3)
        mine, theirs = flags.clone(), flags.clone()
        dist.all_reduce(mine, op=op)
        dist.all_reduce(theirs, op=op, group=gloo)
        report[name] = {"ringtree": mine.tolist(), "gloo": theirs.tolist(), "dtype": str(mine.dtype)}
    finish_group()
    return report


@pytest.mark.timeout(120)
def test_bool_flags_reduce_as_on_gloo():
    world = run_world(3, bool_flags_vs_gloo, timeout=100)
    for rank, res in enumerate(world.check_ok()):
        for name in ("MIN", "MAX", "BAND", "BOR"):
            got = res[name]
            assert got["dtype"] == "torch.bool", (rank, name, got)
            assert got["ringtree"] == got["gloo"], (rank, name, got)
        # logical and / or of [r == 0, True, r == 1, False, r even] over ranks 0, 1, 2
        assert res["MIN"]["ringtree"][:5] == [False, True, False, False, False], res["MIN"]
        assert res["MAX"]["ringtree"][:5] == [True, True, True, False, True], res["MAX"]
