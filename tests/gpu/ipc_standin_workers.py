"""Rank programs for test_ipc_standin.py: the device path over the CUDA stand-in (ringtree's core
from the test module _ringtree_testing, installed by rank_worker.py when RINGTREE_TEST_STANDIN=1).
The device programs of test_device_comm.py run here unchanged with lib='standin' (StandinArrays);
the ones below cover what only a stand-in can provoke on demand (mismatches, set-up refusals)."""

from __future__ import annotations

import ctypes
import gc
import os
import threading
import time

import _ringtree_testing as testing
import numpy as np
from rank_checks import outcome
from reference import rank_order_fold, spread_input
from test_device_comm import DeviceArrays

import ringtree as rt
from ringtree import _core


def require_standin():
    """The rank programs below run only in a rank process that loaded the stand-in."""
    assert getattr(_core, "CUDA_STANDIN", False), "run with RINGTREE_TEST_STANDIN=1 (tests/support/standin.py)"


class StandinArray:
    """A 1-D array in the stand-in's device memory, described by __cuda_array_interface__.
    Slices are views that keep their allocation alive."""

    def __init__(self, ptr, size, dtype, owner=None):
        self.ptr, self.size, self.dtype, self._owner = ptr, size, np.dtype(dtype), owner
        self.__cuda_array_interface__ = {
            "shape": (size,),
            "typestr": self.dtype.str,
            "data": (ptr, False),
            "strides": None,
            "version": 3,
        }

    @classmethod
    def empty(cls, size, dtype):
        return cls(testing.standin_malloc(size * np.dtype(dtype).itemsize), size, dtype)

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    def __getitem__(self, index):
        start, stop, step = index.indices(self.size)
        assert step == 1, "contiguous slices only"
        return StandinArray(
            self.ptr + start * self.dtype.itemsize, max(stop - start, 0), self.dtype, self._owner or self
        )

    def __del__(self):
        if self._owner is None and self.ptr:
            testing.standin_free(self.ptr)


class StandinArrays:
    """DeviceArrays (test_device_comm.py) for the stand-in: copies are ordered on the legacy default
    stream, where the collectives on these arrays are enqueued, and wait for it."""

    lib = "standin"

    def __init__(self):
        require_standin()

    def upload(self, host):
        host = np.ascontiguousarray(host)
        dev = StandinArray.empty(host.size, host.dtype)
        testing.standin_memcpy(dev.ptr, host.ctypes.data, host.nbytes)
        return dev

    def download_into(self, dev, host):
        tmp = np.empty(dev.size, dev.dtype)
        testing.standin_memcpy(tmp.ctypes.data, dev.ptr, dev.nbytes)
        host[...] = tmp.reshape(host.shape)

    def synchronize(self):
        testing.standin_stream_synchronize(0)

    def sleep_kernel(self, seconds):
        testing.standin_sleep(seconds)


def peek(dev):
    """The device array's contents, read directly (the stand-in's device memory is host memory)."""
    if not dev.size:
        return np.empty(0, dev.dtype)
    return np.frombuffer((ctypes.c_char * dev.nbytes).from_address(dev.ptr), dev.dtype).copy()


def caller_stream_order(n=70000, delay=0.5):
    """The caller's stream: a producer writes the input late (a slow kernel, then a copy), the
    collective must read it only then (fork), and a consumer queued after the collective must
    see its result (join), all without the host waiting."""
    arrays = DeviceArrays("standin")
    comm = rt.init()
    r = comm.rank
    x = arrays.upload(np.zeros(n, np.float32))
    comm.all_reduce(arrays.upload(np.zeros(1, np.float32)))  # the executor is set up
    arrays.synchronize()
    late_input = np.full(n, r + 1, np.float32)
    seen = np.full(n, -1, np.float32)
    start = time.monotonic()
    testing.standin_sleep(delay)
    testing.standin_memcpy(x.ptr, late_input.ctypes.data, late_input.nbytes, wait=False)
    work = comm.all_reduce(x, async_op=True)
    testing.standin_memcpy(seen.ctypes.data, x.ptr, x.nbytes, wait=False)
    returned_after = time.monotonic() - start
    arrays.synchronize()
    work.wait(60.0)
    return {"returned_after": returned_after, "consumer_saw": sorted(set(np.unique(seen).tolist()))}


def mismatched_count(odd_rank=1, n=1000, timeout=30.0):
    """Every rank calls all_reduce, odd_rank with one element more: every rank's call must fail
    with CollectiveMismatch promptly (far below the timeout), and the stream is released."""
    arrays = DeviceArrays("standin")
    comm = rt.init()
    y = arrays.upload(np.ones(n, np.float32))
    comm.all_reduce(y)  # a matching call first: the executor is set up and works
    arrays.synchronize()
    first_ok = bool(np.all(peek(y) == comm.size))
    x = arrays.upload(np.ones(n + (comm.rank == odd_rank), np.float32))
    start = time.monotonic()
    out = outcome(comm.all_reduce(x, async_op=True, timeout=timeout), start)
    arrays.synchronize()
    out["stream_released_after"] = time.monotonic() - start
    out["first_ok"] = first_ok
    out["executor"] = comm.status().cuda_executor
    try:  # the CUDA IPC path stays failed: a later call reports the error, it does not hang
        comm.all_reduce(x, timeout=timeout)
        out["later"] = None
    except rt.Error as exc:
        out["later"] = type(exc).__name__
    return out


def setup_refused(n=1000):
    """One rank cannot do CUDA IPC (RINGTREE_CUDA_IPC=0 or a failing runtime call in its
    environment): every rank falls back to the staged path at the same call, says why, and the
    collectives are still right."""
    arrays = DeviceArrays("standin")
    comm = rt.init()
    r, P = comm.rank, comm.size
    x = arrays.upload(np.full(n, r + 1, np.float32))
    comm.all_reduce(x)
    y = arrays.upload(np.zeros(n * P, np.int32))
    comm.all_gather(arrays.upload(np.full(n, r, np.int32)), y)
    arrays.synchronize()
    return {
        "executor": comm.status().cuda_executor,
        "all_reduce_ok": bool(np.all(peek(x) == P * (P + 1) / 2)),
        "all_gather_ok": bool(np.array_equal(peek(y), np.repeat(np.arange(P, dtype=np.int32), n))),
        "ipc_env": os.environ.get("RINGTREE_CUDA_IPC", ""),
        "fail_env": os.environ.get("RINGTREE_STANDIN_FAIL", ""),
    }


def deterministic_sums(n=5003, seed=7):
    """Deterministic mode on the CUDA IPC executor: float32 all_reduce and reduce_scatter of
    random data, every algorithm requested; the bits must be numpy's rank-order fold."""
    arrays = DeviceArrays("standin")
    comm = rt.init()
    r, P = comm.rank, comm.size
    inputs = [spread_input(seed, q, n * P, "float32") for q in range(P)]
    want = rank_order_fold(inputs, "float32")
    wrong = []
    for algo in ("auto", "ring", "tree", "rank_order"):
        x = arrays.upload(inputs[r][:n])
        comm.all_reduce(x, algo=algo, deterministic=True)
        arrays.synchronize()
        if peek(x).tobytes() != want[:n].tobytes():
            wrong.append(f"all_reduce/{algo}")
    out = arrays.upload(np.zeros(n, np.float32))
    comm.reduce_scatter(arrays.upload(inputs[r]), out, deterministic=True)
    arrays.synchronize()
    if peek(out).tobytes() != want[r * n : (r + 1) * n].tobytes():
        wrong.append("reduce_scatter/auto")
    return {"wrong": wrong, "executor": comm.status().cuda_executor}


def buffers_on_another_device(n=1000):
    """Device 0 stays current while every buffer lives on stand-in device 1 (a tensor on cuda:1
    with cuda:0 current): each call must run on device 1, as c10d's device guard has it, and
    leave device 0 current."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    host = np.full(n, r + 1, np.float32)
    x = StandinArray(testing.standin_malloc(host.nbytes, device=1), n, np.float32)
    testing.standin_memcpy(x.ptr, host.ctypes.data, host.nbytes)
    out = {"device_before": testing.standin_get_device()}
    try:
        comm.all_reduce(x, async_op=True).wait(60.0)
        y = StandinArray(testing.standin_malloc(n * P * 4, device=1), n * P, np.float32)
        comm.all_gather(x, y, async_op=True).wait(60.0)
        out["all_reduce_ok"] = bool(np.all(peek(x) == P * (P + 1) / 2))
        out["all_gather_ok"] = bool(np.all(peek(y) == P * (P + 1) / 2))
        out["raised"] = None
    except rt.Error as exc:
        out["raised"], out["message"] = type(exc).__name__, str(exc)
    out["device_after"] = testing.standin_get_device()
    out["executor"] = comm.status().cuda_executor
    return out


def one_device_per_rank(n=70000):
    """Each rank works on stand-in device rank % 2 alone, made current first as
    torch.cuda.set_device(local_rank) does: the walks go over IPC between two devices, and no
    thread of the rank (the device watchdog included) touches another device, where a real one
    would make a context."""
    device = int(os.environ["RINGTREE_RANK"]) % 2
    testing.standin_set_device(device)
    arrays = DeviceArrays("standin")
    comm = rt.init()
    r, P = comm.rank, comm.size
    x = arrays.upload(np.full(n, r + 1, np.float32))
    comm.all_reduce(x, async_op=True).wait(60.0)
    y = arrays.upload(np.zeros(n * P, np.int32))
    comm.all_gather(arrays.upload(np.full(n, r, np.int32)), y)
    arrays.synchronize()
    ok = bool(np.all(peek(x) == P * (P + 1) / 2)) and bool(
        np.array_equal(peek(y), np.repeat(np.arange(P, dtype=np.int32), n))
    )
    executor = comm.status().cuda_executor
    comm.close()
    return {
        "device": device,
        "ok": ok,
        "executor": executor,
        "contexts": testing.standin_contexts(),
        "buffer_device": testing.standin_device_of(x.ptr),
    }


def close_while_a_peer_is_slow(slow_rank=1, delay=0.5, n=256, drop=False):
    """Every rank's last call is a broadcast from rank 0, which only sends: rank 0's walk is done
    once its chunks sit in the others' mailboxes, while the slow rank's walk has not yet started
    (a kernel keeps its stream busy) and will still acknowledge them in rank 0's memory. Rank 0
    then closes at once (with `drop`, every rank drops its communicator without close()). No
    rank may free mailboxes a peer still maps (the stand-in records it)."""
    arrays = DeviceArrays("standin")
    comm = rt.init()
    r, P = comm.rank, comm.size
    x = arrays.upload(np.full(n, r + 1, np.float32))
    comm.all_reduce(x)
    arrays.synchronize()
    ok = bool(np.all(peek(x) == P * (P + 1) / 2))
    b = arrays.upload(np.full(n, 7.0 if r == 0 else 0.0, np.float32))
    if r == slow_rank:
        testing.standin_sleep(delay)
    comm.broadcast(b, root=0)
    arrays.synchronize()
    ok = ok and bool(np.all(peek(b) == 7.0))
    executor = comm.status().cuda_executor
    if drop:
        del comm
        gc.collect()
    else:
        comm.close()
    return {"ok": ok, "executor": executor, "violations": testing.standin_violations()}


def slot_layouts_differ(n=70000):
    """Rank 0 asks for small and few mailbox slots (its environment), the others for the
    defaults: every rank must walk one layout, or a peer writes past rank 0's mailboxes."""
    arrays = DeviceArrays("standin")
    comm = rt.init()
    r, P = comm.rank, comm.size
    x = arrays.upload(np.full(n, r + 1, np.float32))
    comm.all_reduce(x)
    y = arrays.upload(np.zeros(n * P, np.float32))
    comm.all_gather(arrays.upload(np.full(n, r, np.float32)), y)
    arrays.synchronize()
    return {
        "executor": comm.status().cuda_executor,
        "all_reduce_ok": bool(np.all(peek(x) == P * (P + 1) / 2)),
        "all_gather_ok": bool(np.array_equal(peek(y), np.repeat(np.arange(P, dtype=np.float32), n))),
    }


def nccl_init_fails_on_one_rank(timeout=3.0):
    """algo='nccl' over the fake NCCL the test module exports: one rank fails inside NCCL's
    set-up (its environment says so), the others wait there for it, as NCCL's do. Every rank must
    raise within about the call's timeout, and the host communicator stays usable."""
    arrays = DeviceArrays("standin")
    comm = rt.init()
    x = arrays.upload(np.ones(1024, np.float32))
    start = time.monotonic()
    out = {"failing": os.environ.get("RINGTREE_STANDIN_NCCL_INIT") == "fail"}
    try:
        comm.all_reduce(x, algo="nccl", timeout=timeout)
        out["raised"] = None
    except rt.Error as exc:
        out["raised"], out["message"] = type(exc).__name__, str(exc)
    out["seconds"] = time.monotonic() - start
    y = np.full(8, comm.rank, np.int64)
    comm.all_reduce(y)
    out["host_ok"] = bool(np.all(y == comm.size * (comm.size - 1) // 2))
    out["aborts"] = testing.fake_nccl_aborts()
    return out


MISMATCHED_FIELDS = ["collective", "algo", "dtype", "op", "root", "count", "deterministic"]


def mismatch_in_every_field(n=1000, timeout=20.0):
    """For each field of a call's fingerprint, a fresh communicator (a split of the world) makes
    one agreeing call, then one where the last rank differs in that field alone: every rank must
    raise CollectiveMismatch, promptly, whichever executor runs it (the world's environment
    chooses CUDA IPC or staged), in that call or, on a rank that finished it without hearing from
    the odd one (a broadcast root that only sends), in its next."""
    arrays = DeviceArrays("standin")
    world = rt.init()
    odd = world.rank == world.size - 1
    results = {}
    for field in MISMATCHED_FIELDS:
        comm = world.split(0)
        x = arrays.upload(np.ones(n, np.float32))
        comm.all_reduce(x)  # the executor is set up and agrees
        arrays.synchronize()
        start = time.monotonic()
        if field == "collective":  # the same schedule count, algorithm, dtype, op and root
            if odd:
                y = arrays.upload(np.ones(n * comm.size, np.float32))
                work = comm.reduce_scatter(
                    y, arrays.upload(np.zeros(n, np.float32)), algo="ring", async_op=True, timeout=timeout
                )
            else:
                work = comm.all_reduce(x, algo="ring", async_op=True, timeout=timeout)
        elif field == "algo":
            work = comm.all_reduce(x, algo="tree" if odd else "ring", async_op=True, timeout=timeout)
        elif field == "dtype":
            y = arrays.upload(np.ones(n, np.int32 if odd else np.float32))
            work = comm.all_reduce(y, async_op=True, timeout=timeout)
        elif field == "op":
            work = comm.all_reduce(x, op="max" if odd else "sum", async_op=True, timeout=timeout)
        elif field == "root":
            work = comm.broadcast(x, root=1 if odd else 0, async_op=True, timeout=timeout)
        elif field == "count":
            y = arrays.upload(np.ones(n + odd, np.float32))
            work = comm.all_reduce(y, async_op=True, timeout=timeout)
        else:  # deterministic
            work = comm.all_reduce(x, deterministic=odd, async_op=True, timeout=timeout)
        out = outcome(work, start)
        out["next"] = None
        if out["raised"] is None:
            out["next"] = outcome(comm.all_reduce(x, async_op=True, timeout=timeout), start)["raised"]
        arrays.synchronize()
        out["executor"] = comm.status().cuda_executor
        comm.close()
        results[field] = out
    return results


def stream_named_by_the_array(n=70000, delay=0.5):
    """A producer fills the input late on a stream of its own (a slow kernel, then a copy) and
    the array names that stream in __cuda_array_interface__ (version 3's "stream"): the collective
    must be ordered after the producer's work there, and a consumer queued on that stream after
    the collective must see the sum."""
    arrays = DeviceArrays("standin")
    comm = rt.init()
    r, P = comm.rank, comm.size
    comm.all_reduce(arrays.upload(np.zeros(1, np.float32)))  # the executor is set up
    arrays.synchronize()
    stream = testing.standin_stream_create()
    x = arrays.upload(np.zeros(n, np.float32))
    x.__cuda_array_interface__["stream"] = stream
    late_input = np.full(n, r + 1, np.float32)
    seen = np.full(n, -1, np.float32)
    testing.standin_sleep(delay, stream=stream)
    testing.standin_memcpy(x.ptr, late_input.ctypes.data, late_input.nbytes, stream=stream, wait=False)
    work = comm.all_reduce(x, async_op=True)
    testing.standin_memcpy(seen.ctypes.data, x.ptr, x.nbytes, stream=stream, wait=False)
    testing.standin_stream_synchronize(stream)
    work.wait(60.0)
    testing.standin_stream_destroy(stream)
    return {"consumer_saw": sorted(set(np.unique(seen).tolist())), "sum": P * (P + 1) / 2}


def abort_during_a_device_call(victim=1, n=70000, timeout=20.0):
    """The victim does not make its second call; meanwhile rank 0 aborts the communicator from
    another thread while the others' device calls wait for the victim: each of those calls must
    raise Aborted at once, not at its timeout, and so must the victim's late call (when waited
    for: a device call reports on its Work or at the next call)."""
    arrays = DeviceArrays("standin")
    comm = rt.init()
    x = arrays.upload(np.ones(n, np.float32))
    comm.all_reduce(x)
    arrays.synchronize()
    start = time.monotonic()
    if comm.rank == victim:
        time.sleep(2.0)
        return {**outcome(comm.all_reduce(x, async_op=True, timeout=timeout), time.monotonic()), "victim": True}
    if comm.rank == 0:
        threading.Timer(0.5, lambda: comm.abort("the test aborts")).start()
    out = outcome(comm.all_reduce(x, async_op=True, timeout=timeout), start)
    arrays.synchronize()
    out["stream_released_after"] = time.monotonic() - start
    return out


def more_calls_in_flight_than_statuses(calls=1100, hold=8.0, odd_rank=1):
    """More device calls in flight than the CUDA IPC executor keeps status entries for (1024):
    the caller's stream is held by a slow kernel while the host issues `calls` all_reduces, the
    last with one element more on odd_rank. The host must wait for room rather than let a later
    call's status overwrite an earlier one's (so it returns from the calls only once the stream
    moves); every call before the last is right, and the mismatch names the last call."""
    arrays = DeviceArrays("standin")
    # Each call's timeout counts from its issue, with up to a thousand calls ahead of it on a slow
    # stand-in: long enough that only a hang ends one.
    comm = rt.init(timeout=200.0)
    r, P = comm.rank, comm.size
    comm.all_reduce(arrays.upload(np.zeros(1, np.float32)))  # the executor is set up: call #0
    arrays.synchronize()
    xs = [arrays.upload(np.full(1 + (k == calls - 1 and r == odd_rank), r + k, np.float32)) for k in range(calls)]
    start = time.monotonic()
    testing.standin_sleep(hold)
    returned = []  # seconds from the hold's start to each call's return
    for x in xs[:-1]:
        comm.all_reduce(x)
        returned.append(time.monotonic() - start)
    out = outcome(comm.all_reduce(xs[-1], async_op=True, timeout=150.0), start)
    arrays.synchronize()
    wrong = [k for k, x in enumerate(xs[:-1]) if peek(x).tolist() != [sum(q + k for q in range(P))]]
    # Call #k + 1 is xs[k]: #1024 is the last with a free status entry during the hold, #1025 waits.
    return {**out, "wrong": wrong[:10], "hold": hold, "returned_1024": returned[1023], "returned_1025": returned[1024]}


def capture_is_refused(n=1000):
    """A device call on a stream being captured into a CUDA graph (torch.cuda.graph, torch.compile's
    reduce-overhead mode): refused with InvalidArgument before anything is set up, enqueued or
    allocated, the first call (which would set the executor up) and a later one alike; the capture
    stays empty, and the communicator works on once the stream is no longer captured."""
    arrays = DeviceArrays("standin")
    comm = rt.init()
    r, P = comm.rank, comm.size
    stream = testing.standin_stream_create()
    out = {}

    def captured_call(label):
        x = arrays.upload(np.full(n, r + 1, np.float32))
        x.__cuda_array_interface__["stream"] = stream
        testing.standin_begin_capture(stream)
        try:
            comm.all_reduce(x)
            out[label] = None
        except rt.Error as exc:
            out[label] = f"{type(exc).__name__}: {exc}"
        graph = testing.standin_end_capture(stream)
        out[label + "_nodes"] = testing.standin_graph_nodes(graph)
        testing.standin_graph_destroy(graph)
        out[label + "_executor"] = comm.status().cuda_executor

    def plain_call():
        x = arrays.upload(np.full(n, r + 1, np.float32))
        x.__cuda_array_interface__["stream"] = stream
        comm.all_reduce(x)
        testing.standin_stream_synchronize(stream)
        return bool(np.all(peek(x) == P * (P + 1) / 2))

    captured_call("first")  # before the executor is set up
    out["after_first_ok"] = plain_call()
    captured_call("later")  # with the executor set up
    out["after_later_ok"] = plain_call()
    testing.standin_stream_destroy(stream)
    return out


def sums_on_one_device(calls=2, n=4096):
    """Every rank on stand-in device 0 (several processes on one GPU): `calls` all_reduces of
    rank + 1, each checked; the path that ran them."""
    arrays = DeviceArrays("standin")
    comm = rt.init()
    r, P = comm.rank, comm.size
    ok = True
    for _ in range(calls):
        x = arrays.upload(np.full(n, r + 1, np.float32))
        comm.all_reduce(x)
        arrays.synchronize()
        ok = ok and bool(np.all(peek(x) == P * (P + 1) / 2))
    executor = comm.status().cuda_executor
    comm.close()
    return {"ok": ok, "executor": executor}
