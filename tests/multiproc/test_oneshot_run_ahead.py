"""One-shot lets a broadcast's or scatter's root, and a gather's or reduce's other ranks, return
without waiting for their peers, up to ONESHOT_RUN_AHEAD calls ahead when a call's payload fits in its
slot's page and ONESHOT_PAYLOAD_RUN_AHEAD when it takes a payload slot (common/oneshot.h). Data
stays exact while the slots turn over, each bound holds (a rank that far ahead waits), a peer that
never comes gives a Timeout naming it, and a dead one a PeerFailure."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from harness import run_world

import ringtree as rt
from ringtree import _core

AHEAD = _core.ONESHOT_RUN_AHEAD
PAYLOAD_AHEAD = _core.ONESHOT_PAYLOAD_RUN_AHEAD
# int64 elements a broadcast takes to fit beside its fingerprint, and to need a payload slot.
INLINE_COUNT = _core.ONESHOT_INLINE_BYTES // 8
SIZES = {
    "inline": (5, AHEAD),
    "largest inline": (INLINE_COUNT, AHEAD),
    "payload slot": (INLINE_COUNT + 1, PAYLOAD_AHEAD),
}


def one_call(comm, coll, k, count):
    """Call k of a run-ahead test: a broadcast or scatter from rank 0, or a gather or reduce to the
    last rank (so that rank 0 is one that returns at once); the wrong elements this rank got."""
    r, P = comm.rank, comm.size
    if coll == "broadcast":
        x = np.full(count, 1000 * k + r, np.int64)
        comm.broadcast(x, root=0)
        return int((x != 1000 * k).sum())
    if coll == "scatter":  # the root publishes all P blocks: ceil(count / P) each, the same slot kind
        block = -(-count // P)
        out = np.zeros(block, np.int64)
        comm.scatter(np.arange(block * P, dtype=np.int64) + 1000 * k + r, out, root=0)
        return int((out != np.arange(block * r, block * (r + 1)) + 1000 * k).sum())
    if coll == "reduce":
        out = np.zeros(count, np.int64)
        comm.reduce(np.full(count, 1000 * k + r, np.int64), out, root=P - 1)
        return int((out != 1000 * k * P + P * (P - 1) // 2).sum()) if r == P - 1 else 0
    out = np.zeros(count * P, np.int64)
    comm.gather(np.full(count, 1000 * k + r, np.int64), out, root=P - 1)
    return int((out != np.repeat(np.arange(P) + 1000 * k, count)).sum()) if r == P - 1 else 0


def calls_ahead(coll="broadcast", late_s=0.3, count=5, ahead=AHEAD):
    """Rank 0 calls first (the root of a broadcast or scatter, a rank other than the root of a
    gather or reduce); the others start `late_s` later (count-0 calls wait for no peer at all:
    test_zero_count.py). Returns when each call ended (rank 0) or began (the others), on the
    machine-wide monotonic clock, and every value received."""
    comm = rt.init(timeout=30)
    r = comm.rank
    comm.barrier()
    if r != 0:
        time.sleep(late_s)
    stamps, wrong = [], 0
    for k in range(6 * ahead):  # every slot reused several times
        if r != 0:
            stamps.append(time.monotonic())
        wrong += one_call(comm, coll, k, count)
        if r == 0:
            stamps.append(time.monotonic())
        if r != 0 and k % 7 == 0:
            time.sleep(0.002)  # stay behind, so the root keeps running ahead
    # Data still lines up after the run-ahead: a normal call and its exact result.
    total = comm.all_reduce(np.array([r + 1], np.int64))
    comm.close()
    return {"stamps": stamps, "wrong": wrong, "total": int(total[0])}


# Broadcast at every slot kind and P; the other collectives that return early at P=4 (a gather
# also with a payload slot), where one rank runs ahead of three.
RUNS_AHEAD = [(P, "broadcast", size) for P in (2, 4) for size in SIZES] + [
    (4, "gather", "inline"),
    (4, "gather", "payload slot"),
    (4, "scatter", "inline"),
    (4, "reduce", "inline"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks,coll,size", RUNS_AHEAD)
def test_a_rank_runs_ahead_by_the_bound_and_no_further(nranks, coll, size):
    count, ahead = SIZES[size]
    ranks = run_world(nranks, calls_ahead, {"coll": coll, "count": count, "ahead": ahead}, timeout=100).check_ok()
    for rank, res in enumerate(ranks):
        assert res["wrong"] == 0, (rank, res["wrong"])
        assert res["total"] == nranks * (nranks + 1) // 2
    first_late_call = min(res["stamps"][0] for res in ranks[1:])
    done = ranks[0]["stamps"]
    # Rank 0 finished its first `ahead` calls before any other rank began one ...
    assert done[ahead - 1] < first_late_call, (done[: ahead + 1], first_late_call)
    # ... and the next one only after every other rank had begun its first.
    last_first_call = max(res["stamps"][0] for res in ranks[1:])
    assert done[ahead] > last_first_call, (done[: ahead + 1], last_first_call)


def late_messages_between_oneshot_calls(rounds):
    """Each round: two one-shot collectives, then rank k % P sends to its right neighbour after a
    pause, so the receiver waits in its recv while the sender's one-shot slots hold collectives
    numbered like the recv's message. Returns every value received that was wrong."""
    comm = rt.init(timeout=30)
    r, P = comm.rank, comm.size
    wrong = []
    for k in range(rounds):
        x = np.full(5, r + k, np.int64)
        comm.all_reduce(x, algo="oneshot")
        g = comm.all_gather(np.full(2, r * k, np.int64), np.zeros(2 * P, np.int64), algo="oneshot")
        if x.tolist() != [sum(q + k for q in range(P))] * 5 or g.tolist() != np.repeat(np.arange(P) * k, 2).tolist():
            wrong.append(f"collectives in round {k}")
        sender = k % P
        if r == sender:
            time.sleep(0.15)  # long enough for the receiver to stop spinning and block
            comm.send(np.full(3, 100 * k + r, np.int64), (r + 1) % P)
        elif r == (sender + 1) % P:
            got = comm.recv(np.zeros(3, np.int64), sender)
            if got.tolist() != [100 * k + sender] * 3:
                wrong.append(f"message in round {k}: {got.tolist()}")
    comm.close()
    return wrong


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 3])
def test_a_receive_waiting_beside_oneshot_calls_is_no_mismatch(nranks):
    """A blocked receive looks for a peer in a one-shot call for its own call; a point-to-point
    call's number counts messages with one peer, so it must not match the peer's collectives."""
    for rank, wrong in enumerate(run_world(nranks, late_messages_between_oneshot_calls, {"rounds": 12}).check_ok()):
        assert wrong == [], (rank, wrong)


def root_alone(fate, coll="broadcast", count=3, ahead=AHEAD):
    """Rank 0 broadcasts (or gathers to rank 1) on its own; rank 1 never calls: it sleeps (fate
    'stalls') or dies ('dies', after rank 0 has run ahead)."""
    comm = rt.init(timeout=1.5)
    r = comm.rank
    comm.barrier()
    if r == 1:
        if fate == "dies":
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(6)
        return {"skipped": True}
    start = time.monotonic()
    calls = 0
    try:
        for _ in range(4 * ahead):
            if coll == "broadcast":
                comm.broadcast(np.ones(count, np.float32), root=0)
            else:
                comm.gather(np.ones(count, np.float32), root=1)
            calls += 1
        return {"raised": None, "calls": calls}
    except rt.Error as exc:
        return {"raised": type(exc).__name__, "message": str(exc), "calls": calls, "seconds": time.monotonic() - start}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "coll,size,fate,error",
    [
        ("broadcast", size, *fate)
        for size in ("inline", "payload slot")
        for fate in (("stalls", "Timeout"), ("dies", "PeerFailure"))
    ]
    + [("gather", "inline", "stalls", "Timeout")],  # a gather's other rank runs ahead of its root
)
def test_a_root_that_ran_ahead_hears_of_a_missing_peer_within_the_timeout(fate, error, size, coll):
    count, ahead = SIZES[size]
    count = count * 2  # float32 elements: the same bytes as the int64 counts
    world = run_world(2, root_alone, dict(fate=fate, coll=coll, count=count, ahead=ahead), timeout=40)
    res = world.results[0]
    assert res is not None and world.returncodes[0] == 0, world.failure_report()
    assert res["raised"] == error, res
    assert res["calls"] == ahead, res  # it ran exactly the bound ahead, then waited
    assert "rank 1" in res["message"], res
    if error == "Timeout":
        assert f"at most {ahead} one-shot calls ahead" in res["message"], res
    assert res["seconds"] < 10, res


DEFAULT_CAPACITY = 256 << 10  # RINGTREE_ONESHOT_BYTES' default


def full_payloads_in_a_row(calls):
    """Calls in a row whose one-shot payload fills a payload slot of the default capacity, each
    with new data, so every slot is rewritten several times while peers read the previous
    calls: an all_to_all (payload: the whole send buffer) and an all_reduce (the whole buffer) of
    int64, exact; then one element more, which the slots refuse."""
    comm = rt.init(timeout=60)
    P, r = comm.size, comm.rank
    block = DEFAULT_CAPACITY // 8 // P  # int64 elements per all_to_all block: P blocks fill the slot
    wrong = 0
    for i in range(calls):
        x = np.arange(P * block, dtype=np.int64) + 1000 * i + 100_000 * r
        got = np.empty_like(x)
        comm.all_to_all(x, got, algo="oneshot")
        mine = np.arange(r * block, (r + 1) * block, dtype=np.int64) + 1000 * i
        want = np.concatenate([mine + 100_000 * q for q in range(P)])
        wrong += int(np.count_nonzero(got != want))
        y = np.arange(P * block, dtype=np.int64) * (r + 1) + i
        total = comm.all_reduce(y, algo="oneshot")
        wrong += int(np.count_nonzero(total != np.arange(P * block, dtype=np.int64) * (P * (P + 1) // 2) + P * i))
    try:
        comm.all_reduce(np.ones(DEFAULT_CAPACITY // 8 + 1, np.int64), algo="oneshot")
        refused = "no error"
    except rt.InvalidArgument as exc:
        refused = str(exc)
    comm.close()
    return {"wrong": wrong, "refused": refused}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 4])
def test_payload_slots_turn_over_exactly_at_the_default_capacity(nranks):
    calls = 3 * _core.ONESHOT_PAYLOAD_SLOTS + 1
    for rank, res in enumerate(run_world(nranks, full_payloads_in_a_row, {"calls": calls}, timeout=100).check_ok()):
        assert res["wrong"] == 0, (rank, res)
        assert f"at most {DEFAULT_CAPACITY} bytes per rank in the one-shot slots" in res["refused"], res
