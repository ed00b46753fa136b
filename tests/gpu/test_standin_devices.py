"""Which device a call runs on, across real rank processes over the CUDA stand-in with two
devices (RINGTREE_STANDIN_DEVICES=2): a call follows its buffers' device whatever device is
current (as c10d's device guard does), and nothing in a rank touches a device it does not use
(a real GPU gets a context, hundreds of MiB, on the first such call). The stand-in records which
devices got a context; its memory is host memory, so this checks the host code's device handling,
not peer access between real GPUs (the GPU check's multi-GPU stage does that)."""

from __future__ import annotations

import pytest
import standin
from harness import run_world
from ipc_standin_workers import buffers_on_another_device, one_device_per_rank, sums_on_one_device

TWO_DEVICES = {**standin.ENV, "RINGTREE_STANDIN_DEVICES": "2"}


@pytest.mark.timeout(120)
def test_a_call_runs_on_its_buffers_device_and_restores_the_current_one():
    world = run_world(2, buffers_on_another_device, {}, timeout=110, env=TWO_DEVICES)
    for rank, res in enumerate(world.check_ok()):
        assert res["raised"] is None, (rank, res)
        assert res["all_reduce_ok"] and res["all_gather_ok"] and res["executor"] == "ipc", (rank, res)
        assert res["device_before"] == res["device_after"] == 0, (rank, res)


@pytest.mark.timeout(120)
def test_each_rank_touches_only_its_own_device():
    world = run_world(2, one_device_per_rank, {}, timeout=110, env=TWO_DEVICES)
    for rank, res in enumerate(world.check_ok()):
        assert res["ok"] and res["executor"] == "ipc", (rank, res)
        assert res["buffer_device"] == res["device"] == rank % 2, (rank, res)
        assert res["contexts"] == [res["device"]], (rank, res)
    # A GPU each: nothing time-slices, so nothing warns of it.
    assert not any(SHARED_GPU_WARNING in out for out in world.outputs), world.failure_report()


SHARED_GPU_WARNING = "without MPS: the GPU time-slices their processes"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mps", ["0", "1"])
def test_ranks_sharing_a_gpu_without_mps_are_warned_once(mps):
    # Three processes on stand-in device 0 (one GPU), its MPS reported as set: the lowest rank
    # says once, over two calls, that the GPU will time-slice them; with MPS on nobody says it.
    env = {**standin.ENV, "RINGTREE_STANDIN_MPS": mps}
    world = run_world(3, sums_on_one_device, {}, timeout=110, env=env)
    for rank, res in enumerate(world.check_ok()):
        assert res["ok"] and res["executor"] == "ipc", (rank, res)
    said = [out.count(SHARED_GPU_WARNING) for out in world.outputs]
    if mps == "1":
        assert said == [0, 0, 0], world.failure_report()
    else:
        assert said == [1, 0, 0], world.failure_report()
        assert "ranks 0, 1, 2 share the GPU at PCI 0000:01:00" in world.outputs[0], world.outputs[0]
