"""A communicator's life as long-running jobs live it: a watchdog thread aborts a stuck call on
every rank, and hundreds of communicators made, used, failed and closed in one process leave no
file descriptors, threads, shared-memory segments or memory behind."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from harness import run_world

import ringtree as rt


def aborted_by_watchdog(delay=1.0, late=3.0):
    """Rank 0's watchdog thread aborts an all_reduce that rank 2 never joins; ranks 0 and 1 are
    blocked in it. Every rank must raise Aborted (rank 2 in its late call), promptly, and calls
    after the abort must raise Aborted at once."""
    comm = rt.init(timeout=60.0)
    r = comm.rank
    x = np.ones(256, np.float32)
    comm.all_reduce(x)  # everyone is up
    out = {}
    start = time.monotonic()
    if r == 0:
        threading.Timer(delay, comm.abort, args=("watchdog",)).start()
    if r == 2:
        time.sleep(delay + late)
        start = time.monotonic()
    # Larger than a one-shot slot: in one-shot calls rank 2 would find ranks 0 and 1's inputs
    # already published and finish its call correctly (then fail in the next one).
    big = np.ones(1 << 16, np.float32)
    try:
        comm.all_reduce(big)
        out["raised"] = None
    except rt.Error as exc:
        out["raised"] = type(exc).__name__
        out["message"] = str(exc)
    out["seconds"] = time.monotonic() - start
    t0 = time.monotonic()
    try:
        comm.barrier()
        out["after"] = None
    except rt.Error as exc:
        out["after"] = type(exc).__name__
    out["after_seconds"] = time.monotonic() - t0
    out["is_aborted"] = comm.is_aborted
    comm.close()
    return out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("hosts", [1, 2])
def test_abort_from_another_thread_ends_the_call_on_every_rank(hosts):
    world = run_world(3, aborted_by_watchdog, dict(delay=1.0, late=3.0), hosts=hosts, timeout=80)
    results = world.check_ok()
    for rank, res in enumerate(results):
        assert res["raised"] == "Aborted", (rank, res)
        assert "comm.abort() on rank 0: watchdog" in res["message"], (rank, res)
        assert res["after"] == "Aborted" and res["after_seconds"] < 1.0, (rank, res)
        assert res["is_aborted"], (rank, res)
    # Far inside the 60 s timeout: the abort ends the calls, not the clock.
    assert results[0]["seconds"] < 1.0 + 2.0, results[0]
    assert results[1]["seconds"] < 1.0 + 3.0, results[1]
    assert results[2]["seconds"] < 3.0, results[2]  # its late call, from when it made it


def resources(ids=()):
    """(open file descriptors, threads, /dev/shm entries of the communicators named by `ids`,
    resident bytes) of this process. Only our own segments count: other jobs on the machine may
    hold theirs."""
    fds = len(os.listdir("/proc/self/fd"))
    threads = len(os.listdir("/proc/self/task"))
    prefixes = tuple(f"rt-{i}-" for i in ids)
    shm = len([f for f in os.listdir("/dev/shm") if prefixes and f.startswith(prefixes)])
    rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return fds, threads, shm, rss


def init_use_close_cycles(cycles=200, warmup=20):
    """`cycles` communicators made from a fresh unique id each (handed over by a long-lived one),
    used (an all_reduce, an async all_gather), every fourth failed on purpose (ranks call
    different counts: CollectiveMismatch) and closed. Reports resources after `warmup` cycles
    and at the end."""
    base = rt.init()
    r, P = base.rank, base.size
    token = np.zeros(96, np.uint8)
    report = {"mismatches": 0, "wrong": 0}
    ids = [base.id]  # each communicator's segments are named after its id
    for i in range(cycles):
        if r == 0:
            raw = str(rt.UniqueId.create()).encode()
            token[:] = 0
            token[: len(raw)] = np.frombuffer(raw, np.uint8)
        base.broadcast(token)
        comm = rt.Communicator(r, P, token.tobytes().rstrip(b"\0").decode(), 30.0)
        ids.append(comm.id)
        x = np.full(1000, r + i, np.int64)
        comm.all_reduce(x)
        report["wrong"] += int(np.count_nonzero(x != sum(q + i for q in range(P))))
        out = np.empty(8 * P, np.float32)
        comm.all_gather(np.full(8, r, np.float32), out, async_op=True).wait()
        report["wrong"] += int(np.count_nonzero(out != np.repeat(np.arange(P, dtype=np.float32), 8)))
        if i % 4 == 3:
            try:
                comm.all_reduce(np.zeros(16 + r, np.float32))
            except rt.CollectiveMismatch:
                report["mismatches"] += 1
        comm.close()
        del comm
        if i + 1 == warmup:
            report["before"] = resources(ids)
    report["after"] = resources(ids)
    base.close()
    return report


@pytest.mark.timeout(240)
def test_many_communicators_leave_nothing_behind():
    cycles, warmup = 200, 20
    world = run_world(2, init_use_close_cycles, dict(cycles=cycles, warmup=warmup), timeout=220)
    for rank, res in enumerate(world.check_ok()):
        assert res["wrong"] == 0, (rank, res)
        assert res["mismatches"] == cycles // 4, (rank, res)
        fds0, threads0, shm0, rss0 = res["before"]
        fds1, threads1, shm1, rss1 = res["after"]
        assert fds1 == fds0, (rank, res)
        assert threads1 == threads0, (rank, res)
        assert shm1 == shm0 == 0, (rank, res)
        # 180 communicators: a leak of even one recorder (256 KiB) or ring (1 MiB) each shows.
        assert rss1 - rss0 < 16 << 20, (rank, rss1 - rss0)
