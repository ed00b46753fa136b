"""Set-up and tear-down of the device executors across real rank processes over the CUDA stand-in:
ranks that ask for different CUDA IPC mailbox layouts still agree on one; no rank frees its
mailboxes while a peer still maps them (undefined behaviour on a GPU, which the stand-in records:
a slower peer's walk would still write acknowledgements and stop words into freed memory); and a
rank failing inside NCCL's set-up does not leave the others waiting there for ever (the test
module exports a fake NCCL whose set-up waits for every rank, as NCCL's does)."""

from __future__ import annotations

import _ringtree_testing as testing
import pytest
import standin
from harness import run_world
from ipc_standin_workers import close_while_a_peer_is_slow, nccl_init_fails_on_one_rank, slot_layouts_differ

STANDIN = standin.ENV


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("drop", [False, True], ids=["close", "drop"])
def test_close_waits_for_every_peer_before_freeing_the_mailboxes(nranks, drop):
    world = run_world(nranks, close_while_a_peer_is_slow, {"drop": drop}, timeout=110, env=STANDIN)
    for rank, res in enumerate(world.check_ok()):
        assert res["ok"] and res["executor"] == "ipc", (rank, res)
        assert res["violations"] == [], (rank, res)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 3])
def test_ranks_asking_for_different_slots_walk_one_layout(nranks):
    small = {"RINGTREE_CUDA_IPC_SLOT_BYTES": "4096", "RINGTREE_CUDA_IPC_SLOTS": "2"}
    world = run_world(
        nranks, slot_layouts_differ, {}, timeout=110, env=STANDIN, per_rank_env=lambda r: small if r == 0 else {}
    )
    for rank, res in enumerate(world.check_ok()):
        assert res["executor"] == "ipc" and res["all_reduce_ok"] and res["all_gather_ok"], (rank, res)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nranks,failing", [(2, 1), (3, 0)])
def test_a_rank_failing_inside_nccl_set_up_fails_every_rank_within_the_timeout(nranks, failing):
    env = {**STANDIN, "RINGTREE_NCCL_LIBRARY": testing.__file__}
    world = run_world(
        nranks,
        nccl_init_fails_on_one_rank,
        {"timeout": 3.0},
        timeout=50,
        env=env,
        per_rank_env=lambda r: {"RINGTREE_STANDIN_NCCL_INIT": "fail"} if r == failing else {},
    )
    for rank, res in enumerate(world.check_ok()):
        assert res["host_ok"] and res["failing"] == (rank == failing), (rank, res)
        assert res["raised"] is not None and res["seconds"] < 10, (rank, res)
        if rank == failing:
            assert res["raised"] == "Error" and f"failed on rank {rank}" in res["message"], (rank, res)
        else:  # waited in NCCL's set-up for the failing rank, up to the call's timeout, then aborted it
            assert res["raised"] == "Timeout" and "aborted" in res["message"], (rank, res)
            assert 2.5 < res["seconds"] and res["aborts"] == 1, (rank, res)
