"""Collectives across real, separate network stacks: 2 and 3 emulated hosts, each a network
namespace holding 2 ranks, joined by a bridge (bench/rtbench/netns.py makes and removes them).
Ranks of one namespace are one host to ringtree (shared memory), ranks of different namespaces
talk over TCP. Every collective runs with its flat and hierarchical algorithms against numpy; and
when a host's link is cut mid-collective, every rank raises PeerFailure or Timeout within its
timeout instead of hanging. Needs root and `ip netns`; skips, saying why, without them."""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid

import numpy as np
import pytest
from harness import run_world, spawn_world
from rank_checks import report_wait_policy, run_case

import ringtree as rt
from rtbench import netns

RANKS_PER_HOST = 2
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "gather", "scatter")
DTYPE_OPS = [
    ("float32", "sum"),
    ("int32", "max"),
    ("bfloat16", "sum"),
    ("float64", "avg"),
    ("int8", "min"),
    ("int64", "prod"),
]


def every_algo(coll):
    code = rt._core.COLLECTIVES.index(coll)
    return [rt._core.ALGOS[a] for a in rt._core.supported_algos(code) + rt._core.hier_algos(code)]


def in_namespaces(hosts):
    """run_world options placing rank r on host r // RANKS_PER_HOST, rank 0 listening on host 0."""
    return dict(
        unique_id=rt.UniqueId.from_seed(hosts.addrs[0], 29541, uuid.uuid4().hex),
        per_rank_prefix=lambda r: hosts.prefix(r // RANKS_PER_HOST),
    )


def sweep(counts):
    """Every collective x every algorithm it has (flat and hierarchical) x counts, rotating dtype,
    op, root and in/out of place; returns what went wrong and how this rank reaches the others."""
    comm = rt.init(timeout=30.0)
    P = comm.size
    checks, failures, i = 0, [], 0
    for coll in COLLECTIVES:
        for algo in every_algo(coll):
            for N in counts:
                dtype, op = DTYPE_OPS[i % len(DTYPE_OPS)]
                i += 1
                wrong, desc = run_case(
                    comm, coll, N, dtype, op, algo, in_place=i % 3 == 0, root=(0, P - 1)[i % 2], salt=i
                )
                checks += 1
                if wrong:
                    failures.append(f"{desc}: {wrong} wrong")
    comm.barrier()
    out = {
        "checks": checks,
        "failures": failures,
        "hosts": comm.status().machine["hosts"],
        "transports": [comm.status().transports[q] if q != comm.rank else "self" for q in range(P)],
    }
    comm.close()
    return out


@pytest.mark.timeout(80)
@pytest.mark.parametrize("namespace_hosts", [2, 3], indirect=True, ids=["2hosts", "3hosts"])
def test_every_collective_flat_and_hierarchical_matches_numpy(namespace_hosts):
    hosts = namespace_hosts
    P = len(hosts.names) * RANKS_PER_HOST
    counts = [1, 7, 40001]
    world = run_world(P, sweep, dict(counts=counts), timeout=70, **in_namespaces(hosts))
    host_of = netns.rank_placement([RANKS_PER_HOST] * len(hosts.names))
    want_hosts = f"{len(hosts.names)} hosts: " + " ".join(
        "{" + ",".join(str(r) for r in range(P) if host_of[r] == h) + "}" for h in range(len(hosts.names))
    )
    cases = sum(len(every_algo(c)) for c in COLLECTIVES) * len(counts)
    for r, res in enumerate(world.check_ok()):
        assert not res["failures"], f"rank {r}: {res['failures']}"
        assert res["checks"] == cases
        assert res["hosts"] == want_hosts, res["hosts"]  # found by probing, not told
        for q, kind in enumerate(res["transports"]):
            if q != r:
                assert kind == ("shm" if host_of[q] == host_of[r] else "tcp"), (r, q, res["transports"])


def loop_until_cut(marker_dir, timeout):
    """All_reduces with a short timeout until one raises; says when it started looping (a file in
    marker_dir) and when and how the call failed."""
    comm = rt.init(timeout=30.0)
    x = np.ones(1 << 18, np.float32)
    calls = 0
    try:
        while True:
            comm.all_reduce(x, timeout=timeout)
            calls += 1
            if calls == 1:
                open(os.path.join(marker_dir, f"rank{comm.rank}"), "w").close()
            if calls > 100_000:
                return {"raised": None, "calls": calls}
    except rt.Error as exc:
        out = {"raised": type(exc).__name__, "message": str(exc)[:300], "at": time.time(), "calls": calls}
    comm.abort("the link is gone")  # nothing more to say to anyone; leave without waiting on them
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("namespace_hosts", [2], indirect=True, ids=["2hosts"])
def test_cutting_a_host_link_mid_collective_raises_on_every_rank(namespace_hosts):
    hosts = namespace_hosts
    P, timeout = 2 * RANKS_PER_HOST, 3.0
    markers = tempfile.mkdtemp(prefix="ringtree-cut-")
    running = spawn_world(P, loop_until_cut, dict(marker_dir=markers, timeout=timeout), **in_namespaces(hosts))
    try:
        deadline = time.monotonic() + 30
        while len(os.listdir(markers)) < P and time.monotonic() < deadline and len(running.wait(deadline=0)) == P:
            time.sleep(0.05)
        assert len(os.listdir(markers)) == P, "the ranks never got going"
        cut_at = time.time()
        hosts.cut(1)
        hung = running.wait(deadline=time.monotonic() + timeout + 15)
    finally:
        world = running.collect()
    assert not hung, f"ranks {hung} still running 15 s past the timeout after the cut:\n" + world.failure_report()
    for r, res in enumerate(world.check_ok()):
        assert res["raised"] in ("PeerFailure", "Timeout"), (r, res)
        assert res["calls"] >= 1
        # within the call's timeout of the cut, plus slack for a loaded 2-core machine
        assert res["at"] - cut_at < timeout + 5, (r, res, json.dumps({"cut_at": cut_at}))


def namespaces_now() -> set:
    return set(netns.ip("netns", "list").stdout.split()) if os.geteuid() == 0 else set()


def test_hosts_are_removed_after_a_failure_and_links_capped_as_asked():
    try:
        with pytest.raises(RuntimeError, match="inside"):
            with netns.emulated_hosts(3, rate="500mbit") as hosts:
                made = [*hosts.names, hosts.switch]
                assert set(made) <= namespaces_now()
                qdisc = netns.tc("-n", hosts.names[1], "qdisc", "show", "dev", hosts.device).stdout
                assert "tbf" in qdisc and "500Mbit" in qdisc, qdisc
                raise RuntimeError("inside the block")
    except netns.NetnsUnavailable as exc:
        pytest.skip(str(exc))
    assert not set(made) & namespaces_now()


def test_leftovers_of_a_dead_run_are_removed():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    dead = 2**22 + 12345  # above pid_max's default: no such process
    name = f"{netns.PREFIX}{dead}-abcdef-h0"
    netns.ip("netns", "add", name)
    try:
        netns.remove_leftovers()
        assert name not in namespaces_now()
    finally:
        netns.ip("netns", "del", name, check=False)


def test_bad_rate_is_refused_before_anything_is_made():
    with pytest.raises(ValueError, match="2gbit"):
        with netns.emulated_hosts(2, rate="fast"):
            pass
    assert netns.rate_bytes_per_second("2gbit") == 250e6


@pytest.mark.timeout(60)
@pytest.mark.parametrize("namespace_hosts", [2], indirect=True, ids=["2hosts"])
def test_ranks_of_other_namespaces_on_this_kernel_count_against_its_cpus(namespace_hosts):
    # Each emulated host holds 2 ranks, but all 4 run on this machine's CPUs: the wait policy must
    # count all 4 (and stop spinning where they outnumber the CPUs), not 2 per host.
    hosts = namespace_hosts
    P = len(hosts.names) * RANKS_PER_HOST
    world = run_world(P, report_wait_policy, timeout=50, **in_namespaces(hosts))
    for r, res in enumerate(world.check_ok()):
        cpus = res["cpus"]
        assert f"{RANKS_PER_HOST} ranks on this host, {P} allowed the same {cpus} CPUs" in res["policy"], (r, res)
        oversubscribed = P > cpus
        assert res["policy"].startswith("spin 1 us" if oversubscribed else "spin 1000 us"), (r, res)
        assert res["policy"].endswith(": oversubscribed") == oversubscribed, (r, res)
