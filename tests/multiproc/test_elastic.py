"""Shrink and grow (Communicator.shrink / grow, rt.join): survivors of a SIGKILL, of a SIGSTOP
and of an exclusion on purpose agree on one communicator of exactly the live ranks, densely
renumbered in old-rank order; a rank that dies during the shrink leaves it; a rank that was
only stopped raises Excluded once resumed instead of forming a communicator of its own; a
freshly started process joins through grow's token. After every shrink and grow a check
all_reduce / all_gather / broadcast is compared exactly with numpy.

The rank bodies run in every rank of a test's world (harness.py) and return a JSON report."""

import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
from harness import rank_command, rank_pythonpath, run_world

import ringtree as rt

SHRINK_TIMEOUT = 3.0


def _check(comm, old_rank, members, n=1000):
    """Exact collectives on comm, whose ranks are the old ranks `members` in order: all_reduce
    of values that depend on the old rank, all_gather of old ranks (the renumbering), broadcast
    from the last rank. Returns the list of what was wrong (empty when all is right)."""
    wrong = []
    if comm.size != len(members) or comm.rank != members.index(old_rank):
        wrong.append(f"rank {comm.rank} of {comm.size}, expected {members.index(old_rank)} of {len(members)}")
        return wrong
    x = np.arange(n, dtype=np.int64) * (old_rank + 1) + old_rank
    comm.all_reduce(x)
    expected = sum(np.arange(n, dtype=np.int64) * (q + 1) + q for q in members)
    if not np.array_equal(x, expected):
        wrong.append("all_reduce")
    olds = np.empty(comm.size, np.int64)
    comm.all_gather(np.array([old_rank], np.int64), olds)
    if olds.tolist() != list(members):
        wrong.append(f"all_gather: {olds.tolist()}")
    b = np.full(n, old_rank, np.float64)
    comm.broadcast(b, root=comm.size - 1)
    if not np.array_equal(b, np.full(n, members[-1], np.float64)):
        wrong.append("broadcast")
    return wrong


def _fail_until_error(comm, timeout=None, limit=30.0):
    """Run all_reduces until one raises; the error's class name."""
    x = np.ones(4096, np.float32)
    start = time.monotonic()
    try:
        while time.monotonic() - start < limit:
            comm.all_reduce(x, timeout=timeout)
    except rt.Error as exc:
        return type(exc).__name__
    return None


def _pids(comm):
    pids = np.empty(comm.size, np.int64)
    comm.all_gather(np.array([os.getpid()], np.int64), pids)
    return pids.tolist()


def _shrink_report(comm, old, members, **extra):
    try:
        new = comm.shrink(timeout=SHRINK_TIMEOUT)
    except rt.Error as exc:
        return dict(extra, shrunk=False, error=type(exc).__name__, message=str(exc))
    report = dict(extra, shrunk=True, rank=new.rank, size=new.size, wrong=_check(new, old, members))
    new.close()
    return report


# --- shrink after SIGKILL ----------------------------------------------------------------------


def survive_kill(victim):
    """The victim SIGKILLs itself during a loop of all_reduces; the others catch the error and shrink."""
    comm = rt.init(timeout=20)
    old, P = comm.rank, comm.size
    comm.all_reduce(np.ones(16, np.float32))
    if old == victim:
        threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    error = _fail_until_error(comm)
    return _shrink_report(comm, old, [q for q in range(P) if q != victim], failure=error)


def _assert_shrunk(world, members):
    for q in members:
        res = world.results[q]
        assert res is not None and world.returncodes[q] == 0, world.failure_report()
        assert res["shrunk"], res
        assert res["size"] == len(members) and res["rank"] == members.index(q), res
        assert res["wrong"] == [], res


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nranks,victim,hosts", [(3, 1, 1), (4, 0, 1), (4, 2, 2), (3, 0, 1)])
def test_shrink_after_sigkill(nranks, victim, hosts):
    world = run_world(nranks, survive_kill, dict(victim=victim), hosts=hosts, timeout=50)
    assert world.returncodes[victim] == -9, world.failure_report()
    members = [q for q in range(nranks) if q != victim]
    _assert_shrunk(world, members)
    assert all(world.results[q]["failure"] in ("PeerFailure", "Aborted") for q in members), world.results


# --- shrink on purpose -----------------------------------------------------------------------


def exclude_on_purpose(leaver, leaver_shrinks):
    """Everyone but `leaver` shrinks with exclude=[leaver]; the leaver either closes its
    communicator (a rank that leaves) or calls shrink() too and must learn it is excluded."""
    comm = rt.init(timeout=20)
    old, P = comm.rank, comm.size
    comm.all_reduce(np.ones(16, np.float32))  # healthy: no failure before the shrink
    members = [q for q in range(P) if q != leaver]
    if old == leaver:
        if not leaver_shrinks:
            comm.close()
            return {"left": True}
        return _shrink_report(comm, old, members)
    new = comm.shrink(exclude=[leaver], timeout=SHRINK_TIMEOUT)
    report = dict(shrunk=True, rank=new.rank, size=new.size, wrong=_check(new, old, members))
    new.close()
    return report


@pytest.mark.timeout(60)
@pytest.mark.parametrize("leaver_shrinks", [False, True])
def test_shrink_on_purpose_with_exclude(leaver_shrinks):
    world = run_world(4, exclude_on_purpose, dict(leaver=1, leaver_shrinks=leaver_shrinks), timeout=50)
    results = world.check_ok()
    _assert_shrunk(world, [0, 2, 3])
    if leaver_shrinks:
        assert results[1]["shrunk"] is False and results[1]["error"] == "Excluded", results[1]
        assert "rank 1 is excluded" in results[1]["message"], results[1]


def bad_shrink_arguments():
    """Each bad call raises InvalidArgument before any traffic; the communicator stays usable."""
    comm = rt.init(timeout=20)
    raised = []
    for exclude, timeout in (([comm.rank], None), ([comm.size], None), ([-1], None), ("x", None), ([], 0), ([], -1.0)):
        try:
            comm.shrink(exclude=exclude, timeout=timeout)
            raised.append(None)
        except rt.InvalidArgument as exc:
            raised.append(str(exc))
    # Rank 0 alone is told it needs publish (the others would enter the collective).
    publish_missing = (lambda: comm.grow(1, publish=None)) if comm.rank == 0 else (lambda: comm.grow(1.5))
    for bad in (lambda: comm.grow(0, publish=print), publish_missing, lambda: comm.isend(np.zeros(1), 0, tag=1 << 62)):
        try:
            bad()
            raised.append(None)
        except rt.InvalidArgument as exc:
            raised.append(str(exc))
    x = np.full(8, comm.rank + 1, np.int64)
    comm.all_reduce(x)
    return {"raised": raised, "usable": x.tolist() == [comm.size * (comm.size + 1) // 2] * 8}


@pytest.mark.timeout(60)
def test_bad_shrink_and_grow_arguments_raise_before_traffic():
    results = run_world(2, bad_shrink_arguments, timeout=50).check_ok()
    for r, res in enumerate(results):
        assert res["usable"], res
        raised = res["raised"]
        assert "cannot exclude itself" in raised[0], raised
        assert "outside 0..1" in raised[1] and "outside 0..1" in raised[2], raised
        assert "collection of ranks" in raised[3], raised
        assert "timeout" in raised[4] and "timeout" in raised[5], raised
        assert "at least 1" in raised[6], raised
        assert ("needs publish" if r == 0 else "must be an int") in raised[7], raised
        assert "reserved" in raised[8], raised


# --- a stopped rank -----------------------------------------------------------------------------


def survive_stop(victim, stopper):
    """The stopper SIGSTOPs the victim; the others time out, shrink without it and check the
    new communicator; then the stopper SIGCONTs it, and the victim's own shrink must raise
    Excluded (never form a communicator of its own)."""
    comm = rt.init(timeout=20)
    old, P = comm.rank, comm.size
    pids = _pids(comm)
    members = [q for q in range(P) if q != victim]
    if old == stopper:
        os.kill(pids[victim], signal.SIGSTOP)
    error = _fail_until_error(comm, timeout=1.5)
    if old == victim:
        return _shrink_report(comm, old, members, failure=error)
    new = comm.shrink(timeout=SHRINK_TIMEOUT)
    report = dict(failure=error, shrunk=True, rank=new.rank, size=new.size, wrong=_check(new, old, members))
    if old == stopper:
        os.kill(pids[victim], signal.SIGCONT)
    new.barrier()  # the victim is resumed before the survivors leave
    new.close()
    return report


@pytest.mark.timeout(60)
def test_stopped_rank_is_left_out_and_raises_excluded_when_resumed():
    world = run_world(4, survive_stop, dict(victim=2, stopper=0), timeout=50)
    results = world.check_ok()
    _assert_shrunk(world, [0, 1, 3])
    assert results[2]["shrunk"] is False and results[2]["error"] == "Excluded", results[2]


# --- a death during the shrink ----------------------------------------------------------------


def die_during_shrink(first, second):
    """`first` is SIGKILLed; the others shrink. `second` waits until a survivor's view of the
    shrink reaches it (so it is in every survivor's view) and then SIGKILLs itself: the
    survivors must leave it out too."""
    comm = rt.init(timeout=20)
    old, P = comm.rank, comm.size
    comm.all_reduce(np.ones(16, np.float32))
    if old == first:
        os.kill(os.getpid(), signal.SIGKILL)
    error = _fail_until_error(comm)
    if old == second:
        comm.probe(tag=rt.elastic.RESERVED_TAGS + 1, timeout=10)  # a round-0 view arrived
        os.kill(os.getpid(), signal.SIGKILL)
    return _shrink_report(comm, old, [q for q in range(P) if q not in (first, second)], failure=error)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("first,second", [(1, 3), (2, 0)])
def test_rank_dying_during_the_shrink_is_left_out(first, second):
    world = run_world(4, die_during_shrink, dict(first=first, second=second), timeout=50)
    assert world.returncodes[first] == -9 and world.returncodes[second] == -9, world.failure_report()
    _assert_shrunk(world, [q for q in range(4) if q not in (first, second)])


# --- grow back -------------------------------------------------------------------------------


def joiner(token):
    comm = rt.join(token, timeout=20)
    wrong = _check(comm, old_rank=comm.rank, members=list(range(comm.size)))
    comm.close()
    if wrong:
        raise SystemExit(f"joiner: wrong results {wrong}")
    return {"rank": comm.rank}


def shrink_then_grow(victim):
    """Shrink from P to P-1 after a SIGKILL, then grow back to P with a freshly started process
    (started by the new rank 0 from the token it publishes); every collective exact."""
    comm = rt.init(timeout=20)
    old, P = comm.rank, comm.size
    comm.all_reduce(np.ones(16, np.float32))
    if old == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    _fail_until_error(comm)
    members = [q for q in range(P) if q != victim]
    small = comm.shrink(timeout=SHRINK_TIMEOUT)
    wrong = _check(small, old, members)
    spawned = []

    def publish(token):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RINGTREE_") or k == "RINGTREE_TIMEOUT"}
        env["PYTHONPATH"] = rank_pythonpath(joiner, env.get("PYTHONPATH"))
        spawned.append(
            subprocess.Popen(
                rank_command(joiner, dict(token=token)), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
        )

    big = small.grow(1, publish=publish if small.rank == 0 else None, timeout=20)
    # Old ranks keep their numbers in the grown communicator; the joiner is the last.
    wrong += _check(big, small.rank, list(range(big.size)))
    report = {"rank": big.rank, "size": big.size, "wrong": wrong}
    big.close()
    small.close()
    if spawned:
        out, _ = spawned[0].communicate(timeout=30)
        report["joiner_exit"], report["joiner_output"] = spawned[0].returncode, out.decode()[-2000:]
    return report


@pytest.mark.timeout(60)
def test_shrink_after_sigkill_then_grow_back_with_a_new_process():
    world = run_world(4, shrink_then_grow, dict(victim=1), timeout=50)
    assert world.returncodes[1] == -9, world.failure_report()
    for q, new_rank in ((0, 0), (2, 1), (3, 2)):
        res = world.results[q]
        assert res is not None and world.returncodes[q] == 0, world.failure_report()
        assert res["size"] == 4 and res["rank"] == new_rank and res["wrong"] == [], res
    assert world.results[0]["joiner_exit"] == 0, world.results[0]["joiner_output"]


def test_join_rejects_bad_tokens_before_traffic():
    for token, index in (
        ("rt1:127.0.0.1:1:00", 0),
        ("rtgrow1:3:4:rt1:127.0.0.1:1:00", 1),
        ("rtgrow1:3:4:rt1:127.0.0.1:1:00", -1),
    ):
        with pytest.raises(rt.InvalidArgument):
            rt.join(token, index)
