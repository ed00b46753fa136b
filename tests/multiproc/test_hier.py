"""Hierarchical collectives (algo="hier" / "hier_tree") between real processes on emulated hosts:
distinct RINGTREE_HOSTNAMEs, so ranks of one host talk over shared memory and hosts over TCP.
Every hierarchical collective is checked against numpy on even, uneven and interleaved hosts, in
place and out of place; a rank that picks another algorithm is caught like any mismatch; the
cost model weighs flat against hierarchical alike on every rank and explain() says why.

The rank bodies run in every rank of a test's world (harness.py) and return JSON reports."""

from __future__ import annotations

import numpy as np
import pytest
from harness import run_world
from rank_checks import run_case

import ringtree as rt

HIER = {
    "all_reduce": ["hier", "hier_tree"],
    "reduce_scatter": ["hier"],
    "all_gather": ["hier"],
    "all_to_all": ["hier"],
    "broadcast": ["hier", "hier_tree"],
    "reduce": ["hier", "hier_tree"],
}
DTYPE_OPS = [
    ("float32", "sum"),
    ("int32", "max"),
    ("bfloat16", "sum"),
    ("float64", "avg"),
    ("int8", "min"),
    ("int64", "prod"),
]


def sweep(counts):
    """Every hierarchical collective x algorithm x placement x count, rotating dtype, op and root
    (first, last) so that each count meets several of each."""
    comm = rt.init()
    P = comm.size
    checks, failures, i = 0, [], 0
    for coll, algos in HIER.items():
        for algo in algos:
            for in_place in (False, True):
                for spec in counts:
                    N = spec if isinstance(spec, int) else 3 * P + 1
                    dtype, op = DTYPE_OPS[i % len(DTYPE_OPS)]
                    root = (0, P - 1)[i % 2]
                    i += 1
                    wrong, desc = run_case(comm, coll, N, dtype, op, algo, in_place, root, salt=i)
                    checks += 1
                    if wrong:
                        failures.append(f"{desc}: {wrong} wrong")
    hosts = comm.status().machine["hosts"]
    comm.close()
    return {"checks": checks, "failures": failures, "hosts": hosts}


def interleaved_hosts(labels):
    return lambda r: {"RINGTREE_HOSTNAME": f"emulated-host-{labels[r]}"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "nranks,hosts,labels,want_hosts",
    [
        (4, 2, None, "2 hosts: {0,1} {2,3}"),
        (5, 2, None, "2 hosts: {0,1,2} {3,4}"),
        (6, 3, None, "3 hosts: {0,1} {2,3} {4,5}"),
        (5, 1, [0, 1, 0, 2, 0], "3 hosts: {0,2,4} {1} {3}"),  # uneven and interleaved
    ],
)
def test_hier_collectives_match_numpy(nranks, hosts, labels, want_hosts):
    counts = [0, 1, 7, "3P+1", 40000]
    world = run_world(
        nranks,
        sweep,
        dict(counts=counts),
        hosts=hosts,
        timeout=110,
        per_rank_env=interleaved_hosts(labels) if labels else None,
    )
    for rank, res in enumerate(world.check_ok()):
        assert res["hosts"] == want_hosts
        assert not res["failures"], f"rank {rank}: {res['failures']}"
        assert res["checks"] == sum(len(a) for a in HIER.values()) * 2 * len(counts)


def one_host_and_refusals():
    """On one host hier runs its intra-host phases only; gather has no hierarchical schedule."""
    comm = rt.init()
    P = comm.size
    x = np.arange(10, dtype=np.float32) * (comm.rank + 1)
    got = {a: comm.all_reduce(x.copy(), algo=a).tolist() for a in ("hier", "hier_tree", "ring")}
    estimates = [a for a, _, _ in comm.estimate("all_reduce", 1 << 20)]
    try:
        comm.gather(x, np.empty(10 * P, np.float32) if comm.rank == 0 else None, algo="hier")
        refused = None
    except rt.InvalidArgument as exc:
        refused = str(exc)
    comm.barrier()  # still usable
    comm.close()
    return {"got": got, "estimates": estimates, "refused": refused, "factor": sum(range(1, P + 1))}


@pytest.mark.timeout(60)
def test_hier_on_one_host_runs_and_auto_does_not_offer_it():
    for res in run_world(3, one_host_and_refusals, timeout=50).check_ok():
        want = (np.arange(10) * res["factor"]).tolist()
        assert res["got"] == {"hier": want, "hier_tree": want, "ring": want}
        assert not any(a.startswith("hier") for a in res["estimates"])
        assert "algo 'hier' is not available for gather" in res["refused"]


def mismatched_algo():
    comm = rt.init(timeout=30)
    x = np.ones(64, np.float32)
    try:
        comm.all_reduce(x, algo="ring" if comm.rank == comm.size - 1 else "hier")
        comm.barrier()
        out = {"raised": None}
    except rt.Error as exc:
        out = {"raised": type(exc).__name__, "message": str(exc)}
    comm.close()
    return out


@pytest.mark.timeout(60)
def test_mismatched_hier_choice_raises_on_every_rank():
    for rank, res in enumerate(run_world(4, mismatched_algo, hosts=2, timeout=50).check_ok()):
        assert res["raised"] == "CollectiveMismatch", (rank, res)
        assert "algo=hier" in res["message"] and "algo=ring" in res["message"], res["message"]


def choices():
    comm = rt.init()
    sizes = [8, 4096, 1 << 16, 1 << 20, 1 << 24]
    out = {
        "choices": {f"{c}/{n}": comm.choose_algo(c, n) for c in HIER for n in sizes},
        "estimates": {f"{c}/{n}": [(a, t) for a, t, _ in comm.estimate(c, n)] for c in HIER for n in sizes},
        "explain": rt.explain("all_reduce", 1 << 20, comm=comm, file=None),
    }
    comm.close()
    return out


@pytest.mark.timeout(60)
def test_auto_weighs_flat_against_hier_alike_on_every_rank():
    results = run_world(4, choices, hosts=2, timeout=50).check_ok()
    first = results[0]
    for res in results[1:]:
        assert res["choices"] == first["choices"]
    for key, candidates in first["estimates"].items():
        algos = dict(candidates)
        coll = key.split("/")[0]
        assert set(HIER[coll]) <= set(algos), key  # the hierarchical candidates are priced
        assert algos[first["choices"][key]] <= min(algos.values()) * 1.0101, (key, candidates)
    text = first["explain"]
    assert "hosts: 2 hosts: {0,1} {2,3}" in text
    assert "hierarchical vs flat:" in text
    assert "across hosts" in text
    assert f"auto chooses {first['choices']['all_reduce/1048576']}" in text
