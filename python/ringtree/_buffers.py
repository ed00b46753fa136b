"""Turn user arrays into (pointer, element count, dtype code, read-only) without copying.

numpy arrays, torch CPU tensors (detected by module, so torch is never imported here), and
anything with DLPack or the buffer protocol are accepted. Shapes are ignored; buffers must be
contiguous. The returned keepalive object must outlive any async collective using the buffer.
"""
from __future__ import annotations

import numpy as np

from . import _core

_DTYPE_CODES = {name: code for code, name in enumerate(_core.DTYPES)}
_TORCH_DTYPES = {
    "torch.int8": "int8", "torch.uint8": "uint8", "torch.int32": "int32", "torch.int64": "int64",
    "torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.float32": "float32",
    "torch.float64": "float64",
}


class BufferInfo:
    __slots__ = ("ptr", "count", "dtype", "readonly", "keepalive")

    def __init__(self, ptr, count, dtype, readonly, keepalive):
        self.ptr, self.count, self.dtype, self.readonly, self.keepalive = ptr, count, dtype, readonly, keepalive


def _invalid(msg: str) -> Exception:
    return _core.InvalidArgument(msg)


def _from_torch(x, name: str) -> BufferInfo:
    if x.device.type != "cpu":
        raise _invalid(f"{name}: {x.device.type} tensors are not supported by this build's host path "
                       f"(got a tensor on {x.device}); move it to the CPU")
    dtype = _TORCH_DTYPES.get(str(x.dtype))
    if dtype is None:
        raise _invalid(f"{name}: unsupported dtype {x.dtype}; supported: {', '.join(_core.DTYPES)}")
    if not x.is_contiguous():
        raise _invalid(f"{name}: tensor must be contiguous (got strides {tuple(x.stride())} for shape {tuple(x.shape)})")
    return BufferInfo(x.data_ptr(), x.numel(), _DTYPE_CODES[dtype], False, x)


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
        raise _invalid(f"{name}: expected an array (numpy, torch CPU tensor, DLPack or buffer protocol), "
                       f"got {type(x).__name__}") from None


def buffer_info(x, name: str) -> BufferInfo:
    if x is None:
        raise _invalid(f"{name}: a buffer is required, got None")
    if type(x).__module__.startswith("torch") and hasattr(x, "data_ptr"):
        return _from_torch(x, name)
    arr = _to_numpy(x, name)
    dtype = arr.dtype.name
    if dtype not in _DTYPE_CODES:
        raise _invalid(f"{name}: unsupported dtype {arr.dtype}; supported: {', '.join(_core.DTYPES)}")
    if not arr.dtype.isnative:
        raise _invalid(f"{name}: byte-swapped dtype {arr.dtype.str} is not supported; use native byte order")
    if not arr.flags.c_contiguous:
        raise _invalid(f"{name}: array must be C-contiguous (got strides {arr.strides} for shape {arr.shape})")
    ptr, readonly = arr.__array_interface__["data"]
    return BufferInfo(ptr, arr.size, _DTYPE_CODES[dtype], bool(readonly), arr)
