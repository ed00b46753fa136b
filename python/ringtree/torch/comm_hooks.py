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
- topk_hook: send only the largest `ratio` of each bucket (values and their indices), keeping
  what was not sent as error feedback for the next step (see TopKState).
"""

import math
import numbers
from fractions import Fraction

import torch
import torch.distributed as dist

from .process_group import ProcessGroupRingtree, bucket_label

__all__ = [
    "AllReduceState",
    "Int8QuantizationState",
    "TopKState",
    "allreduce_hook",
    "fp16_compress_hook",
    "bf16_compress_hook",
    "bfloat16_compress_hook",
    "int8_quantize_hook",
    "topk_hook",
]

_gather_into_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class AllReduceState:
    """State of allreduce_hook, fp16_compress_hook and bf16_compress_hook: the group only.

    Parameters
    ----------
    process_group : torch.distributed.ProcessGroup or None
        The group to average over; None: the default group.
    """

    __slots__ = {"process_group": "The group the hook averages over; None means the default group."}

    def __init__(self, process_group=None):
        self.process_group = process_group


# Bucket dtypes whose sum of P gradients is safe to take before dividing.
_WIDE = (torch.float32, torch.float64)


def _on_ringtree(group) -> bool:
    return isinstance(dist.group.WORLD if group is None else group, ProcessGroupRingtree)


def _average_in(dtype, state, bucket):
    """All-reduce the bucket converted to `dtype`, averaged; then back into the bucket."""
    group = state.process_group if state is not None else None
    buffer = bucket.buffer()
    if dtype == buffer.dtype and dtype in _WIDE and _on_ringtree(group):
        # ringtree averages in the collective itself (Gloo has no AVG): one pass over the
        # bucket fewer than dividing first, and in place on the bucket.
        payload, op = buffer, dist.ReduceOp.AVG
    else:
        # Divide before converting, so a 16-bit sum of P gradients cannot overflow. In place: in
        # the bucket's own dtype the all_reduce then runs on the bucket itself, with no copy.
        payload, op = buffer.div_(dist.get_world_size(group)), dist.ReduceOp.SUM
        if payload.dtype != dtype:
            payload = payload.to(dtype)
    with bucket_label(group, bucket.index()):
        future = dist.all_reduce(payload, op=op, group=group, async_op=True).get_future()

    def unpack(fut):
        reduced = fut.value()[0]  # re-raises the collective's error
        if payload is not buffer:
            buffer.copy_(reduced)
        return buffer

    return future.then(unpack)


def allreduce_hook(state: AllReduceState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over the group in its own dtype: DDP's default, as a hook.

    Parameters
    ----------
    state : AllReduceState
        The hook's state (register_comm_hook's first argument).
    bucket : torch.distributed.GradBucket
        The gradients DDP hands over.

    Returns
    -------
    torch.futures.Future
        Completes with the averaged bucket tensor, as DDP expects.
    """
    return _average_in(bucket.buffer().dtype, state, bucket)


def fp16_compress_hook(state: AllReduceState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket in float16: half the bytes of float32 on the wire.

    Parameters
    ----------
    state : AllReduceState
        The hook's state (register_comm_hook's first argument).
    bucket : torch.distributed.GradBucket
        The gradients DDP hands over.

    Returns
    -------
    torch.futures.Future
        Completes with the averaged bucket tensor, as DDP expects.
    """
    return _average_in(torch.float16, state, bucket)


def bfloat16_compress_hook(state: AllReduceState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket in bfloat16: float32's range with half its bytes.

    Parameters
    ----------
    state : AllReduceState
        The hook's state (register_comm_hook's first argument).
    bucket : torch.distributed.GradBucket
        The gradients DDP hands over.

    Returns
    -------
    torch.futures.Future
        Completes with the averaged bucket tensor, as DDP expects.
    """
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

    Parameters
    ----------
    process_group : torch.distributed.ProcessGroup or None
        The group to average over; None: the default group.
    error_feedback : bool
        Keep each bucket's quantization error for the next step (above).
    """

    __slots__ = {
        "process_group": "The group the hook averages over; None means the default group.",
        "error_feedback": "Whether each bucket's quantization error is added back the next step.",
        "residuals": "Per bucket index, the quantization error to add the next step.",
    }

    def __init__(self, process_group=None, error_feedback: bool = True):
        self.process_group = process_group
        self.error_feedback = bool(error_feedback)
        self.residuals = {}


_INT8_MAX = 127.0


def int8_quantize_hook(state: Int8QuantizationState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket after quantizing it to int8 with one scale per bucket per rank.

    Parameters
    ----------
    state : Int8QuantizationState
        The hook's state (register_comm_hook's first argument).
    bucket : torch.distributed.GradBucket
        The gradients DDP hands over.

    Returns
    -------
    torch.futures.Future
        Completes with the averaged bucket tensor, as DDP expects.
    """
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


class TopKState:
    """State of topk_hook.

    ratio: the fraction of each bucket a rank sends, 0 < ratio <= 1; a bucket of n elements
    sends k = ceil(ratio * n) of them (ratio read as the decimal it prints as, so 0.07 of 100
    is 7, not 8), at least one of a non-empty bucket.
    warmup_steps: the first optimizer steps average the full buckets (as allreduce_hook does)
    while the model moves fastest; a step ends with the bucket DDP marks last.

    Each rank sends one message per bucket: k indices (int32, or int64 for buckets of 2^31
    elements or more), then k values in the bucket's dtype, each part padded to 8 bytes. For
    float32 that is 8k bytes against the bucket's 4n: 2 * ratio of its size. Every rank
    all-gathers the P messages, so the bytes a rank sends with a ring all_gather are (P - 1) 8k,
    against 2 (P - 1) / P * 4n for a float32 ring all_reduce: a saving of 1 / (P * ratio).

    residuals: per bucket index, (ids of the bucket's parameters, what the rank has not sent
    yet: its gradient plus the old residual, less the values sent), in float32 (float64 for
    float64 buckets), added to the bucket's gradient the next step. sent_bytes / dense_bytes
    count this rank's messages and the buckets they stand for, for measuring.

    Parameters
    ----------
    process_group : torch.distributed.ProcessGroup or None
        The group to average over; None: the default group.
    ratio : float
        The fraction of each bucket a rank sends (above).
    warmup_steps : int
        Optimizer steps that average full buckets first, >= 0.

    Raises
    ------
    ValueError
        A ratio outside (0, 1] or a negative or non-integer warmup_steps.
    """

    __slots__ = {
        "process_group": "The group the hook averages over; None means the default group.",
        "_ratio": None,
        "warmup_steps": "Optimizer steps that average full buckets before top-k starts.",
        "step": "Optimizer steps seen so far.",
        "residuals": "Per bucket index, the parameters' ids and what this rank has not sent yet.",
        "_counts": None,
        "sent_bytes": "Bytes of this rank's top-k messages so far.",
        "dense_bytes": "Bytes of the buckets those messages stand for.",
    }

    def __init__(self, process_group=None, ratio: float = 0.01, warmup_steps: int = 0):
        self.ratio = ratio
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, numbers.Integral) or warmup_steps < 0:
            raise ValueError(f"TopKState: warmup_steps must be a whole number >= 0, got {warmup_steps!r}")
        self.process_group = process_group
        self.warmup_steps = int(warmup_steps)
        self.step = 0
        self.residuals = {}
        self.sent_bytes = 0
        self.dense_bytes = 0

    @property
    def ratio(self) -> float:
        """The fraction of each bucket a rank sends, 0 < ratio <= 1; setting it checks it."""
        return self._ratio

    @ratio.setter
    def ratio(self, ratio):
        # Checked here, so that no rank can reach the all_gather with a bad k.
        if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not 0 < ratio <= 1:
            raise ValueError(f"TopKState: ratio must be a number with 0 < ratio <= 1, got {ratio!r}")
        self._ratio = float(ratio)
        self._counts = {}

    def count(self, numel: int) -> int:
        """k for a bucket of `numel` elements: ceil(ratio x numel), at most numel.

        Parameters
        ----------
        numel : int
            The bucket's elements.

        Returns
        -------
        int
            How many entries a rank sends.
        """
        k = self._counts.get(numel)
        if k is None:
            k = self._counts[numel] = min(numel, math.ceil(Fraction(repr(self._ratio)) * numel))
        return k


def _padded(nbytes: int) -> int:
    return -(-nbytes // 8) * 8


def _select_largest(magnitude: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest magnitudes; among equal ones, the lowest indices. torch.topk
    leaves ties to its implementation, and ranks must agree on what is sent and kept."""
    top = torch.topk(magnitude, k, sorted=False)
    threshold = top.values.min()
    if int((magnitude >= threshold).sum()) == k:  # no tie at the boundary: topk's choice is the only one
        return top.indices
    above = (magnitude > threshold).nonzero().squeeze(1)
    ties = (magnitude == threshold).nonzero().squeeze(1)
    return torch.cat((above, ties[: k - above.numel()]))


def topk_hook(state: TopKState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket from each rank's k largest entries (after adding its residual).

    Parameters
    ----------
    state : TopKState
        The hook's state (register_comm_hook's first argument).
    bucket : torch.distributed.GradBucket
        The gradients DDP hands over.

    Returns
    -------
    torch.futures.Future
        Completes with the averaged bucket tensor, as DDP expects.
    """
    group = state.process_group
    buffer = bucket.buffer()
    warming_up = state.step < state.warmup_steps
    if bucket.is_last():
        state.step += 1
    if warming_up:
        return _average_in(buffer.dtype, state, bucket)
    count = buffer.numel()
    k = state.count(count)
    if k == 0:  # an empty bucket is empty on every rank: nothing to send
        done = torch.futures.Future()
        done.set_result(buffer)
        return done

    world = dist.get_world_size(group)
    key = bucket.index()
    work_dtype = torch.float64 if buffer.dtype == torch.float64 else torch.float32
    # DDP rebuilds its buckets after the first step, so an index can come to name other
    # parameters: a residual belongs to the bucket's parameters, not to its index alone.
    members = tuple(map(id, bucket.parameters()))
    members_then, residual = state.residuals.get(key, (None, None))
    # The residual's storage becomes this step's sum and then the next residual: no bucket-sized
    # allocation per step beyond the magnitudes.
    if members_then != members or residual.numel() != count or residual.device != buffer.device:
        residual = buffer.to(work_dtype, copy=True)
        state.residuals[key] = (members, residual)
    else:
        residual.add_(buffer)

    # Not-a-number counts as the largest magnitude, so exactly k entries are always chosen, and
    # the non-finite ones among them reach every rank (where GradScaler can see them).
    magnitude = residual.abs().nan_to_num_(nan=math.inf)
    indices = _select_largest(magnitude, k)
    values = residual[indices].to(buffer.dtype)
    residual[indices] -= values.to(work_dtype)  # zero in float32; the rounding in 16 bits
    if not torch.isfinite(values).all():
        residual.masked_fill_(~torch.isfinite(residual), 0)  # one overflow must not poison every later step

    index_dtype = torch.int32 if count < 2**31 else torch.int64
    # Both parts start on 8-byte boundaries, so the gathered rows can be viewed, not copied.
    index_bytes = _padded(k * index_dtype.itemsize)
    row = index_bytes + _padded(k * buffer.element_size())
    message = torch.zeros(row, dtype=torch.int8, device=buffer.device)
    message[: k * index_dtype.itemsize] = indices.to(index_dtype).view(torch.int8)
    message[index_bytes : index_bytes + values.nbytes] = values.view(torch.int8)
    gathered = torch.empty(world * row, dtype=torch.int8, device=buffer.device)
    state.sent_bytes += row
    state.dense_bytes += count * buffer.element_size()
    with bucket_label(group, key):
        future = _gather_into_tensor(gathered, message, group=group, async_op=True).get_future()

    def scatter_average(fut):
        fut.value()  # re-raises the collective's error
        rows = gathered.view(world, row)
        all_indices = rows[:, :index_bytes].view(index_dtype)
        all_values = rows[:, index_bytes:].view(buffer.dtype)
        dense = buffer if buffer.dtype == work_dtype else torch.empty(count, dtype=work_dtype, device=buffer.device)
        dense.zero_()
        # Rank by rank, in rank order: within one rank the indices are distinct, so each
        # index_add_ is one addition per element even on a GPU, and all ranks get the same bits.
        for r in range(world):
            dense.index_add_(0, all_indices[r, :k], all_values[r, :k].to(work_dtype))
        dense.div_(world)
        if dense is not buffer:
            buffer.copy_(dense)
        return buffer

    return future.then(scatter_average)
