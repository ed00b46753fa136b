"""Communication hooks for DistributedDataParallel: ddp.register_comm_hook(state, hook).

Each hook is hook(state, bucket) -> torch.futures.Future whose value is the bucket's
averaged gradient (a tensor shaped like bucket.buffer()). They use only torch.distributed
calls on state.process_group (None: the default group), so they run on the ringtree
backend and on Gloo alike, and every rank issues the same collectives in the same order. On
the ringtree backend each call carries its bucket's index as its flight-recorder label.

- allreduce_hook: average in the gradient dtype (what DDP does without a hook).
- fp16_compress_hook / bf16_compress_hook: send half the bytes; the result is rounded to
  16 bits once per reduction step.
- int8_quantize_hook: send a quarter of the bytes (at P <= 4; see Int8QuantizationState),
  with a per-bucket scale and optional error feedback.
"""

import torch
import torch.distributed as dist

from .process_group import bucket_label

__all__ = ["AllReduceState", "Int8QuantizationState", "allreduce_hook", "fp16_compress_hook",
           "bf16_compress_hook", "bfloat16_compress_hook", "int8_quantize_hook"]

_gather_into_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class AllReduceState:
    """State of allreduce_hook, fp16_compress_hook and bf16_compress_hook: the group only."""

    __slots__ = ("process_group",)

    def __init__(self, process_group=None):
        self.process_group = process_group


def _average_in(dtype, state, bucket):
    """All-reduce the bucket converted to `dtype`, averaged; then back into the bucket."""
    group = state.process_group if state is not None else None
    buffer = bucket.buffer()
    # Divide before converting, so a 16-bit sum of P gradients cannot overflow. In place: in
    # the bucket's own dtype the all_reduce then runs on the bucket itself, with no copy.
    payload = buffer.div_(dist.get_world_size(group))
    if payload.dtype != dtype:
        payload = payload.to(dtype)
    with bucket_label(group, bucket.index()):
        future = dist.all_reduce(payload, group=group, async_op=True).get_future()

    def unpack(fut):
        if payload is not buffer:
            buffer.copy_(fut.value()[0])
        return buffer

    return future.then(unpack)


def allreduce_hook(state: AllReduceState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over the group in its own dtype: DDP's default, as a hook."""
    return _average_in(bucket.buffer().dtype, state, bucket)


def fp16_compress_hook(state: AllReduceState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket in float16: half the bytes of float32 on the wire."""
    return _average_in(torch.float16, state, bucket)


def bfloat16_compress_hook(state: AllReduceState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket in bfloat16: float32's range with half its bytes."""
    return _average_in(torch.bfloat16, state, bucket)


# DDP refuses any hook *named* bf16_compress_hook unless NCCL is present (a check meant for
# torch's own CUDA hook), so the function carries a longer name and this alias the short one.
bf16_compress_hook = bfloat16_compress_hook


class Int8QuantizationState:
    """State of int8_quantize_hook.

    error_feedback: keep each bucket's quantization error and add it to that bucket's
    gradient the next step, so the error does not accumulate in the parameters.

    Every rank all-gathers the other ranks' int8 buckets (plus a float32 scale each) and
    averages them locally, in rank order, so all ranks get bit-identical results. Bytes
    received per rank are (P - 1) N against 8 (P - 1) N / P for a float32 ring all_reduce:
    a 4x saving at P = 2, 2x at P = 4, none at P = 8.
    """

    __slots__ = ("process_group", "error_feedback", "residuals")

    def __init__(self, process_group=None, error_feedback: bool = True):
        self.process_group = process_group
        self.error_feedback = bool(error_feedback)
        self.residuals = {}


_INT8_MAX = 127.0


def int8_quantize_hook(state: Int8QuantizationState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket after quantizing it to int8 with one scale per bucket per rank."""
    group = state.process_group
    world = dist.get_world_size(group)
    buffer = bucket.buffer()
    count = buffer.numel()
    grad = buffer.to(torch.float32, copy=True)
    key = bucket.index()
    if state.error_feedback:
        residual = state.residuals.get(key)
        if residual is not None and residual.numel() == count:  # DDP may rebuild its buckets once
            grad.add_(residual)
    scale = grad.abs().max().reshape(1) / _INT8_MAX if count else torch.ones(1)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    quantized = torch.round(grad / scale).clamp_(-_INT8_MAX, _INT8_MAX).to(torch.int8)
    if state.error_feedback:
        state.residuals[key] = grad - quantized.to(torch.float32) * scale

    # One message per rank: the int8 values, then the float32 scale's 4 bytes.
    message = torch.empty(count + 4, dtype=torch.int8)
    message[:count] = quantized
    message[count:] = scale.to(torch.float32).view(torch.int8)
    gathered = torch.empty(world * (count + 4), dtype=torch.int8)
    with bucket_label(group, key):
        future = _gather_into_tensor(gathered, message, group=group, async_op=True).get_future()

    def dequantize(fut):
        fut.value()  # re-raises the collective's error
        rows = gathered.view(world, count + 4)
        scales = rows[:, count:].contiguous().view(torch.float32)  # (world, 1)
        average = (rows[:, :count].to(torch.float32) * scales).sum(dim=0).div_(world)
        buffer.copy_(average)
        return buffer

    return future.then(dequantize)
