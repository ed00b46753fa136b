"""Grouped and persistent calls across real processes: every collective persistent, a persistent
all_reduce reused 1,000 times with changing data, groups that mix collectives with sends and
receives (blocking, async, nested, persistent), a mismatch inside a group named on every rank,
and an error inside a group's block that leaves the communicator usable.

Expected values are exact integers computed here with numpy from what every rank sent."""

import threading

import numpy as np
import pytest
from harness import run_world

import ringtree as rt

N = 5  # elements per rank's block


def persistent_every_collective(reuses):
    """Each collective as a persistent request, started `reuses` times with new data each time;
    returns the collectives whose result was ever wrong."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    ar = np.arange(N * P, dtype=np.int64)
    wrong = []

    def check(name, got, want):
        if not np.array_equal(got, want):
            wrong.append(f"{name}: got {got.tolist()} want {np.asarray(want).tolist()}")

    bufs = {name: (np.zeros(N * P, np.int64), np.zeros(N * P, np.int64)) for name in ("rs", "ag", "a2a", "sc")}
    x_ar, out_ar = np.zeros(N, np.int64), np.zeros(N, np.int64)
    x_bc = np.zeros(N, np.int64)
    x_red, out_red = np.zeros(N, np.int64), np.zeros(N, np.int64)
    x_ga, out_ga = np.zeros(N, np.int64), np.zeros(N * P, np.int64)
    out_sc = np.zeros(N, np.int64)
    x_sr, out_sr = np.zeros(N, np.int64), np.zeros(N, np.int64)
    x_s, x_r = np.zeros(N, np.int64), np.zeros(N, np.int64)
    root = P - 1
    reqs = {
        "all_reduce": comm.all_reduce_init(x_ar, out_ar),
        "reduce_scatter": comm.reduce_scatter_init(bufs["rs"][0], bufs["rs"][1][:N]),
        "all_gather": comm.all_gather_init(bufs["ag"][0][:N], bufs["ag"][1]),
        "all_to_all": comm.all_to_all_init(bufs["a2a"][0], bufs["a2a"][1]),
        "broadcast": comm.broadcast_init(x_bc, root=root),
        "reduce": comm.reduce_init(x_red, out_red, root=root, op="max"),
        "gather": comm.gather_init(x_ga, out_ga, root=0),
        "scatter": comm.scatter_init(bufs["sc"][0], out_sc, root=0),
        "barrier": comm.barrier_init(),
        "sendrecv": comm.sendrecv_init(x_sr, (r + 1) % P, out_sr, (r - 1) % P),
        "send": comm.send_init(x_s, (r + 1) % P),
        "recv": comm.recv_init(x_r, (r - 1) % P),
    }
    for k in range(reuses):
        x_ar[:] = 1000 * r + k + ar[:N]
        bufs["rs"][0][:] = (r + 1) * k + ar
        bufs["ag"][0][:N] = r + 10 * k
        bufs["a2a"][0][:] = 100 * r + ar + k
        x_bc[:] = 7 * k + 3 if r == root else -1
        x_red[:] = r * k - ar[:N]
        x_ga[:] = r + k
        bufs["sc"][0][:] = ar + k if r == 0 else -1
        x_sr[:] = r * 11 + k
        x_s[:] = r * 13 + k
        comm.start_all(reqs[name] for name in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"))
        for name in ("broadcast", "reduce", "gather", "scatter", "barrier", "sendrecv"):
            reqs[name].start()
        work = reqs["send"].start(async_op=True)
        reqs["recv"].start()
        work.wait(timeout=60)
        prev = (r - 1) % P
        check("all_reduce", out_ar, sum(1000 * q + k for q in range(P)) + P * ar[:N])
        check("reduce_scatter", bufs["rs"][1][:N], k * P * (P + 1) // 2 + P * ar[r * N : (r + 1) * N])
        check("all_gather", bufs["ag"][1], np.repeat(np.arange(P) + 10 * k, N))
        check("all_to_all", bufs["a2a"][1], np.concatenate([100 * q + ar[r * N : (r + 1) * N] + k for q in range(P)]))
        check("broadcast", x_bc, np.full(N, 7 * k + 3))
        if r == root:
            check("reduce", out_red, np.max([q * k - ar[:N] for q in range(P)], axis=0))
        if r == 0:
            check("gather", out_ga, np.repeat(np.arange(P) + k, N))
        check("scatter", out_sc, ar[r * N : (r + 1) * N] + k)
        check("sendrecv", out_sr, np.full(N, prev * 11 + k))
        check("recv", x_r, np.full(N, prev * 13 + k))
    comm.close()
    return {"wrong": wrong[:5], "starts": reuses}


def persistent_reused(reuses):
    """One persistent all_reduce started `reuses` times with new data; async starts too."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    x = np.zeros(3, np.int64)
    req = comm.all_reduce_init(x)
    bad = 0
    for k in range(reuses):
        x[:] = [r * k, k * k + r, -r - k]
        if k % 10 == 0:
            res = req.start(async_op=True).wait(timeout=60)
        else:
            res = req.start()
        want = [k * P * (P - 1) // 2, P * k * k + P * (P - 1) // 2, -P * (P - 1) // 2 - P * k]
        bad += res is not x or x.tolist() != want
    comm.close()
    return {"bad": bad}


def grouped_mix():
    """Groups mixing many small all_reduces (fused), a large one, other collectives and a ring of
    sends and receives: blocking, async, explicit, nested and persistent."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    report = {}
    small = [np.full(2, r + i, np.int32) for i in range(64)]
    maxed = np.array([r, -r, 5 * r], np.int64)
    big = np.full(300_000, r + 1, np.int64)  # 2.4 MB: runs alone, not fused
    rs_in, rs_out = np.arange(N * P, dtype=np.int64) * (r + 1), np.zeros(N, np.int64)
    ag_out = np.zeros(N * P, np.int64)
    bc = np.full(N, r, np.int64)
    sent, got = np.full(N, 100 + r, np.int64), np.zeros(N, np.int64)
    first = comm.record()["recorded"]
    with comm.group():
        for a in small:
            comm.all_reduce(a)
        comm.send(sent, (r + 1) % P)  # before the receive on every rank: the group pairs them
        comm.all_reduce(maxed, op="max")
        comm.all_reduce(big)
        comm.reduce_scatter(rs_in, rs_out)
        comm.all_gather(np.full(N, r * 3, np.int64), ag_out)
        comm.broadcast(bc, root=P - 1)
        comm.barrier()
        comm.recv(got, (r - 1) % P)
    calls = [c["coll"] for c in comm.record()["calls"] if c["id"] > first]
    # The 64 small all_reduces of one dtype and op ran as one call; the max and the large one alone.
    report["fused"] = calls.count("all_reduce") == 3 and calls.count("sendrecv") == 1 and len(calls) == 8
    report["small"] = all(np.array_equal(a, np.full(2, sum(q + i for q in range(P)))) for i, a in enumerate(small))
    report["max"] = maxed.tolist() == [P - 1, 0, 5 * (P - 1)]
    report["big"] = bool(np.all(big == P * (P + 1) // 2))
    report["reduce_scatter"] = rs_out.tolist() == (np.arange(N * P)[r * N : (r + 1) * N] * P * (P + 1) // 2).tolist()
    report["all_gather"] = ag_out.tolist() == np.repeat(np.arange(P) * 3, N).tolist()
    report["broadcast"] = bc.tolist() == [P - 1] * N
    report["p2p"] = got.tolist() == [100 + (r - 1) % P] * N
    # Async: the block's end returns at once; the Group is the group's Work; an async call inside
    # it returns the same group's Work.
    xs = [np.full(4, r * 2 + i, np.int64) for i in range(8)]
    with comm.group(async_op=True) as g:
        inner = [comm.all_reduce(x, async_op=True) for x in xs[:4]]
        for x in xs[4:]:
            comm.all_reduce(x, op="min")
    g.wait(timeout=60)
    report["async"] = g.is_completed() and all(w.is_completed() for w in inner)
    report["async_values"] = all(xs[i].tolist() == [sum(2 * q + i for q in range(P))] * 4 for i in range(4)) and all(
        xs[i].tolist() == [i] * 4 for i in range(4, 8)
    )
    # Explicit and nested: the outermost end runs them.
    a, b = np.full(3, r, np.int64), np.full(3, 2 * r, np.int64)
    comm.group_start()
    comm.all_reduce(a)
    with comm.group():
        comm.all_reduce(b)
    report["nested_waits"] = a.tolist() == [r] * 3 and b.tolist() == [2 * r] * 3
    comm.group_end()
    report["nested"] = a.tolist() == [P * (P - 1) // 2] * 3 and b.tolist() == [P * (P - 1)] * 3
    # Persistent group: collected once, started with new data.
    ys = [np.zeros(2, np.int64) for _ in range(10)]
    z = np.zeros(N * P, np.int64)
    with comm.group(persistent=True) as pg:
        for y in ys:
            comm.all_reduce(y)
        comm.all_gather(np.full(N, r, np.int64)[:N], z)
    ok = True
    for k in range(20):
        for i, y in enumerate(ys):
            y[:] = r * k + i
        pg.start(async_op=k % 2 == 1)
        pg.request.wait(timeout=60)
        ok = ok and all(y.tolist() == [k * P * (P - 1) // 2 + P * i] * 2 for i, y in enumerate(ys))
        ok = ok and z.tolist() == np.repeat(np.arange(P), N).tolist()
    report["persistent_group"] = ok
    comm.close()
    return report


def group_mismatch():
    """The last rank's group differs in its third call: every rank names that call."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    try:
        with comm.group():
            comm.all_reduce(np.ones(2))
            comm.broadcast(np.ones(4), root=0)
            comm.all_reduce(np.ones(3), op="max" if r == P - 1 else "sum")
            comm.barrier()
    except rt.CollectiveMismatch as e:
        return {"error": str(e)}
    return {"error": None}


def group_repeated(steps, diverge_at):
    """The same group, on the same buffers, step after step with new data (as a training step
    issues it), with a second group on other buffers between some steps and an async one at some;
    at `diverge_at` the last rank's group differs in its second call. Returns the steps whose
    results were wrong and the mismatch error, if any."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    grads = [np.zeros(3, np.int64) for _ in range(8)]
    other = np.zeros(4, np.int64)
    wrong, error = [], None
    for k in range(steps):
        for i, g in enumerate(grads):
            g[:] = 100 * r + 10 * i + k
        try:
            with comm.group(async_op=k % 5 == 4) as group:
                for i, g in enumerate(grads):
                    op = "max" if (k == diverge_at and r == P - 1 and i == 1) else "sum"
                    comm.all_reduce(g, op=op)
            if k % 5 == 4:
                group.wait(timeout=60)
        except rt.CollectiveMismatch as e:
            error = str(e)
            break
        for i, g in enumerate(grads):
            if not np.array_equal(g, np.full(3, sum(100 * q + 10 * i + k for q in range(P)))):
                wrong.append(k)
        if k % 3 == 1:
            other[:] = r + k
            with comm.group():
                comm.all_reduce(other, op="max")
                comm.all_reduce(grads[0][:2], op="min")
            if not np.array_equal(other, np.full(4, P - 1 + k)):
                wrong.append(k)
    return {"wrong": wrong, "error": error}


@pytest.mark.timeout(120)
def test_a_group_issued_again_on_the_same_buffers_stays_exact_and_checked():
    for res in run_world(2, group_repeated, dict(steps=40, diverge_at=-1), timeout=100).check_ok():
        assert res == {"wrong": [], "error": None}, res
    # The same group again and again, then one rank's differs: its call is named on every rank.
    for res in run_world(3, group_repeated, dict(steps=40, diverge_at=21), timeout=100).check_ok():
        assert res["wrong"] == [], res
        assert "its call 1 is all_reduce (count=3, dtype=int64, op=sum" in res["error"], res
        assert "op=max, algo=auto) on rank 2" in res["error"], res


def repeated_group_with_a_hook():
    """The same group twice, then twice more with an algorithm hook set: the hook decides the
    later groups' fused all_reduce, as for any call (a group issued again does not keep what was
    chosen before the hook)."""
    comm = rt.init()
    r = comm.rank
    xs = [np.full(2, r + 1, np.int64) for _ in range(4)]

    def group():
        with comm.group():
            for x in xs:
                comm.all_reduce(x)

    group()
    group()
    seen = []
    comm.set_algo_hook(lambda request: seen.append(request.collective))
    group()
    group()
    comm.set_algo_hook(None)
    return {"hooked_all_reduces": seen.count("all_reduce"), "values": [x.tolist() for x in xs]}


@pytest.mark.timeout(120)
def test_an_algorithm_hook_decides_a_group_issued_again():
    for res in run_world(2, repeated_group_with_a_hook, timeout=100).check_ok():
        # Asked once for the fused all_reduce: its answer is remembered for that size, as for any call.
        assert res["hooked_all_reduces"] == 1, res
        assert res["values"] == [[3 * 2**3] * 2] * 4, res  # sums of 1 and 2, then doubled thrice


def group_errors():
    """A user exception and a bad argument inside a block discard the group; the communicator
    stays usable (the next calls agree on every rank)."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    report = {}
    x = np.full(2, r, np.int64)
    try:
        with comm.group():
            comm.all_reduce(x)
            raise ValueError("the user's own error")
    except ValueError:
        report["user_error"] = x.tolist() == [r, r]
    report["after_user_error"] = comm.all_reduce(np.full(2, r + 1, np.int64)).tolist() == [P * (P + 1) // 2] * 2
    work = None
    try:
        with comm.group():
            work = comm.all_reduce(x, async_op=True)
            comm.all_gather(x, np.zeros(3, np.int64))  # wrong output size: rejected at once
    except rt.InvalidArgument as e:
        report["bad_argument"] = "its call 1: all_gather" in str(e)
    try:
        work.wait(timeout=10)
        report["discarded_work"] = "completed"
    except rt.Aborted as e:
        report["discarded_work"] = "discarded" in str(e)
    report["not_in_group"] = not comm._core.in_group
    report["after_bad_argument"] = comm.all_reduce(np.full(2, r, np.int64)).tolist() == [P * (P - 1) // 2] * 2
    with comm.group():
        comm.all_reduce(x)
    report["group_after"] = x.tolist() == [P * (P - 1) // 2] * 2
    try:
        comm.group_end()
    except rt.InvalidArgument:
        report["end_without_start"] = True
    # A group holds the calls of the thread that opened it; another thread's call runs at once.
    y, seen = np.full(2, r, np.int64), []
    comm.group_start()
    comm.all_reduce(y)
    other = threading.Thread(target=lambda: seen.append(comm.all_reduce(np.full(2, 1, np.int64)).tolist()))
    other.start()
    other.join(30)
    report["other_thread"] = seen == [[P, P]] and y.tolist() == [r, r]
    comm.group_end()
    report["other_thread"] = report["other_thread"] and y.tolist() == [P * (P - 1) // 2] * 2
    comm.close()
    return report


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nranks", [2, 3])
def test_every_collective_persistent(nranks):
    for res in run_world(nranks, persistent_every_collective, {"reuses": 4}, timeout=200).check_ok():
        assert res["wrong"] == [] and res["starts"] == 4, res


@pytest.mark.timeout(240)
def test_persistent_all_reduce_reused_1000_times():
    for res in run_world(2, persistent_reused, {"reuses": 1000}, timeout=200).check_ok():
        assert res["bad"] == 0, res


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nranks", [2, 4])
def test_groups_mix_collectives_and_messages(nranks):
    for res in run_world(nranks, grouped_mix, timeout=200).check_ok():
        assert all(res.values()) and len(res) == 13, res  # every check ran and held


@pytest.mark.timeout(120)
def test_mismatch_inside_a_group_names_the_call_on_every_rank():
    results = run_world(3, group_mismatch, timeout=100).check_ok()
    for res in results:
        assert "its call 2 is all_reduce (count=3, dtype=float64, op=sum" in res["error"], res
        assert "op=max, algo=auto) on rank 2" in res["error"], res
    assert len({res["error"] for res in results}) == 1


@pytest.mark.timeout(120)
def test_an_error_inside_the_block_discards_the_group():
    for res in run_world(2, group_errors, timeout=100).check_ok():
        assert res == {
            "user_error": True,
            "after_user_error": True,
            "bad_argument": True,
            "discarded_work": True,
            "not_in_group": True,
            "after_bad_argument": True,
            "group_after": True,
            "end_without_start": True,
            "other_thread": True,
        }


def test_persistent_and_group_arguments_are_checked_before_any_traffic():
    comm = rt.Communicator(0, 1, rt.UniqueId.create(), 10.0)
    with pytest.raises(rt.InvalidArgument, match="all_reduce"):
        comm.all_reduce_init(np.ones(3), np.ones(4))
    with pytest.raises(rt.InvalidArgument, match="persistent group"):
        comm.group(async_op=True, persistent=True)
    with pytest.raises(rt.InvalidArgument, match="expected ringtree Requests"):
        comm.start_all([object()])
    comm.close()


def cpp_group_bench():
    """The C++ entry alone (group_start, 64 calls, group_end, and run_coalesced with the same 64)
    on a communicator made in C++: the hook checks every all_reduce's result (the max over ranks)
    and raises otherwise."""
    import os

    import _ringtree_testing

    plain_us, group_us, coalesced_us = _ringtree_testing.bench_group(
        int(os.environ["RINGTREE_RANK"]),
        int(os.environ["RINGTREE_WORLD_SIZE"]),
        os.environ["RINGTREE_UNIQUE_ID"],
        calls=64,
        count=3,
        blocks=3,
        reps=5,
    )
    return {"plain_us": plain_us, "group_us": group_us, "coalesced_us": coalesced_us}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 3])
def test_a_cpp_group_and_list_of_64_calls_run_with_exact_results(nranks):
    pytest.importorskip("_ringtree_testing")
    for res in run_world(nranks, cpp_group_bench, timeout=100).check_ok():
        assert res["plain_us"] > 0 and res["group_us"] > 0 and res["coalesced_us"] > 0, res


def persistent_all_to_all_v(reuses):
    """all_to_all_v_init with uneven counts (rank i sends i + j + 1 elements to rank j), started
    `reuses` times with new data; then a request whose counts disagree with its buffers."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    send_counts = [r + j + 1 for j in range(P)]
    recv_counts = [i + r + 1 for i in range(P)]
    x, out = np.zeros(sum(send_counts), np.int64), np.zeros(sum(recv_counts), np.int64)
    req = comm.all_to_all_v_init(x, out, send_counts, recv_counts)
    bad = 0
    for k in range(reuses):
        # element e of the block for rank j: 1000 * k + 100 * r + 10 * j + e
        x[:] = np.concatenate([1000 * k + 100 * r + 10 * j + np.arange(c) for j, c in enumerate(send_counts)])
        req.start(async_op=k % 2 == 1)
        req.wait()
        want = np.concatenate([1000 * k + 100 * i + 10 * r + np.arange(c) for i, c in enumerate(recv_counts)])
        bad += int(not np.array_equal(out, want))
    try:
        comm.all_to_all_v_init(x, out, send_counts, [c + 1 for c in recv_counts])
        refused = False
    except rt.InvalidArgument as e:
        refused = "all_to_all_v" in str(e)
    comm.close()
    return {"bad": bad, "refused": refused}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 3])
def test_persistent_all_to_all_v_with_uneven_counts(nranks):
    for res in run_world(nranks, persistent_all_to_all_v, {"reuses": 50}, timeout=100).check_ok():
        assert res == {"bad": 0, "refused": True}, res


def small_groups_against_plain_calls():
    """Groups of 16 small all_reduces of one dtype and op (fused into one item, which rides the
    group's check: one exchange carries the check and their data), run twice each with new data,
    against the same calls run one by one on copies of the same data: the same bits, and for
    integers numpy's exact result. Then a group that repeats the last one but for one buffer, and
    one whose calls give per-call timeouts that differ between ranks."""
    import ml_dtypes

    comm = rt.init()
    r, P = comm.rank, comm.size
    cases = [
        (np.float32, "sum", False),
        (np.float16, "sum", False),
        (ml_dtypes.bfloat16, "sum", False),
        (ml_dtypes.float8_e4m3fn, "sum", False),
        (np.complex64, "prod", False),
        (np.float64, "min", False),
        (np.int8, "max", False),
        (np.uint64, "sum", False),
        (np.int32, "band", False),
        (np.float32, "avg", False),  # scaled after the sum: runs as its own call, not in the check
        (np.float32, "sum", True),
    ]
    report = {}
    for ci, (dtype, op, det) in enumerate(cases):
        same_bits = exact = True
        xs = [np.zeros(3, dtype) for _ in range(16)]
        for step in range(2):
            rng = np.random.default_rng(1000 * ci + 10 * step + r)
            if np.issubdtype(dtype, np.integer):
                data = [rng.integers(0, 100, 3).astype(dtype) for _ in xs]
            elif dtype is np.complex64:
                data = [(rng.uniform(0.5, 1.5, 3) + 1j * rng.uniform(-1, 1, 3)).astype(dtype) for _ in xs]
            else:
                data = [rng.uniform(-2, 2, 3).astype(dtype) for _ in xs]
            for x, d in zip(xs, data):
                x[:] = d
            with comm.group():
                for x in xs:
                    comm.all_reduce(x, op=op, deterministic=det)
            plain = [comm.all_reduce(d.copy(), op=op, deterministic=det) for d in data]
            same_bits &= all(x.tobytes() == p.tobytes() for x, p in zip(xs, plain))
            if np.issubdtype(dtype, np.integer):
                every = [comm.all_gather(d, np.zeros(3 * P, dtype)).reshape(P, 3) for d in data]
                reduce = {"max": np.max, "sum": np.sum, "band": np.bitwise_and.reduce}[op]
                exact &= all(np.array_equal(x, reduce(e, axis=0).astype(dtype)) for x, e in zip(xs, every))
        report[f"{np.dtype(dtype).name}/{op}{'/det' if det else ''}"] = bool(same_bits and exact)
    # The same group on the same buffers but for its fifth call's: the calls before it were only
    # compared, and the group runs as issued.
    xs = [np.full(2, r + i, np.int64) for i in range(8)]
    other = np.zeros(2, np.int64)
    for step in range(3):
        for i, x in enumerate(xs):
            x[:] = r + i + step
        other[:] = r + 4 + step
        with comm.group():
            for i, x in enumerate(xs):
                comm.all_reduce(other if step == 1 and i == 4 else x)
        want = [np.full(2, sum(q + i + step for q in range(P))) for i in range(8)]
        if step == 1:
            ok = np.array_equal(other, want[4]) and xs[4].tolist() == [r + 4 + step] * 2
            ok = ok and all(np.array_equal(x, w) for i, (x, w) in enumerate(zip(xs, want)) if i != 4)
        else:
            ok = all(np.array_equal(x, w) for x, w in zip(xs, want))
        report[f"buffer_changed_step{step}"] = bool(ok)
    # Per-call timeouts that differ between ranks fuse the same calls differently: refused on
    # every rank, as a mismatch, before any result is written.
    ys = [np.full(2, r, np.int64) for _ in range(2)]
    try:
        with comm.group():
            comm.all_reduce(ys[0], timeout=30)
            comm.all_reduce(ys[1], timeout=30 if r == 0 else 31)
        report["timeouts_refused"] = "no error"
    except rt.CollectiveMismatch as e:
        report["timeouts_refused"] = "timeouts differ" in str(e) and all(y.tolist() == [r, r] for y in ys)
    return report


@pytest.mark.timeout(180)
@pytest.mark.parametrize("nranks", [2, 3])
def test_a_group_of_small_calls_gives_the_bits_of_plain_calls(nranks):
    for res in run_world(nranks, small_groups_against_plain_calls, timeout=150).check_ok():
        assert all(v is True for v in res.values()) and len(res) == 15, res


def group_buffers_held_until_run():
    """Buffers that only the group refers to stay alive until the group has run, then are let go:
    blocking, async (until the Work is waited for and dropped), and on the Python route a torch
    tensor takes (torch CPU tensors, when torch is installed)."""
    import gc
    import weakref

    comm = rt.init()
    r, P = comm.rank, comm.size
    report = {}

    def issue(make):
        """Issue one all_reduce and one all_gather on buffers only the group holds; returns weak
        references to the all_reduce's buffer and the all_gather's output."""
        x, out = make(np.full(3, r + 1, np.int64)), make(np.zeros(3 * P, np.int64))
        comm.all_reduce(x)
        comm.all_gather(make(np.full(3, r, np.int64)), out)
        return [weakref.ref(x), weakref.ref(out)]

    makers = [("ndarray", lambda a: a)]
    try:
        import torch

        makers.append(("torch", torch.from_numpy))
    except ImportError:
        pass
    for label, make in makers:
        with comm.group():
            refs = issue(make)
            gc.collect()
            report[f"{label}_alive_in_group"] = all(ref() is not None for ref in refs)
        gc.collect()
        report[f"{label}_freed_after"] = all(ref() is None for ref in refs)
        with comm.group(async_op=True) as group:
            refs = issue(make)
        gc.collect()
        alive = all(ref() is not None for ref in refs)
        x = refs[0]()
        group.wait()
        report[f"{label}_async_alive_until_wait"] = alive and np.asarray(x).tolist() == [P * (P + 1) // 2] * 3
        del x, group
        gc.collect()
        report[f"{label}_async_freed_after"] = all(ref() is None for ref in refs)
    comm.close()
    return report


@pytest.mark.timeout(120)
def test_a_group_holds_its_calls_buffers_until_it_has_run():
    for res in run_world(2, group_buffers_held_until_run, timeout=100).check_ok():
        assert all(v is True for v in res.values()) and len(res) in (4, 8), res
