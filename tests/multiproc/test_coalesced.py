"""The *_coalesced calls across real processes: a list of one collective's calls as one group,
in one call from Python. Exact integer results computed here with numpy, the bits of the same
calls run one by one, a list issued again with new data (and with one buffer changed), async
lists, the Python route (torch tensors, other dtypes, an open group), a mismatch named on every
rank, and bad lists refused before any traffic."""

import gc
import threading
import time
import weakref

import numpy as np
import pytest
from harness import run_world

import ringtree as rt

N = 3  # elements per rank's block


def coalesced_results(steps):
    """Each form, blocking and async, list and tuple, step after step on the same buffers with new
    data; returns the checks that failed."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    failed = []

    def check(name, got, want):
        if not np.array_equal(got, want):
            failed.append(f"{name}: got {np.asarray(got).tolist()} want {np.asarray(want).tolist()}")

    # Mixed dtypes and sizes; the last one too large to be fused (it runs as its own call).
    dtypes = [np.int64, np.int32, np.float32, np.int64, np.float64, np.int8]
    xs = [np.zeros(N + i, dt) for i, dt in enumerate(dtypes)] + [np.zeros(20000, np.int64)]
    outs = [np.zeros_like(x) for x in xs]
    ag_in = [np.zeros(N + i, np.int64) for i in range(4)]
    ag_out = [np.zeros(P * (N + i), np.int64) for i in range(4)]
    rs_in = [np.zeros(P * (N + i), np.float32) for i in range(4)]
    rs_out = [np.zeros(N + i, np.float32) for i in range(4)]
    for k in range(steps):
        data = [(np.arange(x.size) % 7 + r + k).astype(x.dtype) for x in xs]
        want = [sum((np.arange(x.size) % 7 + q + k) for q in range(P)).astype(x.dtype) for x in xs]
        # Out of place, then in place (a tuple), then async with max.
        for x, d in zip(xs, data):
            x[:] = d
        got = comm.all_reduce_coalesced(xs, outs)
        check("all_reduce returns outs", [got is outs], [True])
        for i, (o, w) in enumerate(zip(outs, want)):
            check(f"all_reduce out {i} step {k}", o, w)
        for i, (x, d) in enumerate(zip(xs, data)):
            check(f"all_reduce input {i} untouched", x, d)
        as_tuple = tuple(xs)
        check("all_reduce in place returns xs", [comm.all_reduce_coalesced(as_tuple) is as_tuple], [True])
        for i, (x, w) in enumerate(zip(xs, want)):
            check(f"all_reduce in place {i} step {k}", x, w)
        for x, d in zip(xs, data):
            x[:] = d
        work = comm.all_reduce_coalesced(xs, op="max", async_op=True)
        check("async wait returns xs", [work.wait(timeout=60) is xs], [True])
        for i, x in enumerate(xs):
            check(f"all_reduce max {i}", x, (np.arange(x.size) % 7 + P - 1 + k).astype(x.dtype))
        # all_gather and reduce_scatter lists.
        for i, a in enumerate(ag_in):
            a[:] = 10 * r + i + k
        comm.all_gather_coalesced(ag_in, ag_out)
        for i, o in enumerate(ag_out):
            check(f"all_gather {i}", o, np.repeat(10 * np.arange(P) + i + k, N + i))
        for a in rs_in:
            a[:] = np.arange(a.size) + r + k
        work = comm.reduce_scatter_coalesced(rs_in, rs_out, async_op=k % 2 == 1)
        if k % 2 == 1:
            work.wait(timeout=60)
        for i, o in enumerate(rs_out):
            n = N + i
            full = sum(np.arange(P * n) + q + k for q in range(P)).astype(np.float32)
            check(f"reduce_scatter {i}", o, full[r * n : (r + 1) * n])
    # The same list but for one buffer: the new one is reduced, the one it replaced is not.
    spare = np.full(xs[3].size, r, np.int64)
    before = xs[3].copy()
    changed = list(xs)
    changed[3] = spare
    comm.all_reduce_coalesced(changed)
    check("changed buffer reduced", spare, np.full(spare.size, P * (P - 1) // 2))
    check("replaced buffer untouched", xs[3], before)
    check("empty list", [comm.all_reduce_coalesced([]) == []], [True])
    comm.close()
    return failed


@pytest.mark.timeout(180)
@pytest.mark.parametrize("nranks", [2, 3])
def test_coalesced_calls_give_exact_results_step_after_step(nranks):
    for res in run_world(nranks, coalesced_results, {"steps": 6}, timeout=150).check_ok():
        assert res == [], res


def coalesced_bits():
    """A coalesced list of float32 sums gives the bits of the same all_reduces called one by one,
    and so does a list on the Python route (float16 is not a type the list entry reads)."""
    comm = rt.init()
    r = comm.rank
    report = {}
    for dtype in (np.float32, np.float16):
        rng = np.random.default_rng(7 + r)
        data = [rng.uniform(-2, 2, 5).astype(dtype) for _ in range(24)]
        xs = [d.copy() for d in data]
        comm.all_reduce_coalesced(xs)
        plain = [comm.all_reduce(d.copy()) for d in data]
        report[np.dtype(dtype).name] = all(x.tobytes() == p.tobytes() for x, p in zip(xs, plain))
    comm.close()
    return report


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 4])
def test_coalesced_sums_give_the_bits_of_plain_calls(nranks):
    for res in run_world(nranks, coalesced_bits, timeout=100).check_ok():
        assert res == {"float32": True, "float16": True}, res


def python_route():
    """Lists the C entry leaves to the Python route: a dtype it does not read, a non-contiguous
    array (refused), torch tensors, and a list issued inside an open group (run with the group)."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    total = P * (P - 1) // 2
    report = {}
    plain, other_dtype = np.full(3, r, np.int64), np.full(4, r, np.uint16)
    comm.all_reduce_coalesced([plain, other_dtype])
    report["uint16"] = other_dtype.tolist() == [total] * 4 and plain.tolist() == [total] * 3
    try:  # refused at its call, as a plain call on it is: the list is dropped, nothing sent
        comm.all_reduce_coalesced([plain, np.full(8, r, np.int64)[::2]])
    except rt.InvalidArgument as e:
        report["strided_refused"] = "C-contiguous" in str(e) and plain.tolist() == [total] * 3
    a, b = np.full(2, r, np.int64), np.full(2, 2 * r, np.int64)
    with comm.group():
        comm.all_reduce(a)
        comm.all_reduce_coalesced([b])
        report["deferred_in_group"] = b.tolist() == [2 * r] * 2
    report["in_group"] = a.tolist() == [total] * 2 and b.tolist() == [2 * total] * 2
    # A bad list inside a group is refused at its call, as a bad call there is; the group goes on.
    with comm.group():
        comm.all_reduce(a)
        try:
            comm.all_reduce_coalesced([b, np.full(8, r, np.int64)[::2]])
        except rt.InvalidArgument:
            report["refused_in_group"] = True
    report["group_went_on"] = a.tolist() == [P * total] * 2 and b.tolist() == [2 * P * total] * 2
    try:
        import torch
    except ImportError:
        return report
    ts = [torch.full((3,), float(r + i)) for i in range(5)]
    work = comm.all_reduce_coalesced(ts, async_op=True)
    work.wait(timeout=60)
    report["torch"] = all(t.tolist() == [float(total + P * i)] * 3 for i, t in enumerate(ts))
    outs = [torch.zeros(P * 2, dtype=torch.int64) for _ in range(3)]
    comm.all_gather_coalesced([torch.full((2,), r + i, dtype=torch.int64) for i in range(3)], outs)
    report["torch_all_gather"] = all(
        o.tolist() == [q + i for q in range(P) for _ in range(2)] for i, o in enumerate(outs)
    )
    comm.close()
    return report


@pytest.mark.timeout(120)
def test_lists_the_c_entry_leaves_take_the_python_route():
    for res in run_world(2, python_route, timeout=100).check_ok():
        assert all(v is True for v in res.values()) and len(res) in (6, 8), res


def coalesced_mismatch():
    """The last rank's list differs in its third call: every rank names that call."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    xs = [np.ones(2), np.ones(4), np.ones(3 if r == P - 1 else 5), np.ones(1)]
    try:
        comm.all_reduce_coalesced(xs)
    except rt.CollectiveMismatch as e:
        return {"error": str(e)}
    return {"error": None}


@pytest.mark.timeout(120)
def test_a_mismatch_in_a_list_names_the_call_on_every_rank():
    results = run_world(3, coalesced_mismatch, timeout=100).check_ok()
    for res in results:
        assert res["error"] and "collective mismatch in a group: its call 2 is all_reduce" in res["error"], res
    assert len({res["error"] for res in results}) == 1


def bad_lists():
    """Bad lists are refused before any traffic, on the rank that made them, and the communicator
    stays usable; a list only the call refers to stays alive until an async call is waited for."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    report = {}
    x = np.full(2, r, np.int64)
    try:
        comm.all_gather_coalesced([x, x], [np.zeros(2 * P, np.int64)])
    except rt.InvalidArgument as e:
        report["lengths"] = "2 inputs but 1 outputs" in str(e)
    try:
        comm.all_gather_coalesced([x, x], [np.zeros(2 * P, np.int64), np.zeros(3, np.int64)])
    except rt.InvalidArgument as e:
        report["bad_call"] = "its call 1: all_gather" in str(e) and x.tolist() == [r, r]
    try:
        comm.all_reduce_coalesced(np.zeros(3))
    except rt.InvalidArgument as e:
        report["not_a_list"] = "list or tuple" in str(e)
    report["usable"] = comm.all_reduce(np.full(2, r + 1, np.int64)).tolist() == [P * (P + 1) // 2] * 2
    # An async list emptied by its caller: the call still holds the buffers until wait().
    xs = [np.full(3, r + i, np.int64) for i in range(4)]
    refs = [weakref.ref(a) for a in xs]
    work = comm.all_reduce_coalesced(xs, async_op=True)
    kept = list(xs)
    xs.clear()
    gc.collect()
    report["held_until_wait"] = all(ref() is not None for ref in refs)
    work.wait(timeout=60)
    report["async_values"] = all(a.tolist() == [P * (P - 1) // 2 + P * i] * 3 for i, a in enumerate(kept))
    del kept, work
    gc.collect()
    report["freed_after"] = all(ref() is None for ref in refs)
    # A blocking list emptied by another thread while the call waits for the other rank: the
    # call holds its buffers (rank 1 comes late; rank 0's thread empties the list meanwhile).
    xs = [np.full(3, r + i, np.int64) for i in range(4)]
    refs = [weakref.ref(a) for a in xs]
    seen = []

    def empty_the_list():
        time.sleep(0.3)
        xs.clear()
        gc.collect()
        seen.append(all(ref() is not None for ref in refs))

    comm.barrier()
    if r == 0:
        thief = threading.Thread(target=empty_the_list)
        thief.start()
    else:
        time.sleep(1.5)
    held = comm.all_reduce_coalesced(xs)
    if r == 0:
        thief.join(30)
        gc.collect()
        report["held_while_blocking"] = seen == [True] and held == [] and all(ref() is None for ref in refs)
    comm.close()
    return report


@pytest.mark.timeout(120)
def test_bad_lists_are_refused_before_any_traffic():
    results = run_world(2, bad_lists, timeout=100).check_ok()
    assert len(results[0]) == 8 and "held_while_blocking" in results[0], results[0]
    assert len(results[1]) == 7, results[1]
    for res in results:
        assert all(v is True for v in res.values()), res
