"""Collectives on CUDA buffers over a multi-process communicator (csrc/exec/cuda/device_comm):
staged through the host communicator, or handed to NCCL with algo='nccl'.

Everywhere: the host half of the staged path (a Gate holds a call's place in the order until its
input is ready, and failures on that side reach every rank), argument checks on CUDA arrays
(described by __cuda_array_interface__, no device needed), and NCCL's run-time loading (the
nvidia-nccl wheel from the test extra). Tests marked gpu run the device path for real and are
skipped, with the reason, where there is no CUDA device."""
from __future__ import annotations

import functools
import importlib.metadata

import numpy as np
import pytest

import ringtree as rt
from ringtree import _core
from harness import run_world


@pytest.mark.timeout(90)
@pytest.mark.parametrize("nranks", [2, 3])
def test_gated_call_keeps_its_place_and_waits_for_its_input(nranks):
    world = run_world(nranks, "gate_holds_its_place", module="device_workers", timeout=80)
    for rank, res in enumerate(world.check_ok()):
        assert res == {"a_ok": True, "b_ok": True, "a_untouched_before_open": True, "b_after_open": True,
                       "done_calls": 1, "done_after_open": True}, (rank, res)


@pytest.mark.timeout(90)
def test_input_that_never_arrives_times_out_on_every_rank():
    world = run_world(3, "gate_never_opens", dict(victim=1, timeout=2.0), module="device_workers", timeout=80)
    results = world.check_ok()
    victim = results[1]
    assert victim["raised"] == "Timeout" and "waiting for its own input" in victim["message"], victim
    for rank, res in enumerate(results):
        assert res["raised"] is not None, (rank, res)
        assert res["seconds"] < 20, (rank, res)  # the 2 s timeout plus slack, not a hang
        assert res["done_calls"] == 1, (rank, res)  # the stream side is always released


@pytest.mark.timeout(90)
def test_failed_staging_is_reported_on_every_rank_promptly():
    world = run_world(3, "gate_fails", dict(victim=0), module="device_workers", timeout=80)
    results = world.check_ok()
    assert "could not be staged: device-to-host copy failed (test)" in results[0]["message"], results[0]
    for rank, res in enumerate(results):
        assert res["raised"] is not None, (rank, res)
        assert res["seconds"] < 15, (rank, res)  # far below the 30 s timeout: the abort notice
        assert res["done_calls"] == 1, (rank, res)


def _device_count():
    return _core.cuda_device_count() if _core.cuda_available() else 0


@pytest.mark.timeout(90)
@pytest.mark.skipif(_core.cuda_available(), reason="checks the no-device errors; this machine has a CUDA device")
def test_cuda_arrays_without_a_device_fail_on_their_rank_before_traffic():
    world = run_world(2, "device_arguments_without_a_device", module="device_workers", timeout=80)
    for rank, res in enumerate(world.check_ok()):
        bad = {k: v for k, v in res["report"].items() if v != "ok"}
        assert not bad, (rank, bad)
    assert len(world.results[0]["report"]) == 9


class _Cai:
    """An object describing (made-up) device memory through __cuda_array_interface__."""

    def __init__(self, **cai):
        self.__cuda_array_interface__ = {"version": 3, "strides": None, **cai}


@pytest.mark.parametrize("typestr,dtype", [("|i1", "int8"), ("|u1", "uint8"), ("<i4", "int32"), ("<i8", "int64"),
                                           ("<f2", "float16"), ("<f4", "float32"), ("<f8", "float64")])
def test_cuda_array_interface_is_read_exactly(typestr, dtype):
    from ringtree._buffers import CUDA, buffer_info
    size = int(typestr[2:])
    shape = (3, 5, 2)
    # C-contiguous strides given explicitly, and a size-1 dimension with an arbitrary stride.
    strides = (5 * 2 * size, 2 * size, size)
    for cai in ({"shape": shape, "typestr": typestr, "data": (0x7F0000001000, False)},
                {"shape": shape, "typestr": typestr, "data": (0x7F0000001000, True), "strides": strides},
                {"shape": (4, 1), "typestr": typestr, "data": (0x7F0000002000, False), "strides": (size, 999)}):
        info = buffer_info(_Cai(**cai), "x")
        assert info.device == CUDA and info.stream == 0
        assert info.ptr == cai["data"][0] and info.readonly == cai["data"][1]
        assert info.count == int(np.prod(cai["shape"]))
        assert _core.DTYPES[info.dtype] == dtype


@pytest.mark.parametrize("cai,needle", [
    ({"shape": (3, 4), "typestr": "<f4", "data": (1 << 40, False), "strides": (4, 12)}, "C-contiguous"),
    ({"shape": (8,), "typestr": "<f4", "data": (1 << 40, False), "strides": (8,)}, "C-contiguous"),
    ({"shape": (8,), "typestr": ">f4", "data": (1 << 40, False)}, "byte-swapped"),
    ({"shape": (8,), "typestr": "<c8", "data": (1 << 40, False)}, "unsupported dtype"),
    ({"shape": (8,), "typestr": "<i2", "data": (1 << 40, False)}, "unsupported dtype"),
    ({"typestr": "<f4", "data": (1 << 40, False)}, "malformed"),
])
def test_bad_cuda_arrays_are_explained(cai, needle):
    from ringtree._buffers import buffer_info
    with pytest.raises(rt.InvalidArgument, match=needle):
        buffer_info(_Cai(**cai), "x")


def test_dlpack_only_cuda_objects_are_explained():
    from ringtree._buffers import buffer_info

    class DlpackOnly:
        def __dlpack__(self, stream=None):
            raise AssertionError("must not be consumed")

        def __dlpack_device__(self):
            return (2, 0)  # kDLCUDA

    with pytest.raises(rt.InvalidArgument, match="__cuda_array_interface__"):
        buffer_info(DlpackOnly(), "x")


def _nccl_wheel_version():
    try:
        return importlib.metadata.version("nvidia-nccl-cu13")
    except importlib.metadata.PackageNotFoundError:
        return None


def test_nccl_is_loaded_at_run_time_from_the_wheel():
    wheel = _nccl_wheel_version()
    if wheel is None:
        pytest.skip("nvidia-nccl-cu13 is not installed (the test extra installs it)")
    info = rt.nccl_info()
    major, minor, patch = (int(p) for p in wheel.split(".")[:3])
    assert info["version"] == (major, minor, patch), (info, wheel)
    assert info["code"] == major * 10000 + minor * 100 + patch
    assert info["path"].endswith("libnccl.so.2")


def test_missing_nccl_is_explained(tmp_path):
    import subprocess
    import sys
    missing = tmp_path / "libnccl.so.2"
    code = ("import ringtree as rt\n"
            "try:\n    rt.nccl_info()\nexcept rt.Error as e:\n    print('ERROR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**__import__("os").environ, "RINGTREE_NCCL_LIBRARY": str(missing)})
    assert out.returncode == 0, out.stderr
    assert "ERROR NCCL could not be loaded: RINGTREE_NCCL_LIBRARY" in out.stdout and str(missing) in out.stdout, out.stdout


# ---- on a GPU ------------------------------------------------------------------------------

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
    world = run_world(nranks, "device_sweep", dict(lib=_lib()), module="device_workers", timeout=280, env=env,
                      hosts=hosts)
    for rank, res in enumerate(world.check_ok()):
        assert res["cases"] > 100 and not res["failures"], (rank, res)
        assert res["executor"].startswith(executor.split()[0]), (rank, res["executor"])


@pytest.mark.gpu
@pytest.mark.timeout(200)
def test_device_collectives_async_and_cupy():
    usable, _ = _libs()
    lib = "cupy" if "cupy" in usable else _lib()
    world = run_world(2, "device_sweep", dict(lib=lib, counts=[1000], async_op=True), module="device_workers",
                      timeout=180)
    for rank, res in enumerate(world.check_ok()):
        assert res["cases"] > 30 and not res["failures"], (rank, res)


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_device_call_returns_before_the_stream_reaches_it():
    world = run_world(2, "device_stream_semantics", dict(lib=_lib(), seconds=1.0), module="device_workers",
                      timeout=100)
    for rank, res in enumerate(world.check_ok()):
        assert res["ok"] and not res["completed_early"] and res["returned_after"] < 0.5, (rank, res)


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_device_call_with_a_stalled_peer_fails_and_releases_the_stream():
    world = run_world(2, "device_peer_stalls", dict(lib=_lib(), timeout=3.0), module="device_workers", timeout=100)
    res = world.check_ok()[0]
    assert res["raised"] == "Timeout" and res["seconds"] < 20, res
    assert res["stream_released_after"] < 25, res


@pytest.mark.gpu
@pytest.mark.timeout(200)
@pytest.mark.parametrize("nranks", [1, 2])
def test_nccl_algo(nranks):
    lib = _lib()
    try:
        rt.nccl_info()
    except rt.Error as e:
        pytest.skip(str(e))
    world = run_world(nranks, "nccl_world", dict(lib=lib), module="device_workers", timeout=180)
    results = world.check_ok()
    if nranks == 1:
        assert not results[0]["failures"], results[0]
        return
    for rank, res in enumerate(results):
        assert res["host_ok"], (rank, res)
        # One GPU for several ranks: NCCL refuses; every rank must say so (or, if this NCCL
        # accepts it, compute the right sum).
        assert (res["raised"] is not None and "nccl" in res["message"].lower()) or res.get("ok"), (rank, res)


@pytest.mark.gpu
@pytest.mark.timeout(200)
def test_torch_backend_with_cuda_tensors():
    _torch_lib()
    world = run_world(2, "torch_backend_cuda", module="device_workers", timeout=180)
    for rank, res in enumerate(world.check_ok()):
        assert all(res["report"].values()), (rank, res["report"])


@pytest.mark.gpu
@pytest.mark.timeout(200)
def test_data_parallel_hook_on_a_cuda_model():
    _torch_lib()
    world = run_world(2, "data_parallel_cuda", module="device_workers", timeout=180)
    for rank, res in enumerate(world.check_ok()):
        assert all(res["ok"]), (rank, res)
