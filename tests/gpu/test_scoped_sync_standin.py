"""The walk kernel's scoped synchronization (kernels/cuda/scoped_sync.cuh) over the CUDA stand-in.

Every access of the walk kernel to a word another agent shares goes through a named primitive
with a scope. In the stand-in each checks its scope: a word of memory shared with another process
or with the host (mailboxes exported or mapped through CUDA IPC, pinned host memory) accessed
below system scope faults the kernel with a message naming the access. RINGTREE_STANDIN_PLANT=2
plants a fault (every system-scope release store downgraded to device scope) to show the check
catches it; the same walks without the plant are right. RINGTREE_STANDIN_WEAK=1 holds the
kernel's copies into shared mailboxes back until a system-scope release: a walk missing that
release (RINGTREE_STANDIN_PLANT=1) passes in the ordinary stand-in and gives wrong sums there."""

from __future__ import annotations

import pytest
import standin
from harness import run_world
from test_device_comm import device_sweep

# Two channels, so that the grid barrier's device-scope atomics run too (the check must let
# them pass: the barrier lives in device memory no other process maps).
WALK = {**standin.ENV, "RINGTREE_CUDA_IPC_CHANNELS": "2", "RINGTREE_STANDIN_SEED": "3", "RINGTREE_STANDIN_YIELD": "5"}
ARGS = dict(lib="standin", dtypes=["float32"], counts=[10000], ops=["sum"])


@pytest.fixture(autouse=True, scope="module")
def _standin_built():
    if not standin.available():
        pytest.fail("the test module _ringtree_testing is missing: build with RINGTREE_TESTING=ON (the default)")


@pytest.mark.timeout(120)
def test_scoped_walks_are_right_without_a_planted_fault():
    world = run_world(2, device_sweep, ARGS, timeout=110, env=WALK)
    for rank, res in enumerate(world.check_ok()):
        assert res["cases"] == 16 and not res["failures"], (rank, res)
        assert res["executor"] == "ipc", (rank, res["executor"])


@pytest.mark.timeout(120)
def test_a_device_scope_release_to_a_mailbox_fails_the_scope_check():
    env = {**WALK, "RINGTREE_STANDIN_PLANT": "2", "RINGTREE_TIMEOUT": "10"}
    world = run_world(2, device_sweep, ARGS, timeout=110, env=env)
    for rank, out in enumerate(world.outputs):
        ok = world.returncodes[rank] == 0 and world.results[rank] is not None
        assert not ok or world.results[rank]["failures"], (rank, "the planted fault went unnoticed")
        assert "scope check: store_release at device scope" in out, (rank, out[-3000:])
        assert "it needs system scope" in out, (rank, out[-3000:])


# The weak-memory mode: each block's copies into mailboxes another process maps stay held back
# until its next system-scope release. RINGTREE_STANDIN_PLANT=1 makes those releases publish
# nothing (a fence removed): the receivers then read stale slots.
WEAK = {**WALK, "RINGTREE_STANDIN_WEAK": "1"}


@pytest.mark.timeout(120)
def test_weak_mode_walks_are_right_without_a_planted_fault():
    world = run_world(2, device_sweep, ARGS, timeout=110, env=WEAK)
    for rank, res in enumerate(world.check_ok()):
        assert res["cases"] == 16 and not res["failures"], (rank, res)


@pytest.mark.timeout(120)
def test_a_removed_fence_passes_in_order_but_fails_in_weak_mode():
    planted = {"RINGTREE_STANDIN_PLANT": "1", "RINGTREE_TIMEOUT": "10"}
    strong = run_world(2, device_sweep, ARGS, timeout=110, env={**WALK, **planted})
    for rank, res in enumerate(strong.check_ok()):
        assert res["cases"] == 16 and not res["failures"], (rank, res)
    weak = run_world(2, device_sweep, ARGS, timeout=110, env={**WEAK, **planted})
    for rank, res in enumerate(weak.check_ok()):
        assert res["failures"], (rank, "the removed fence went unnoticed in weak mode")


@pytest.mark.timeout(120)
def test_a_flag_published_before_its_data_passes_in_order_but_fails_in_weak_mode():
    # RINGTREE_STANDIN_PLANT=4: the flag's release store lands first and the chunk it should
    # publish 20 ms later, so a peer polling the flag reads the slot before the data arrive.
    planted = {"RINGTREE_STANDIN_PLANT": "4", "RINGTREE_TIMEOUT": "10"}
    strong = run_world(2, device_sweep, ARGS, timeout=110, env={**WALK, **planted})
    for rank, res in enumerate(strong.check_ok()):
        assert res["cases"] == 16 and not res["failures"], (rank, res)
    weak = run_world(2, device_sweep, ARGS, timeout=110, env={**WEAK, **planted})
    assert any(res["failures"] for res in weak.check_ok()), "the early flag went unnoticed in weak mode"
