"""Data parallelism without DistributedDataParallel: a hook object on an ordinary module.

    hook = DataParallelHook(model, comm)       # broadcasts rank 0's parameters
    for x, y in batches:
        loss_fn(model(x), y).backward()        # buckets all-reduce while backward runs
        optimizer.step()                       # grads are already averaged over ranks
        optimizer.zero_grad()

Each parameter gets a post-accumulate-grad hook that hands its gradient to a
ringtree.Bucketer, which starts a bucket's all_reduce the moment the bucket is complete,
so communication overlaps the rest of backward. At the end of each backward pass the
remaining buckets are launched (gradients that did not arrive count as zeros, so unused
parameters need no special flag) and, by default, all buckets are waited for, so the
optimizer step sees averaged gradients: each .grad becomes a view of its bucket's buffer
(like DDP's gradient_as_bucket_view), so a gradient is copied once per step, into its bucket.
"""

from __future__ import annotations

import contextlib

import torch

from ringtree._world import init
from ringtree.bucketing import Bucketer

__all__ = ["BackwardSync", "DataParallelHook"]


class BackwardSync:
    """What every gradient-synchronizing wrapper of an ordinary module shares: a
    post-accumulate-grad hook per parameter, a call at the start and at the end of each
    backward pass, accumulation (communicate every k-th backward pass, or not inside
    no_sync()), and the initial broadcast of one rank's parameters and buffers.

    Subclasses say what a communicating backward pass does: _start_step() at its first
    gradient, _mark_ready(index, param) per gradient, _flush() at its end, finish() to wait.
    """

    def __init__(self, model: torch.nn.Module, comm, accumulation_steps: int, broadcast_from: int | None):
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be at least 1, got {accumulation_steps}")
        comm = init() if comm is None else getattr(comm, "comm", comm)
        self.comm = comm
        self.model = model
        self.accumulation_steps = int(accumulation_steps)
        self.params = [p for p in model.parameters() if p.requires_grad]
        devices = sorted({str(p.device) for p in self.params})
        if len(devices) > 1 or (devices and not (devices[0] == "cpu" or devices[0].startswith("cuda"))):
            raise ValueError(
                f"{type(self).__name__}: parameters must all be on the CPU or all on one CUDA "
                f"device, got {', '.join(devices)}"
            )
        self.device = devices[0] if devices else None
        self.broadcast_from = broadcast_from
        self._backward_count = 0
        self._sync_enabled = True
        self._graph_task = None  # the backward pass the hooks last saw
        self._communicating = False
        self._handles = []

    def _attach(self):
        """Broadcast the starting state and install the hooks (call once the subclass is set up)."""
        if self.broadcast_from is not None:
            self._broadcast_state(self.broadcast_from)
        self._handles = [p.register_post_accumulate_grad_hook(self._grad_hook(i)) for i, p in enumerate(self.params)]

    def _broadcast_state(self, root):
        with torch.no_grad():
            for tensor in list(self.model.parameters()) + list(self.model.buffers()):
                if tensor.is_contiguous():
                    self.comm.broadcast(tensor, root=root)
                else:
                    staged = tensor.contiguous()
                    self.comm.broadcast(staged, root=root)
                    tensor.copy_(staged)

    # --- autograd callbacks -----------------------------------------------------------------

    def _grad_hook(self, index):
        def hook(param):
            # A new graph task id means a new backward pass, even if the last one died
            # half-way (then its end-of-backward callback never ran).
            task = torch._C._current_graph_task_id()
            if task != self._graph_task:
                self._graph_task = task
                self._begin_backward()
            if self._communicating:
                self._mark_ready(index, param)

        return hook

    def _begin_backward(self):
        self._communicating = self._sync_enabled and (self._backward_count + 1) % self.accumulation_steps == 0
        if self._step_outstanding():
            # The previous step was left unfinished (not waited for, or it failed).
            self.finish()
        if self._communicating:
            self._start_step()
        # Runs once the whole backward pass is done, on the thread that ran it.
        torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

    def _end_backward(self):
        self._graph_task = None
        self._backward_count += 1
        if self._communicating:
            self._flush()

    # --- what subclasses provide ------------------------------------------------------------

    def _step_outstanding(self) -> bool:
        raise NotImplementedError

    def _start_step(self):
        raise NotImplementedError

    def _mark_ready(self, index: int, param):
        raise NotImplementedError

    def _flush(self):
        raise NotImplementedError

    def finish(self):
        raise NotImplementedError

    # --- public -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside this block only accumulate locally, like DDP.no_sync()."""
        previous, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = previous

    def remove(self):
        """Detach the hooks from the model, finishing any outstanding step first. A step that
        failed (its communicator lost a rank, say) re-raises its error, after the hooks are
        gone: the model is then free for a hook on a new communicator (see shrink)."""
        try:
            self.finish()
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles = []


class DataParallelHook(BackwardSync):
    """Average a module's gradients over a ringtree communicator during backward.

    Parameters
    ----------
    model
        A torch.nn.Module whose parameters are all on the CPU or all on one CUDA device (CUDA
        gradients are all-reduced on the device path, see the manual's GPU page).
    comm
        A ringtree Communicator, or a ProcessGroupRingtree (its communicator is used); default:
        ringtree.init().
    bucket_cap_mb
        Bucket size cap in MiB (25, like DDP).
    accumulation_steps
        Communicate once every this many backward passes; gradients of the others accumulate
        locally (sum them, or scale the loss by 1/k for a mean).
    finish_in_backward
        Wait for all buckets at the end of each communicating backward pass (default). With
        False, call finish() before optimizer.step(); that leaves the optimizer's own set-up
        free to overlap the last buckets.
    broadcast_from
        The rank whose parameters and buffers every rank starts from (None: keep each rank's
        own).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        comm=None,
        bucket_cap_mb: float = 25.0,
        accumulation_steps: int = 1,
        finish_in_backward: bool = True,
        broadcast_from: int | None = 0,
    ):
        super().__init__(model, comm, accumulation_steps, broadcast_from)
        self.finish_in_backward = bool(finish_in_backward)
        self.bucketer = Bucketer(
            [p.numel() for p in self.params],
            dtypes=[p.dtype for p in self.params],
            bucket_cap_mb=bucket_cap_mb,
            op="avg",
            device=self.device,
        )
        self._attach()

    def _step_outstanding(self) -> bool:
        return self.bucketer.active

    def _start_step(self):
        self.bucketer.start_step(self.comm)

    def _mark_ready(self, index, param):
        # finish() makes .grad a view of the reduced bucket: nothing to copy back.
        self.bucketer.mark_ready(index, param.grad, copy_back=False)

    def _flush(self):
        self.bucketer.flush()
        if self.finish_in_backward:
            self.finish()

    # --- public -----------------------------------------------------------------------------

    def finish(self):
        """Wait for every bucket of the last communicating backward pass; each parameter's
        .grad then is the average, as a view into its bucket's buffer (the all_reduce ran on
        it in place, so nothing is copied back), also where this rank produced no gradient
        (zeros if no rank did). Does nothing when no step is outstanding."""
        if not self.bucketer.active:
            return
        reduced = self.bucketer.finish()
        with torch.no_grad():
            for index, param in enumerate(self.params):
                param.grad = reduced[index].view(param.shape)

    @property
    def bucket_assignment(self) -> list[list[int]]:
        """Indices into self.params of each bucket, in launch order."""
        return self.bucketer.assignment
