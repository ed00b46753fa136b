"""Grouped and persistent calls on CUDA buffers across real rank processes, over the CUDA stand-in
(RINGTREE_TEST_STANDIN=1, see test_ipc_standin.py), with the IPC executor and the staged one.

Each rank checks every result against numpy's, computed from what every rank sent: exact int64."""

from __future__ import annotations

import numpy as np
import pytest
import standin
from harness import run_world
from test_ipc_standin import executor_env

N = 5  # elements per rank's block


def device_groups_and_requests(reuses):
    """Persistent device calls started `reuses` times with new data, blocking and async, and a
    persistent all_to_all_v; groups of
    device calls (fused-size all_reduces, an all_gather, a send/recv exchange), a group mixing host
    and device calls, an async group, a persistent device group; the refusals. Returns what went
    wrong."""
    import _ringtree_testing as testing
    from ipc_standin_workers import StandinArrays

    import ringtree as rt

    arrays = StandinArrays()
    comm = rt.init()
    r, P = comm.rank, comm.size
    ar = np.arange(N * P, dtype=np.int64)
    wrong = []

    def fill(dev, host):
        host = np.ascontiguousarray(host, dtype=dev.dtype)
        testing.standin_memcpy(dev.ptr, host.ctypes.data, host.nbytes)

    def check(name, dev, want):
        got = np.empty(dev.size, dev.dtype)
        arrays.download_into(dev, got)
        if not np.array_equal(got, want):
            wrong.append(f"{name}: got {got.tolist()} want {np.asarray(want).tolist()}")

    def zeros(n):
        return arrays.upload(np.zeros(n, np.int64))

    # Persistent calls.
    x_ar, out_ar = zeros(N), zeros(N)
    rs_in, rs_out = zeros(N * P), zeros(N)
    ag_in, ag_out = zeros(N), zeros(N * P)
    a2a_in, a2a_out = zeros(N * P), zeros(N * P)
    bc = zeros(N)
    root = P - 1
    reqs = [
        comm.all_reduce_init(x_ar, out_ar),
        comm.reduce_scatter_init(rs_in, rs_out, op="max"),
        comm.all_gather_init(ag_in, ag_out),
        comm.all_to_all_init(a2a_in, a2a_out),
        comm.broadcast_init(bc, root=root),
    ]
    for k in range(reuses):
        fill(x_ar, 1000 * r + k + ar[:N])
        fill(rs_in, (r + 1) * k - ar)
        fill(ag_in, np.full(N, r + 10 * k))
        fill(a2a_in, 100 * r + ar + k)
        fill(bc, np.full(N, 7 * k + 3 if r == root else -1))
        if k % 2:
            for w in comm.start_all(reqs, async_op=True):
                w.wait()
        else:
            for req in reqs:
                req.start()
        check(f"all_reduce {k}", out_ar, sum(1000 * q + k + ar[:N] for q in range(P)))
        check(f"reduce_scatter {k}", rs_out, np.max([(q + 1) * k - ar[r * N : (r + 1) * N] for q in range(P)], axis=0))
        check(f"all_gather {k}", ag_out, np.repeat([q + 10 * k for q in range(P)], N))
        check(f"all_to_all {k}", a2a_out, np.concatenate([100 * q + ar[r * N : (r + 1) * N] + k for q in range(P)]))
        check(f"broadcast {k}", bc, np.full(N, 7 * k + 3))

    # A persistent all_to_all_v with uneven counts: rank i sends i + j + 1 elements to rank j.
    send_counts, recv_counts = [r + j + 1 for j in range(P)], [i + r + 1 for i in range(P)]
    v_in, v_out = zeros(sum(send_counts)), zeros(sum(recv_counts))
    v_req = comm.all_to_all_v_init(v_in, v_out, send_counts, recv_counts)
    for k in range(3):
        fill(v_in, np.concatenate([1000 * k + 100 * r + 10 * j + np.arange(c) for j, c in enumerate(send_counts)]))
        v_req.start()
        want = np.concatenate([1000 * k + 100 * i + 10 * r + np.arange(c) for i, c in enumerate(recv_counts)])
        check(f"all_to_all_v {k}", v_out, want)

    # A group of device calls: small all_reduces, an all_gather, an exchange around the ring.
    grads = [arrays.upload(np.full(3, r + i, np.int64)) for i in range(8)]
    sent, got = arrays.upload(np.full(4, r, np.int64)), zeros(4)
    fill(ag_in, np.full(N, r))
    with comm.group():
        for g in grads:
            comm.all_reduce(g)
        comm.all_gather(ag_in, ag_out)
        comm.send(sent, (r + 1) % P)
        comm.recv(got, (r - 1) % P)
    for i, g in enumerate(grads):
        check(f"group all_reduce {i}", g, np.full(3, sum(q + i for q in range(P))))
    check("group all_gather", ag_out, np.repeat(np.arange(P), N))
    check("group recv", got, np.full(4, (r - 1) % P))

    # Host and device calls in one group, async: the host call runs first, then the device one.
    host = np.full(2, r + 1, np.int64)
    dev = arrays.upload(np.full(2, 2 * r, np.int64))
    with comm.group(async_op=True) as group:
        comm.all_reduce(host)
        work = comm.all_reduce(dev, async_op=True)
    group.wait()
    work.wait()
    if host.tolist() != [P * (P + 1) // 2] * 2:
        wrong.append(f"mixed group host: {host.tolist()}")
    check("mixed group device", dev, np.full(2, P * (P - 1)))

    # A persistent group of device calls, started again with new data.
    with comm.group(persistent=True) as step:
        for g in grads:
            comm.all_reduce(g, op="min")
    for k in range(3):
        for i, g in enumerate(grads):
            fill(g, np.full(3, 10 * k + i - r))
        step.start()
        for i, g in enumerate(grads):
            check(f"persistent group {k}.{i}", g, np.full(3, 10 * k + i - (P - 1)))

    # Refusals, before any traffic; the communicator stays usable.
    refused = {}
    work = None
    try:
        with comm.group():
            work = comm.all_reduce(dev, async_op=True)
            comm.all_gather(ag_in, zeros(N * P + 1))  # wrong output size: refused at the call
    except rt.InvalidArgument as e:
        refused["bad argument"] = "all_gather" in str(e)
    try:
        work.wait()
    except rt.Aborted as e:
        refused["discarded work"] = "has not run" in str(e)
    try:
        with comm.group():
            comm.all_to_all_v(zeros(P), zeros(P), [1] * P, [1] * P)
    except rt.InvalidArgument as e:
        refused["all_to_all_v"] = "outside a group" in str(e)
    fill(dev, np.full(2, r, np.int64))
    comm.all_reduce(dev)
    check("after the refusals", dev, np.full(2, P * (P - 1) // 2))
    comm.close()
    return {"wrong": wrong, "refused": refused}


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("executor", "nranks"), [("ipc", 2), ("ipc", 3), ("staged", 2)])
def test_device_groups_and_persistent_calls_match_numpy(executor, nranks):
    if not standin.available():
        pytest.fail("the test module _ringtree_testing is missing: build with RINGTREE_TESTING=ON (the default)")
    world = run_world(nranks, device_groups_and_requests, {"reuses": 6}, timeout=260, env=executor_env(executor))
    for res in world.check_ok():
        assert res["wrong"] == [], res["wrong"][:5]
        assert res["refused"] == {"bad argument": True, "discarded work": True, "all_to_all_v": True}, res
