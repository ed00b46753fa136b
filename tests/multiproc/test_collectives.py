"""Every collective between real processes, against numpy, over shared memory, TCP (two
emulated hosts), and TCP only. See reference.py for how expectations are computed.

The rank bodies (sweep, p2p_and_barrier, ...) run in every rank of a test's world (harness.py);
each returns a JSON report that the test asserts on."""

from __future__ import annotations

import time

import numpy as np
import pytest
from harness import run_world
from rank_checks import run_case
from reference import NEW_DTYPES, NUMPY_DTYPES, OPS, make_input, ops_for

import ringtree as rt

ALL_DTYPES = ["int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
# The later dtypes (int16, uint16/32/64, float8, complex) run in sweeps of their own, at fewer sizes.
COLLECTIVES = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "gather", "scatter"]
COUNTS = [0, 1, 7, "P-1", "3P+1", "large"]
REDUCTIONS = ("all_reduce", "reduce_scatter", "reduce")
ALGOS = {
    "all_reduce": ["ring", "tree", "oneshot"],
    "broadcast": ["tree", "ring", "direct", "oneshot"],
    "reduce": ["tree", "ring", "oneshot"],
    "reduce_scatter": ["ring", "oneshot"],
    "all_gather": ["ring", "oneshot"],
    "all_to_all": ["direct", "oneshot"],
    "gather": ["direct", "oneshot"],
    "scatter": ["direct", "oneshot"],
}
IN_PLACE = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "gather", "scatter"}


def resolve_count(spec, P, coll="all_reduce"):
    """Count specs: ints, 'P-1', '3P+1' (not divisible by P), 'large' (>= 1M elements in the
    bigger buffer: the whole buffer for all_reduce/broadcast/reduce, else N*P)."""
    if isinstance(spec, int):
        return spec
    if spec == "large":
        return (1 << 20) if coll in ("all_reduce", "broadcast", "reduce") else (1 << 20) // P + 1
    return {"P-1": P - 1, "3P+1": 3 * P + 1}[spec]


def oneshot_takes(comm, coll, N, dtype_name):
    """Whether oneshot can run this call here (one host, small enough)."""
    try:
        comm.choose_algo(coll, N * np.dtype(NUMPY_DTYPES[dtype_name]).itemsize, "oneshot")
        return True
    except rt.InvalidArgument:
        return False


def sweep(collectives, counts, dtypes, ops, large=True, salt=0, report_transports=False):
    """Every collective x count x dtype x op, each against numpy. Algorithm, placement
    (in/out of place) and root rotate through all their combinations across the dtype x op
    pairs of each count, so every combination runs at every count without the full product.
    The 1M-element count runs every dtype and every op once per (algorithm, placement).
    report_transports: the report also says how this rank reaches each rank (transport_report),
    as it was before the first call."""
    comm = rt.init()
    P = comm.size
    seen = transport_report(comm) if report_transports else {}
    checks, failures = 0, []
    dtypes = [d for d in dtypes if NUMPY_DTYPES[d] is not None]
    for coll in collectives:
        rooted = coll in ("broadcast", "reduce", "gather", "scatter")
        variants = [
            (algo, in_place, root)
            for algo in ALGOS[coll]
            for in_place in ([False, True] if coll in IN_PLACE and coll != "broadcast" else [False])
            for root in (sorted({0, P - 1}) if rooted else [0])
        ]
        coll_ops = ops if coll in REDUCTIONS else ["sum"]
        for spec in counts:
            if spec == "large" and not large:
                continue
            N = resolve_count(spec, P, coll)
            if spec == "large":
                combos = [
                    (d, ops_for(d, coll_ops)[(i + j) % len(ops_for(d, coll_ops))], *v)
                    for j, v in enumerate(variants[:4])
                    for i, d in enumerate(dtypes)
                ]
            else:
                pairs = [(d, op) for d in dtypes for op in ops_for(d, coll_ops)]
                n = max(len(pairs), len(variants))
                combos = [(*pairs[i % len(pairs)], *variants[i % len(variants)]) for i in range(n)]
            for d, op, algo, in_place, root in combos:
                if algo == "oneshot" and not oneshot_takes(comm, coll, N, d):
                    continue
                try:
                    wrong, desc = run_case(comm, coll, N, d, op, algo, in_place, root, salt)
                except rt.Error as exc:
                    wrong, desc = -1, f"{coll} N={N} {d} {op} {algo} raised {type(exc).__name__}: {exc}"
                checks += 1
                if wrong:
                    failures.append(f"rank {comm.rank}: {desc}: {wrong} wrong")
    comm.close()
    return {"checks": checks, "failures": failures[:30], **seen}


def transport_report(comm):
    """This rank's Status: how it reaches each rank, the hosts, and its printed summary."""
    status = comm.status()
    assert isinstance(status, rt.Status)
    comm.barrier()
    return {
        "transports": list(status.transports),
        "hosts": status.hosts,
        "machine_hosts": status.machine["hosts"],
        "text": str(status),
    }


def assert_clean(world):
    results = world.check_ok()
    failures = [f for res in results for f in res["failures"]]
    assert not failures, "\n".join(failures[:40])
    assert all(res["checks"] > 0 for res in results)
    return results


@pytest.mark.timeout(600)
@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 5, 8])
def test_collectives_shared_memory(nranks):
    world = run_world(
        nranks, sweep, dict(collectives=COLLECTIVES, counts=COUNTS, dtypes=ALL_DTYPES, ops=OPS), timeout=540
    )
    assert_clean(world)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("nranks", [2, 3, 4, 5, 8])
def test_collectives_two_hosts(nranks):
    """Ranks split over two emulated hosts: TCP between the groups, shared memory inside. The
    sweep's world also reports how each rank reaches the others (one world, not a second one
    started for the report)."""
    world = run_world(
        nranks,
        sweep,
        dict(collectives=COLLECTIVES, counts=COUNTS, dtypes=ALL_DTYPES, ops=OPS, salt=1, report_transports=True),
        hosts=2,
        timeout=540,
    )
    results = assert_clean(world)
    t = [res["transports"] for res in results]
    half = [r * 2 // nranks for r in range(nranks)]
    for a in range(nranks):
        for b in range(nranks):
            want = "self" if a == b else ("shm" if half[a] == half[b] else "tcp")
            assert t[a][b] == want, (a, b, t[a][b])
    groups = " ".join("{" + ",".join(str(r) for r in range(nranks) if half[r] == h) + "}" for h in (0, 1))
    for res in results:
        assert res["hosts"] == res["machine_hosts"] == f"2 hosts: {groups}", res
        assert res["text"].startswith(f"hosts: {res['hosts']}; transports: 0:") and "waiting: spin" in res["text"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nranks", [3, 4])
def test_collectives_tcp_only(nranks):
    world = run_world(
        nranks,
        sweep,
        dict(collectives=COLLECTIVES, counts=[0, 1, "3P+1", "large"], dtypes=ALL_DTYPES, ops=OPS, salt=2),
        env={"RINGTREE_TRANSPORT": "tcp"},
        timeout=280,
    )
    assert_clean(world)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "nranks,hosts,counts",
    [
        (2, 1, [0, 1, 7, "3P+1"]),
        (3, 1, [0, 7, "3P+1", "large"]),
        (5, 1, [1, "3P+1"]),
        (8, 1, [1, "3P+1"]),
        (4, 2, [0, 7, "3P+1", "large"]),
    ],
    ids=["P2", "P3-large", "P5", "P8", "P4-two-hosts-large"],
)
def test_new_dtypes(nranks, hosts, counts):
    """int16, uint16/32/64, float8 (e4m3fn, e5m2) and complex64/128: every collective, algorithm,
    placement and op (complex: no min/max) against numpy, exact (avg: one rounding), over shared
    memory and TCP between two emulated hosts."""
    large = "large" in counts
    args = dict(collectives=COLLECTIVES, counts=counts, dtypes=list(NEW_DTYPES), ops=OPS, large=large, salt=4)
    assert_clean(run_world(nranks, sweep, args, hosts=hosts, timeout=540))


def p2p_and_barrier(rounds=3):
    """Ring of send/recv (blocking and async), and a barrier that must not release early."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    failures = []
    for k in range(rounds):
        # sendrecv: both directions at once, so messages far larger than the transport's
        # buffering (1 MiB shared-memory ring) still flow around the ring.
        for n, dtype in ((0, "int32"), (7, "int64"), (3_000_001, "float32")):
            x = make_input(r, n, dtype, salt=k)
            got = np.full(n, 99, NUMPY_DTYPES[dtype])
            nxt, prv = (r + 1) % P, (r - 1) % P
            if P == 1:
                continue
            comm.sendrecv(x, nxt, got, prv)
            if not np.array_equal(got, make_input(prv, n, dtype, salt=k)):
                failures.append(f"sendrecv from {prv} n={n} {dtype} round {k} wrong")
        # A sendrecv on rank 0 matches a plain recv-then-send on the others.
        if P > 1:
            n = 2_000_003
            x = make_input(r, n, "float32", salt=k)
            got = np.empty(n, np.float32)
            if r == 0:
                comm.sendrecv(x, 1, got, P - 1)
            else:
                comm.recv(got, r - 1)
                comm.send(x, (r + 1) % P)
            if not np.array_equal(got, make_input((r - 1) % P, n, "float32", salt=k)):
                failures.append(f"mixed sendrecv/recv+send round {k} wrong")
        for n, dtype in ((0, "int32"), (5, "float64"), (300001, "int8")):
            x = make_input(r, n, dtype, salt=k)
            got = np.full(n, 99, NUMPY_DTYPES[dtype])
            nxt, prv = (r + 1) % P, (r - 1) % P
            if P == 1:
                continue
            work = comm.send(x, nxt, async_op=True)
            comm.recv(got, prv)
            work.wait()
            if not np.array_equal(got, make_input(prv, n, dtype, salt=k)):
                failures.append(f"recv from {prv} n={n} {dtype} round {k} wrong")
    # Barrier: the last rank arrives late; nobody may leave before it arrived.
    late = P - 1
    if r == late:
        time.sleep(0.3)
    arrived = time.time()
    comm.barrier()
    left = time.time()
    arrivals = np.zeros(P, dtype=np.float64)
    mine = np.array([arrived], dtype=np.float64)
    comm.all_gather(mine, arrivals)
    if left < arrivals[late]:
        failures.append(f"rank {r} left the barrier {arrivals[late] - left:.3f}s before rank {late} arrived")
    comm.close()
    return {"failures": failures, "transports": [comm_transport for comm_transport in []]}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks,hosts", [(2, 1), (4, 1), (5, 2)])
def test_send_recv_and_barrier(nranks, hosts):
    world = run_world(nranks, p2p_and_barrier, hosts=hosts, timeout=100)
    failures = [f for res in world.check_ok() for f in res["failures"]]
    assert not failures, failures


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nranks,hosts", [(3, 1), (5, 2)])
def test_pipelined_trees_with_tiny_segments(nranks, hosts):
    """64-byte tree segments make short messages stream through the tree and chain pipelines."""
    world = run_world(
        nranks,
        sweep,
        dict(
            collectives=["all_reduce", "broadcast", "reduce"],
            counts=[7, "3P+1", 1000],
            dtypes=ALL_DTYPES,
            ops=OPS,
            salt=3,
        ),
        hosts=hosts,
        env={"RINGTREE_TREE_SEGMENT_BYTES": "64"},
        timeout=280,
    )
    assert_clean(world)


def all_to_all_v(salt=0):
    """Per-pair sizes (zeros included) against the senders' data; then a disagreement on one
    pair's size must raise CollectiveMismatch, and bad count lists InvalidArgument."""
    comm = rt.init(timeout=30)
    r, P = comm.rank, comm.size
    count = lambda i, j: (i * 7 + j * 3 + salt) % 5  # elements rank i sends to rank j
    failures = []
    for dtype in ("int8", "float32", "float64"):
        send_counts = [count(r, j) for j in range(P)]
        recv_counts = [count(i, r) for i in range(P)]
        data = {i: make_input(i, sum(count(i, j) for j in range(P)), dtype, salt=salt) for i in range(P)}
        out = np.full(sum(recv_counts), 77, NUMPY_DTYPES[dtype])
        comm.all_to_all_v(data[r], out, send_counts, recv_counts)
        want = np.concatenate([data[i][sum(count(i, j) for j in range(r)) :][: count(i, r)] for i in range(P)])
        if not np.array_equal(out, want):
            failures.append(f"{dtype}: {out.tolist()} != {want.tolist()}")
        # In place: one buffer big enough for both layouts.
        both = np.full(max(len(data[r]), len(want)), 55, NUMPY_DTYPES[dtype])
        both[: len(data[r])] = data[r]
        comm.all_to_all_v(both[: len(data[r])], both[: len(want)], send_counts, recv_counts)
        if not np.array_equal(both[: len(want)], want):
            failures.append(f"{dtype} in place: {both[: len(want)].tolist()} != {want.tolist()}")
    report = {"failures": failures}
    try:
        comm.all_to_all_v(np.zeros(3, np.float32), np.zeros(3, np.float32), [3] + [0] * (P - 1), [1] * P)
        report["bad_counts"] = "no error"
    except rt.InvalidArgument as exc:
        report["bad_counts"] = "ok" if "sum(recv_counts)" in str(exc) or "own block" in str(exc) else str(exc)
    if P > 1:
        send_counts = [2] * P
        recv_counts = [2] * P
        if r == 1:
            recv_counts[0] = 3  # rank 0 sends 2
        try:
            comm.all_to_all_v(
                np.zeros(sum(send_counts), np.int32), np.zeros(sum(recv_counts), np.int32), send_counts, recv_counts
            )
            comm.barrier()
            report["mismatch"] = None
        except rt.CollectiveMismatch as exc:
            report["mismatch"] = "CollectiveMismatch"
            report["mismatch_message"] = str(exc)
        except rt.Error as exc:
            report["mismatch"] = f"{type(exc).__name__}: {exc}"
    comm.close()
    return report


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks,hosts", [(1, 1), (3, 1), (4, 2)])
def test_all_to_all_v(nranks, hosts):
    world = run_world(nranks, all_to_all_v, dict(salt=nranks), hosts=hosts, timeout=100)
    results = world.check_ok()
    for rank, res in enumerate(results):
        assert not res["failures"], (rank, res["failures"])
        assert res["bad_counts"] == "ok", res
        if nranks > 1:
            assert res["mismatch"] == "CollectiveMismatch", (rank, res)
    if nranks > 1:
        assert "sends 8 bytes to rank 1, which expects 12" in results[1]["mismatch_message"], results[1]


def all_to_all_mixed_placement(block, rounds=3):
    """Direct all_to_all with some ranks in one buffer (their own block stays, only the blocks
    overwritten before they are sent are staged) and the others out of place: every result
    against the senders' data, several calls in a row with fresh data each time."""
    comm = rt.init(timeout=60)
    r, P = comm.rank, comm.size
    failures = []
    for k in range(rounds):
        sent = [np.arange(P * block, dtype=np.int64) * 7 + q * 1_000_003 + k for q in range(P)]
        want = np.concatenate([sent[q][r * block : (r + 1) * block] for q in range(P)])
        in_place = (r + k) % 2 == 0
        buf = sent[r].copy()
        got = comm.all_to_all(buf, buf if in_place else np.full(P * block, -1, np.int64), algo="direct")
        if not np.array_equal(got, want):
            bad = np.flatnonzero(got != want)
            failures.append(f"call {k} ({'in place' if in_place else 'out of place'}): {bad.size} wrong from {bad[0]}")
    comm.close()
    return {"failures": failures}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("nranks", [2, 3, 4, 5])
@pytest.mark.parametrize(
    "block,env",
    [
        (3, {}),
        # 64 KiB blocks over 4 KiB single-copy reads and 16 KiB streamed outputs
        (8192, {"RINGTREE_CMA_MIN_BYTES": "4096", "RINGTREE_STREAM_BYTES": "16384"}),
        (8192, {"RINGTREE_TRANSPORT": "tcp"}),
    ],
    ids=["tiny", "single-copy", "tcp"],
)
def test_all_to_all_in_one_buffer_beside_out_of_place_ranks(nranks, block, env):
    world = run_world(nranks, all_to_all_mixed_placement, dict(block=block), env=env, timeout=150)
    for rank, res in enumerate(world.check_ok()):
        assert res["failures"] == [], (rank, res["failures"])


def oneshot_stress(rounds=300):
    """One-shot calls back to back, mixed with ring calls: broadcasts, scatters and gathers from
    rotating roots (whose ranks return before the others have published: a gather's ranks other
    than the root at once), all_reduce, a large all_gather, barrier. Each result is checked every
    round, so a one-shot slot rewritten too early shows as wrong data."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    failures = []
    big = np.empty(P * 70_000, np.float32)
    for k in range(rounds):
        root = k % P
        x = np.full(5, float(r * 1000 + k), np.float64)
        comm.broadcast(x, root=root)
        if not np.array_equal(x, np.full(5, float(root * 1000 + k))):
            failures.append(f"round {k}: broadcast from {root} gave {x[:2]}")
        gathered = np.zeros(2 * P, np.int64)
        comm.gather(np.full(2, r * 1000 + k, np.int64), gathered, root=root)
        if r == root and not np.array_equal(gathered, np.repeat(np.arange(P) * 1000 + k, 2)):
            failures.append(f"round {k}: gather to {root} gave {gathered[:4]}")
        mine = np.zeros(3, np.int64)
        comm.scatter(np.arange(3 * P, dtype=np.int64) + r * 1000 + k, mine, root=root)
        if not np.array_equal(mine, np.arange(3 * r, 3 * r + 3) + root * 1000 + k):
            failures.append(f"round {k}: scatter from {root} gave {mine}")
        y = comm.all_reduce(np.full(3, k + r, np.int64))
        if not np.array_equal(y, np.full(3, P * k + P * (P - 1) // 2)):
            failures.append(f"round {k}: all_reduce gave {y}")
        if k % 50 == 0:  # a ring call between one-shot calls
            comm.all_gather(np.full(70_000, r + k, np.float32), big)
            want = np.repeat(np.arange(P, dtype=np.float32) + k, 70_000)
            if not np.array_equal(big, want):
                failures.append(f"round {k}: all_gather wrong")
        if k % 7 == 0:
            comm.barrier()
    comm.close()
    return {"failures": failures[:20]}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 3, 5])
def test_oneshot_back_to_back(nranks):
    """One-shot slots are reused every other call; broadcasts return before every rank has
    published. Wrong data would show here if a slot were rewritten too early."""
    world = run_world(nranks, oneshot_stress, timeout=100)
    failures = [f for res in world.check_ok() for f in res["failures"]]
    assert not failures, failures
