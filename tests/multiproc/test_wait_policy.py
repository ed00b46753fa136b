"""Waiting when the scheduler puts two ranks on one core: a rank whose awaited peer last waited on
this rank's CPU yields at once instead of spinning (the spin would hold the core the peer needs,
about a millisecond a wait); ranks on different cores keep spinning as before."""

from __future__ import annotations

import os

import numpy as np
import pytest
from harness import run_world
from rank_checks import report_wait_policy

import ringtree as rt


def small_and_large_calls(placement, calls=200):
    comm = rt.init()  # every rank may use every core at start-up, so it would spin
    cores = sorted(os.sched_getaffinity(0))
    core = cores[0] if placement == "same" else cores[comm.rank % len(cores)]
    # Then the placement a busy machine's scheduler can make (all threads of the rank).
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), {core})
    P, r = comm.size, comm.rank
    ok = True
    x = np.full(4, r + 1, np.int64)
    for _ in range(calls):
        y = np.empty_like(x)
        comm.all_reduce(x, y)  # oneshot
        ok = ok and bool((y == P * (P + 1) // 2).all())
    big = np.arange(1 << 20, dtype=np.int64) + r
    out = np.empty_like(big)
    comm.all_reduce(big, out, algo="ring")  # ring steps over the shared-memory rings
    ok = ok and bool(np.array_equal(out, P * np.arange(1 << 20, dtype=np.int64) + P * (P - 1) // 2))
    waits = comm.status().shared_cpu_waits
    comm.close()
    return {"ok": ok, "shared_cpu_waits": waits, "cores": len(cores)}


@pytest.mark.timeout(120)
def test_ranks_on_one_core_yield_to_each_other():
    ranks = run_world(2, small_and_large_calls, dict(placement="same"), timeout=100).check_ok()
    assert all(res["ok"] for res in ranks)
    # Every call needs the other rank, which is on this core: waits see it there.
    assert sum(res["shared_cpu_waits"] for res in ranks) > 50, ranks


@pytest.mark.timeout(120)
def test_ranks_on_their_own_cores_do_not():
    ranks = run_world(2, small_and_large_calls, dict(placement="apart"), timeout=100).check_ok()
    if ranks[0]["cores"] < 2:
        pytest.skip("one usable core here: the ranks cannot be placed apart")
    assert all(res["ok"] for res in ranks)
    assert [res["shared_cpu_waits"] for res in ranks] == [0, 0]


@pytest.mark.timeout(60)
def test_the_wait_policy_says_what_decided_it():
    ranks = run_world(2, report_wait_policy, timeout=50).check_ok()
    for res in ranks:
        assert f"2 ranks on this host, 2 allowed the same {res['cpus']} CPUs" in res["policy"], res
        assert res["policy"].startswith("spin 1 us" if res["cpus"] < 2 else "spin 1000 us"), res
    pinned = run_world(
        2, report_wait_policy, env={"RINGTREE_SPIN_US": "50", "RINGTREE_YIELD_US": "7"}, timeout=50
    ).check_ok()
    for res in pinned:
        assert res["policy"].startswith("spin 50 us (RINGTREE_SPIN_US), yield 7 us (RINGTREE_YIELD_US)"), res
