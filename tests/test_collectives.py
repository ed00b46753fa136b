"""Every collective between real processes, against numpy, over shared memory, TCP (two
emulated hosts), and TCP only. See reference.py for how expectations are computed."""
import pytest

from harness import run_world
from reference import OPS

ALL_DTYPES = ["int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
COLLECTIVES = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "gather", "scatter"]
COUNTS = [0, 1, 7, "P-1", "3P+1", "large"]


def assert_clean(world):
    results = world.check_ok()
    failures = [f for res in results for f in res["failures"]]
    assert not failures, "\n".join(failures[:40])
    assert all(res["checks"] > 0 for res in results)
    return results


@pytest.mark.timeout(600)
@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 5, 8])
def test_collectives_shared_memory(nranks):
    world = run_world(nranks, "sweep", dict(collectives=COLLECTIVES, counts=COUNTS, dtypes=ALL_DTYPES, ops=OPS),
                      timeout=540)
    assert_clean(world)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("nranks", [2, 3, 4, 5, 8])
def test_collectives_two_hosts(nranks):
    """Ranks split over two emulated hosts: TCP between the groups, shared memory inside."""
    world = run_world(nranks, "sweep", dict(collectives=COLLECTIVES, counts=COUNTS, dtypes=ALL_DTYPES, ops=OPS, salt=1),
                      hosts=2, timeout=540)
    assert_clean(world)
    world = run_world(nranks, "transports", hosts=2, timeout=60)
    t = [res["transports"] for res in world.check_ok()]
    half = [r * 2 // nranks for r in range(nranks)]
    for a in range(nranks):
        for b in range(nranks):
            want = "self" if a == b else ("shm" if half[a] == half[b] else "tcp")
            assert t[a][b] == want, (a, b, t[a][b])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nranks", [3, 4])
def test_collectives_tcp_only(nranks):
    world = run_world(nranks, "sweep", dict(collectives=COLLECTIVES, counts=[0, 1, "3P+1", "large"], dtypes=ALL_DTYPES,
                                            ops=OPS, salt=2),
                      env={"RINGTREE_TRANSPORT": "tcp"}, timeout=280)
    assert_clean(world)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks,hosts", [(2, 1), (4, 1), (5, 2)])
def test_send_recv_and_barrier(nranks, hosts):
    world = run_world(nranks, "p2p_and_barrier", hosts=hosts, timeout=100)
    failures = [f for res in world.check_ok() for f in res["failures"]]
    assert not failures, failures


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nranks,hosts", [(3, 1), (5, 2)])
def test_pipelined_trees_with_tiny_segments(nranks, hosts):
    """64-byte tree segments make short messages stream through the tree and chain pipelines."""
    world = run_world(nranks, "sweep", dict(collectives=["all_reduce", "broadcast", "reduce"], counts=[7, "3P+1", 1000],
                                            dtypes=ALL_DTYPES, ops=OPS, salt=3),
                      hosts=hosts, env={"RINGTREE_TREE_SEGMENT_BYTES": "64"}, timeout=280)
    assert_clean(world)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks,hosts", [(1, 1), (3, 1), (4, 2)])
def test_all_to_all_v(nranks, hosts):
    world = run_world(nranks, "all_to_all_v", dict(salt=nranks), hosts=hosts, timeout=100)
    results = world.check_ok()
    for rank, res in enumerate(results):
        assert not res["failures"], (rank, res["failures"])
        assert res["bad_counts"] == "ok", res
        if nranks > 1:
            assert res["mismatch"] == "CollectiveMismatch", (rank, res)
    if nranks > 1:
        assert "sends 8 bytes to rank 1, which expects 12" in results[1]["mismatch_message"], results[1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 3, 5])
def test_one_shot_board_back_to_back(nranks):
    """Board slots are reused every other call; broadcasts return before every rank has
    published. Wrong data would show here if a slot were rewritten too early."""
    world = run_world(nranks, "board_stress", timeout=100)
    failures = [f for res in world.check_ok() for f in res["failures"]]
    assert not failures, failures
