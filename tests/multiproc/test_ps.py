"""ringtree.ps: the parameter server's modes against a numpy reference, its staleness bound,
and what a dead worker or a dead server does.

Gradients are small multiples of 1/8 and learning rates powers of two, so every float32 sum is
exact whatever order the server applies pushes in: expected values compare with ==."""

import os
import signal
import threading
import time

import numpy as np
import pytest
from harness import run_world

import ringtree as rt
from ringtree import ps

ROWS, DIM, EMB_DIM = 10, 3, 4


def _grad(worker, step, n, dim, salt=0):
    rng = np.random.default_rng([worker, step, salt])
    return (rng.integers(-8, 9, size=(n, dim)) / 8).astype(np.float32)


def _emb_keys(worker, step):
    rng = np.random.default_rng([worker, step, 99])
    return rng.integers(0, 1000, size=6) * 7919  # sparse, far apart, with repeats


def _tables(scale=0.0):
    return [
        ps.Table("w", dim=DIM, rows=ROWS, optimizer=ps.SGD(lr=0.5)),
        ps.Table("emb", dim=EMB_DIM, init_scale=scale, optimizer=ps.SGD(lr=0.25)),
    ]


def sync_steps(num_servers, steps=5):
    """Sync mode: a worker's pull at step t sees exactly the state after t mean updates, which
    each rank recomputes in numpy from every worker's gradients."""
    comm = rt.init()
    node = ps.start(comm, _tables(), num_servers=num_servers, mode="sync")
    workers = comm.size - num_servers
    if node.is_server:
        report = node.serve()
        return {"server": True, "died": report.died, "finished": sorted(report.finished)}
    me = node.worker_index
    dense = np.zeros((ROWS, DIM), np.float32)
    emb = {}
    errors = []
    for t in range(steps):
        got_w = node.pull("w")
        keys = _emb_keys(me, t)
        got_e = node.pull("emb", keys)
        want_e = np.stack([emb.get(int(k), np.zeros(EMB_DIM, np.float32)) for k in keys])
        if not np.array_equal(got_w, dense) or not np.array_equal(got_e, want_e):
            errors.append(f"step {t}: pulled values differ from the reference")
        if node.version("w") != t:
            errors.append(f"step {t}: version {node.version('w')}")
        node.push("w", np.arange(ROWS), _grad(me, t, ROWS, DIM))
        node.push("emb", keys, _grad(me, t, len(keys), EMB_DIM, salt=1))
        # The reference update of step t: the mean over every worker's gradients.
        dense -= np.float32(0.5) * sum(_grad(w, t, ROWS, DIM) for w in range(workers)) / np.float32(workers)
        total = {}
        for w in range(workers):
            for k, g in zip(_emb_keys(w, t).tolist(), _grad(w, t, 6, EMB_DIM, salt=1)):
                total[k] = total.get(k, 0) + g
        for k, g in total.items():
            emb[k] = emb.get(k, np.zeros(EMB_DIM, np.float32)) - np.float32(0.25) * (g / np.float32(workers))
    final = node.pull("w")
    if not np.array_equal(final, dense):
        errors.append("final dense state differs")
    node.finish()
    return {"server": False, "errors": errors}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks,num_servers", [(3, 1), (5, 2)])
def test_sync_mode_matches_numpy_reference(nranks, num_servers):
    world = run_world(nranks, sync_steps, dict(num_servers=num_servers), timeout=100)
    results = world.check_ok()
    for res in results:
        if res["server"]:
            assert res["died"] == [] and res["finished"] == list(range(num_servers, nranks)), res
        else:
            assert res["errors"] == [], res


def async_totals(num_servers, steps, combine):
    """Async mode with plain SGD: the final rows are the initial rows minus lr times the sum
    of every push, whatever order they arrived in; each server checks its own rows."""
    comm = rt.init()
    table = ps.Table("emb", dim=EMB_DIM, init_scale=0.5, optimizer=ps.SGD(lr=0.25))
    node = ps.start(comm, [table], num_servers=num_servers, mode="async")
    workers = comm.size - num_servers
    if not node.is_server:
        node.combine = combine
        for t in range(steps):
            keys = _emb_keys(node.worker_index, t)
            node.pull("emb", keys)
            node.push("emb", keys, _grad(node.worker_index, t, len(keys), EMB_DIM, salt=1))
        node.finish()
        return {"server": False}
    report = node.serve()
    total = {}
    for w in range(workers):
        for t in range(steps):
            for k, g in zip(_emb_keys(w, t).tolist(), _grad(w, t, 6, EMB_DIM, salt=1)):
                total[k] = total.get(k, 0) + g
    mine = sorted(k for k in total if k % num_servers == comm.rank)
    shard = node.shards[0]
    got = shard.values[shard.rows_of(np.array(mine, np.int64))]
    init = ps.initial_rows(table, np.array(mine, np.int64))
    # Exact only where the initial value and the updates share a binade; compare to 1 ulp-ish.
    want = init - np.float32(0.25) * np.stack([total[k] for k in mine])
    return {
        "server": True,
        "max_err": float(np.abs(got - want).max()),
        "rows": len(mine),
        "pushes": report.pushes,
        "version": report.versions["emb"],
        "died": report.died,
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("combine", [True, False])
def test_async_mode_applies_every_push_once(combine):
    steps, num_servers, nranks = 12, 2, 5
    world = run_world(nranks, async_totals, dict(num_servers=num_servers, steps=steps, combine=combine), timeout=100)
    results = world.check_ok()
    for res in results[:num_servers]:
        assert res["died"] == [] and res["rows"] > 0, res
        assert res["max_err"] <= 1e-6, res
        # every worker's every push reaches every server (empty where it holds none of the keys)
        assert res["pushes"] == steps * (nranks - num_servers) == res["version"], res


def staleness(mode, bound, steps=12, slow_s=0.03):
    """One slow worker; the fast ones record how far ahead of the slowest they were at each pull.
    A pull the server never answers times out (the communicator's 20 s) rather than hang."""
    comm = rt.init(timeout=20)
    node = ps.start(comm, [ps.Table("w", dim=2, rows=4)], num_servers=1, mode=mode, staleness=bound)
    if node.is_server:
        node.serve()
        return {"gaps": []}
    gaps = []
    slow = node.worker_index == 0
    for t in range(steps):
        node.pull("w")
        gaps.append(t - node.slowest[0])
        if slow:
            time.sleep(slow_s)
        node.push("w", np.arange(4), np.zeros((4, 2), np.float32))
    node.finish()
    return {"gaps": gaps}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bound", [0, 2])
def test_bounded_staleness_lets_fast_workers_reach_the_bound_and_no_further(bound):
    """The fast workers run ahead of the slow one until exactly `bound` pushes separate them;
    with bound 0 every pull waits for the slowest worker to catch up (lock step), and runs."""
    ssp = run_world(4, staleness, dict(mode="ssp", bound=bound), timeout=100).check_ok()
    fast_gaps = [g for res in ssp[2:] for g in res["gaps"]]
    assert max(fast_gaps) == bound and min(fast_gaps) >= 0, fast_gaps
    assert len(fast_gaps) == 2 * 12, fast_gaps  # every pull was answered


@pytest.mark.timeout(120)
def test_async_workers_run_past_any_staleness_bound():
    free = run_world(4, staleness, dict(mode="async", bound=0), timeout=100).check_ok()
    assert max(g for res in free[2:] for g in res["gaps"]) > 2  # without the bound they run away


def dead_worker(mode, victim_step=3, steps=10):
    """The last worker SIGKILLs itself mid-run; the others must finish all their steps and the
    server must report it dead."""
    comm = rt.init(timeout=30)
    node = ps.start(comm, _tables(), num_servers=1, mode=mode, staleness=1)
    if node.is_server:
        report = node.serve()
        return {"died": report.died, "finished": sorted(report.finished)}
    victim = node.worker_index == node.num_workers - 1
    for t in range(steps):
        if victim and t == victim_step:
            os.kill(os.getpid(), signal.SIGKILL)
        node.pull("w")
        node.push("w", np.arange(ROWS), _grad(node.worker_index, t, ROWS, DIM))
    node.finish()
    return {"steps": steps}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["async", "ssp", "sync"])
def test_dead_worker_does_not_stop_the_others(mode):
    world = run_world(4, dead_worker, dict(mode=mode), timeout=120)
    assert world.returncodes[3] == -9, world.failure_report()
    for r in (0, 1, 2):
        assert world.returncodes[r] == 0 and world.results[r] is not None, world.failure_report()
    assert world.results[0] == {"died": [3], "finished": [1, 2]}


def dead_server(victim=1):
    """Server 1 dies while workers pull rows it holds: every worker gets PeerFailure naming it."""
    comm = rt.init(timeout=30)
    node = ps.start(comm, _tables(), num_servers=2, mode="async")
    if node.is_server:
        if comm.rank == victim:
            threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        node.serve()
        return {}
    began = time.monotonic()
    try:
        while time.monotonic() - began < 25:
            node.pull("w")
            node.push("w", np.arange(ROWS), np.zeros((ROWS, DIM), np.float32))
        return {"raised": None}
    except rt.Error as exc:
        return {"raised": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - began}


@pytest.mark.timeout(120)
def test_dead_server_raises_peer_failure_on_every_worker():
    world = run_world(4, dead_server, timeout=100)
    assert world.returncodes[1] == -9, world.failure_report()
    for r in (2, 3):
        res = world.results[r]
        assert res is not None, world.failure_report()
        assert res["raised"] == "PeerFailure" and "rank 1" in res["message"], res
        assert res["seconds"] < 20, res


def bad_input():
    """Each bad call raises ValueError on the calling worker before any traffic; the node is
    still usable (a correct pull follows every rejected call)."""
    comm = rt.init(timeout=30)
    node = ps.start(comm, _tables(), num_servers=1, mode="async")
    if node.is_server:
        node.serve()
        return {}
    cases = {
        "unknown table": lambda: node.pull("nope", [1]),
        "row width": lambda: node.push("emb", [1, 2], np.zeros((2, EMB_DIM + 1), np.float32)),
        "float64 gradients": lambda: node.push("emb", [1, 2], np.full((2, EMB_DIM), 0.1)),
        "float16 gradients": lambda: node.push("emb", [1, 2], np.zeros((2, EMB_DIM), np.float16)),
        "int gradients": lambda: node.push("emb", [1, 2], np.zeros((2, EMB_DIM), np.int32)),
        "list of floats": lambda: node.push("emb", [1, 2], [[0.5] * EMB_DIM] * 2),
        "negative key": lambda: node.pull("emb", [3, -1]),
        "dense key range": lambda: node.pull("w", [ROWS]),
        "float keys": lambda: node.pull("emb", [1.5]),
        "sparse without keys": lambda: node.pull("emb"),
    }
    report = {}
    for name, call in cases.items():
        try:
            call()
            report[name] = "no error"
        except ValueError as exc:
            ok = np.array_equal(node.pull("w", [0, 1]), np.zeros((2, DIM), np.float32))
            # A refused push sent nothing: the rows it named are as they started.
            ok = ok and np.array_equal(node.pull("emb", [1, 2]), np.zeros((2, EMB_DIM), np.float32))
            named = "gradients" not in name or "float32" in str(exc)
            report[name] = "ok" if ok and named else f"node unusable afterwards or unclear: {exc}"
    node.finish()
    return report


@pytest.mark.timeout(90)
def test_bad_input_raises_before_traffic_and_node_stays_usable():
    results = run_world(3, bad_input, timeout=80).check_ok()
    for res in results[1:]:
        assert set(res.values()) == {"ok"}, res


def mismatched_setup():
    comm = rt.init(timeout=30)
    try:
        ps.start(comm, _tables(), num_servers=1, mode="async" if comm.rank else "sync")
        return {"raised": None}
    except rt.InvalidArgument as exc:
        return {"raised": "InvalidArgument", "message": str(exc)}


@pytest.mark.timeout(60)
def test_ranks_that_disagree_on_the_setup_fail_together():
    for res in run_world(3, mismatched_setup, timeout=50).check_ok():
        assert res["raised"] == "InvalidArgument" and "different" in res["message"], res


def test_initial_rows_depend_on_key_and_seed_only():
    table = ps.Table("e", dim=5, init_scale=0.1, seed=3)
    keys = np.array([0, 1, 2, 10**12, 7], np.int64)
    rows = ps.initial_rows(table, keys)
    assert rows.shape == (5, 5) and rows.dtype == np.float32
    assert np.abs(rows).max() <= 0.1 and len(np.unique(rows)) == rows.size
    assert np.array_equal(rows[[4, 0]], ps.initial_rows(table, keys[[4, 0]]))
    other = ps.initial_rows(ps.Table("e", dim=5, init_scale=0.1, seed=4), keys)
    assert not np.array_equal(rows, other)
    assert abs(float(ps.initial_rows(table, np.arange(20000)).mean())) < 0.01  # centred


def test_table_and_start_arguments_are_checked():
    with pytest.raises(ValueError, match="dim"):
        ps.Table("x", dim=0)
    with pytest.raises(ValueError, match="optimizer"):
        ps.Table("x", dim=1, optimizer="sgd")
