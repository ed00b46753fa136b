"""Rank programs for tests/test_ipc_standin.py: the device path over the CPU stand-in of the CUDA
runtime (ringtree._core_standin, loaded by ringtree when RINGTREE_CUDA_STANDIN=1). The device
programs of test_device_comm.py run here unchanged with lib='standin' (StandinArrays); the ones
below cover what only a stand-in can provoke on demand (mismatches, set-up refusals)."""
from __future__ import annotations

import ctypes
import os
import time

import numpy as np

import ringtree as rt
from ringtree import _core
from rank_checks import outcome
from reference import rank_order_fold, spread_input
from test_device_comm import DeviceArrays



def require_standin():
    """The rank programs below run only in a rank process that loaded the stand-in."""
    assert getattr(_core, "CUDA_STANDIN", False), "run with RINGTREE_CUDA_STANDIN=1 (ringtree._core_standin)"


class StandinArray:
    """A 1-D array in the stand-in's device memory, described by __cuda_array_interface__.
    Slices are views that keep their allocation alive."""

    def __init__(self, ptr, size, dtype, owner=None):
        self.ptr, self.size, self.dtype, self._owner = ptr, size, np.dtype(dtype), owner
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": self.dtype.str, "data": (ptr, False),
                                         "strides": None, "version": 3}

    @classmethod
    def empty(cls, size, dtype):
        return cls(_core.standin_malloc(size * np.dtype(dtype).itemsize), size, dtype)

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    def __getitem__(self, index):
        start, stop, step = index.indices(self.size)
        assert step == 1, "contiguous slices only"
        return StandinArray(self.ptr + start * self.dtype.itemsize, max(stop - start, 0), self.dtype,
                            self._owner or self)

    def __del__(self):
        if self._owner is None and self.ptr:
            _core.standin_free(self.ptr)


class StandinArrays:
    """DeviceArrays (test_device_comm.py) for the stand-in: copies are ordered on the legacy default
    stream, where the collectives on these arrays are enqueued, and wait for it."""

    lib = "standin"

    def __init__(self):
        require_standin()

    def upload(self, host):
        host = np.ascontiguousarray(host)
        dev = StandinArray.empty(host.size, host.dtype)
        _core.standin_memcpy(dev.ptr, host.ctypes.data, host.nbytes)
        return dev

    def download_into(self, dev, host):
        tmp = np.empty(dev.size, dev.dtype)
        _core.standin_memcpy(tmp.ctypes.data, dev.ptr, dev.nbytes)
        host[...] = tmp.reshape(host.shape)

    def synchronize(self):
        _core.standin_stream_synchronize(0)

    def sleep_kernel(self, seconds):
        _core.standin_sleep(seconds)


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
    r, P = comm.rank, comm.size
    x = arrays.upload(np.zeros(n, np.float32))
    comm.all_reduce(arrays.upload(np.zeros(1, np.float32)))  # the executor is set up
    arrays.synchronize()
    late_input = np.full(n, r + 1, np.float32)
    seen = np.full(n, -1, np.float32)
    start = time.monotonic()
    _core.standin_sleep(delay)
    _core.standin_memcpy(x.ptr, late_input.ctypes.data, late_input.nbytes, wait=False)
    work = comm.all_reduce(x, async_op=True)
    _core.standin_memcpy(seen.ctypes.data, x.ptr, x.nbytes, wait=False)
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
    return {"executor": comm.status().cuda_executor,
            "all_reduce_ok": bool(np.all(peek(x) == P * (P + 1) / 2)),
            "all_gather_ok": bool(np.array_equal(peek(y), np.repeat(np.arange(P, dtype=np.int32), n))),
            "ipc_env": os.environ.get("RINGTREE_CUDA_IPC", ""), "fail_env": os.environ.get("RINGTREE_STANDIN_FAIL", "")}


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
    if peek(out).tobytes() != want[r * n:(r + 1) * n].tobytes():
        wrong.append("reduce_scatter/auto")
    return {"wrong": wrong, "executor": comm.status().cuda_executor}
