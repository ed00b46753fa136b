"""The host half of collectives on CUDA buffers (csrc/exec/cuda/device_comm), between real
processes and without a device: a Gate holds a staged call's place in the call order until its
input is ready, and failures on that side reach every rank; CUDA arrays on a machine without a
device fail on their rank before any traffic. The device path itself is gpu/test_device_comm.py.

The rank bodies (gate_holds_its_place, ...) run in every rank of a test's world (harness.py) and
return a JSON report that the test asserts on."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from harness import run_world
from rank_checks import outcome

import ringtree as rt
from ringtree import _core

F32 = list(_core.DTYPES).index("float32")


ALL_REDUCE = list(_core.COLLECTIVES).index("all_reduce")


def gated_all_reduce(comm, x, gate, timeout=-1.0):
    """An async in-place all_reduce of float32 x that starts its traffic once `gate` opens."""
    ptr = x.ctypes.data
    return comm._core.run(
        ALL_REDUCE,
        F32,
        True,
        ptr,
        x.size,
        False,
        True,
        ptr,
        x.size,
        False,
        0,
        1.0,
        0,
        -1,
        0,
        float(timeout),
        True,
        gate=gate,
    )


def gated_outcome(comm, x, gate, done, timeout=-1.0):
    """Issues a gated all_reduce and reports how it ended, how long that took, and how many
    times the gate's on_done ran."""
    start = time.monotonic()
    out = outcome(gated_all_reduce(comm, x, gate, timeout), start)
    out["done_calls"] = len(done)
    return out


def gate_holds_its_place(delay=0.4):
    """A gated call issued before a blocking one: the blocking one must wait for it (call order),
    and the gated call's buffer is untouched until its gate opens."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    a = np.full(1000, r + 1, np.float32)
    b = np.full(5000, 10 * (r + 1), np.float32)
    done = []
    gate = _core.Gate(on_done=lambda: done.append(time.monotonic()))
    seen = {}

    def open_later():
        seen["a_before_open"] = bool(np.all(a == r + 1))
        seen["opened_at"] = time.monotonic()
        gate.open()

    work = gated_all_reduce(comm, a, gate)
    threading.Timer(delay, open_later).start()
    comm.all_reduce(b)
    b_returned = time.monotonic()
    work.wait(30.0)
    return {
        "a_ok": bool(np.all(a == P * (P + 1) / 2)),
        "b_ok": bool(np.all(b == 10 * P * (P + 1) / 2)),
        "a_untouched_before_open": seen["a_before_open"],
        "b_after_open": b_returned >= seen["opened_at"],
        "done_calls": len(done),
        "done_after_open": bool(done) and done[0] >= seen["opened_at"],
    }


@pytest.mark.timeout(90)
@pytest.mark.parametrize("nranks", [2, 3])
def test_gated_call_keeps_its_place_and_waits_for_its_input(nranks):
    world = run_world(nranks, gate_holds_its_place, timeout=80)
    for rank, res in enumerate(world.check_ok()):
        assert res == {
            "a_ok": True,
            "b_ok": True,
            "a_untouched_before_open": True,
            "b_after_open": True,
            "done_calls": 1,
            "done_after_open": True,
        }, (rank, res)


def gate_never_opens(victim=1, timeout=2.0):
    """The victim's input never arrives: it raises Timeout naming its own input; the others get
    an error (its abort notice) instead of waiting out their own timeout, and every rank's
    on_done still runs (a staged call's stream must never be left waiting)."""
    comm = rt.init()
    x = np.ones(256, np.float32)
    comm.all_reduce(x)
    done = []
    gate = _core.Gate(on_done=lambda: done.append(1))
    if comm.rank != victim:
        gate.open()
    return gated_outcome(comm, np.ones(256, np.float32), gate, done, timeout)


@pytest.mark.timeout(90)
def test_input_that_never_arrives_times_out_on_every_rank():
    world = run_world(3, gate_never_opens, dict(victim=1, timeout=2.0), timeout=80)
    results = world.check_ok()
    victim = results[1]
    assert victim["raised"] == "Timeout" and "waiting for its own input" in victim["message"], victim
    for rank, res in enumerate(results):
        assert res["raised"] is not None, (rank, res)
        assert res["seconds"] < 20, (rank, res)  # the 2 s timeout plus slack, not a hang
        assert res["done_calls"] == 1, (rank, res)  # the stream side is always released


def gate_fails(victim=0):
    """The victim's staging failed (gate.fail): it raises with the reason, the others promptly."""
    comm = rt.init(timeout=30)
    done = []
    gate = _core.Gate(on_done=lambda: done.append(1))
    if comm.rank == victim:
        threading.Timer(0.2, lambda: gate.fail("device-to-host copy failed (test)")).start()
    else:
        gate.open()
    return gated_outcome(comm, np.ones(64, np.float32), gate, done)


@pytest.mark.timeout(90)
def test_failed_staging_is_reported_on_every_rank_promptly():
    world = run_world(3, gate_fails, dict(victim=0), timeout=80)
    results = world.check_ok()
    assert "could not be staged: device-to-host copy failed (test)" in results[0]["message"], results[0]
    for rank, res in enumerate(results):
        assert res["raised"] is not None, (rank, res)
        assert res["seconds"] < 15, (rank, res)  # far below the 30 s timeout: the abort notice
        assert res["done_calls"] == 1, (rank, res)


class FakeCudaArray:
    """Describes device memory through __cuda_array_interface__ without any device."""

    def __init__(self, n, typestr="<f4", strides=None, ptr=0x7F0000000000):
        self.__cuda_array_interface__ = {
            "shape": (n,),
            "typestr": typestr,
            "data": (ptr, False),
            "strides": strides,
            "version": 3,
        }


def device_arguments_without_a_device():
    """On a machine without a CUDA device: device buffers give a clear error on the rank that
    passed them, before any traffic, and the communicator stays usable (the next call, made by
    every rank, is the first traffic and must match)."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    report = {}

    def expect(name, call, kind, words):
        try:
            call()
            report[name] = "no error"
        except rt.Error as exc:
            ok = type(exc).__name__ == kind and all(w in str(exc) for w in words)
            report[name] = "ok" if ok else f"{type(exc).__name__}: {exc}"

    if r == 0:
        built = _core.cuda_built()
        words = ["CUDA buffers need a CUDA device"] if built else ["built without CUDA"]
        expect("device all_reduce", lambda: comm.all_reduce(FakeCudaArray(16)), "Error", words)
        expect("device all_gather", lambda: comm.all_gather(FakeCudaArray(4), FakeCudaArray(4 * P)), "Error", words)
        expect("device nccl", lambda: comm.all_reduce(FakeCudaArray(16), algo="nccl"), "Error", words)
        expect("async device", lambda: comm.broadcast(FakeCudaArray(8), async_op=True), "Error", words)
        expect(
            "nccl on host",
            lambda: comm.all_reduce(np.ones(4, np.float32), algo="nccl"),
            "InvalidArgument",
            ["algo='nccl' needs CUDA buffers"],
        )
        expect(
            "mixed",
            lambda: comm.all_gather(np.ones(4, np.float32), FakeCudaArray(4 * P)),
            "InvalidArgument",
            ["host memory", "CUDA memory"],
        )
        expect("strided", lambda: comm.all_reduce(FakeCudaArray(4, strides=(8,))), "InvalidArgument", ["C-contiguous"])
        expect(
            "dtype",
            lambda: comm.all_reduce(FakeCudaArray(4, typestr="<c32")),
            "InvalidArgument",
            ["unsupported dtype <c32"],
        )
    x = np.arange(10, dtype=np.int64) + r
    comm.all_reduce(x)
    report["usable after"] = "ok" if np.array_equal(x, P * np.arange(10) + P * (P - 1) // 2) else f"wrong: {x}"
    return {"report": report}


@pytest.mark.timeout(90)
@pytest.mark.skipif(_core.cuda_available(), reason="checks the no-device errors; this machine has a CUDA device")
def test_cuda_arrays_without_a_device_fail_on_their_rank_before_traffic():
    world = run_world(2, device_arguments_without_a_device, timeout=80)
    for rank, res in enumerate(world.check_ok()):
        bad = {k: v for k, v in res["report"].items() if v != "ok"}
        assert not bad, (rank, bad)
    assert len(world.results[0]["report"]) == 9
