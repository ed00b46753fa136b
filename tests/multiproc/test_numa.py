"""NUMA placement (common/numa.h): each rank reports its node, and the rings it reads are
allocated on that node by that rank. This machine has one node, so the real-host test checks the
policy and the pages through the kernel's own report (/proc/PID/numa_maps); a stand-in node
directory (RINGTREE_TEST_NUMA_NODE_DIR) gives the ranks a two-node host to decide on."""

from __future__ import annotations

import os

import numpy as np
import pytest
from harness import run_world

import ringtree as rt

NODE_DIR = "/sys/devices/system/node"


def nodes_of_cpus(node_dir):
    """{cpu: node} from nodeN/cpulist, read independently of the library."""
    out = {}
    for name in os.listdir(node_dir):
        if not (name.startswith("node") and name[4:].isdigit()):
            continue
        with open(os.path.join(node_dir, name, "cpulist")) as f:
            text = f.read().strip()
        for part in filter(None, text.split(",")):
            lo, _, hi = part.partition("-")
            for cpu in range(int(lo), int(hi or lo) + 1):
                out[cpu] = int(name[4:])
    return out


def segment_maps():
    """numa_maps lines of this process's ringtree segments: [(line, policy, [[node, pages], ...])]."""
    rows = []
    with open("/proc/self/numa_maps") as f:
        for line in f:
            if "/rt-" not in line:
                continue
            words = line.split()
            pages = [[int(w[1:].split("=")[0]), int(w.split("=")[1])] for w in words if w[:1] == "N" and "=" in w]
            rows.append((line.strip(), words[1], pages))
    return rows


def report():
    if "TEST_PIN_CPU" in os.environ:
        os.sched_setaffinity(0, {int(os.environ["TEST_PIN_CPU"])})
    comm = rt.init(timeout=30)
    x = np.arange(1 << 16, dtype=np.float32) + comm.rank
    y = comm.all_reduce(x)  # the rings carry data after the placement
    ok = bool(np.array_equal(y, np.arange(1 << 16, dtype=np.float32) * comm.size + sum(range(comm.size))))
    out = {
        "rank": comm.rank,
        "numa": comm.status().numa,
        "nodes": comm.status().numa_nodes,
        "maps": segment_maps(),
        "ok": ok,
        "allowed": sorted(os.sched_getaffinity(0)),
    }
    comm.close()
    return out


@pytest.mark.timeout(120)
@pytest.mark.skipif(not os.path.exists(os.path.join(NODE_DIR, "node0")), reason="the kernel reports no NUMA nodes")
def test_rings_sit_on_their_readers_node():
    node_of = nodes_of_cpus(NODE_DIR)
    ranks = run_world(2, report, timeout=100).check_ok()
    for res in ranks:
        assert res["ok"]
        allowed_nodes = {node_of[c] for c in res["allowed"]}
        if len(allowed_nodes) == 1:
            (node,) = allowed_nodes
            assert res["numa"].startswith(f"node {node} (every CPU"), res["numa"]
        node = res["nodes"][res["rank"]]
        assert node in allowed_nodes
        assert f"on node {node} (preferred), allocated by this rank" in res["numa"], res["numa"]
        # Its own segment and its peer's are both mapped here; each carries its owner's policy,
        # and every page of each is on its owner's node.
        assert len(res["maps"]) == 2, res["maps"]
        for line, policy, pages in res["maps"]:
            assert policy.startswith("prefer"), line
            owner_node = int(policy.split(":")[1])
            assert owner_node in res["nodes"], line
            assert pages and {node for node, _ in pages} == {owner_node}, line
    # Both ranks see the same list: their own node and the peer's, read from its segment.
    assert ranks[0]["nodes"] == ranks[1]["nodes"] == [ranks[0]["nodes"][0], ranks[1]["nodes"][1]]


def two_node_host(tmp_path):
    """A stand-in for /sys/devices/system/node: CPU 0 on node 0, CPUs 1, 5 and 6 on node 1, and a
    memory-only node 7. The kernel itself still has one node, so mbind to node 1 is refused."""
    for name, cpulist in (("node0", "0"), ("node1", "1,5-6"), ("node7", "")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "cpulist").write_text(cpulist + "\n")
    (tmp_path / "online").write_text("0-1,7\n")  # not a node directory
    return str(tmp_path)


needs_cpus_0_and_1 = pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1")


@pytest.mark.timeout(120)
@needs_cpus_0_and_1
def test_ranks_pinned_to_two_nodes_report_them(tmp_path):
    node_dir = two_node_host(tmp_path)
    ranks = run_world(
        2, report, timeout=100, per_rank_env=lambda r: {"RINGTREE_TEST_NUMA_NODE_DIR": node_dir, "TEST_PIN_CPU": str(r)}
    ).check_ok()
    assert [res["allowed"] for res in ranks] == [[0], [1]]
    for res in ranks:
        assert res["ok"]
        assert res["nodes"] == [0, 1]
        assert res["numa"].startswith(
            f"node {res['rank']} (every CPU this rank may run on is on it; 2 node(s) on this host)"
        ), res["numa"]
    # Node 0 exists, so rank 0's segment is bound there. Where node 1 exists only in the stand-in
    # (a one-node kernel), rank 1 says why its segment was not bound, and keeps first touch.
    assert "on node 0 (preferred), allocated by this rank" in ranks[0]["numa"]
    policies = {policy for line, policy, pages in ranks[0]["maps"]}
    if os.path.exists(os.path.join(NODE_DIR, "node1")):
        assert "on node 1 (preferred), allocated by this rank" in ranks[1]["numa"], ranks[1]["numa"]
        assert policies == {"prefer:0", "prefer:1"}, ranks[0]["maps"]
    else:
        assert "first touch only (mbind: Invalid argument)" in ranks[1]["numa"], ranks[1]["numa"]
        assert policies == {"prefer:0", "default"}, ranks[0]["maps"]


@pytest.mark.timeout(120)
@needs_cpus_0_and_1
def test_a_rank_on_cpus_of_two_nodes_reports_where_it_runs(tmp_path):
    node_dir = two_node_host(tmp_path)
    world = run_world(2, report, timeout=100, env={"RINGTREE_TEST_NUMA_NODE_DIR": node_dir})
    for res in world.check_ok():
        if set(res["allowed"]) != {0, 1}:
            pytest.skip("the ranks were started with fewer CPUs than 0 and 1")
        node = res["nodes"][res["rank"]]
        assert node in (0, 1)
        assert res["numa"].startswith(f"node {node} (where it runs now; it may run on node(s) 0,1 of 2)"), res["numa"]
