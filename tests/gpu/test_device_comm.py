"""Collectives on CUDA buffers over a multi-process communicator (csrc/exec/cuda/device_comm):
staged through the host communicator, or handed to NCCL with algo='nccl'. Every test here is
marked gpu: it runs the device path for real and is skipped, with the reason, where there is no
CUDA device. The host half, which runs everywhere, is multiproc/test_device_comm_host.py.

The rank bodies (device_sweep, ...) run in every rank of a test's world (harness.py) and return
a JSON report that the test asserts on; they need a CUDA device and torch (CUDA) or cupy."""

from __future__ import annotations

import functools
import os
import time

import numpy as np
import pytest
from harness import run_world
from rank_checks import outcome, run_case
from reference import BITWISE, NUMPY_DTYPES, is_int, ops_for

import ringtree as rt
from ringtree import _core


@functools.lru_cache(maxsize=1)
def _libs():
    """Device-array libraries usable in rank processes, and why others are not."""
    usable, why = [], []
    if not _core.cuda_built():
        return usable, "ringtree was built without CUDA"
    if not _core.cuda_available():
        return usable, f"no CUDA device: {_core.cuda_unavailable_reason()}"
    try:
        import torch

        if torch.cuda.is_available():
            usable.append("torch")
        else:
            why.append("torch has no CUDA")
    except ImportError as e:
        why.append(f"torch: {e}")
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        usable.append("cupy")
    except Exception as e:  # noqa: BLE001 - any import or driver failure means "not usable"
        why.append(f"cupy: {e}")
    return usable, "; ".join(why)


def _torch_lib():
    """Skips unless torch with CUDA can run in rank processes."""
    usable, why = _libs()
    if "torch" not in usable:
        pytest.skip(why or "torch has no CUDA")


def _lib():
    usable, why = _libs()
    if not usable:
        print(f"\nGPU device-comm tests skipped: {why}")
        pytest.skip(why)
    return usable[0]


# ---- device buffers for the rank bodies ------------------------------------------------------


def local_device(torch) -> int:
    """This rank's GPU: one per rank where there are enough, several ranks on one where not
    (as torchrun's LOCAL_RANK % device_count), so a node with several GPUs runs cross-GPU IPC."""
    return int(os.environ.get("RINGTREE_RANK", "0")) % torch.cuda.device_count()


class DeviceArrays:
    """torch or cupy as a device-array library; uploads numpy arrays (bfloat16 as raw bits).
    lib='standin': device memory of the CPU stand-in of the CUDA runtime (ipc_standin_workers)."""

    def __new__(cls, lib):
        if lib == "standin":
            from ipc_standin_workers import StandinArrays

            return StandinArrays()
        return super().__new__(cls)

    def __init__(self, lib):
        self.lib = lib
        if lib == "torch":
            import torch

            self.torch = torch
            torch.cuda.set_device(local_device(torch))
        else:
            import cupy

            self.cp = cupy
            cupy.cuda.Device(int(os.environ.get("RINGTREE_RANK", "0")) % cupy.cuda.runtime.getDeviceCount()).use()

    def upload(self, host):
        if self.lib == "torch":
            t = self.torch
            if host.dtype == NUMPY_DTYPES["bfloat16"]:
                bits = t.from_numpy(np.ascontiguousarray(host).view(np.int16).copy())
                return bits.to("cuda").view(t.bfloat16)
            return t.from_numpy(np.ascontiguousarray(host).copy()).to("cuda")
        return self.cp.asarray(host)

    def download_into(self, dev, host):
        if self.lib == "torch":
            if host.dtype == NUMPY_DTYPES["bfloat16"]:
                host[...] = dev.view(self.torch.int16).cpu().numpy().view(host.dtype)
            else:
                host[...] = dev.cpu().numpy()
        else:
            host[...] = self.cp.asnumpy(dev)

    def synchronize(self):
        if self.lib == "torch":
            self.torch.cuda.synchronize()
        else:
            self.cp.cuda.Device().synchronize()

    def sleep_kernel(self, seconds):
        """Keep the current stream busy for about `seconds`."""
        if self.lib == "torch":
            self.torch.cuda._sleep(int(seconds * 2e9))  # cycles; ~2 GHz
        else:
            kernel = self.cp.RawKernel(
                r"""
extern "C" __global__ void spin(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {}
}""",
                "spin",
            )
            kernel((1,), (1,), (np.int64(int(seconds * 2e9)),))


class OnDevice:
    """Runs rank_checks.run_case with every buffer on the device: each numpy argument is uploaded
    (views of another argument stay views, so in-place layouts stay in place), the collective
    runs on the device buffers, and the results are downloaded into the numpy arrays, which
    run_case then checks against numpy."""

    def __init__(self, comm, arrays, algo_override=None, async_op=False):
        self.comm, self.arrays, self.algo_override, self.async_op = comm, arrays, algo_override, async_op
        self.rank, self.size = comm.rank, comm.size

    def _upload_pair(self, x, out):
        if x is None and out is None:
            return None, None
        if x is not None and out is not None and np.shares_memory(x, out):
            base, view = (out, x) if out.size >= x.size else (x, out)
            dev_base = self.arrays.upload(base)
            offset = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // base.itemsize
            dev_view = dev_base[offset : offset + view.size]
            return (dev_view, dev_base) if base is out else (dev_base, dev_view)
        return (None if x is None else self.arrays.upload(x)), (None if out is None else self.arrays.upload(out))

    def _run(self, name, x, out, result, **kw):
        if self.algo_override:
            kw["algo"] = self.algo_override
        dx, dout = self._upload_pair(x, out)
        args = [a for a in (dx, dout) if a is not None] if name not in ("gather", "scatter", "reduce") else [dx, dout]
        if self.async_op:
            getattr(self.comm, name)(*args, async_op=True, **kw).wait(60.0)
        else:
            getattr(self.comm, name)(*args, **kw)
        # Downloading syncs the stream the call was enqueued on (stream semantics).
        for dev, host in ((dout, out), (dx, x)):
            if dev is not None and host is not None and host.flags.writeable:
                self.arrays.download_into(dev, host)
        return result

    def all_reduce(self, x, out=None, **kw):
        return self._run("all_reduce", x, out, x if out is None else out, **kw)

    def reduce_scatter(self, x, out, **kw):
        return self._run("reduce_scatter", x, out, out, **kw)

    def all_gather(self, x, out, **kw):
        return self._run("all_gather", x, out, out, **kw)

    def all_to_all(self, x, out, **kw):
        return self._run("all_to_all", x, out, out, **kw)

    def broadcast(self, x, root=0, **kw):
        return self._run("broadcast", x, None, x, root=root, **kw)

    def reduce(self, x, out=None, root=0, **kw):
        if self.rank != root:
            out = None
        result = (x if out is None else out) if self.rank == root else None
        return self._run("reduce", x, out, result, root=root, **kw)

    def gather(self, x, out=None, root=0, **kw):
        return self._run("gather", x, out if self.rank == root else None, out, root=root, **kw)

    def scatter(self, x, out, root=0, **kw):
        return self._run("scatter", x if self.rank == root else None, out, out, root=root, **kw)


DEVICE_COLLECTIVES = [
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "all_to_all",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
]


def device_sweep(
    lib="torch",
    algo="auto",
    dtypes=("float32", "int32", "float16", "bfloat16"),
    counts=(1, 1000, 70000),
    async_op=False,
    ops=("sum", "max", "avg"),
):
    """Every collective on device buffers, staged through the host communicator, checked
    against numpy (rank_checks.run_case), out of place and in place."""
    arrays = DeviceArrays(lib)
    comm = rt.init()
    dev = OnDevice(comm, arrays, async_op=async_op)
    failures, cases = [], 0
    for coll in DEVICE_COLLECTIVES:
        for dtype in dtypes:
            if dtype == "bfloat16" and lib != "torch":
                continue
            for op in ops if coll in ("all_reduce", "reduce_scatter", "reduce") else ("sum",):
                if op not in ops_for(dtype, [op]) or (op in BITWISE and not is_int(dtype)):
                    continue  # integer dtypes only; complex has no min/max (refused before any traffic)
                for n in counts:
                    for in_place in (False, True):
                        root = comm.size - 1
                        wrong, desc = run_case(dev, coll, n, dtype, op, algo, in_place, root, salt=cases)
                        cases += 1
                        if wrong:
                            failures.append(f"{desc}: {wrong} wrong")
    return {"cases": cases, "failures": failures[:20], "executor": comm.status().cuda_executor}


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("executor", ["ipc", "staged", "staged between hosts"])
@pytest.mark.parametrize("nranks", [2, 4])
def test_device_collectives_match_numpy(nranks, executor):
    # Several processes share the one GPU of the test machine: CUDA IPC maps memory between
    # processes on one device as between devices. Two emulated hosts put TCP between the
    # halves, which sends device buffers through host staging.
    env = {"RINGTREE_CUDA_IPC": "0" if executor == "staged" else "1"}
    hosts = 2 if executor == "staged between hosts" else 1
    world = run_world(nranks, device_sweep, dict(lib=_lib()), timeout=280, env=env, hosts=hosts)
    for rank, res in enumerate(world.check_ok()):
        assert res["cases"] > 100 and not res["failures"], (rank, res)
        assert res["executor"].startswith(executor.split()[0]), (rank, res["executor"])


@pytest.mark.gpu
@pytest.mark.timeout(200)
def test_device_collectives_async_and_cupy():
    usable, _ = _libs()
    lib = "cupy" if "cupy" in usable else _lib()
    world = run_world(2, device_sweep, dict(lib=lib, counts=[1000], async_op=True), timeout=180)
    for rank, res in enumerate(world.check_ok()):
        assert res["cases"] > 30 and not res["failures"], (rank, res)


def device_stream_semantics(lib="torch", seconds=1.0, set_up_first=True):
    """A device collective queued behind a long kernel returns to the host at once; its result
    is there once the stream gets to it; async works report completion only then. The promise
    is for a set-up device path: the first call sets it up, and on a GPU its kernels' first
    load may wait for work already on the device (once per process), so one call goes first."""
    arrays = DeviceArrays(lib)
    comm = rt.init()
    r, P = comm.rank, comm.size
    x = arrays.upload(np.full(1 << 16, r + 1, np.float32))
    if set_up_first:
        comm.all_reduce(arrays.upload(np.ones(1 << 16, np.float32)))
    arrays.synchronize()
    comm.barrier()
    arrays.sleep_kernel(seconds)
    start = time.monotonic()
    work = comm.all_reduce(x, async_op=True)
    returned_after = time.monotonic() - start
    completed_early = work.is_completed()
    work.wait(60.0)
    host = np.empty(1 << 16, np.float32)
    arrays.download_into(x, host)
    return {
        "returned_after": returned_after,
        "completed_early": completed_early,
        "ok": bool(np.all(host == P * (P + 1) / 2)),
    }


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_device_call_returns_before_the_stream_reaches_it():
    world = run_world(2, device_stream_semantics, dict(lib=_lib(), seconds=1.0), timeout=100)
    for rank, res in enumerate(world.check_ok()):
        assert res["ok"] and not res["completed_early"] and res["returned_after"] < 0.5, (rank, res)


def device_peer_stalls(lib="torch", victim=1, timeout=3.0):
    """The victim never makes its call: the others' device work fails within the timeout, and
    their streams are released (a later synchronize returns)."""
    arrays = DeviceArrays(lib)
    comm = rt.init()
    x = arrays.upload(np.ones(4096, np.float32))
    comm.all_reduce(x)
    arrays.synchronize()
    if comm.rank == victim:
        time.sleep(timeout * 3)
        return {"victim": True}
    start = time.monotonic()
    out = outcome(comm.all_reduce(x, async_op=True, timeout=timeout), start)
    arrays.synchronize()
    out["stream_released_after"] = time.monotonic() - start
    return out


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_device_call_with_a_stalled_peer_fails_and_releases_the_stream():
    world = run_world(2, device_peer_stalls, dict(lib=_lib(), timeout=3.0), timeout=100)
    res = world.check_ok()[0]
    assert res["raised"] == "Timeout" and res["seconds"] < 20, res
    assert res["stream_released_after"] < 25, res


def nccl_world(lib="torch"):
    """algo='nccl': on one rank every collective matches numpy; on several ranks sharing one
    GPU NCCL refuses, and every rank must get that error (no hang)."""
    arrays = DeviceArrays(lib)
    comm = rt.init()
    out = {"nccl": rt.nccl_info()["code"]}
    if comm.size == 1:
        dev = OnDevice(comm, arrays, algo_override="nccl")
        failures = []
        for coll in DEVICE_COLLECTIVES:
            for dtype in ("float32", "int32", "float16"):
                wrong, desc = run_case(dev, coll, 1000, dtype, "sum", "nccl", False, 0, salt=1)
                if wrong:
                    failures.append(f"{desc}: {wrong} wrong")
        out["failures"] = failures
        return out
    x = arrays.upload(np.ones(1024, np.float32))
    try:
        comm.all_reduce(x, algo="nccl")
        arrays.synchronize()
        host = np.empty(1024, np.float32)
        arrays.download_into(x, host)
        out["raised"] = None
        out["ok"] = bool(np.all(host == comm.size))
    except rt.Error as exc:
        out["raised"] = type(exc).__name__
        out["message"] = str(exc)
    y = np.full(8, comm.rank, np.int64)
    comm.all_reduce(y)  # the host communicator is still usable
    out["host_ok"] = bool(np.all(y == comm.size * (comm.size - 1) // 2))
    return out


@pytest.mark.gpu
@pytest.mark.timeout(200)
@pytest.mark.parametrize("nranks", [1, 2])
def test_nccl_algo(nranks):
    lib = _lib()
    try:
        rt.nccl_info()
    except rt.Error as e:
        pytest.skip(str(e))
    world = run_world(nranks, nccl_world, dict(lib=lib), timeout=180)
    results = world.check_ok()
    if nranks == 1:
        assert not results[0]["failures"], results[0]
        return
    for rank, res in enumerate(results):
        assert res["host_ok"], (rank, res)
        # One GPU for several ranks: NCCL refuses; every rank must say so (or, if this NCCL
        # accepts it, compute the right sum).
        assert (res["raised"] is not None and "nccl" in res["message"].lower()) or res.get("ok"), (rank, res)


def torch_backend_cuda():
    """The torch backend with CUDA tensors: collectives against exact expectations, and DDP's
    averaged gradients against a replica that sees every rank's batch."""
    import torch
    import torch.distributed as dist

    import ringtree.torch as rtt

    device = local_device(torch)
    torch.cuda.set_device(device)
    rtt.init_process_group()
    r, P = dist.get_rank(), dist.get_world_size()
    report = {}
    t = torch.full((1000,), float(r + 1), device="cuda")
    dist.all_reduce(t)
    report["all_reduce"] = bool(torch.all(t == P * (P + 1) / 2).item())
    out = torch.empty(P * 10, dtype=torch.int64, device="cuda")
    dist.all_gather_into_tensor(out, torch.full((10,), r, dtype=torch.int64, device="cuda"))
    report["all_gather"] = out.cpu().tolist() == [q for q in range(P) for _ in range(10)]
    b = torch.full((64,), float(r), dtype=torch.bfloat16, device="cuda")
    dist.broadcast(b, src=P - 1)
    report["broadcast_bf16"] = bool(torch.all(b == P - 1).item())
    rs = torch.empty(7, device="cuda")
    dist.reduce_scatter_tensor(rs, torch.arange(7 * P, dtype=torch.float32, device="cuda") * (r + 1))
    want = torch.arange(r * 7, (r + 1) * 7, dtype=torch.float32) * (P * (P + 1) / 2)
    report["reduce_scatter"] = bool(torch.equal(rs.cpu(), want))
    work = dist.all_reduce(torch.ones(5, device="cuda"), async_op=True)
    work.wait()
    report["async"] = work.is_completed()

    def batch(q):
        g = torch.Generator().manual_seed(100 + q)
        return torch.randint(-4, 5, (8, 4), generator=g).float()

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).cuda()
    replica = torch.nn.Linear(4, 2).cuda()
    replica.load_state_dict(model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device])
    ddp(batch(r).cuda()).sum().backward()
    for q in range(P):
        replica(batch(q).cuda()).sum().backward()
    report["ddp"] = all(
        torch.allclose(p.grad, rp.grad / P, rtol=0, atol=1e-5)
        for p, rp in zip(model.parameters(), replica.parameters())
    )
    dist.destroy_process_group()
    return {"report": report}


@pytest.mark.gpu
@pytest.mark.timeout(200)
def test_torch_backend_with_cuda_tensors():
    _torch_lib()
    world = run_world(2, torch_backend_cuda, timeout=180)
    for rank, res in enumerate(world.check_ok()):
        assert all(res["report"].values()), (rank, res["report"])


def data_parallel_cuda(steps=3):
    """DataParallelHook on a CUDA model: after each backward every rank's gradients equal the
    mean of what each rank's batch gives alone (a replica that sees every batch), including a
    parameter that gets no gradient (its bucket is made on the device on every rank)."""
    import torch

    import ringtree.torch as rtt

    torch.cuda.set_device(local_device(torch))
    comm = rt.init()
    r, P = comm.rank, comm.size

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used = torch.nn.Linear(4, 3)
            self.unused = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.used(x)

    def batch(step, q):
        g = torch.Generator().manual_seed(1000 * step + q)
        return torch.randint(-3, 4, (6, 4), generator=g).float().cuda()

    torch.manual_seed(0)
    model = Net().cuda()
    replica = Net().cuda()
    replica.load_state_dict(model.state_dict())
    hook = rtt.DataParallelHook(model, comm, bucket_cap_mb=0.0001)
    ok = []
    for step in range(steps):
        model.zero_grad()
        replica.zero_grad()
        model(batch(step, r)).sum().backward()
        for q in range(P):
            replica(batch(step, q)).sum().backward()
        ok.append(
            all(
                torch.allclose(p.grad, rp.grad / P, rtol=0, atol=1e-5)
                for p, rp in zip(model.used.parameters(), replica.used.parameters())
            )
        )
    hook.remove()
    comm.close()
    return {"ok": ok, "executor": comm.status().cuda_executor}


@pytest.mark.gpu
@pytest.mark.timeout(200)
def test_data_parallel_hook_on_a_cuda_model():
    _torch_lib()
    world = run_world(2, data_parallel_cuda, timeout=180)
    for rank, res in enumerate(world.check_ok()):
        assert all(res["ok"]), (rank, res)
