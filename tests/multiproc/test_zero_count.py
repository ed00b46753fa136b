"""A collective whose per-rank count is zero moves nothing: it is checked on its own rank, takes
its place in the call order and returns without traffic (as MPI does), so it waits for no peer.
Its sequence number is spent, so a peer that made a call with data in its place raises
CollectiveMismatch (tests/multiproc/test_errors.py); two count-0 calls that differ only in
dtype, op or collective are compared with nothing."""

from __future__ import annotations

import time

import numpy as np
import pytest
from harness import run_world

import ringtree as rt

CALLS_AHEAD = 2000  # far beyond any bound a call with traffic could run ahead


def empty_calls(comm, dtype=np.float32):
    """One count-0 call of every collective whose ranks share a count."""
    e = np.empty(0, dtype)
    return [
        ("all_reduce", lambda: comm.all_reduce(e)),
        ("reduce_scatter", lambda: comm.reduce_scatter(e, np.empty(0, dtype))),
        ("all_gather", lambda: comm.all_gather(e, np.empty(0, dtype))),
        ("all_to_all", lambda: comm.all_to_all(e, np.empty(0, dtype))),
        ("broadcast", lambda: comm.broadcast(e, root=comm.size - 1)),
        ("reduce", lambda: comm.reduce(e, root=1 % comm.size)),
        ("gather", lambda: comm.gather(e, np.empty(0, dtype), root=0)),
        ("scatter", lambda: comm.scatter(np.empty(0, dtype), np.empty(0, dtype), root=0)),
    ]


def interleaved():
    """Count-0 calls of every collective between calls with data (counts 1, P+1, large): every
    result exact, and the count-0 calls' async Works complete."""
    comm = rt.init(timeout=60)
    r, P = comm.rank, comm.size
    wrong = {}
    for n in (1, P + 1, 1 << 16):
        for name, call in empty_calls(comm):
            call()
            x = np.arange(n, dtype=np.int64) + r
            comm.all_reduce(x)
            expect = P * np.arange(n, dtype=np.int64) + P * (P - 1) // 2
            wrong[f"{name} then all_reduce n={n}"] = int((x != expect).sum())
        work = comm.all_gather(np.empty(0, np.int32), np.empty(0, np.int32), async_op=True)
        wrong[f"async n={n}"] = 0 if work.wait() is not None and work.is_completed() else 1
        out = np.empty(n * P, np.int64)
        comm.all_gather(np.full(n, r, np.int64), out)
        wrong[f"all_gather n={n}"] = int((out != np.repeat(np.arange(P), n)).sum())
    comm.close()
    return wrong


@pytest.mark.timeout(150)
@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_count0_calls_of_every_collective_keep_the_ranks_in_step(nranks):
    for rank, wrong in enumerate(run_world(nranks, interleaved, timeout=120).check_ok()):
        assert not any(wrong.values()), (rank, {k: v for k, v in wrong.items() if v})
        assert len(wrong) == 3 * (len(empty_calls(None)) + 2)


def alone(late_s=1.0):
    """Rank 0 makes CALLS_AHEAD count-0 calls while the others sleep; then every rank makes them
    too, and one all_reduce with data. Returns when rank 0 finished and the others began."""
    comm = rt.init(timeout=60)
    r = comm.rank
    comm.barrier()
    if r != 0:
        time.sleep(late_s)
    began = time.monotonic()
    calls = empty_calls(comm)
    for k in range(CALLS_AHEAD):
        calls[k % len(calls)][1]()
    ended = time.monotonic()
    x = np.array([r + 1], np.int64)
    comm.all_reduce(x)
    # The flight recorder still lists every count-0 call, done, with its place in the order.
    calls = [c for c in comm.record()["calls"] if c["count"] == 0 and c["coll"] != "barrier"]
    recorded = {
        "calls": len(calls),
        "done": sum(c["state"] == "done" for c in calls),
        "seqs": sorted(c["seq"] for c in calls) == list(range(1, CALLS_AHEAD + 1)),
    }
    comm.close()
    return {"began": began, "ended": ended, "total": int(x[0]), "recorded": recorded}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("nranks", [2, 4])
def test_count0_calls_wait_for_no_peer(nranks):
    ranks = run_world(nranks, alone, timeout=120).check_ok()
    for res in ranks:
        assert res["total"] == nranks * (nranks + 1) // 2
        assert res["recorded"] == {"calls": CALLS_AHEAD, "done": CALLS_AHEAD, "seqs": True}, res["recorded"]
    # Rank 0 finished all its calls before any other rank made its first.
    assert ranks[0]["ended"] < min(res["began"] for res in ranks[1:]), ranks


def differing_empties():
    """The last rank's count-0 call differs in dtype, op and collective from the others'; both
    return (nothing was compared), and the next call with data is exact."""
    comm = rt.init(timeout=60)
    r, P = comm.rank, comm.size
    odd = r == P - 1
    if odd:
        comm.all_gather(np.empty(0, np.float64), np.empty(0, np.float64))
    else:
        comm.all_reduce(np.empty(0, np.float32), op="max")
    x = np.array([r], np.int64)
    comm.all_reduce(x)
    comm.close()
    return int(x[0])


@pytest.mark.timeout(120)
def test_count0_calls_are_compared_with_nothing():
    assert run_world(3, differing_empties, timeout=100).check_ok() == [3, 3, 3]
