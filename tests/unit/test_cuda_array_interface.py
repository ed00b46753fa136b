"""CUDA arrays as ringtree reads them (ringtree._buffers.buffer_info): what
__cuda_array_interface__ describes is taken exactly, and what ringtree cannot use (strided,
byte-swapped, unsupported dtypes, DLPack-only objects) is explained. No device is needed: the
arrays only describe made-up device memory."""

from __future__ import annotations

import numpy as np
import pytest

import ringtree as rt
from ringtree import _core


class _Cai:
    """An object describing (made-up) device memory through __cuda_array_interface__."""

    def __init__(self, **cai):
        self.__cuda_array_interface__ = {"version": 3, "strides": None, **cai}


@pytest.mark.parametrize(
    "typestr,dtype",
    [
        ("|i1", "int8"),
        ("|u1", "uint8"),
        ("<i4", "int32"),
        ("<i8", "int64"),
        ("<f2", "float16"),
        ("<f4", "float32"),
        ("<f8", "float64"),
        ("<i2", "int16"),
        ("<u2", "uint16"),
        ("<u4", "uint32"),
        ("<u8", "uint64"),
        ("<c8", "complex64"),
        ("<c16", "complex128"),
    ],
)
def test_cuda_array_interface_is_read_exactly(typestr, dtype):
    from ringtree._buffers import CUDA, buffer_info

    size = int(typestr[2:])
    shape = (3, 5, 2)
    # C-contiguous strides given explicitly, and a size-1 dimension with an arbitrary stride.
    strides = (5 * 2 * size, 2 * size, size)
    for cai in (
        {"shape": shape, "typestr": typestr, "data": (0x7F0000001000, False)},
        {"shape": shape, "typestr": typestr, "data": (0x7F0000001000, True), "strides": strides},
        {"shape": (4, 1), "typestr": typestr, "data": (0x7F0000002000, False), "strides": (size, 999)},
    ):
        info = buffer_info(_Cai(**cai), "x")
        assert info.device == CUDA and info.stream == 0
        assert info.ptr == cai["data"][0] and info.readonly == cai["data"][1]
        assert info.count == int(np.prod(cai["shape"]))
        assert _core.DTYPES[info.dtype] == dtype


@pytest.mark.parametrize(
    "cai,needle",
    [
        ({"shape": (3, 4), "typestr": "<f4", "data": (1 << 40, False), "strides": (4, 12)}, "C-contiguous"),
        ({"shape": (8,), "typestr": "<f4", "data": (1 << 40, False), "strides": (8,)}, "C-contiguous"),
        ({"shape": (8,), "typestr": ">f4", "data": (1 << 40, False)}, "byte-swapped"),
        ({"shape": (8,), "typestr": "<c4", "data": (1 << 40, False)}, "unsupported dtype"),
        ({"shape": (8,), "typestr": "|V1", "data": (1 << 40, False)}, "unsupported dtype"),
        ({"shape": (8,), "typestr": "<i16", "data": (1 << 40, False)}, "unsupported dtype"),
        ({"typestr": "<f4", "data": (1 << 40, False)}, "malformed"),
    ],
)
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


@pytest.mark.parametrize("stream,want", [(None, 0), (1, 0), (2, 2), (0x7F00DEAD0000, 0x7F00DEAD0000)])
def test_the_interfaces_stream_is_where_a_call_is_enqueued(stream, want):
    # Version 3's "stream": the producer's stream, on which the collective must be ordered after
    # its work. None: no synchronization needed (the legacy default stream here); 1: the legacy
    # default stream (handle 0); 2: the per-thread default stream (cudaStreamPerThread).
    from ringtree._buffers import buffer_info

    info = buffer_info(_Cai(shape=(8,), typestr="<f4", data=(1 << 40, False), stream=stream), "x")
    assert info.stream == want


@pytest.mark.parametrize("stream,needle", [(0, "ambiguous"), ("fast", "integer or None")])
def test_a_stream_the_interface_disallows_is_explained(stream, needle):
    from ringtree._buffers import buffer_info

    with pytest.raises(rt.InvalidArgument, match=needle):
        buffer_info(_Cai(shape=(8,), typestr="<f4", data=(1 << 40, False), stream=stream), "x")
