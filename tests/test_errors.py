"""No silent hang, no silent wrong answer: bad arguments, mismatched calls, dead and stalled
peers, and bootstrap mistakes each give a clear typed error on every rank within bounds."""
import os
import socket
import threading
import time

import pytest

import ringtree as rt
from harness import run_world


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [1, 3])
def test_invalid_arguments_raise_before_traffic_and_leave_comm_usable(nranks):
    world = run_world(nranks, "invalid_arguments", timeout=100)
    for rank, res in enumerate(world.check_ok()):
        bad = {k: v for k, v in res["report"].items() if v != "ok"}
        assert not bad, f"rank {rank}: {bad}"
        assert len(res["report"]) >= 18


MISMATCHES = ["collective", "count", "dtype", "op", "root", "algo", "zero_count", "count_across_paths", "algo_oneshot",
              "collective_across_paths"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", MISMATCHES)
@pytest.mark.parametrize("nranks", [2, 4])
def test_mismatched_calls_raise_collective_mismatch_on_every_rank(kind, nranks):
    world = run_world(nranks, "mismatch", dict(kind=kind), timeout=100)
    results = world.check_ok()
    for rank, res in enumerate(results):
        assert res["raised"] == "CollectiveMismatch", (rank, res)
        assert "called" in res["message"] and " but rank " in res["message"], res["message"]
        assert res["after"] == "aborted"
    # The detecting rank names both calls, with the argument that differs.
    detail = {"count": "count=17", "dtype": "float64", "op": "op=max", "root": "root=1", "algo": "algo=tree",
              "collective": "barrier", "zero_count": "count=0", "count_across_paths": "count=1048576",
              "algo_oneshot": "algo=oneshot", "collective_across_paths": "all_gather"}[kind]
    assert any(detail in res["message"] for res in results), [r["message"] for r in results]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks,hosts,elems", [(3, 1, 1 << 23), (4, 2, 1 << 23), (3, 1, 16)])
def test_sigkill_mid_allreduce_is_reported_fast_on_every_rank(nranks, hosts, elems):
    world = run_world(nranks, "kill_during_allreduce", dict(victim=1, elems=elems), hosts=hosts, timeout=100)
    assert world.returncodes[1] == -9
    for rank in (q for q in range(nranks) if q != 1):
        res = world.results[rank]
        assert res is not None and world.returncodes[rank] == 0, world.failure_report()
        assert res["raised"] in ("PeerFailure",), res
        assert res["seconds"] < 15, res  # far below the 60 s collective timeout
        assert "all_reduce #" in res["message"], res["message"]
    direct = [world.results[q]["message"] for q in range(nranks) if q != 1]
    assert any("rank 1" in m for m in direct), direct


@pytest.mark.timeout(120)
def test_stalled_peer_times_out_naming_collective_sequence_and_peer():
    world = run_world(3, "stalled_peer", dict(victim=1, timeout=2.0), timeout=100)
    results = world.check_ok()
    for rank in (0, 2):
        res = results[rank]
        assert res["raised"] == "Timeout", res
        assert res["seconds"] > 1.5 and res["seconds"] < 8, res
        assert "all_reduce #1" in res["message"], res["message"]
    # Rank 2 receives from rank 1 in the ring: its own wait names the stalled rank.
    assert "rank 1" in results[2]["message"], results[2]["message"]


@pytest.mark.timeout(60)
def test_connection_without_the_secret_is_dropped_and_the_job_continues():
    uid = rt.UniqueId.create()
    fd = uid.take_listener()
    os.close(fd)  # rank 0 (a subprocess) binds the port itself
    stop = threading.Event()

    def intruder():
        # Knock on rank 0's port with garbage until the job has started.
        while not stop.is_set():
            try:
                with socket.create_connection((uid.ip, uid.port), timeout=0.5) as s:
                    s.sendall(b"\x31\x42\x54\x52" + b"\x00" * 200)
            except OSError:
                pass
            time.sleep(0.05)

    t = threading.Thread(target=intruder)
    t.start()
    try:
        world = run_world(3, "init_only", dict(timeout=30.0), timeout=60,
                          per_rank_env=lambda r: {"RINGTREE_UNIQUE_ID": str(uid)})
    finally:
        stop.set()
        t.join()
    for res in world.check_ok():
        assert res["raised"] is None and res["sum"] == 0 + 1 + 2, res


@pytest.mark.timeout(60)
def test_wrong_world_size_is_explained_not_hung():
    world = run_world(3, "init_only", dict(timeout=20.0), timeout=50,
                      per_rank_env=lambda r: {"RINGTREE_WORLD_SIZE": "4"} if r == 2 else {})
    results = world.check_ok()
    for rank in (0, 2):
        assert results[rank]["raised"] == "BootstrapError", results[rank]
        assert "world size mismatch" in results[rank]["message"], results[rank]
        assert results[rank]["seconds"] < 15
    assert results[1]["raised"] in ("BootstrapError", "Timeout", "PeerFailure"), results[1]


@pytest.mark.timeout(60)
def test_duplicate_rank_is_explained_not_hung():
    world = run_world(3, "init_only", dict(timeout=20.0), timeout=50,
                      per_rank_env=lambda r: {"RINGTREE_RANK": "1"} if r == 2 else {})
    results = world.check_ok()
    assert results[0]["raised"] == "BootstrapError" and "duplicate rank" in results[0]["message"], results[0]
    assert any("duplicate rank" in (res.get("message") or "") for res in results[1:]), results


@pytest.mark.timeout(60)
def test_missing_rank_times_out_with_explanation():
    world = run_world(2, "init_only", dict(timeout=3.0), timeout=50,
                      per_rank_env=lambda r: {"RINGTREE_WORLD_SIZE": "3"})
    res = world.check_ok()[0]
    assert res["raised"] == "BootstrapError" and "missing rank(s) 2" in res["message"], res
