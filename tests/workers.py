"""Functions that run inside each rank of a test world (see harness.py). Each returns a
JSON-serialisable report that the test asserts on."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np

import ringtree as rt
from reference import NUMPY_DTYPES, OPS, is_int, make_input, mismatches, op_argument, reduce_reference

REDUCTIONS = ("all_reduce", "reduce_scatter", "reduce")
ALGOS = {"all_reduce": ["ring", "tree", "oneshot"], "broadcast": ["tree", "ring", "oneshot"],
         "reduce": ["tree", "ring", "oneshot"], "reduce_scatter": ["ring", "oneshot"], "all_gather": ["ring", "oneshot"],
         "all_to_all": ["direct", "oneshot"], "gather": ["auto"], "scatter": ["auto"]}
IN_PLACE = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "gather", "scatter"}


def resolve_count(spec, P, coll="all_reduce"):
    """Count specs: ints, 'P-1', '3P+1' (not divisible by P), 'large' (>= 1M elements in the
    bigger buffer: the whole buffer for all_reduce/broadcast/reduce, else N*P)."""
    if isinstance(spec, int):
        return spec
    if spec == "large":
        return (1 << 20) if coll in ("all_reduce", "broadcast", "reduce") else (1 << 20) // P + 1
    return {"P-1": P - 1, "3P+1": 3 * P + 1}[spec]


def input_elems(coll, N, P):
    return N * P if coll in ("reduce_scatter", "all_to_all", "scatter") else N


def run_case(comm, coll, N, dtype_name, op, algo, in_place, root, salt):
    """Runs one collective on this rank; returns (#wrong elements, description)."""
    r, P = comm.rank, comm.size
    dtype = NUMPY_DTYPES[dtype_name]
    op = op if coll in REDUCTIONS else "sum"
    inputs = [make_input(q, input_elems(coll, N, P), dtype_name, op, salt) for q in range(P)]
    x = inputs[r].copy()
    original = x.copy()
    opa = op_argument(op, dtype_name)
    block = slice(r * N, (r + 1) * N)
    want, got, untouched = None, None, x
    if coll == "all_reduce":
        want = reduce_reference(inputs, op, dtype_name)
        out = None if in_place else np.full(N, 77, dtype)
        got = comm.all_reduce(x, out, op=opa, algo=algo)
        if in_place:
            untouched = None
    elif coll == "reduce_scatter":
        want = reduce_reference(inputs, op, dtype_name)[block]
        if in_place:
            got = comm.reduce_scatter(x, x[block], op=opa, algo=algo)
            untouched = None
        else:
            got = comm.reduce_scatter(x, np.full(N, 77, dtype), op=opa, algo=algo)
    elif coll == "all_gather":
        want = np.concatenate(inputs)
        out = np.full(N * P, 77, dtype)
        if in_place:
            out[block] = x
            x = out[block]
            untouched = None
        got = comm.all_gather(x, out, algo=algo)
    elif coll == "all_to_all":
        want = np.concatenate([inputs[q][block] for q in range(P)])
        if in_place:
            got = comm.all_to_all(x, x, algo=algo)
            untouched = None
        else:
            got = comm.all_to_all(x, np.full(N * P, 77, dtype), algo=algo)
    elif coll == "broadcast":
        want = inputs[root]
        got = comm.broadcast(x, root=root, algo=algo)
        untouched = None
    elif coll == "reduce":
        out = None if in_place else np.full(N, 77, dtype)
        res = comm.reduce(x, out, root=root, op=opa, algo=algo)
        if r == root:
            want, got = reduce_reference(inputs, op, dtype_name), res
            if in_place:
                untouched = None
    elif coll == "gather":
        out = np.full(N * P, 77, dtype) if r == root else None
        if in_place and r == root:
            out[root * N:(root + 1) * N] = x
            x = out[root * N:(root + 1) * N]
            untouched = None
        res = comm.gather(x, out, root=root, algo=algo)
        if r == root:
            want, got = np.concatenate(inputs), res
    elif coll == "scatter":
        want = inputs[root][block]
        if in_place and r == root:
            got = comm.scatter(x, x[block], root=root, algo=algo)
        else:
            got = comm.scatter(x if r == root else None, np.full(N, 77, dtype), root=root, algo=algo)
    wrong = 0
    if want is not None:
        wrong += mismatches(np.asarray(got), want, dtype_name, op)
    if untouched is not None and not np.array_equal(untouched, original):
        wrong += 1_000_000  # the input of an out-of-place call (or a non-root reduce) was written
    desc = f"{coll} N={N} {dtype_name} {op} algo={algo} {'in' if in_place else 'out-of'}-place root={root}"
    return wrong, desc


def board_takes(comm, coll, N, dtype_name):
    """Whether the one-shot board can run this call here (one host, small enough)."""
    try:
        comm.choose_algo(coll, N * np.dtype(NUMPY_DTYPES[dtype_name]).itemsize, "oneshot")
        return True
    except rt.InvalidArgument:
        return False


def sweep(collectives, counts, dtypes, ops, large=True, salt=0):
    """Every collective x count x dtype x op, each against numpy. Algorithm, placement
    (in/out of place) and root rotate through all their combinations across the dtype x op
    pairs of each count, so every combination runs at every count without the full product.
    The 1M-element count runs every dtype and every op once per (algorithm, placement)."""
    comm = rt.init()
    P = comm.size
    checks, failures = 0, []
    dtypes = [d for d in dtypes if NUMPY_DTYPES[d] is not None]
    for coll in collectives:
        rooted = coll in ("broadcast", "reduce", "gather", "scatter")
        variants = [(algo, in_place, root)
                    for algo in ALGOS[coll]
                    for in_place in ([False, True] if coll in IN_PLACE and coll != "broadcast" else [False])
                    for root in (sorted({0, P - 1}) if rooted else [0])]
        coll_ops = ops if coll in REDUCTIONS else ["sum"]
        for spec in counts:
            if spec == "large" and not large:
                continue
            N = resolve_count(spec, P, coll)
            if spec == "large":
                combos = [(d, coll_ops[(i + j) % len(coll_ops)], *v)
                          for j, v in enumerate(variants[:4]) for i, d in enumerate(dtypes)]
            else:
                pairs = [(d, op) for d in dtypes for op in coll_ops]
                n = max(len(pairs), len(variants))
                combos = [(*pairs[i % len(pairs)], *variants[i % len(variants)]) for i in range(n)]
            for d, op, algo, in_place, root in combos:
                if algo == "oneshot" and not board_takes(comm, coll, N, d):
                    continue
                try:
                    wrong, desc = run_case(comm, coll, N, d, op, algo, in_place, root, salt)
                except rt.Error as exc:
                    wrong, desc = -1, f"{coll} N={N} {d} {op} {algo} raised {type(exc).__name__}: {exc}"
                checks += 1
                if wrong:
                    failures.append(f"rank {comm.rank}: {desc}: {wrong} wrong")
    comm.close()
    return {"checks": checks, "failures": failures[:30]}


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


def transports():
    comm = rt.init()
    out = [comm.transport_to(q) for q in range(comm.size)]
    comm.barrier()
    comm.close()
    return {"transports": out}


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
        ("dtype", lambda: comm.all_reduce(np.zeros(4, np.complex64)), "unsupported dtype complex64"),
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
        ("reduce_scatter sizes", lambda: comm.reduce_scatter(np.zeros(8 * P + 1, np.float32), np.zeros(8, np.float32)),
         f"expected {8 * P}, got {8 * P + 1}"),
        ("all_gather sizes", lambda: comm.all_gather(f32, np.zeros(8 * P + 2, np.float32)), f"expected {8 * P}, got {8 * P + 2}"),
        ("all_to_all divisibility", lambda: comm.all_to_all(np.zeros(P * 4 + 1, np.float32), np.zeros(P * 4 + 1, np.float32)),
         "not divisible" if P > 1 else None),
        ("partial overlap", lambda: comm.reduce_scatter(*_overlap(P)), "overlap"),
        ("algo", lambda: comm.all_gather(f32, np.zeros(8 * P, np.float32), algo="tree"), "not available for all_gather"),
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
        elif kind == "count_across_paths":  # the small call goes to the one-shot board, the large one to the ring
            comm.all_reduce(np.ones((1 << 20) if odd else 16, np.float32))
        elif kind == "algo_oneshot":
            comm.all_reduce(x, algo="oneshot" if odd else "ring")
        elif kind == "collective_across_paths":
            comm.all_gather(np.ones(1 << 18, np.float32), np.empty(P << 18, np.float32)) if odd else comm.barrier()
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


def kill_during_allreduce(victim=1, elems=1 << 23):
    """The victim SIGKILLs itself in the middle of a run of all_reduces (large ones: mid-ring;
    small ones: on the one-shot board); the others must raise PeerFailure naming it, long
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


def async_and_threads():
    """async_op returns Work at once; results arrive in call order; wait() re-raises errors;
    a blocking call releases the GIL (a Python thread keeps running while it waits)."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    report = {}
    xs = [np.full(1000, r + k, np.int64) for k in range(5)]
    works = [comm.all_reduce(x, async_op=True) for x in xs]
    results = [w.wait(timeout=30) for w in works]
    report["async_results"] = all(np.array_equal(res, np.full(1000, sum(q + k for q in range(P))))
                                  for k, res in enumerate(results))
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
    out = {"sub": [sub.rank, sub.size], "expected": [members.index(r), len(members)],
           "gathered": gathered.tolist(), "members": members, "total": int(total[0])}
    sub.close()
    comm.barrier()
    comm.close()
    return out


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
    comm.close()
    return report


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
        want = np.concatenate([data[i][sum(count(i, j) for j in range(r)):][:count(i, r)] for i in range(P)])
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
            comm.all_to_all_v(np.zeros(sum(send_counts), np.int32), np.zeros(sum(recv_counts), np.int32), send_counts, recv_counts)
            comm.barrier()
            report["mismatch"] = None
        except rt.CollectiveMismatch as exc:
            report["mismatch"] = "CollectiveMismatch"
            report["mismatch_message"] = str(exc)
        except rt.Error as exc:
            report["mismatch"] = f"{type(exc).__name__}: {exc}"
    comm.close()
    return report


def board_stress(rounds=300):
    """One-shot calls back to back, mixed with ring calls: broadcasts from rotating roots (whose
    ranks return before the others have published), all_reduce, a large all_gather, barrier.
    Each result is checked every round, so a board slot rewritten too early shows as wrong data."""
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
        y = comm.all_reduce(np.full(3, k + r, np.int64))
        if not np.array_equal(y, np.full(3, P * k + P * (P - 1) // 2)):
            failures.append(f"round {k}: all_reduce gave {y}")
        if k % 50 == 0:  # a ring call between board calls
            comm.all_gather(np.full(70_000, r + k, np.float32), big)
            want = np.repeat(np.arange(P, dtype=np.float32) + k, 70_000)
            if not np.array_equal(big, want):
                failures.append(f"round {k}: all_gather wrong")
        if k % 7 == 0:
            comm.barrier()
    comm.close()
    return {"failures": failures[:20]}
