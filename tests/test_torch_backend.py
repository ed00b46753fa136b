"""The "ringtree" torch.distributed backend: every collective against Gloo on the same
inputs in the same processes, the three rendezvous paths, and errors that surface as
exceptions (never hangs)."""
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from torch_rank_worker import run_torch_world  # noqa: E402


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_importing_ringtree_does_not_import_torch():
    code = "import sys, ringtree, ringtree.bucketing; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_importing_ringtree_torch_registers_the_backend():
    code = ("import torch.distributed as dist, ringtree.torch; "
            "assert 'ringtree' in dist.Backend.backend_list; "
            "assert dist.Backend.default_device_backend_map.get('cpu') in ('gloo', 'ringtree'); "
            "assert dist.Backend.backend_capability['ringtree'] == ['cpu', 'cuda']")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("nranks", [2, 3])
def test_every_collective_matches_gloo(nranks):
    world = run_torch_world(nranks, "collectives_vs_gloo", timeout=140)
    for rank, res in enumerate(world.check_ok()):
        assert not res["failures"], f"rank {rank}: " + "\n".join(res["failures"])
        assert res["checked"] >= 170, res["checked"]


@pytest.mark.timeout(100)
@pytest.mark.parametrize("method", ["env", "tcp"])
def test_init_process_group_through_env_and_tcp(method):
    world = run_torch_world(2, "rendezvous", dict(method=method, port=_free_port()), timeout=90)
    for res in world.check_ok():
        assert res == {"sum": [3.0, 3.0, 3.0], "backend": "ringtree"}


@pytest.mark.timeout(100)
def test_errors_surface_as_typed_exceptions_within_the_timeout():
    world = run_torch_world(2, "errors", dict(timeout=2.0), timeout=90)
    results = world.check_ok()
    report = results[0]["report"]
    expected = ["BAND", "reduction dtype", "tag", "recv any source", "all_gather list length",
                "usable after bad arguments", "mismatch", "stall", "stall async wait", "stall async future"]
    assert sorted(report) == sorted(expected)
    bad = {name: case for name, case in report.items() if not case.get("ok")}
    assert not bad, bad
    for name in ("stall", "stall async wait"):
        assert report[name]["seconds"] > 1.5 and report[name]["seconds"] < 8, report[name]
        assert "all_reduce #" in report[name]["message"] and "rank 1" in report[name]["message"]
    # The mismatch is reported on the other rank too; it names both calls.
    assert "count=4" in report["mismatch"]["message"] and "count=5" in report["mismatch"]["message"]


@pytest.mark.timeout(100)
def test_a_killed_rank_makes_ddp_raise_on_the_survivor():
    world = run_torch_world(2, "kill_during_ddp", dict(victim=1), timeout=90)
    assert world.returncodes[1] == -9, world.failure_report()
    res = world.results[0]
    assert res is not None and world.returncodes[0] == 0, world.failure_report()
    assert res["peer_failure"], res
    assert res["seconds"] < 15, res  # far below the 60 s collective timeout
    assert "rank 1" in res["message"], res["message"]
