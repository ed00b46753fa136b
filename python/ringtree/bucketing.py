"""Gradient bucketing without a framework: group many small gradients into a few large
all_reduce calls, and start each call as soon as its gradients exist.

    bucketer = Bucketer([p.size for p in params], dtypes=[p.dtype for p in params])
    bucketer.start_step(comm)                # once per step, before backward
    bucketer.mark_ready(i, grad_i)           # as each gradient is produced, in any order
    bucketer.finish()                        # grads now hold the average over ranks

Buckets are filled in reverse registration order, because backpropagation produces the
last layer's gradients first; a bucket holds one dtype and closes once it reaches the cap
(a larger gradient gets a bucket of its own). Buckets are launched strictly in bucket
order, so every rank issues the same collectives in the same order even when its
gradients arrive in a different order. Works with numpy arrays and torch tensors: only
methods both share (reshape, slicing) plus a small copy helper are used; torch is never
imported here.
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np

__all__ = ["Bucketer", "assign_buckets"]

_MB = 1024 * 1024


def _itemsize(dtype) -> int:
    # torch.dtype and numpy.dtype both expose itemsize; strings and numpy types go through numpy.
    size = getattr(dtype, "itemsize", None)
    return int(size) if isinstance(size, int) else np.dtype(dtype).itemsize


def assign_buckets(sizes, itemsizes, bucket_cap_bytes, dtypes=None, first_bucket_cap_bytes=None):
    """Bucket assignment alone: a list of buckets, each a list of parameter indices, in the
    order they will be launched (the last parameter comes first).

    A bucket closes once its byte size reaches its cap, or when the next parameter has
    another dtype. The first bucket may have a smaller cap, so communication starts early.

    Parameters
    ----------
    sizes : sequence of int
        Element count of each parameter, in registration order.
    itemsizes : sequence of int
        Bytes per element of each.
    bucket_cap_bytes : int
        The cap, positive.
    dtypes : sequence or None
        Each parameter's dtype; None: all alike.
    first_bucket_cap_bytes : int or None
        The first bucket's cap; None: bucket_cap_bytes.

    Returns
    -------
    list of list of int
        The buckets' parameter indices.

    Raises
    ------
    ValueError
        The cap is not positive.
    """
    if bucket_cap_bytes <= 0:
        raise ValueError(f"bucket cap must be positive, got {bucket_cap_bytes} bytes")
    first_cap = bucket_cap_bytes if first_bucket_cap_bytes is None else first_bucket_cap_bytes
    buckets, current, current_bytes, current_dtype = [], [], 0, None
    for index in reversed(range(len(sizes))):
        dtype = None if dtypes is None else dtypes[index]
        if current and dtype != current_dtype:
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(index)
        current_dtype = dtype
        current_bytes += int(sizes[index]) * int(itemsizes[index])
        if current_bytes >= (first_cap if not buckets else bucket_cap_bytes):
            buckets.append(current)
            current, current_bytes = [], 0
    if current:
        buckets.append(current)
    return buckets


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _copy_into(dst, src):
    """dst[...] = src, both flat views of the same element count."""
    if _is_torch(dst):
        dst.copy_(src)
    else:
        np.copyto(dst, src, casting="same_kind")


def _new_flat_like(example, count):
    if _is_torch(example):
        return example.new_empty((count,))
    return np.empty(count, dtype=np.asarray(example).dtype)


def _zero(buf):
    if _is_torch(buf):
        buf.zero_()
    else:
        buf.fill(0)


class _Bucket:
    __slots__ = ("indices", "offsets", "count", "buffer", "pending", "work", "grads")

    def __init__(self, indices, sizes):
        self.indices = indices
        self.offsets, self.count = {}, 0
        for index in indices:
            self.offsets[index] = self.count
            self.count += int(sizes[index])
        self.buffer = None
        self.pending = set()
        self.work = None
        self.grads = {}


class Bucketer:
    """Assigns gradients to buckets and runs one async all_reduce per bucket.

    Each bucket's all_reduce carries its bucket id (its place in launch order) as its label in
    the flight recorder, so dumps and traces say which bucket a call was.

    Per step: start_step(comm), then mark_ready(index, grad) for each gradient (a bucket's
    all_reduce starts the moment its last gradient is marked), then finish(), which launches
    the buckets whose gradients never arrived (their missing gradients count as zeros),
    waits for every bucket and copies the reduced values back into the gradients.

    Parameters
    ----------
    sizes : sequence of int
        Element count of each gradient, in parameter registration order.
    dtypes : np.dtype, torch.dtype, list or None
        One dtype per gradient (numpy or torch dtypes), one dtype for all, or None (float32).
        Buckets never mix dtypes.
    bucket_cap_mb : float
        Bucket size cap in MiB (25, like DistributedDataParallel).
    first_bucket_cap_mb : float or None
        A smaller cap for the first bucket; None: bucket_cap_mb.
    op : str, ReduceOp or PremulSum
        The reduction, any op the communicator accepts ("avg" averages over ranks).
    device : str, torch.device or None
        Where a bucket whose gradients never arrived on this rank is made (torch dtypes only;
        e.g. "cuda:0" when the gradients live there), so every rank's call for that bucket
        takes the same path. None: the CPU.

    Raises
    ------
    ValueError
        A negative size, as many dtypes as gradients not given, or a cap that is not positive.
    """

    __slots__ = {
        "sizes": "Element count of each gradient, in registration order.",
        "dtypes": "The dtype of each gradient.",
        "itemsizes": "The bytes per element of each gradient.",
        "bucket_cap_bytes": "The bucket size cap in bytes.",
        "buckets": "The buckets, in launch order.",
        "bucket_of": "Gradient index -> the index of its bucket.",
        "op": "The reduction each bucket's all_reduce applies.",
        "device": "Where a bucket with no gradient of this rank is made; None means the CPU.",
        "_comm": None,
        "_next_launch": None,
        "_active": None,
        "_timeout": None,
    }

    def __init__(
        self,
        sizes,
        dtypes=None,
        bucket_cap_mb: float = 25.0,
        first_bucket_cap_mb: float | None = None,
        op="avg",
        device=None,
    ):
        self.device = device
        self.sizes = [int(s) for s in sizes]
        if any(s < 0 for s in self.sizes):
            raise ValueError(f"gradient sizes must be non-negative, got {self.sizes}")
        if dtypes is None or not isinstance(dtypes, (list, tuple)):
            dtypes = [dtypes if dtypes is not None else np.float32] * len(self.sizes)
        if len(dtypes) != len(self.sizes):
            raise ValueError(f"got {len(dtypes)} dtypes for {len(self.sizes)} gradients")
        self.dtypes = list(dtypes)
        self.itemsizes = [_itemsize(d) for d in self.dtypes]
        self.bucket_cap_bytes = int(bucket_cap_mb * _MB)
        first = None if first_bucket_cap_mb is None else int(first_bucket_cap_mb * _MB)
        self.op = op
        index_buckets = assign_buckets(self.sizes, self.itemsizes, self.bucket_cap_bytes, self.dtypes, first)
        self.buckets = [_Bucket(indices, self.sizes) for indices in index_buckets]
        self.bucket_of = {index: b for b, bucket in enumerate(self.buckets) for index in bucket.indices}
        self._comm = None
        self._next_launch = 0
        self._active = False
        self._timeout = None

    @property
    def assignment(self) -> list[list[int]]:
        """The parameter indices of each bucket, in launch order."""
        return [list(bucket.indices) for bucket in self.buckets]

    @property
    def active(self) -> bool:
        """True between start_step() and finish()."""
        return self._active

    def start_step(self, comm, timeout=None):
        """Begin a step whose gradients are reduced over `comm`.

        Parameters
        ----------
        comm : Communicator
            The communicator the buckets' all_reduce calls run on.
        timeout : float or None
            Seconds each bucket's all_reduce may take; None: the communicator's.

        Raises
        ------
        RuntimeError
            The previous step was not finished.
        """
        if self._active:
            raise RuntimeError("Bucketer.start_step: the previous step was not finished; call finish() first")
        self._comm, self._timeout = comm, timeout
        self._next_launch = 0
        for bucket in self.buckets:
            bucket.pending = set(bucket.indices)
            bucket.work = None
            bucket.grads = {}
        self._active = True

    def mark_ready(self, index: int, grad, copy_back: bool = True):
        """Gradient `index` is final for this step: copy it into its bucket; launch every
        bucket, in order, whose gradients are all in.

        Parameters
        ----------
        index : int
            The gradient's place in `sizes`.
        grad : np.ndarray or torch.Tensor
            Its values, `sizes[index]` elements.
        copy_back : bool
            False: finish() does not copy the result into `grad` (the caller uses the flat view
            finish() returns instead).

        Raises
        ------
        RuntimeError
            Outside a step, or the gradient was already marked in this step.
        ValueError
            `grad` does not have `sizes[index]` elements.
        """
        if not self._active:
            raise RuntimeError("Bucketer.mark_ready called outside a step; call start_step(comm) first")
        bucket = self.buckets[self.bucket_of[index]]
        if index not in bucket.pending:
            raise RuntimeError(f"Bucketer.mark_ready: gradient {index} was already marked ready in this step")
        if _numel(grad) != self.sizes[index]:
            raise ValueError(
                f"Bucketer.mark_ready: gradient {index} has {_numel(grad)} elements, expected {self.sizes[index]}"
            )
        if bucket.buffer is None:
            bucket.buffer = _new_flat_like(grad, bucket.count)
        start = bucket.offsets[index]
        _copy_into(bucket.buffer[start : start + self.sizes[index]], grad.reshape(-1))
        if copy_back:
            bucket.grads[index] = grad
        bucket.pending.discard(index)
        self._launch_ready()

    def _launch_ready(self, force=False):
        while self._next_launch < len(self.buckets):
            bucket = self.buckets[self._next_launch]
            if bucket.pending and not force:
                return
            if bucket.buffer is None:
                # No gradient of this bucket arrived on this rank: take part with zeros.
                bucket.buffer = _zeros(bucket.count, self.dtypes[bucket.indices[0]], self.device)
            for index in bucket.pending:
                start = bucket.offsets[index]
                _zero(bucket.buffer[start : start + self.sizes[index]])
            # The flight recorder (dumps, traces) names each call by its bucket id.
            label = getattr(self._comm, "label", None)
            with label(self._next_launch) if label is not None else contextlib.nullcontext():
                bucket.work = self._comm.all_reduce(bucket.buffer, op=self.op, async_op=True, timeout=self._timeout)
            self._next_launch += 1

    def flush(self):
        """Launch every bucket not launched yet; missing gradients count as zeros."""
        if self._active:
            self._launch_ready(force=True)

    def finish(self):
        """Launch what is left, wait for every bucket, copy the results into the gradients
        that were marked. Returns {index: reduced flat view} for every gradient, so callers
        can also fill gradients that were never marked on this rank."""
        if not self._active:
            return {}
        try:
            self._launch_ready(force=True)
            reduced = {}
            for bucket in self.buckets:
                bucket.work.wait()
                for index in bucket.indices:
                    start = bucket.offsets[index]
                    flat = bucket.buffer[start : start + self.sizes[index]]
                    grad = bucket.grads.get(index)
                    if grad is not None:
                        _copy_back(grad, flat)  # a view in grad's shape: no copy for strided grads
                    reduced[index] = flat
            return reduced
        finally:
            self._active = False
            for bucket in self.buckets:
                bucket.work = None
                bucket.grads = {}


def _numel(x) -> int:
    return int(x.numel()) if _is_torch(x) else int(np.size(x))


def _copy_back(grad, flat):
    if _is_torch(grad):
        grad.copy_(flat.view(grad.shape))
    else:
        np.copyto(grad, flat.reshape(grad.shape))


def _zeros(count, dtype, device=None):
    if type(dtype).__module__.startswith("torch"):
        # A torch dtype means torch is already imported; reach it without importing it here.
        return sys.modules["torch"].zeros(count, dtype=dtype, device=device)
    return np.zeros(count, dtype=dtype)
