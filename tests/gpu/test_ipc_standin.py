"""The CUDA IPC and staged executors across real rank processes, without a GPU.

The ranks run ringtree over the CUDA stand-in (RINGTREE_TEST_STANDIN=1, tests/support/standin.py):
the same executor sources as a CUDA build (exec/cuda, transport/cuda_ipc) over a CPU stand-in of
the CUDA runtime, and the same device sources (launch.cu, reduce.cu) through its CUDA-on-CPU layer
(kernels/cuda/standin): device memory is shared memory, IPC handles name it, streams and events
are host queues, and the walk kernel runs as 512 fibers per channel on threads of the rank. So the
set-up collective, the mailbox exchange, call order on the caller's stream, the walk kernel's
barriers and flags, the watchdog, aborts, timeouts and mismatch stop words run here as they do on
a GPU; the GPU's memory model, warps, real IPC and speed do not. Rank programs: those of
test_device_comm.py (lib='standin'), as the GPU tests run them, and ipc_standin_workers.py."""

from __future__ import annotations

import pytest
import standin
from harness import run_world
from ipc_standin_workers import (
    MISMATCHED_FIELDS,
    abort_during_a_device_call,
    caller_stream_order,
    capture_is_refused,
    deterministic_sums,
    mismatch_in_every_field,
    mismatched_count,
    more_calls_in_flight_than_statuses,
    setup_refused,
    stream_named_by_the_array,
)
from test_device_comm import device_peer_stalls, device_stream_semantics, device_sweep

STANDIN = standin.ENV


def executor_env(executor):
    """The stand-in's environment for ranks that take the CUDA IPC executor or the staged one."""
    return {**STANDIN, "RINGTREE_CUDA_IPC": "1" if executor == "ipc" else "0"}


@pytest.fixture(autouse=True, scope="module")
def _standin_built():
    if not standin.available():
        pytest.fail("the test module _ringtree_testing is missing: build with RINGTREE_TESTING=ON (the default)")


# Worlds of the sweep: (ranks, channels, seed, yield percent, dtypes, reduce ops, counts). Together
# they cover every collective with every dtype that reaches the device path as a CUDA array
# (bfloat16 and float8 only do as torch CUDA tensors: the kernel tests cover them), every op, 2 to
# 4 ranks, 1 to 4 channels, thread orders in order and shuffled with yields, in and out of place.
SWEEP = [
    (2, 1, 1, 5, ["int8", "float32", "float64"], ["sum", "prod", "band", "avg"], [0, 37, 70000]),
    (3, 2, 2, 10, ["uint8", "int32", "float16"], ["max", "premul_sum", "bor", "sum"], [1, 1001]),
    (4, 3, 3, 0, ["int64", "float32", "int8"], ["min", "bxor", "avg", "sum"], [3, 4099]),
    (4, 4, 0, 0, ["float16", "int32", "float64", "uint8"], ["sum", "max", "prod", "min"], [0, 1, 70000]),
    # The later dtypes (float8 reaches the device path as a torch tensor only: the kernel tests cover it).
    (3, 2, 4, 5, ["int16", "uint64", "complex64", "complex128"], ["sum", "prod", "avg", "bxor"], [1, 4099]),
    (2, 3, 5, 0, ["uint16", "uint32"], ["premul_sum", "min", "band"], [0, 70000]),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "nranks,channels,seed,yield_percent,dtypes,ops,counts", SWEEP, ids=[f"P{w[0]}-C{w[1]}-seed{w[2]}" for w in SWEEP]
)
def test_every_ipc_collective_matches_numpy(nranks, channels, seed, yield_percent, dtypes, ops, counts):
    args = dict(lib="standin", dtypes=dtypes, counts=counts, ops=ops)
    env = {
        **STANDIN,
        "RINGTREE_CUDA_IPC_CHANNELS": str(channels),
        "RINGTREE_STANDIN_SEED": str(seed),
        "RINGTREE_STANDIN_YIELD": str(yield_percent),
    }
    world = run_world(nranks, device_sweep, args, timeout=280, env=env)
    for rank, res in enumerate(world.check_ok()):
        assert res["cases"] > 100 and not res["failures"], (rank, res)
        assert res["executor"] == "ipc", (rank, res["executor"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 3])
def test_one_channel_ipc_walks_are_right(nranks):
    # RINGTREE_CUDA_IPC_CHANNELS=1 (or any rank offering one channel) leaves each rank's walk
    # kernel without a step barrier among channels; its block must still finish every step
    # before the next (a review reproduced 4,980 of 10,000 elements wrong at P=2 without).
    args = dict(lib="standin", dtypes=["float32"], counts=[10000], ops=["sum"])
    world = run_world(nranks, device_sweep, args, timeout=110, env={**STANDIN, "RINGTREE_CUDA_IPC_CHANNELS": "1"})
    for rank, res in enumerate(world.check_ok()):
        assert res["cases"] == 16 and not res["failures"], (rank, res)
        assert res["executor"] == "ipc", (rank, res["executor"])


@pytest.mark.timeout(200)
def test_async_work_with_the_default_channels():
    world = run_world(
        3,
        device_sweep,
        dict(lib="standin", dtypes=["float32"], counts=[1, 70000], async_op=True),
        timeout=180,
        env=STANDIN,
    )
    for rank, res in enumerate(world.check_ok()):
        assert res["cases"] == 56 and not res["failures"], (rank, res)
        assert res["executor"] == "ipc", (rank, res["executor"])


@pytest.mark.timeout(100)
def test_deterministic_mode_walks_rank_order_on_the_ipc_executor():
    world = run_world(3, deterministic_sums, {}, timeout=90, env=STANDIN)
    for rank, res in enumerate(world.check_ok()):
        assert res["executor"] == "ipc" and not res["wrong"], (rank, res)


@pytest.mark.timeout(100)
def test_call_returns_before_the_stream_reaches_it():
    # The first device call sets the executor up; neither that nor the call itself may wait for
    # the kernel already on the caller's stream; the result is there once the stream gets to it.
    world = run_world(2, device_stream_semantics, dict(lib="standin", seconds=1.0), timeout=90, env=STANDIN)
    for rank, res in enumerate(world.check_ok()):
        assert res["ok"] and not res["completed_early"] and res["returned_after"] < 0.5, (rank, res)


@pytest.mark.timeout(100)
def test_collective_is_ordered_between_producer_and_consumer_on_the_callers_stream():
    world = run_world(3, caller_stream_order, {}, timeout=90, env=STANDIN)
    for rank, res in enumerate(world.check_ok()):
        assert res["returned_after"] < 0.3, (rank, res)  # the host did not wait for the 0.5 s producer
        # The sum of the late inputs: not the zeros before them (no fork), nor this rank's own
        # late input (no join), nor a mix.
        assert res["consumer_saw"] == [6.0], (rank, res)


@pytest.mark.timeout(100)
def test_collective_is_ordered_on_the_stream_the_array_names():
    world = run_world(2, stream_named_by_the_array, {}, timeout=90, env=STANDIN)
    for rank, res in enumerate(world.check_ok()):
        assert res["consumer_saw"] == [res["sum"]], (rank, res)


@pytest.mark.timeout(100)
def test_mismatched_call_fails_on_every_rank():
    world = run_world(3, mismatched_count, dict(odd_rank=1), timeout=90, env=STANDIN)
    for rank, res in enumerate(world.check_ok()):
        assert res["first_ok"] and res["executor"] == "ipc", (rank, res)
        assert res["raised"] == "CollectiveMismatch", (rank, res)
        assert "all_reduce" in res["message"] and "#1" in res["message"], (rank, res)
        assert res["seconds"] < 10 and res["stream_released_after"] < 10, (rank, res)  # not the 30 s timeout
        assert res["later"] == "CollectiveMismatch", (rank, res)  # the failure sticks; no hang


@pytest.mark.timeout(150)
@pytest.mark.parametrize("executor", ["ipc", "staged"])
def test_a_mismatch_in_any_fingerprinted_field_fails_every_rank(executor):
    # Collective, algorithm, dtype, op, root, count, deterministic: each alone must stop every
    # rank with CollectiveMismatch, not mix the ranks' data (the host executor's own tests are
    # multiproc/test_errors.py and test_deterministic.py).
    world = run_world(3, mismatch_in_every_field, {}, timeout=140, env=executor_env(executor))
    for rank, res in enumerate(world.check_ok()):
        assert sorted(res) == sorted(MISMATCHED_FIELDS), (rank, res)
        for field, out in res.items():
            assert out["executor"].startswith(executor), (rank, field, out)
            assert "CollectiveMismatch" in (out["raised"], out["next"]) and out["seconds"] < 10, (rank, field, out)


@pytest.mark.timeout(100)
def test_stalled_peer_times_out_on_every_caller_and_releases_the_stream():
    world = run_world(3, device_peer_stalls, dict(lib="standin", victim=1, timeout=3.0), timeout=90, env=STANDIN)
    results = world.check_ok()
    assert results[1] == {"victim": True}
    for rank in (0, 2):
        res = results[rank]
        assert res["raised"] == "Timeout" and "all_reduce" in res["message"], (rank, res)
        assert 2.5 < res["seconds"] < 10, (rank, res)  # at its 3 s timeout, not before, not much after
        assert res["stream_released_after"] < 10, (rank, res)


@pytest.mark.timeout(100)
def test_abort_ends_every_device_call_in_flight():
    world = run_world(3, abort_during_a_device_call, {}, timeout=90, env=STANDIN)
    results = world.check_ok()
    assert results[1]["victim"] and results[1]["raised"] == "Aborted" and results[1]["seconds"] < 5, results[1]
    for rank in (0, 2):
        res = results[rank]
        assert res["raised"] == "Aborted" and res["seconds"] < 5, (rank, res)  # not at the 20 s timeout
        assert res["stream_released_after"] < 5, (rank, res)


@pytest.mark.timeout(100)
@pytest.mark.parametrize(
    "refusal,first,words",
    [
        ({"RINGTREE_CUDA_IPC": "0"}, 1, "RINGTREE_CUDA_IPC=0"),  # round 1: cannot export
        (
            {"RINGTREE_STANDIN_FAIL": "cudaIpcOpenMemHandle"},
            2,
            "cudaIpcOpenMemHandle for rank 0",
        ),  # round 2: cannot map
    ],
)
def test_one_rank_without_ipc_moves_every_rank_to_staged(refusal, first, words):
    world = run_world(
        3, setup_refused, {}, timeout=90, env=STANDIN, per_rank_env=lambda r: refusal if r == first else {}
    )
    for rank, res in enumerate(world.check_ok()):
        assert res["all_reduce_ok"] and res["all_gather_ok"], (rank, res)
        if rank == first:
            assert res["executor"].startswith(f"staged: rank {first}: ") and words in res["executor"], (rank, res)
        else:
            assert res["executor"] == f"staged: rank {first} cannot (its own error says why)", (rank, res)


@pytest.mark.timeout(260)
def test_more_calls_in_flight_than_status_entries_wait_and_report_the_right_call():
    calls = 1100  # the executor keeps 1024 status entries (kStatusRing)
    world = run_world(3, more_calls_in_flight_than_statuses, dict(calls=calls), timeout=240, env=STANDIN)
    for rank, res in enumerate(world.check_ok()):
        assert res["wrong"] == [], (rank, res)
        # Call #0 set the executor up: the first held call is #1, so #1025 is the first that would
        # reuse a status entry still in flight. The host issues up to #1024 during the hold, and
        # returns from #1025 only once the stream moves on.
        assert res["returned_1024"] < res["hold"] <= res["returned_1025"], (rank, res)
        assert res["raised"] == "CollectiveMismatch", (rank, res)
        assert f"all_reduce device call #{calls} " in res["message"], (rank, res)
        assert res["seconds"] < 140, (rank, res)  # ended by the mismatch, not the 150 s timeout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("executor", ["ipc", "staged"])
def test_a_call_on_a_capturing_stream_is_refused_before_anything_is_enqueued(executor):
    world = run_world(3, capture_is_refused, {}, timeout=110, env=executor_env(executor))
    for rank, res in enumerate(world.check_ok()):
        for label in ("first", "later"):
            assert res[label].startswith("InvalidArgument: all_reduce: the stream is being captured"), (rank, res)
            assert res[label + "_nodes"] == 0, (rank, res)  # nothing was captured
        assert res["first_executor"] == "not set up", (rank, res)  # nor set up
        assert res["later_executor"].startswith(executor), (rank, res)
        assert res["after_first_ok"] and res["after_later_ok"], (rank, res)
