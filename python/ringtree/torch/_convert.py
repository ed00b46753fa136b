"""torch arguments as the ringtree core takes them: reduce ops, timeouts, tensor lists, and
tensors staged (made contiguous, or viewed as bytes) for collectives and messages."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from ringtree._buffers import DTYPE_CODES, TORCH_DTYPES
from ringtree._core import InvalidArgument
from ringtree.ops import premul_sum

# torch dtypes the core reduces natively (the ones ringtree._buffers maps); anything else is
# moved as raw bytes.
NATIVE_DTYPES = {getattr(torch, name.split(".", 1)[1]) for name in TORCH_DTYPES}
# The core's dtype code of each of them, for calls that hand the core a tensor's pointer directly.
TORCH_DTYPE_CODES = {getattr(torch, name.split(".", 1)[1]): DTYPE_CODES[code] for name, code in TORCH_DTYPES.items()}

RED_OP = dist.ReduceOp.RedOpType
SIMPLE_OPS = {RED_OP.SUM: "sum", RED_OP.PRODUCT: "prod", RED_OP.MIN: "min", RED_OP.MAX: "max", RED_OP.AVG: "avg"}
# Flags: a bool all_reduce with MIN is a logical and, with MAX a logical or: min / max of the
# flags' bytes (0 or 1), as Gloo accepts them.
BOOL_OPS = {RED_OP.MIN: "min", RED_OP.MAX: "max"}
# Bitwise ops act byte by byte, so any integer or bool tensor reduces as its bytes with the core's
# band / bor / bxor (a bool BAND is a logical and, BXOR a logical xor).
BITWISE_OPS = {RED_OP.BAND: "band", RED_OP.BOR: "bor", RED_OP.BXOR: "bxor"}


def timeout_seconds(timeout):
    """A timedelta or number of seconds; None, zero and negative mean "no limit"."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    return seconds if seconds > 0 else None


def ringtree_op(op):
    """torch ReduceOp (or its RedOpType) -> a ringtree op."""
    kind = getattr(op, "op", op)
    if kind in SIMPLE_OPS:
        return SIMPLE_OPS[kind]
    if kind in BITWISE_OPS:
        return BITWISE_OPS[kind]
    if kind == RED_OP.PREMUL_SUM:
        factor = getattr(op, "factor", None)
        if isinstance(factor, torch.Tensor):
            if factor.numel() != 1:
                raise ValueError(
                    f"ringtree: premul_sum needs a scalar factor, got a tensor of {factor.numel()} elements"
                )
            factor = factor.item()
        if factor is None:
            raise ValueError("ringtree: premul_sum without a factor")
        return premul_sum(float(factor))
    raise ValueError(
        f"ringtree backend does not support ReduceOp.{getattr(kind, 'name', kind)}; "
        f"supported: SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM, BAND, BOR, BXOR"
    )


class StagedTensor:
    """A tensor as ringtree can take it: contiguous, with a dtype the core knows.

    Data-movement calls pass other dtypes (bool, complex32, float8_e4m3fnuz...) as raw bytes;
    reductions refuse them. When a copy was needed, write_back() copies the result back.
    """

    __slots__ = ("tensor", "buffer", "copied")

    def __init__(self, tensor, what, reduction=False):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"ringtree: {what} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type not in ("cpu", "cuda"):
            raise ValueError(f"ringtree: {what} is on {tensor.device}; the ringtree backend takes CPU and CUDA tensors")
        if tensor.is_sparse:
            raise ValueError(f"ringtree: {what} is sparse; the ringtree backend supports dense tensors only")
        self.tensor = tensor
        buffer = tensor if tensor.is_contiguous() else tensor.contiguous()
        self.copied = buffer is not tensor
        if buffer.dtype not in NATIVE_DTYPES:
            if reduction:
                raise ValueError(
                    f"ringtree: {what} has dtype {tensor.dtype}, which the ringtree backend cannot "
                    f"reduce; supported: {', '.join(sorted(str(d) for d in NATIVE_DTYPES))}"
                )
            buffer = buffer.reshape(-1).view(torch.uint8)
        self.buffer = buffer

    def write_back(self):
        if self.copied:
            self.tensor.copy_(self.buffer.view(self.tensor.dtype).view(self.tensor.shape))


def cuda_device_of(outputs):
    """The CUDA device of a call's outputs (a list of tensors or of tensor lists), or None."""
    for item in outputs:
        for t in item if isinstance(item, (list, tuple)) else [item]:
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                return t.device
    return None


def tensor_list(tensors, what):
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"ringtree: {what} needs at least one tensor")
    return tensors


def concatenated(tensors, what):
    """One contiguous tensor holding `tensors` back to back."""
    dtype = tensors[0].dtype
    for t in tensors:
        if t.dtype != dtype:
            raise ValueError(f"ringtree: {what}: tensors must share one dtype, got {dtype} and {t.dtype}")
    return torch.cat([t.reshape(-1) for t in tensors])


def as_buffer(tensor):
    """The ringtree view of a contiguous tensor we allocated ourselves."""
    return tensor if tensor.dtype in NATIVE_DTYPES else tensor.reshape(-1).view(torch.uint8)


def host_view(tensor):
    """(pointer, element count, dtype code) of a tensor the core can take as it is: a dense,
    contiguous CPU tensor of a dtype it reduces. None for anything else, which takes the
    staged route (StagedTensor) with its checks and copies."""
    if not isinstance(tensor, torch.Tensor):
        return None
    code = TORCH_DTYPE_CODES.get(tensor.dtype)
    if code is None or tensor.device.type != "cpu" or tensor.layout != torch.strided or not tensor.is_contiguous():
        return None
    return tensor.data_ptr(), tensor.numel(), code


def elements_per_item(dtype):
    """Elements ringtree moves per tensor element: 1, or the item size for dtypes moved as bytes."""
    return 1 if dtype in NATIVE_DTYPES else dtype.itemsize


def copy_blocks(flat, outputs):
    offset = 0
    for out in outputs:
        n = out.numel()
        out.copy_(flat[offset : offset + n].view(out.shape))
        offset += n


def row_elements(tensor):
    """Elements per dim-0 row, for all_to_all split sizes."""
    if tensor.dim() == 0:
        return 1
    return tensor.numel() // tensor.size(0) if tensor.size(0) else 0


class MessageBuffer:
    """A tensor's bytes as a message takes them: host memory, contiguous, viewed as uint8 (so
    every dtype travels as is). CUDA and non-contiguous tensors go through a host copy."""

    __slots__ = ("tensor", "buffer", "copied")

    def __init__(self, tensor, what, copy_in):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"ringtree: {what} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type not in ("cpu", "cuda") or tensor.is_sparse:
            raise ValueError(
                f"ringtree: {what} must be a dense CPU or CUDA tensor, got {tensor.layout} on {tensor.device}"
            )
        host = tensor.detach()
        if host.device.type != "cpu":
            host = host.to("cpu") if copy_in else torch.empty(host.shape, dtype=host.dtype)
        elif not host.is_contiguous():
            host = host.contiguous()
        self.copied = host is not tensor and host.data_ptr() != tensor.data_ptr()
        self.tensor = tensor
        self.buffer = host.reshape(-1).view(torch.uint8)

    def write_back(self, message):
        """After the receive: the whole tensor must have come (as Gloo demands), then into place."""
        want = self.buffer.numel()
        if message.nbytes != want:
            raise InvalidArgument(
                f"ringtree: recv: rank {message.source} sent {message.nbytes} bytes with tag "
                f"{message.tag}, but the tensor holds {want} bytes"
            )
        if self.copied:
            with torch.no_grad():
                self.tensor.copy_(self.buffer.view(self.tensor.dtype).view(self.tensor.shape))
