"""Turn user arrays into (pointer, element count, dtype code, read-only, device) without copying.

Host: numpy arrays, torch CPU tensors (detected by module, so torch is never imported here),
and anything with DLPack or the buffer protocol. CUDA: torch CUDA tensors and anything with
__cuda_array_interface__ (cupy, numba, ...); their `stream` is the one a collective is enqueued
on: the stream the array's interface names (version 3's "stream" key), else the producer's
current stream (torch's or cupy's), else the legacy default stream. Shapes are ignored; buffers
must be contiguous. The returned keepalive object must outlive any async collective using it.
"""

from __future__ import annotations

import sys

import numpy as np

from . import _core

#: The dtype names every collective takes, as numpy names them (ml_dtypes for bfloat16 and
#: float8); the API page's dtype table says what each reduces with.
DTYPES = tuple(_core.DTYPES)
DTYPE_CODES = {name: code for code, name in enumerate(_core.DTYPES)}
TORCH_DTYPES = {
    "torch.int8": "int8",
    "torch.uint8": "uint8",
    "torch.int32": "int32",
    "torch.int64": "int64",
    "torch.float16": "float16",
    "torch.bfloat16": "bfloat16",
    "torch.float32": "float32",
    "torch.float64": "float64",
    "torch.int16": "int16",
    "torch.uint16": "uint16",
    "torch.uint32": "uint32",
    "torch.uint64": "uint64",
    "torch.float8_e4m3fn": "float8_e4m3fn",
    "torch.float8_e5m2": "float8_e5m2",
    "torch.complex64": "complex64",
    "torch.complex128": "complex128",
}


HOST, CUDA = 0, 1
DEVICE_NAMES = ("host", "CUDA")
# __cuda_array_interface__ typestr kinds and sizes -> ringtree dtype names.
_CAI_DTYPES = {
    ("i", 1): "int8",
    ("u", 1): "uint8",
    ("i", 2): "int16",
    ("u", 2): "uint16",
    ("i", 4): "int32",
    ("u", 4): "uint32",
    ("i", 8): "int64",
    ("u", 8): "uint64",
    ("f", 2): "float16",
    ("f", 4): "float32",
    ("f", 8): "float64",
    ("c", 8): "complex64",
    ("c", 16): "complex128",
}
_DLPACK_CUDA_DEVICES = (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged


class BufferInfo:
    __slots__ = ("ptr", "count", "dtype", "readonly", "keepalive", "device", "stream")

    def __init__(self, ptr, count, dtype, readonly, keepalive, device=HOST, stream=0):
        self.ptr, self.count, self.dtype, self.readonly, self.keepalive = ptr, count, dtype, readonly, keepalive
        self.device, self.stream = device, stream


def _invalid(msg: str) -> Exception:
    return _core.InvalidArgument(msg)


def _from_torch(x, name: str) -> BufferInfo:
    if x.device.type not in ("cpu", "cuda"):
        raise _invalid(
            f"{name}: {x.device.type} tensors are not supported (got a tensor on {x.device}); use a CPU or CUDA tensor"
        )
    dtype = TORCH_DTYPES.get(str(x.dtype))
    if dtype is None:
        raise _invalid(f"{name}: unsupported dtype {x.dtype}; supported: {', '.join(_core.DTYPES)}")
    if not x.is_contiguous():
        raise _invalid(
            f"{name}: tensor must be contiguous (got strides {tuple(x.stride())} for shape {tuple(x.shape)})"
        )
    if x.device.type == "cuda":
        stream = sys.modules["torch"].cuda.current_stream(x.device).cuda_stream
        return BufferInfo(x.data_ptr(), x.numel(), DTYPE_CODES[dtype], False, x, CUDA, stream)
    return BufferInfo(x.data_ptr(), x.numel(), DTYPE_CODES[dtype], False, x)


_TORCHDTYPE_CODES = {}  # {torch dtype object: ringtree dtype code}, filled at the first torch call
_HOST_VIEW_TAG = _core.HOST_VIEW_TAG  # marks torch_host_view()'s tuples for the core's fast entry


def torch_host_view(x):
    """(tag, pointer, element count, dtype code) of a contiguous torch CPU tensor of a supported
    dtype, in a few attribute reads; None for anything else (buffer_info then converts or
    explains). The core's tag marks it as read here: a plain tuple is never taken for an address."""
    if not type(x).__module__.startswith("torch") or not x.is_cpu or not x.is_contiguous():
        return None
    if not _TORCHDTYPE_CODES:
        torch = sys.modules["torch"]
        _TORCHDTYPE_CODES.update(
            {getattr(torch, name.split(".")[1]): DTYPE_CODES[code_name] for name, code_name in TORCH_DTYPES.items()}
        )
    code = _TORCHDTYPE_CODES.get(x.dtype)
    return None if code is None else (_HOST_VIEW_TAG, x.data_ptr(), x.numel(), code)


def _producer_stream(x) -> int:
    """The stream a CUDA array's library enqueues on now: cupy's current stream, else the
    legacy default stream (0)."""
    if type(x).__module__.split(".", 1)[0] == "cupy":
        return int(sys.modules["cupy"].cuda.get_current_stream().ptr)
    return 0


# __cuda_array_interface__ v3 stream values with a meaning of their own; cudaStreamPerThread.
_CAI_LEGACY_STREAM, _CAI_PER_THREAD_STREAM = 1, 2
_PER_THREAD_STREAM_HANDLE = 2


def _interface_stream(x, cai, name: str) -> int:
    """The stream to enqueue on for an array whose interface may name one (version 3): the
    producer made the data on it, so a collective ordered after its work there sees them. None
    means no synchronization is needed; 0 is disallowed by the interface (ambiguous)."""
    if "stream" not in cai or cai["stream"] is None:
        return _producer_stream(x)
    try:
        stream = int(cai["stream"])
    except (TypeError, ValueError):
        raise _invalid(
            f"{name}: __cuda_array_interface__ stream must be an integer or None, got {cai['stream']!r}"
        ) from None
    if stream == 0:
        raise _invalid(
            f"{name}: __cuda_array_interface__ stream 0 is ambiguous and disallowed by the interface; "
            f"the producer must give 1 (legacy default), 2 (per-thread default), a stream or None"
        )
    if stream == _CAI_LEGACY_STREAM:
        return 0
    if stream == _CAI_PER_THREAD_STREAM:
        return _PER_THREAD_STREAM_HANDLE
    return stream


def _from_cuda_array_interface(x, cai, name: str) -> BufferInfo:
    try:
        shape = tuple(int(d) for d in cai["shape"])
        typestr = cai["typestr"]
        ptr, readonly = cai["data"]
    except (KeyError, TypeError, ValueError):
        raise _invalid(f"{name}: malformed __cuda_array_interface__ {cai!r}") from None
    order, kind, size = typestr[0], typestr[1], int(typestr[2:] or 0)
    if order == ">" and size > 1:
        raise _invalid(f"{name}: byte-swapped dtype {typestr} is not supported; use native byte order")
    dtype = _CAI_DTYPES.get((kind, size))
    if dtype is None:
        raise _invalid(
            f"{name}: unsupported dtype {typestr}; supported: {', '.join(_core.DTYPES)} "
            f"(bfloat16 and float8 on CUDA: use a torch tensor)"
        )
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    strides = cai.get("strides")
    if strides is not None and count > 1:
        expected, step = [], size
        for extent in reversed(shape):
            expected.append(step)
            step *= extent
        expected.reverse()
        if any(extent > 1 and int(got) != want for extent, got, want in zip(shape, strides, expected)):
            raise _invalid(f"{name}: array must be C-contiguous (got strides {tuple(strides)} for shape {shape})")
    return BufferInfo(
        int(ptr or 0), count, DTYPE_CODES[dtype], bool(readonly), x, CUDA, _interface_stream(x, cai, name)
    )


def _to_numpy(x, name: str) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__array_interface__"):
        return np.asarray(x)
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    try:
        return np.asarray(memoryview(x))
    except TypeError:
        raise _invalid(
            f"{name}: expected an array (numpy, torch CPU tensor, DLPack or buffer protocol), got {type(x).__name__}"
        ) from None


def buffer_info(x, name: str) -> BufferInfo:
    if x is None:
        raise _invalid(f"{name}: a buffer is required, got None")
    if type(x).__module__.startswith("torch") and hasattr(x, "data_ptr"):
        return _from_torch(x, name)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        return _from_cuda_array_interface(x, cai, name)
    if hasattr(x, "__dlpack_device__") and not hasattr(x, "__array_interface__"):
        device_type = x.__dlpack_device__()[0]
        if int(device_type) in _DLPACK_CUDA_DEVICES:
            raise _invalid(
                f"{name}: a CUDA array must expose __cuda_array_interface__ (cupy, numba and torch "
                f"do); got {type(x).__name__}, which offers DLPack only"
            )
    arr = _to_numpy(x, name)
    dtype = arr.dtype.name
    if dtype not in DTYPE_CODES:
        raise _invalid(f"{name}: unsupported dtype {arr.dtype}; supported: {', '.join(_core.DTYPES)}")
    if not arr.dtype.isnative:
        raise _invalid(f"{name}: byte-swapped dtype {arr.dtype.str} is not supported; use native byte order")
    if not arr.flags.c_contiguous:
        raise _invalid(f"{name}: array must be C-contiguous (got strides {arr.strides} for shape {arr.shape})")
    ptr, readonly = arr.__array_interface__["data"]
    return BufferInfo(ptr, arr.size, DTYPE_CODES[dtype], bool(readonly), arr)


def host_bytes(x, name: str):
    """(pointer, bytes, read-only, keepalive) of a contiguous host buffer of any dtype, for
    messages, which move bytes and never look at the elements."""
    if x is None:
        raise _invalid(f"{name}: a buffer is required, got None")
    if type(x).__module__.startswith("torch") and hasattr(x, "data_ptr"):
        if x.device.type != "cpu":
            raise _invalid(f"{name}: messages take host buffers; got a tensor on {x.device} (copy it to the CPU)")
        if not x.is_contiguous():
            raise _invalid(
                f"{name}: tensor must be contiguous (got strides {tuple(x.stride())} for shape {tuple(x.shape)})"
            )
        return x.data_ptr(), x.numel() * x.element_size(), False, x
    if getattr(x, "__cuda_array_interface__", None) is not None:
        raise _invalid(f"{name}: messages take host buffers; got a CUDA array {type(x).__name__}")
    arr = _to_numpy(x, name)
    if not arr.flags.c_contiguous:
        raise _invalid(f"{name}: array must be C-contiguous (got strides {arr.strides} for shape {arr.shape})")
    ptr, readonly = arr.__array_interface__["data"]
    return ptr, arr.nbytes, bool(readonly), arr


def call_buffers(x, out, label: str):
    """A call's input and output buffers (None where absent), checked against each other before
    any traffic: one dtype, and both in host memory or both in CUDA memory. label names the call."""
    inb = None if x is None else buffer_info(x, f"{label}: input")
    outb = None if out is None else buffer_info(out, f"{label}: output")
    if inb and outb and inb.dtype != outb.dtype:
        raise _core.InvalidArgument(
            f"{label}: input and output dtypes differ: {_core.DTYPES[inb.dtype]} vs {_core.DTYPES[outb.dtype]}"
        )
    if inb and outb and inb.device != outb.device:
        raise _core.InvalidArgument(
            f"{label}: the input is in {DEVICE_NAMES[inb.device]} memory but the output "
            f"in {DEVICE_NAMES[outb.device]} memory; give both on one side"
        )
    return inb, outb


def call_fields(inb, outb) -> tuple:
    """The dtype and the eight buffer arguments (present, pointer, count, read-only for the input,
    then the output) that the core's run, persistent and device run entries take, in that order."""
    some = inb or outb
    return (
        some.dtype if some else 0,
        inb is not None,
        inb.ptr if inb else 0,
        inb.count if inb else 0,
        inb.readonly if inb else False,
        outb is not None,
        outb.ptr if outb else 0,
        outb.count if outb else 0,
        outb.readonly if outb else False,
    )
