"""The cost model behind algo="auto": every rank must choose alike (rank 0's machine figures),
explain() must show what choose_algo() does, and the figures are cached per host.

The rank bodies (choices_and_estimates, oneshot_boundary) run in every rank of a test's world
(harness.py) and return a JSON report that the test asserts on."""

import io
import math
import multiprocessing
import os
import time

import numpy as np
import pytest
from harness import run_world

import ringtree as rt
from ringtree import _core
from ringtree._args import ALGO_CODES, COLL_CODES

COLL = COLL_CODES
ALGO = ALGO_CODES
SEGMENT = 128 << 10  # RINGTREE_TREE_SEGMENT_BYTES' default, which the price table uses


def counted(coll, algo, P, count, segment=0):
    return _core.schedule_counts(COLL[coll], ALGO[algo], P, count, 0, segment)


COLLS = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "barrier"]


SIZES = [0, 8, 256, 4096, 65536, 1 << 20, 1 << 24]


def choices_and_estimates():
    """Every rank reports auto's choice and the model's candidates for a grid of calls, plus
    what explain printed for one of them."""
    comm = rt.init()
    choices, estimates = {}, {}
    for coll in COLLS:
        for nbytes in SIZES:
            for dtype in ("float32", "bfloat16"):
                key = f"{coll}/{nbytes}/{dtype}"
                choices[key] = comm.choose_algo(coll, nbytes, "auto", dtype)
                estimates[key] = [(a, t) for a, t, _ in comm.estimate(coll, nbytes, dtype)]
    text = rt.explain("all_reduce", 4096, comm=comm, file=io.StringIO())
    costs = comm.status().machine
    comm.close()
    return {"choices": choices, "estimates": estimates, "explain": text, "costs": costs}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 4])
def test_every_rank_chooses_alike_and_explain_matches(nranks, tmp_path):
    world = run_world(nranks, choices_and_estimates, timeout=100, env={"RINGTREE_CACHE_DIR": str(tmp_path)})
    results = world.check_ok()
    first = results[0]
    for res in results[1:]:
        assert res["choices"] == first["choices"]
        assert res["costs"] == first["costs"]
    for key, candidates in first["estimates"].items():
        coll, nbytes, dtype = key.split("/")
        algos = [a for a, _ in candidates]
        assert first["choices"][key] in algos, key
        best = min(t for _, t in candidates)
        chosen_t = dict(candidates)[first["choices"][key]]
        assert chosen_t <= best * 1.0101, (key, candidates)  # auto takes the cheapest (ties within 1%)
        assert all(t > 0 and math.isfinite(t) for _, t in candidates), key
    # One-shot takes small calls on one host, and never calls beyond its capacity.
    assert "oneshot" in [a for a, _ in first["estimates"]["all_reduce/8/float32"]]
    assert "oneshot" not in [a for a, _ in first["estimates"][f"all_reduce/{1 << 24}/float32"]]
    # Larger calls of one algorithm never get cheaper.
    for coll in ("all_reduce", "all_gather", "broadcast"):
        ring = "direct" if coll == "all_to_all" else ("tree" if coll == "broadcast" else "ring")
        times = [dict(first["estimates"][f"{coll}/{n}/float32"])[ring] for n in (8, 4096, 65536, 1 << 20, 1 << 24)]
        assert times == sorted(times), (coll, times)
    text = first["explain"]
    chosen = first["choices"]["all_reduce/4096/float32"]
    assert f"auto chooses {chosen}" in text
    assert f"* {chosen}" in text
    # The ring's line says what was counted in its schedules: 2(P-1) hops, and no handshake, as
    # its first step meets both neighbours (the tree's first step does not: it has one).
    lines = text.splitlines()
    ring_line = next(line for line in lines if line[2:].startswith("ring "))
    assert f"0 handshake + {2 * (nranks - 1)} hops on the critical path" in ring_line, ring_line
    tree_line = next(line for line in lines if line[2:].startswith("tree "))
    assert "1 handshake + " in tree_line, tree_line
    for algo, _ in first["estimates"]["all_reduce/4096/float32"]:
        assert algo in text
    # A probe that ran beside other work (this machine may be busy) is used but not cached.
    source = first["costs"]["source"]
    assert source in ("measured", "measured (busy)")
    cached = list(tmp_path.glob("machine-v*.txt"))
    assert bool(cached) == (source == "measured"), (source, cached)
    if cached:
        # The next communicator on this host reads the cache instead of measuring again.
        env = {"RINGTREE_CACHE_DIR": str(tmp_path)}
        again = run_world(2, choices_and_estimates, timeout=100, env=env).check_ok()
        assert again[0]["costs"]["source"] == "cached"
        assert again[0]["costs"]["hop_us"] == pytest.approx(first["costs"]["hop_us"], rel=1e-4)


CACHED_FIGURES = {
    "hop_s": 3.25e-6,
    "switch_s": 7.5e-6,
    "copy_hot_Bps": 11e9,
    "copy_cold_Bps": 5e9,
    "reduce_hot_Bps": 9e9,
    "reduce_cold_Bps": 4e9,
}


def machine_figures():
    comm = rt.init()
    costs = comm.status().machine
    comm.close()
    return costs


@pytest.mark.timeout(120)
def test_a_cached_probe_is_read_and_adopted_by_every_rank(tmp_path):
    # The figures come from a file written here (named after the host), not from a measurement.
    path = tmp_path / "machine-v2-cost-model-host.txt"
    path.write_text("".join(f"{key} {value:.6g}\n" for key, value in CACHED_FIGURES.items()))
    path.chmod(0o600)
    env = {"RINGTREE_CACHE_DIR": str(tmp_path), "RINGTREE_HOSTNAME": "cost-model-host"}
    res = run_world(2, machine_figures, timeout=100, env=env).check_ok()
    for costs in res:
        assert costs["source"] == "cached"
        assert costs["hop_us"] == pytest.approx(CACHED_FIGURES["hop_s"] * 1e6)
        assert costs["copy_cold_GBps"] == pytest.approx(CACHED_FIGURES["copy_cold_Bps"] / 1e9)


def burn(seconds, cpu):
    os.sched_setaffinity(0, {cpu})
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.timeout(120)
def test_a_probe_taken_beside_busy_cores_is_used_but_not_cached(tmp_path):
    # The ranks run on (at most) two CPUs, each with two spinning processes pinned to it, so the
    # probe's threads get about a third of the CPU time they ask for wherever the scheduler puts
    # them, well below the 70% under which the probe counts as busy. (Twice as many spinners as
    # cores, left to the scheduler, were not enough on a machine with more cores: one of the
    # probe's tries there judged itself quiet.)
    cpus = sorted(os.sched_getaffinity(0))[:2]
    burners = [multiprocessing.get_context("fork").Process(target=burn, args=(60, cpu)) for cpu in cpus * 2]
    saved = os.sched_getaffinity(0)
    for proc in burners:
        proc.start()
    try:
        time.sleep(0.5)
        os.sched_setaffinity(0, set(cpus))  # the rank processes inherit it
        try:
            res = run_world(2, machine_figures, timeout=100, env={"RINGTREE_CACHE_DIR": str(tmp_path)}).check_ok()
        finally:
            os.sched_setaffinity(0, saved)
    finally:
        for proc in burners:
            proc.kill()
            proc.join()
    assert all(costs["source"] == "measured (busy)" for costs in res)
    assert not list(tmp_path.glob("machine-v*.txt"))


@pytest.mark.timeout(120)
def test_default_figures_without_measuring():
    res = run_world(2, choices_and_estimates, timeout=100, env={"RINGTREE_COST_MODEL": "defaults"}).check_ok()
    assert all(r["costs"]["source"] == "defaults" for r in res)


def overrule_past(limit, request):
    """An algorithm hook: for calls larger than `limit`, ring or tree, whichever the model did not pick."""
    if request.nbytes <= limit:
        return None
    return next(a for a, _, _ in request.candidates if a in ("ring", "tree") and a != request.model_choice)


def hooked_calls():
    """Every rank sets the same hook: its choice runs (the flight recorder says so) and gives
    numpy's sum; a hook that answers a non-candidate fails the call on every rank, before any
    traffic, leaving the communicator usable; ranks whose hooks disagree get CollectiveMismatch
    (last: it aborts the communicator)."""
    import functools

    comm = rt.init(timeout=20)
    P, r = comm.size, comm.rank
    out = {"model": [comm.choose_algo("all_reduce", n) for n in (4096, 1 << 20)]}
    comm.set_algo_hook(functools.partial(overrule_past, 65536))
    out["hooked"] = [comm.choose_algo("all_reduce", n) for n in (4096, 1 << 20)]
    x = np.arange(1 << 18, dtype=np.float32) + r
    comm.all_reduce(x)
    out["exact"] = bool(np.array_equal(x, P * np.arange(1 << 18, dtype=np.float32) + P * (P - 1) / 2))
    out["recorded_algo"] = comm.record()["calls"][-1]["algo"]
    out["status_hook"] = comm.status().algo_hook
    out["explain"] = rt.explain("all_reduce", 1 << 20, comm=comm, file=None)
    comm.set_algo_hook(lambda request: "oneshot")
    try:
        comm.all_reduce(x)
        out["bad_answer"] = None
    except rt.InvalidArgument as exc:
        out["bad_answer"] = str(exc)
    comm.set_algo_hook(None)
    y = np.ones(1 << 18, np.float32)
    comm.all_reduce(y)
    out["usable"] = bool((y == P).all()) and not comm.status().algo_hook
    comm.set_algo_hook(lambda request: "ring" if r == 0 else "tree")
    try:
        comm.all_reduce(np.ones(1 << 18, np.float32))
        out["disagree"] = None
    except rt.Error as exc:
        out["disagree"] = type(exc).__name__
    comm.close()
    return out


@pytest.mark.timeout(60)
def test_an_algorithm_hook_set_on_every_rank_decides_what_auto_runs():
    for res in run_world(2, hooked_calls, timeout=50).check_ok():
        small, large = res["model"]
        overruled = "tree" if large == "ring" else "ring"
        assert res["hooked"] == [small, overruled], res
        assert res["exact"] and res["recorded_algo"] == overruled and res["status_hook"], res
        assert f"auto chooses {overruled} (the algorithm hook's choice" in res["explain"], res["explain"]
        assert "hook chose 'oneshot'" in res["bad_answer"] and res["usable"], res
        assert res["disagree"] in ("CollectiveMismatch", "Aborted"), res


def deterministic_estimates():
    """What deterministic mode weighs for a small and a large all_reduce, what it chooses and
    what it runs, and explain()'s account of it."""
    comm = rt.init()
    out = {}
    for n in (64, 1 << 20):
        out[str(n)] = {
            "estimates": [(a, t) for a, t, _ in comm.estimate("all_reduce", n, deterministic=True)],
            "auto": comm.choose_algo("all_reduce", n),
            "chosen": comm.choose_algo("all_reduce", n, deterministic=True),
            "ints": [a for a, _, _ in comm.estimate("all_reduce", n, "int32", deterministic=True)],
            "explain": rt.explain("all_reduce", n, comm=comm, file=None),
        }
    comm.close()
    return out


@pytest.mark.timeout(60)
def test_estimate_and_explain_show_deterministic_mode_and_its_cost():
    for res in run_world(3, deterministic_estimates, timeout=50).check_ok():
        small, large = res["64"], res[str(1 << 20)]
        # one-shot fits a small call and reduces in rank order too; a large one has the chain alone
        assert {a for a, _ in small["estimates"]} == {"rank_order", "oneshot"}
        assert [a for a, _ in large["estimates"]] == ["rank_order"]
        for case in (small, large):
            times = dict(case["estimates"])
            assert case["chosen"] == min(times, key=times.get)
            assert f"deterministic mode chooses {case['chosen']}" in case["explain"]
            assert f"x auto's {case['auto']}" in case["explain"]
            # integers are exact whatever the order: deterministic mode leaves them to auto
            assert "rank_order" not in case["ints"]


def oneshot_boundary(limit_bytes):
    """With RINGTREE_ONESHOT_BYTES=limit_bytes, the largest all_reduce that fits runs on the
    one-shot slots and the next size up does not; both give numpy's answer."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    fits = limit_bytes // 4
    report = {}
    for n in (fits, fits + 1):
        report[f"algo_{n}"] = comm.choose_algo("all_reduce", n * 4)
        x = (np.arange(n, dtype=np.int64) * (r + 1)).astype(np.float32)
        got = comm.all_reduce(x.copy())
        want = np.arange(n, dtype=np.float32) * sum(q + 1 for q in range(P))
        report[f"ok_{n}"] = bool(np.array_equal(got, want))
    x = np.full(fits, r + 1, np.float32)
    report["explicit_fits"] = bool((comm.all_reduce(x, algo="oneshot") == P * (P + 1) / 2).all())
    try:
        comm.all_reduce(np.ones(fits + 1, np.float32), algo="oneshot")
        report["oversize"] = "no error"
    except rt.InvalidArgument as exc:
        report["oversize"] = str(exc)
    report["after"] = float(comm.all_reduce(np.ones(1, np.float32))[0])  # still usable
    comm.close()
    return report


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 3])
def test_oneshot_capacity_boundary(nranks):
    limit = 1024
    res = run_world(
        nranks, oneshot_boundary, dict(limit_bytes=limit), timeout=100, env={"RINGTREE_ONESHOT_BYTES": str(limit)}
    ).check_ok()
    fits = limit // 4
    for r in res:
        assert r[f"ok_{fits}"] and r[f"ok_{fits + 1}"], r
        assert r[f"algo_{fits + 1}"] != "oneshot", r
        assert r["explicit_fits"], r
        assert "RINGTREE_ONESHOT_BYTES" in r["oversize"] and str(limit) in r["oversize"], r["oversize"]
        assert r["after"] == nranks


# Pricing counts the schedules themselves; these check the counts against what each algorithm
# is known to do, worked out independently of the schedule code.


@pytest.mark.parametrize("P", [2, 3, 4, 5, 8, 16])
def test_ring_all_reduce_counts_2_P_minus_1_hops_and_its_share_of_bytes(P):
    n = P * 3000  # divisible by P: every block the same
    k = counted("all_reduce", "ring", P, n)
    assert k["steps"] == k["hops"] == 2 * (P - 1)
    # Each rank sends 2(P-1) blocks of n/P, receives P-1 into place and P-1 with a reduction.
    assert k["sent"] == 2 * (P - 1) * n // P
    assert k["received"] == k["reduced"] == (P - 1) * n // P
    assert k["copied"] == 0


@pytest.mark.parametrize("P", [2, 3, 4, 5, 8, 13, 16])
@pytest.mark.parametrize("segments", [1, 2, 8])
def test_pipelined_broadcast_hops_grow_with_depth_plus_segments(P, segments):
    n = segments * SEGMENT
    depth = P.bit_length() - 1  # deepest node of a binary heap of P ranks
    tree = counted("broadcast", "tree", P, n, SEGMENT)
    assert tree["hops"] == depth + segments - 1
    chain = counted("broadcast", "ring", P, n, SEGMENT)
    assert chain["hops"] == (P - 1) + segments - 1
    # The busiest rank: a tree node with two children sends the buffer twice (the root when P
    # <= 4, where no node has a parent and two children); a chain's middle receives and sends.
    assert tree["sent"] == n * min(2, P - 1)
    assert tree["received"] == (n if P > 4 else 0)
    assert (chain["sent"], chain["received"]) == ((n, n) if P > 2 else (n, 0))


@pytest.mark.parametrize("P", [2, 3, 4, 7, 8])
def test_direct_all_to_all_and_barrier_counts(P):
    N = 1000
    k = counted("all_to_all", "direct", P, N)
    assert k["hops"] == P - 1 and k["steps"] == P - 1  # P-1 exchanges, the first with the local copy
    assert k["sent"] == k["received"] == (P - 1) * N and k["copied"] == N
    assert k["handshakes"] == 1  # ranks may mix its one-buffer schedule, whose first step differs
    for coll in ("all_gather", "all_reduce", "reduce_scatter"):  # first steps meet both neighbours
        assert counted(coll, "ring", P, N)["handshakes"] == 0, coll
    assert counted("broadcast", "tree", P, N)["handshakes"] == 1
    barrier = counted("barrier", "direct", P, 0)
    assert barrier["hops"] == (P - 1).bit_length()  # ceil(log2 P) rounds
    assert barrier["sent"] == barrier["received"] == 0


def test_tree_all_reduce_root_reduces_children_one_step_each():
    # P=4: the root has two children and reduces them in separate steps, so each segment costs
    # it two steps; the reduce phase takes 2 per segment plus the depth, the broadcast one.
    S = 8
    k = counted("all_reduce", "tree", 4, S * SEGMENT, SEGMENT)
    assert k["reduced"] == 2 * S * SEGMENT  # the root: two children's segments
    assert k["hops"] == 26  # 2S + 1 (reduce, root last) + S + 1 (broadcast through depth 2)


@pytest.mark.parametrize("P", [2, 3, 5, 8])
def test_price_table_matches_counting_the_call_itself(P):
    # choose_algo prices from a table counted at powers of two and extended past the last size
    # it counted; between and beyond, it must agree with counting the call's own schedules.
    cases = [
        ("all_reduce", "ring", 0),
        ("all_reduce", "tree", SEGMENT),
        ("broadcast", "tree", SEGMENT),
        ("broadcast", "ring", SEGMENT),
        ("reduce", "tree", SEGMENT),
        ("all_gather", "ring", 0),
        ("all_to_all", "direct", 0),
        ("gather", "direct", 0),
    ]
    for coll, algo, segment in cases:
        for nbytes in (0, 4096, 3 * SEGMENT, (1 << 20) + 3 * P * SEGMENT, 1 << 26):
            exact = counted(coll, algo, P, nbytes, segment)
            table = _core.price_table_counts(COLL[coll], ALGO[algo], P, nbytes)
            for field, value in exact.items():
                assert table[field] == pytest.approx(value, rel=1e-3, abs=1e-6), (coll, algo, nbytes, field)


# Across hosts a link carries both directions at once: what it must carry is counted step by step,
# the larger of what a step sends and what it receives across hosts (remote_link), worked out
# here by hand from what each schedule does.


def counted_on(coll, algo, hosts, count, segment=0):
    return _core.schedule_counts(COLL[coll], ALGO[algo], len(hosts), count, 0, segment, hosts)


def test_a_ring_between_two_hosts_sends_and_receives_at_once():
    n = 1 << 20
    k = counted_on("all_reduce", "ring", [0, 1], n)
    # 2 steps of n/2: each sends n/2 and receives (or reduces) n/2 across, both at once
    assert (k["remote_sent"], k["remote_received"], k["remote_reduced"]) == (n, n / 2, n / 2)
    assert k["remote_link"] == n
    # 2 x 2 flat ring: rank 0 only receives across (from rank 3), a quarter a step for 6 steps
    k = counted_on("all_reduce", "ring", [0, 0, 1, 1], n)
    assert k["remote_link"] == 6 * n / 4 and k["remote_sent"] + k["remote_received"] + k["remote_reduced"] == 6 * n / 4


def test_tree_phases_cross_one_direction_at_a_time():
    S = 8
    n = S * SEGMENT
    # P=2 across hosts: rank 0 reduces all of rank 1's segments, then sends all back
    k = counted_on("all_reduce", "tree", [0, 1], n, SEGMENT)
    assert k["remote_link"] == 2 * n and k["remote_reduced"] == n and k["remote_sent"] == n
    # hier_tree on 2 x 2: the column (n/2) goes up, then comes down
    k = counted_on("all_reduce", "hier_tree", [0, 0, 1, 1], n, SEGMENT)
    assert k["remote_link"] == n
    # hier on 2 x 2: a ring of two on the column, a quarter each way per step, two steps
    k = counted_on("all_reduce", "hier", [0, 0, 1, 1], n)
    assert k["remote_link"] == n / 2 and k["remote_sent"] == n / 2


def test_hier_tree_root_carries_both_children_one_way():
    # 4 hosts x 1, tree 0 -> {1, 2}, 1 -> {3}. The root reduces its two children in separate
    # steps (2n in), then sends each segment to both in one step (2n out, the same direction);
    # rank 1 overlaps receiving segment t from rank 3 with forwarding t-1 to rank 0, so it
    # carries n plus one segment (the pipeline shift, its drain step) a phase: 2n + 2 segments.
    # The busiest is the root.
    S = 4
    n = S * SEGMENT
    k = _core.schedule_counts(COLL["all_reduce"], ALGO["hier_tree"], 4, n, 0, SEGMENT, [0, 1, 2, 3])
    assert k["remote_link"] == 4 * n
    assert k["remote_reduced"] == 2 * n and k["remote_sent"] == 2 * n


@pytest.mark.parametrize("hosts", [[0, 0, 0, 1], [0, 1, 1, 2, 2, 2], [0, 0, 1, 2, 2, 2, 3, 3], [0, 0, 0, 1, 1, 2]])
@pytest.mark.parametrize("coll", ["reduce_scatter", "all_gather"])
def test_hier_block_collectives_on_uneven_hosts_cross_each_block_once_per_host_pair(hosts, coll):
    # Every case has a host of one rank, so S = 1 column: the owners (local rank 0 of each host)
    # run a ring over the G hosts on a column of every rank's block, each step carrying one
    # host's share (the blocks of that host's ranks) one way and another's the other way.
    N = 4096
    G = max(hosts) + 1
    per_host = [hosts.count(g) for g in range(G)]
    k = counted_on(coll, "hier", hosts, N)
    assert k["hops"] >= G - 1
    # the busiest owner: over its G-1 steps, the larger of the share it sends and the one it receives
    owners_link = []
    for g in range(G):
        if coll == "reduce_scatter":  # step i sends the share of host g-1-i and receives that of g-2-i
            steps = [max(per_host[(g - 1 - i) % G], per_host[(g - 2 - i) % G]) for i in range(G - 1)]
        else:  # all_gather: step i sends host (g-i)'s share and receives host (g-1-i)'s
            steps = [max(per_host[(g - i) % G], per_host[(g - 1 - i) % G]) for i in range(G - 1)]
        owners_link.append(N * sum(steps))
    assert k["remote_link"] in owners_link, (k, owners_link)
    assert k["remote_link"] <= max(owners_link)


def explain_across_hosts():
    comm = rt.init()
    out = {
        "explain": rt.explain("all_reduce", 1 << 20, comm=comm, file=None),
        "estimates": {a: t for a, t, _ in comm.estimate("all_reduce", 1 << 20)},
        "chosen": comm.choose_algo("all_reduce", 1 << 20),
    }
    comm.close()
    return out


@pytest.mark.timeout(60)
def test_explain_across_hosts_gives_the_terms_of_the_hier_verdict():
    res = run_world(4, explain_across_hosts, hosts=2, timeout=50).check_ok()[0]
    text, est = res["explain"], res["estimates"]
    verdict = next(line for line in text.splitlines() if "hierarchical vs flat:" in line)
    hier = min((a for a in est if a.startswith("hier")), key=est.get)
    flat = min((a for a in est if not a.startswith("hier")), key=est.get)
    assert f"({hier} vs {flat})" in verdict and "latency" in verdict and "data" in verdict, verdict
    assert ("wins by" in verdict) == res["chosen"].startswith("hier"), verdict
    # every candidate that crosses hosts says what the link carries one way
    for line in text.splitlines():
        if line[2:].startswith(("ring ", "hier ", "hier_tree ", "tree ")):
            assert "the host link carries" in line, line


@pytest.mark.parametrize("P", [2, 3, 4])
def test_oneshot_publication_is_counted_once_on_the_critical_path(P):
    # A reader starts only once a whole publication is out: the largest one is counted apart
    # (all_reduce and all_gather publish the input, reduce_scatter all P blocks, broadcast the
    # root alone, a barrier nothing); the busiest rank's own copy stays in its bytes.
    N = 4096
    assert counted("all_reduce", "oneshot", P, N)["published"] == N
    assert counted("all_gather", "oneshot", P, N)["published"] == N
    assert counted("reduce_scatter", "oneshot", P, N)["published"] == N * P
    assert counted("broadcast", "oneshot", P, N)["published"] == N
    assert counted("barrier", "oneshot", P, 0)["published"] == 0
    assert counted("all_reduce", "ring", P, N)["published"] == 0  # messages pipeline by pieces
    k = counted("all_reduce", "oneshot", P, N)
    assert k["copied"] == N and k["reduced"] == (P - 1) * N and k["hops"] == 1


def test_host_work_sums_every_rank_so_a_tree_and_a_ring_share_cores_alike():
    # P=4 on one host, n = 8 segments. Tree 0 -> {1, 2}, 1 -> {3}: the root reduces 2n and sends
    # 2n down; rank 1 reduces n, sends n up and n down, receives n; the leaves send n and receive
    # n: 9n sent or received, 3n reduced over the host. The ring: each rank sends 1.5n and
    # receives and reduces 0.75n each, the same 9n and 3n. So when 4 ranks share 2 cores both
    # take at least that work over the cores, though the tree's root alone does more.
    n = 8 * SEGMENT
    tree, ring = counted("all_reduce", "tree", 4, n, SEGMENT), counted("all_reduce", "ring", 4, n)
    for k in (tree, ring):
        assert (k["host_net"], k["host_reduced"], k["host_copied"]) == (9 * n, 3 * n, 0)
    assert tree["reduced"] == 2 * n and ring["reduced"] == 3 * n / 4
    # across hosts the busiest host's ranks are summed, inside the host: 2 x 2 ring, rank 0
    # sends 1.5n to rank 1 and takes its 1.5n from rank 3 (across); rank 1 sends its 1.5n to
    # rank 2 (across) and receives 0.75n and reduces 0.75n from rank 0
    k = counted_on("all_reduce", "ring", [0, 0, 1, 1], n)
    assert (k["host_net"], k["host_reduced"]) == (2.25 * n, 0.75 * n)
