"""A communicator's life as long-running jobs live it: a watchdog thread aborts a stuck call on
every rank, hundreds of communicators made, used, failed and closed in one process leave no
file descriptors, threads, shared-memory segments or memory behind, and buffers of calls and
messages in flight outlive a dropped Work, MessageWork or communicator."""

from __future__ import annotations

import gc
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
    # Larger than a one-shot slot (256 KiB by default): in one-shot calls rank 2 would find ranks
    # 0 and 1's inputs already published and finish its call correctly (then fail in the next one).
    big = np.ones(1 << 18, np.float32)
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


class _Watched(np.ndarray):
    """An array that notes, as it is freed, whether the core work using it had finished and
    whether it held `expect` in every element: the core must never outlive its buffer."""

    def __del__(self):
        notes = getattr(self, "notes", None)
        if notes is not None:
            notes.append({"finished": self.core_work.is_completed(), "exact": bool((self == self.expect).all())})


def _watched(n, value, expect, notes):
    buf = np.full(n, value, np.int32).view(_Watched)
    buf.expect, buf.notes = expect, notes
    return buf


def dropped_in_flight(late=0.5):
    """Rank 0 drops a Work, a persistent request with its started Work, and then a communicator
    with a receive in flight, without waiting or closing; rank 1 joins each collective `late` s
    after. Rank 0's buffers must stay alive until their collective is done (and then hold its
    exact result), and until the dropped communicator's receive has failed. Rank 1 must see
    rank 0 leave, not vanish."""
    comm = rt.init(timeout=30.0)
    r, P, n = comm.rank, comm.size, 1 << 16
    comm.barrier()
    expect = sum(q + 1 for q in range(P))
    kinds = ("work", "request")
    if r != 0:
        exact = []
        for _ in kinds:
            time.sleep(late)
            x = np.full(n, r + 1, np.int32)
            comm.all_reduce(x)
            exact.append(bool((x == expect).all()))
        try:
            comm.probe(src=0, tag=7, timeout=20.0)
            left = None
        except rt.Error as exc:
            left = f"{type(exc).__name__}: {exc}"
        comm.close()
        return {"exact": exact, "left": left}
    report, notes = {}, {kind: [] for kind in (*kinds, "message")}
    for kind in kinds:
        buf = _watched(n, r + 1, expect, notes[kind])
        if kind == "work":
            work = comm.all_reduce(buf, async_op=True)
        else:
            request = comm.all_reduce_init(buf)
            work = request.start(async_op=True)
            del request
        buf.core_work = core_work = work._work
        del work, buf
        gc.collect()
        # Freed unfinished is the fault; freed finished only means this rank was held up longer than `late`.
        report[f"{kind} freed while running"] = [note for note in notes[kind] if not note["finished"]]
        core_work.wait(-1.0)  # the collective, which nobody holds a Work of any more, runs to the end
    buf = _watched(4, -1, -1, notes["message"])  # nothing ever arrives: rank 1 never sends it
    message = comm.irecv(buf, src=1, tag=7)
    buf.core_work = message._work
    del message, buf
    del comm  # no close(): the finalizers must end the receive before its buffer goes
    gc.collect()
    report.update(notes)
    return report


@pytest.mark.timeout(90)
def test_buffers_outlive_a_dropped_work_and_a_dropped_communicator():
    rank0, rank1 = run_world(2, dropped_in_flight, timeout=60).check_ok()
    for kind in ("work", "request"):
        assert rank0[f"{kind} freed while running"] == [], rank0  # the call still writes it
    done = {"finished": True, "exact": True}
    assert rank0["message"] == [done], rank0
    assert rank0["work"] == [done] and rank0["request"] == [done], rank0  # let go by the dropped comm
    assert rank1["exact"] == [True, True], rank1
    assert rank1["left"] and "closed its communicator" in rank1["left"], rank1
