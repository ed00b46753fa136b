"""No silent hang, no silent wrong answer: bad arguments, mismatched calls, dead and stalled
peers, and bootstrap mistakes each give a clear typed error on every rank within bounds.

The rank bodies (invalid_arguments, mismatch, ...) run in every rank of a test's world
(harness.py); each returns a JSON report that the test asserts on."""

import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
from harness import run_world

import ringtree as rt


def invalid_arguments():
    """Each bad call must raise InvalidArgument on this rank before any traffic and name the
    expected and actual values; afterwards the communicator still works (checked by an
    all_reduce after every rejected call)."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    f32 = np.zeros(8, np.float32)
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    cases = [
        ("dtype", lambda: comm.all_reduce(np.zeros(4, np.clongdouble)), "unsupported dtype complex256"),
        ("op", lambda: comm.all_reduce(f32, op="xor"), "unsupported reduce op 'xor'"),
        ("count", lambda: comm.all_reduce(f32, np.zeros(7, np.float32)), "expected 8, got 7"),
        ("dtype pair", lambda: comm.all_reduce(f32, np.zeros(8, np.float64)), "float32 vs float64"),
        ("root", lambda: comm.broadcast(f32, root=P), f"root must be in [0, {P}), got {P}"),
        ("negative root", lambda: comm.reduce(f32, root=-1), f"root must be in [0, {P}), got -1"),
        ("peer", lambda: comm.send(f32, P + 3), f"peer must be in [0, {P}), got {P + 3}"),
        ("self peer", lambda: comm.recv(f32, r), "peer must differ from this rank"),
        ("non-contiguous", lambda: comm.all_reduce(np.zeros(16, np.float32)[::2]), "C-contiguous"),
        ("read-only output", lambda: comm.all_reduce(f32, ro), "read-only"),
        ("read-only in place", lambda: comm.all_reduce(ro), "read-only"),
        (
            "reduce_scatter sizes",
            lambda: comm.reduce_scatter(np.zeros(8 * P + 1, np.float32), np.zeros(8, np.float32)),
            f"expected {8 * P}, got {8 * P + 1}",
        ),
        (
            "all_gather sizes",
            lambda: comm.all_gather(f32, np.zeros(8 * P + 2, np.float32)),
            f"expected {8 * P}, got {8 * P + 2}",
        ),
        (
            "all_to_all divisibility",
            lambda: comm.all_to_all(np.zeros(P * 4 + 1, np.float32), np.zeros(P * 4 + 1, np.float32)),
            "not divisible" if P > 1 else None,
        ),
        ("partial overlap", lambda: comm.reduce_scatter(*_overlap(P)), "overlap"),
        (
            "algo",
            lambda: comm.all_gather(f32, np.zeros(8 * P, np.float32), algo="tree"),
            "not available for all_gather",
        ),
        ("algo name", lambda: comm.all_reduce(f32, algo="butterfly"), "unknown algo 'butterfly'"),
        ("timeout", lambda: comm.all_reduce(f32, timeout=-1), "timeout must be positive"),
        ("premul factor", lambda: comm.all_reduce(f32, op=rt.premul_sum(float("nan"))), "must be finite"),
        ("not an array", lambda: comm.all_reduce("hello"), "got str"),
    ]
    report = {}
    for name, call, needle in cases:
        if needle is None:
            continue
        try:
            call()
            report[name] = "no error"
        except rt.InvalidArgument as exc:
            report[name] = "ok" if needle in str(exc) else f"message lacks {needle!r}: {exc}"
        except Exception as exc:  # noqa: BLE001 - reported to the test as a failure
            report[name] = f"wrong type {type(exc).__name__}: {exc}"
        probe = np.full(3, r + 1, np.int64)
        comm.all_reduce(probe)
        if not np.array_equal(probe, np.full(3, P * (P + 1) // 2)):
            report[name + " then all_reduce"] = f"wrong result {probe}"
    comm.close()
    return {"report": report}


_OVERLAP_BUF = {}


def _overlap(P):
    """reduce_scatter buffers where the output overlaps the input off this rank's block."""
    buf = _OVERLAP_BUF.setdefault(P, np.zeros(8 * P, np.float32))
    return buf[: 4 * P], buf[1:5]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [1, 3])
def test_invalid_arguments_raise_before_traffic_and_leave_comm_usable(nranks):
    world = run_world(nranks, invalid_arguments, timeout=100)
    for rank, res in enumerate(world.check_ok()):
        bad = {k: v for k, v in res["report"].items() if v != "ok"}
        assert not bad, f"rank {rank}: {bad}"
        assert len(res["report"]) >= 18


MISMATCHES = [
    "collective",
    "count",
    "dtype",
    "op",
    "root",
    "algo",
    "zero_count",
    "count_across_paths",
    "algo_oneshot",
    "collective_across_paths",
    "root_run_ahead",
    "ring_count",
    "ring_beside_rooted",
]


def mismatch(kind):
    """The ranks disagree on one argument; every rank must raise CollectiveMismatch naming
    both calls, in the mismatched call or (on a rank that already finished it with data from
    agreeing peers) in the next one. Nothing may hang."""
    comm = rt.init(timeout=30)
    r, P = comm.rank, comm.size
    odd = r == P - 1
    x = np.ones(16, np.float32)
    try:
        if kind == "collective":
            comm.barrier() if odd else comm.all_reduce(x)
        elif kind == "count":
            comm.all_reduce(np.ones(17 if odd else 16, np.float32))
        elif kind == "dtype":
            comm.all_reduce(np.ones(16, np.float64 if odd else np.float32))
        elif kind == "op":
            comm.all_reduce(x, op="max" if odd else "sum")
        elif kind == "root":
            comm.broadcast(x, root=1 if odd else 0)
        elif kind == "algo":
            comm.all_reduce(x, algo="tree" if odd else "ring")
        elif kind == "zero_count":
            comm.all_reduce(np.ones(0 if odd else 16, np.float32))
        elif kind == "count_across_paths":  # the small call runs oneshot, the large one the ring
            comm.all_reduce(np.ones((1 << 20) if odd else 16, np.float32))
        elif kind == "algo_oneshot":
            comm.all_reduce(x, algo="oneshot" if odd else "ring")
        elif kind == "collective_across_paths":
            comm.all_gather(np.ones(1 << 18, np.float32), np.empty(P << 18, np.float32)) if odd else comm.barrier()
        elif kind == "root_run_ahead":  # agreeing broadcasts the root runs ahead on, then one that disagrees
            for k in range(5):
                comm.broadcast(np.full(4, r + k, np.int64), root=0)
            comm.broadcast(x, root=1 if odd else 0)
            for k in range(5):
                comm.broadcast(np.full(4, r + k, np.int64), root=0)
        elif kind == "ring_count":  # schedules whose first messages stand in for the handshake
            n = 4097 if odd else 4096
            comm.all_gather(np.ones(n, np.float32), np.empty(P * n, np.float32), algo="ring")
        elif kind == "ring_beside_rooted":  # the odd rank only sends, to ranks expecting the ring's data
            y = np.ones(1 << 14, np.float32)
            comm.broadcast(y, root=P - 1, algo="tree") if odd else comm.all_gather(
                y, np.empty(P << 14, np.float32), algo="ring"
            )
        comm.barrier()
        outcome = {"raised": None}
    except rt.CollectiveMismatch as exc:
        outcome = {"raised": "CollectiveMismatch", "message": str(exc)}
    except rt.Error as exc:
        outcome = {"raised": type(exc).__name__, "message": str(exc)}
    try:
        comm.barrier()
        outcome["after"] = "usable"
    except rt.Aborted:
        outcome["after"] = "aborted"
    comm.close()
    return outcome


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", MISMATCHES)
@pytest.mark.parametrize("nranks", [2, 4])
def test_mismatched_calls_raise_collective_mismatch_on_every_rank(kind, nranks):
    world = run_world(nranks, mismatch, dict(kind=kind), timeout=100)
    results = world.check_ok()
    for rank, res in enumerate(results):
        assert res["raised"] == "CollectiveMismatch", (rank, res)
        assert "called" in res["message"] and " but rank " in res["message"], res["message"]
        assert res["after"] == "aborted"
    # The detecting rank names both calls, with the argument that differs.
    detail = {
        "count": "count=17",
        "dtype": "float64",
        "op": "op=max",
        "root": "root=1",
        "algo": "algo=tree",
        "collective": "barrier",
        "zero_count": "count=0",
        "count_across_paths": "count=1048576",
        "algo_oneshot": "algo=oneshot",
        "collective_across_paths": "all_gather",
        "root_run_ahead": "root=1",
        "ring_count": "count=4097",
        "ring_beside_rooted": "broadcast",
    }[kind]
    assert any(detail in res["message"] for res in results), [r["message"] for r in results]
    if kind == "zero_count":  # the rank that sent nothing names its count-0 call
        assert "all_reduce #0 (count=0" in results[-1]["message"], results[-1]["message"]


def kill_during_allreduce(victim=1, elems=1 << 23):
    """The victim SIGKILLs itself in the middle of a run of all_reduces (large ones: mid-ring;
    small ones: oneshot); the others must raise PeerFailure naming it, long
    before the collective timeout."""
    comm = rt.init(timeout=60)
    r = comm.rank
    x = np.ones(elems, np.float32)
    comm.all_reduce(x)  # warm up: every pair has moved data
    if r == victim:
        threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    start = time.monotonic()
    try:
        while time.monotonic() - start < 30:  # small calls finish fast: keep calling until the kill
            comm.all_reduce(x)
        return {"raised": None}
    except rt.Error as exc:
        return {"raised": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks,hosts,elems", [(3, 1, 1 << 23), (4, 2, 1 << 23), (3, 1, 16)])
def test_sigkill_mid_allreduce_is_reported_fast_on_every_rank(nranks, hosts, elems):
    world = run_world(nranks, kill_during_allreduce, dict(victim=1, elems=elems), hosts=hosts, timeout=100)
    assert world.returncodes[1] == -9
    for rank in (q for q in range(nranks) if q != 1):
        res = world.results[rank]
        assert res is not None and world.returncodes[rank] == 0, world.failure_report()
        assert res["raised"] in ("PeerFailure",), res
        assert res["seconds"] < 15, res  # far below the 60 s collective timeout
        assert "all_reduce #" in res["message"], res["message"]
    direct = [world.results[q]["message"] for q in range(nranks) if q != 1]
    assert any("rank 1" in m for m in direct), direct


def stalled_peer(victim=1, timeout=2.0):
    """The victim stops calling collectives; the others must raise Timeout within the
    per-call timeout (plus slack), naming the collective and its sequence number."""
    comm = rt.init()
    x = np.ones(1024, np.float32)
    comm.all_reduce(x)
    if comm.rank == victim:
        time.sleep(timeout * 4)
        return {"raised": None, "victim": True}
    start = time.monotonic()
    try:
        comm.all_reduce(x, timeout=timeout)
        return {"raised": None}
    except rt.Error as exc:
        return {"raised": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}


@pytest.mark.timeout(120)
def test_stalled_peer_times_out_naming_collective_sequence_and_peer():
    world = run_world(3, stalled_peer, dict(victim=1, timeout=2.0), timeout=100)
    results = world.check_ok()
    for rank in (0, 2):
        res = results[rank]
        assert res["raised"] == "Timeout", res
        assert res["seconds"] > 1.5 and res["seconds"] < 8, res
        assert "all_reduce #1" in res["message"], res["message"]
    # Rank 2 receives from rank 1 in the ring: its own wait names the stalled rank.
    assert "rank 1" in results[2]["message"], results[2]["message"]


def init_only(timeout=10.0):
    """Initialise (with whatever the environment says) and report what happened."""
    start = time.monotonic()
    try:
        comm = rt.init(timeout=timeout)
        x = np.full(4, comm.rank, np.int32)
        comm.all_reduce(x)
        comm.close()
        return {"raised": None, "sum": int(x[0]), "seconds": time.monotonic() - start}
    except rt.Error as exc:
        return {"raised": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}


@pytest.mark.timeout(60)
def test_connection_without_the_secret_is_dropped_and_the_job_continues():
    uid = rt.UniqueId.create()
    fd = uid.take_listener()
    os.close(fd)  # rank 0 (a subprocess) binds the port itself
    stop = threading.Event()

    def intruder():
        # Knock on rank 0's port with garbage until the job has started.
        while not stop.is_set():
            try:
                with socket.create_connection((uid.ip, uid.port), timeout=0.5) as s:
                    s.sendall(b"\x31\x42\x54\x52" + b"\x00" * 200)
            except OSError:
                pass
            time.sleep(0.05)

    t = threading.Thread(target=intruder)
    t.start()
    try:
        world = run_world(
            3, init_only, dict(timeout=30.0), timeout=60, per_rank_env=lambda r: {"RINGTREE_UNIQUE_ID": str(uid)}
        )
    finally:
        stop.set()
        t.join()
    for res in world.check_ok():
        assert res["raised"] is None and res["sum"] == 0 + 1 + 2, res


@pytest.mark.timeout(60)
def test_wrong_world_size_is_explained_not_hung():
    # Ranks 0 and 2 must explain the mismatch well within their 20 s. Rank 1 may come after rank
    # 0 has given up, and then waits for it until its own timeout: 6 s (RINGTREE_TIMEOUT), so
    # that such a run does not wait 20 s for an outcome any of whose forms passes.
    world = run_world(
        3,
        init_only,
        dict(timeout=None),
        timeout=50,
        per_rank_env=lambda r: {"RINGTREE_TIMEOUT": "6" if r == 1 else "20"}
        | ({"RINGTREE_WORLD_SIZE": "4"} if r == 2 else {}),
    )
    results = world.check_ok()
    for rank in (0, 2):
        assert results[rank]["raised"] == "BootstrapError", results[rank]
        assert "world size mismatch" in results[rank]["message"], results[rank]
        assert results[rank]["seconds"] < 15
    assert results[1]["raised"] in ("BootstrapError", "Timeout", "PeerFailure"), results[1]


@pytest.mark.timeout(60)
def test_duplicate_rank_is_explained_not_hung():
    world = run_world(
        3, init_only, dict(timeout=20.0), timeout=50, per_rank_env=lambda r: {"RINGTREE_RANK": "1"} if r == 2 else {}
    )
    results = world.check_ok()
    assert results[0]["raised"] == "BootstrapError" and "duplicate rank" in results[0]["message"], results[0]
    assert any("duplicate rank" in (res.get("message") or "") for res in results[1:]), results


@pytest.mark.timeout(60)
def test_missing_rank_times_out_with_explanation():
    world = run_world(2, init_only, dict(timeout=3.0), timeout=50, per_rank_env=lambda r: {"RINGTREE_WORLD_SIZE": "3"})
    res = world.check_ok()[0]
    assert res["raised"] == "BootstrapError" and "missing rank(s) 2" in res["message"], res
