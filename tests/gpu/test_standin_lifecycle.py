"""Set-up and tear-down of the CUDA IPC executor across real rank processes over the CUDA stand-in:
ranks that ask for different mailbox layouts still agree on one, and no rank frees its mailboxes
while a peer still maps them (undefined behaviour on a GPU, which the stand-in records: a slower
peer's walk would still write acknowledgements and stop words into freed memory)."""
from __future__ import annotations

import pytest

import standin
from harness import run_world
from ipc_standin_workers import close_while_a_peer_is_slow, slot_layouts_differ

STANDIN = standin.ENV


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 3])
def test_close_waits_for_every_peer_before_freeing_the_mailboxes(nranks):
    world = run_world(nranks, close_while_a_peer_is_slow, {}, timeout=110, env=STANDIN)
    for rank, res in enumerate(world.check_ok()):
        assert res["ok"] and res["executor"] == "ipc", (rank, res)
        assert res["violations"] == [], (rank, res)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 3])
def test_ranks_asking_for_different_slots_walk_one_layout(nranks):
    small = {"RINGTREE_CUDA_IPC_SLOT_BYTES": "4096", "RINGTREE_CUDA_IPC_SLOTS": "2"}
    world = run_world(nranks, slot_layouts_differ, {}, timeout=110, env=STANDIN,
                      per_rank_env=lambda r: small if r == 0 else {})
    for rank, res in enumerate(world.check_ok()):
        assert res["executor"] == "ipc" and res["all_reduce_ok"] and res["all_gather_ok"], (rank, res)
