"""ZeRO-style sharded data parallelism on a ringtree communicator, for any torch optimizer.

    zero = ShardedDataParallel(model, torch.optim.Adam, comm, stage=2, lr=1e-3)
    for x, y in batches:
        loss_fn(model(x), y).backward()        # buckets reduce while backward runs
        zero.clip_grad_norm_(1.0)              # optional: the global norm over every shard
        zero.step()                            # steps this rank's shard, then all-gathers
        zero.zero_grad()

Terms. The parameters are grouped into buckets (ringtree.bucketing.assign_buckets: reverse
registration order, one dtype, a byte cap). A bucket's parameters live in one flat buffer,
padded to a multiple of the world size P; the parameters become views into it. The bucket's
shard r is its r-th of P equal slices, owned by rank r. Each rank's optimizer holds one
master parameter per bucket: its own shard (a view of the flat buffer in fp32, an fp32 copy
when the model runs in fp16/bf16), so the optimizer state is 1/P of the unsharded one.

Stage 1: a bucket's gradients are all-reduced (every rank keeps the full averaged gradient in
param.grad); the optimizer steps the owned shard. Stage 2: a bucket's gradients are
reduce-scattered and param.grad is dropped, so a rank keeps only its shard's gradient. Both
launch each bucket's collective asynchronously from the post-accumulate-grad hooks
(BackwardSync), in bucket order on every rank, and wait for them in step() (or in
clip_grad_norm_ / unscale_, whichever comes first; stage 2 already waits for a bucket once
two later ones are launched, and drops its full-size gradient buffer). After the step, each bucket's updated
shard is all-gathered in place, asynchronously; the next forward pass (or synchronize())
waits for it.

Stage 3: the parameters are sharded at rest too. Each rank keeps only its shard of every
bucket (the master itself in fp32); the bucket's flat buffer has its storage resized to 0
and its parameters point at a one-element NaN placeholder (expanded to their shape, so a
stray read gives NaN rather than a crash). A forward pre-hook on each module that owns
parameters all-gathers its buckets (resizing the storage back) and starts the all_gather of
the next bucket in the order the last forward pass used them (prefetch); its forward hook
releases a bucket once every module owning part of it has run. Autograd's saved-tensor
hooks replace saved views of a gathered bucket by their place in it, and gather the bucket
again when backward unpacks them, prefetching the bucket used before it in forward; a bucket
is released once all its parameters' gradients are in (and at the end of backward).
Gradients are reduce-scattered as in stage 2. Every rank must therefore run the same modules
in the same order, as under FSDP.
"""

from __future__ import annotations

import contextlib
import copy

import torch

from ringtree.bucketing import assign_buckets

from .data_parallel import BackwardSync

__all__ = ["ShardedDataParallel"]

_MB = 1024 * 1024
_MASTER_DTYPE = torch.float32
# Stages 2 and 3 wait for a bucket's reduce-scatter once this many later buckets are launched,
# and drop its full-size gradient buffer, so backward holds a few buckets' gradients, not all.
_REDUCTIONS_IN_FLIGHT = 2
# Stage 3 bucket states.
_FREED, _GATHERING, _FULL = "freed", "gathering", "full"


class _Bucket:
    """One bucket: its parameters' places in the flat buffers and this rank's shard."""

    __slots__ = (
        "indices",
        "offsets",
        "count",
        "shard_size",
        "flat_params",
        "flat_grads",
        "master",
        "reduced",
        "pending",
        "work",
        "gather",
        "shard",
        "state",
        "views",
        "placeholders",
        "owners",
        "forward_pending",
        "grads_pending",
    )

    def __init__(self, indices, params, world_size, rank, device, sharded_at_rest=False):
        self.indices = indices
        self.offsets, self.count = {}, 0
        for index in indices:
            self.offsets[index] = self.count
            self.count += params[index].numel()
        self.shard_size = -(-self.count // world_size)
        dtype = params[indices[0]].dtype
        self.flat_params = torch.zeros(self.shard_size * world_size, dtype=dtype, device=device)
        with torch.no_grad():
            for index in indices:
                param = params[index]
                view = self.flat_params[self.offsets[index] : self.offsets[index] + param.numel()]
                view.copy_(param.detach().reshape(-1))
                param.data = view.view(param.shape)  # the module now reads the flat buffer
        own = self.own_slice(self.flat_params, rank)
        # Stage 3: the shard has storage of its own, which outlives the flat buffer's.
        self.shard = own.clone() if sharded_at_rest else own
        # In fp32 the optimizer updates the shard itself; in fp16/bf16 an fp32 copy.
        self.master = torch.nn.Parameter(self.shard if dtype == _MASTER_DTYPE else self.shard.to(_MASTER_DTYPE))
        self.master.grad = torch.zeros_like(self.master)
        self.flat_grads = None  # stage 1: kept; stage 2: made per step, dropped once reduced
        # The reduced shard in the parameters' dtype: the master's gradient itself in fp32.
        self.reduced = self.master.grad if dtype == _MASTER_DTYPE else torch.empty_like(own)
        self.pending = set()
        self.work = None
        self.gather = None
        self.state = _FULL
        self.views = {index: params[index].data for index in indices}
        self.placeholders = {}
        self.owners = set()  # stage 3: the modules whose own parameters lie in this bucket
        self.forward_pending = set()  # those that have not run in this forward pass yet
        self.grads_pending = set()  # the parameters whose gradient backward has not given yet
        if sharded_at_rest:
            nan = torch.full((1,), float("nan"), dtype=dtype, device=device)
            self.placeholders = {index: nan.expand(params[index].shape) for index in indices}

    def own_slice(self, flat, rank):
        return flat[rank * self.shard_size : (rank + 1) * self.shard_size]

    def region(self, flat, index, numel):
        start = self.offsets[index]
        return flat[start : start + numel]


class ShardedDataParallel(BackwardSync):
    """Data parallelism with sharded optimizer state (stage 1), gradients (stage 2) and
    parameters (stage 3).

    Parameters
    ----------
    model
        A torch.nn.Module, parameters all on the CPU or all on one CUDA device, of one floating
        dtype (after param_dtype).
    optimizer_class
        Any torch.optim.Optimizer class; it is built over this rank's master shards with
        `**optimizer_defaults` (one parameter group). Element-wise optimizers (SGD, Adam, AdamW,
        RMSprop, Adagrad, ...) step exactly as on the unsharded model; ones that look at whole
        tensors (LAMB-style trust ratios, Adafactor, LBFGS) would see shards instead and are not
        supported.
    comm
        A ringtree Communicator or a ProcessGroupRingtree; default ringtree.init().
    stage
        1 (optimizer state sharded), 2 (gradients too) or 3 (parameters too: gathered per bucket
        around each module's forward and backward, see the module doc; between steps read them
        inside gathered_parameters()).
    bucket_cap_mb
        Bucket size cap in MiB (25, like DDP).
    accumulation_steps
        Communicate once every this many backward passes (or use no_sync()).
    param_dtype
        Run the model in torch.float16 or torch.bfloat16 (its parameters are cast; feed it
        inputs of that dtype); the optimizer steps fp32 master shards.
    broadcast_from
        The rank whose parameters and buffers every rank starts from.
    **optimizer_defaults
        Passed to optimizer_class (lr=..., weight_decay=...).

    Raises
    ------
    ValueError
        A stage other than 1, 2 or 3, a cap that is not positive, or another param_dtype.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer_class,
        comm=None,
        *,
        stage: int = 2,
        bucket_cap_mb: float = 25.0,
        accumulation_steps: int = 1,
        param_dtype: torch.dtype | None = None,
        broadcast_from: int | None = 0,
        **optimizer_defaults,
    ):
        if stage not in (1, 2, 3):
            raise ValueError(f"ShardedDataParallel: stage must be 1, 2 or 3, got {stage!r}")
        if bucket_cap_mb <= 0:
            raise ValueError(f"ShardedDataParallel: bucket_cap_mb must be positive, got {bucket_cap_mb}")
        if param_dtype not in (None, torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(
                f"ShardedDataParallel: param_dtype must be float32, float16 or bfloat16, got {param_dtype}"
            )
        super().__init__(model, comm, accumulation_steps, broadcast_from)
        if not self.params:
            raise ValueError("ShardedDataParallel: the model has no parameters that require gradients")
        if param_dtype is not None:
            with torch.no_grad():
                for param in self.params:
                    param.data = param.data.to(param_dtype)
        dtypes = sorted({str(p.dtype) for p in self.params})
        if len(dtypes) > 1 or not self.params[0].is_floating_point():
            raise ValueError(
                f"ShardedDataParallel: parameters must share one floating dtype, got {', '.join(dtypes)}"
                f" (pass param_dtype= to cast them)"
            )
        self.stage = stage
        self.param_dtype = self.params[0].dtype
        self.world_size, self.rank = self.comm.size, self.comm.rank
        self._attach()  # the broadcast comes before the flat buffers copy the parameters
        sizes = [p.numel() for p in self.params]
        itemsizes = [p.element_size() for p in self.params]
        self.buckets = [
            _Bucket(indices, self.params, self.world_size, self.rank, self.device, stage == 3)
            for indices in assign_buckets(sizes, itemsizes, int(bucket_cap_mb * _MB))
        ]
        self.bucket_of = {index: b for b, bucket in enumerate(self.buckets) for index in bucket.indices}
        if stage == 1:
            for bucket in self.buckets:
                bucket.flat_grads = torch.zeros_like(bucket.flat_params)
        self.optimizer = optimizer_class([bucket.master for bucket in self.buckets], **optimizer_defaults)
        if len(self.optimizer.param_groups) != 1:
            raise ValueError("ShardedDataParallel: the optimizer must keep its parameters in one group")
        self._active = False
        self._next_launch = 0
        self._found_inf = False
        self.local_found_inf = False  # this rank's own verdict at the last unscale_ (before the reduction)
        self._module_handles = []
        if stage == 3:
            self._shard_parameters()
        else:
            self._module_handles.append(model.register_forward_pre_hook(lambda module, args: self.synchronize()))

    # --- stage 3: parameters gathered around their use ----------------------------------------

    def _shard_parameters(self):
        """Release every bucket and hook the modules: called once, after the buckets are made."""
        index_of = {id(param): index for index, param in enumerate(self.params)}
        self._module_buckets = {}  # module -> the buckets holding its own parameters
        for module in self.model.modules():
            buckets = sorted(
                {self.bucket_of[index_of[id(p)]] for p in module.parameters(recurse=False) if id(p) in index_of}
            )
            if buckets:
                self._module_buckets[module] = buckets
                for b in buckets:
                    self.buckets[b].owners.add(module)
        # Prefetch follows the order of the last forward pass; before the first, registration
        # order (the reverse of bucket order). The same on every rank, as the collectives must be.
        self._forward_order = list(reversed(range(len(self.buckets))))
        self._order_seen, self._seen, self._unseen = [], set(), 0  # this forward pass's first uses
        self._saved_buckets = set()
        self._gathered_storage = {}  # data_ptr of a gathered flat buffer -> its bucket
        self._saved_tensor_hooks = []  # entered by module pre-hooks, left by their forward hooks
        for b in range(len(self.buckets)):
            self._release(b)
        self._module_handles.append(self.model.register_forward_pre_hook(self._before_model))
        for module in self._module_buckets:
            self._module_handles.append(module.register_forward_pre_hook(self._before_module))
            self._module_handles.append(module.register_forward_hook(self._after_module))
        self._module_handles.append(self.model.register_forward_hook(self._after_model))

    def _before_model(self, model, args):
        while self._saved_tensor_hooks:  # left by a forward pass that raised
            self._saved_tensor_hooks.pop().__exit__(None, None, None)
        for bucket in self.buckets:
            bucket.forward_pending = set(bucket.owners)
            bucket.grads_pending = set(bucket.indices)
        self._order_seen, self._seen, self._unseen = [], set(), 0
        self._saved_buckets = set()  # those whose parameters autograd saved in this pass

    def _after_model(self, model, args, output):
        seen = set(self._order_seen)
        self._forward_order = self._order_seen + [b for b in self._forward_order if b not in seen]
        for b in range(len(self.buckets)):
            self._release(b)

    def _before_module(self, module, args):
        buckets = self._module_buckets[module]
        for b in buckets:
            if b not in self._seen:
                self._seen.add(b)
                self._order_seen.append(b)
            self._gather(b)
        # Prefetch the first bucket this pass has not used yet: it arrives while this module computes.
        order = self._forward_order
        while self._unseen < len(order) and order[self._unseen] in self._seen:
            self._unseen += 1
        if self._unseen < len(order):
            self._gather(order[self._unseen])
        for b in buckets:
            self._wait_gathered(b)
        # What autograd saves from this module's parameters is kept as a place in the bucket,
        # not as its storage, which is released after forward and gathered again in backward.
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()
        self._saved_tensor_hooks.append(hooks)

    def _after_module(self, module, args, output):
        if self._saved_tensor_hooks:
            self._saved_tensor_hooks.pop().__exit__(None, None, None)
        for b in self._module_buckets[module]:
            bucket = self.buckets[b]
            bucket.forward_pending.discard(module)
            if not bucket.forward_pending:
                self._release(b)

    def _pack(self, tensor):
        if tensor.layout != torch.strided:
            return tensor
        b = self._gathered_storage.get(tensor.untyped_storage().data_ptr())
        if b is None or tensor.dtype != self.param_dtype:
            return tensor
        self._saved_buckets.add(b)
        return (b, tensor.size(), tensor.stride(), tensor.storage_offset())

    def _unpack(self, saved):
        if torch.is_tensor(saved):
            return saved
        b, size, stride, offset = saved
        self._gather(b)
        # Prefetch the last bucket before this one in forward order that backward still needs.
        for previous in reversed(self._forward_order[: self._forward_order.index(b)]):
            if previous in self._saved_buckets and self.buckets[previous].grads_pending:
                self._gather(previous)
                break
        self._wait_gathered(b)
        return self.buckets[b].flat_params.as_strided(size, stride, offset)

    def _gather(self, b):
        """Start the all_gather of bucket b into its flat buffer, unless it is there or coming."""
        bucket = self.buckets[b]
        if bucket.state != _FREED:
            return
        flat = bucket.flat_params
        flat.untyped_storage().resize_(flat.numel() * flat.element_size())
        self._gathered_storage[flat.untyped_storage().data_ptr()] = b
        with self._label(b):
            bucket.gather = self.comm.all_gather(bucket.shard, flat, async_op=True)
        bucket.state = _GATHERING

    def _wait_gathered(self, b):
        bucket = self.buckets[b]
        self._gather(b)
        if bucket.state == _GATHERING:
            work, bucket.gather = bucket.gather, None
            work.wait()
            self._point_params_at(bucket, bucket.views)
            bucket.state = _FULL

    def _release(self, b):
        bucket = self.buckets[b]
        if bucket.state == _FREED:
            return
        if bucket.gather is not None:  # a prefetch nobody used: the storage is still being written
            work, bucket.gather = bucket.gather, None
            work.wait()
        self._point_params_at(bucket, bucket.placeholders)
        storage = bucket.flat_params.untyped_storage()
        self._gathered_storage.pop(storage.data_ptr(), None)
        storage.resize_(0)
        bucket.state = _FREED

    def _point_params_at(self, bucket, tensors):
        for index in bucket.indices:
            self.params[index].data = tensors[index]

    def _grad_hook(self, index):
        hook = super()._grad_hook(index)
        if self.stage != 3:
            return hook

        def release_when_done(param):
            hook(param)
            bucket = self.bucket_of[index]
            pending = self.buckets[bucket].grads_pending
            if pending:
                pending.discard(index)
                if not pending:  # backward needs none of this bucket's parameters any more
                    self._release(bucket)

        return release_when_done

    def _end_backward(self):
        super()._end_backward()
        if self.stage == 3:
            for b in range(len(self.buckets)):
                self._release(b)

    # --- backward: one collective per bucket, launched in bucket order ------------------------

    def _step_outstanding(self) -> bool:
        return self._active

    def _start_step(self):
        for bucket in self.buckets:
            bucket.pending = set(bucket.indices)
            bucket.work = None
        self._next_launch = 0
        self._active = True

    def _mark_ready(self, index, param):
        bucket = self.buckets[self.bucket_of[index]]
        self._take_grad(bucket, index)
        bucket.pending.discard(index)
        self._launch_ready(force=False)

    def _take_grad(self, bucket, index):
        """Move param.grad (zeros if it has none) into the bucket's flat gradient buffer."""
        param = self.params[index]
        if bucket.flat_grads is None:  # stage 2: made when the bucket's first gradient arrives
            bucket.flat_grads = torch.empty_like(bucket.flat_params)
            bucket.flat_grads[bucket.count :].zero_()
        region = bucket.region(bucket.flat_grads, index, param.numel())
        grad = param.grad
        with torch.no_grad():
            if grad is None:
                region.zero_()
            elif grad.data_ptr() != region.data_ptr():
                region.copy_(grad.reshape(-1))
        # Stage 1 keeps the full gradient, as a view that the all_reduce averages in place;
        # stage 2 keeps only the shard.
        param.grad = region.view(param.shape) if self.stage == 1 else None

    def _launch_ready(self, force):
        while self._next_launch < len(self.buckets):
            bucket = self.buckets[self._next_launch]
            if bucket.pending and not force:
                return
            for index in sorted(bucket.pending):  # no gradient on this rank: its own, or zeros
                self._take_grad(bucket, index)
            bucket.pending.clear()
            label = getattr(self.comm, "label", None)
            with label(self._next_launch) if label is not None else contextlib.nullcontext():
                if self.stage == 1:
                    bucket.work = self.comm.all_reduce(bucket.flat_grads, op="avg", async_op=True)
                else:
                    bucket.work = self.comm.reduce_scatter(bucket.flat_grads, bucket.reduced, op="avg", async_op=True)
            self._next_launch += 1
            if self.stage >= 2 and self._next_launch > _REDUCTIONS_IN_FLIGHT:
                self._complete(self.buckets[self._next_launch - 1 - _REDUCTIONS_IN_FLIGHT])

    def _flush(self):
        self._launch_ready(force=True)

    def finish(self):
        """Wait for every bucket of the last communicating backward pass; the masters' .grad
        then hold this rank's shard of the averaged gradient. Called by step(), unscale_()
        and clip_grad_norm_(); does nothing when no step is outstanding."""
        if not self._active:
            return
        try:
            self._launch_ready(force=True)
            for bucket in self.buckets:
                self._complete(bucket)
        finally:
            self._active = False
            for bucket in self.buckets:
                bucket.work = None

    def _complete(self, bucket):
        """Wait for a bucket's gradient collective and put this rank's shard of it in the master's .grad."""
        if bucket.work is None:
            return
        work, bucket.work = bucket.work, None
        work.wait()
        with torch.no_grad():
            grad = bucket.master.grad
            if grad is None:  # the optimizer's zero_grad(set_to_none=True) dropped it
                grad = bucket.master.grad = torch.zeros_like(bucket.master)
            if self.stage == 1:
                grad.copy_(bucket.own_slice(bucket.flat_grads, self.rank))
            else:
                if grad is not bucket.reduced:
                    grad.copy_(bucket.reduced)
                bucket.flat_grads = None

    # --- the step ---------------------------------------------------------------------------

    def step(self, scaler: torch.amp.GradScaler | None = None):
        """Step this rank's shards with the optimizer, then all-gather the updated parameters
        (asynchronously; the next forward pass waits; stage 3 gathers them only when a module
        runs).

        Parameters
        ----------
        scaler : torch.amp.GradScaler or None
            With a scaler: unscale (unless `unscale_` ran already), decide on overflow over every
            rank and let the scaler skip the step on every rank or on none; call scaler.update()
            afterwards as usual.

        Returns
        -------
        object
            What the optimizer's step returned (None when skipped).
        """
        self.finish()
        self.synchronize()  # the previous gathers still read the shards this step writes
        if scaler is not None and scaler.is_enabled():
            if self._scaler_state(scaler)["stage"].name == "READY":
                self.unscale_(scaler)
            result = scaler.step(self.optimizer)
            stepped = not self._found_inf
        else:
            result = self.optimizer.step()
            stepped = True
        if stepped:
            self._publish_masters()
        return result

    def _publish_masters(self):
        """The masters' values become the parameters': stages 1 and 2 all-gather them into the
        flat buffers (asynchronously), stage 3 only updates the shards kept at rest."""
        with torch.no_grad():
            for b, bucket in enumerate(self.buckets):
                if bucket.master.data_ptr() != bucket.shard.data_ptr():
                    bucket.shard.copy_(bucket.master)  # fp32 master -> fp16/bf16 parameters
                if self.stage != 3:
                    with self._label(b):
                        bucket.gather = self.comm.all_gather(bucket.shard, bucket.flat_params, async_op=True)

    def _label(self, value):
        label = getattr(self.comm, "label", None)
        return label(value) if label is not None else contextlib.nullcontext()

    def synchronize(self):
        """Wait for the parameter all-gathers in flight (the model's next forward pass does
        this by itself; at stages 1 and 2 call it before reading parameters directly, at stage
        3 use gathered_parameters())."""
        for bucket in self.buckets:
            if bucket.gather is not None:
                work, bucket.gather = bucket.gather, None
                work.wait()
                if bucket.state == _GATHERING:
                    self._point_params_at(bucket, bucket.views)
                    bucket.state = _FULL

    @contextlib.contextmanager
    def gathered_parameters(self, writeback: bool = False):
        """A context manager: inside the block every parameter holds its full value (collective at
        stage 3: an all_gather per bucket, and the storage is released again at the end).

        Parameters
        ----------
        writeback : bool
            True: values written to the parameters inside the block become the masters' (and so
            survive the next step), e.g. to load a model state_dict.
        """
        for b in range(len(self.buckets)):
            self._gather(b)
        self.synchronize()
        try:
            yield self.model
        finally:
            if writeback:
                with torch.no_grad():
                    for bucket in self.buckets:
                        own = bucket.own_slice(bucket.flat_params, self.rank)
                        if bucket.shard.data_ptr() != own.data_ptr():
                            bucket.shard.copy_(own)
                        if bucket.master.data_ptr() != bucket.shard.data_ptr():
                            bucket.master.copy_(bucket.shard)
            if self.stage == 3:
                for b in range(len(self.buckets)):
                    self._release(b)

    def zero_grad(self):
        """Drop the model's gradients and zero the master shards' (call after step())."""
        for param in self.params:
            param.grad = None
        for bucket in self.buckets:
            if bucket.master.grad is not None:
                bucket.master.grad.zero_()

    # --- loss scaling and clipping ------------------------------------------------------------

    def _scaler_state(self, scaler) -> dict:
        # GradScaler keeps a record per optimizer, keyed by id(optimizer): its stage (READY,
        # UNSCALED, STEPPED) and found_inf_per_device, which its step() and update() read.
        return scaler._per_optimizer_states[id(self.optimizer)]

    def unscale_(self, scaler: torch.amp.GradScaler):
        """`scaler.unscale_` on the master shards, then one all_reduce (max) of the overflow
        flag, written back into the scaler's found_inf_per_device: every rank's scaler then
        skips the step and lowers the scale, or none does. Call before `clip_grad_norm_`.

        Parameters
        ----------
        scaler : torch.amp.GradScaler
            The scaler; a disabled one is left alone.
        """
        self.finish()
        if not scaler.is_enabled():
            return
        scaler.unscale_(self.optimizer)
        found = self._scaler_state(scaler)["found_inf_per_device"]
        flags = list(found.values())
        local = torch.stack([f.to(torch.float32) for f in flags]).amax().reshape(1) if flags else torch.zeros(1)
        self.local_found_inf = bool(local.item() > 0)
        self.comm.all_reduce(local, op="max")
        self._found_inf = bool(local.item() > 0)
        if not flags:  # no gradient here at all: record the verdict for step() and update()
            found[torch.device("cpu")] = torch.zeros((), dtype=torch.float32)
            flags = list(found.values())
        for flag in flags:
            flag.fill_(local.item())

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scale the gradients so that their norm over all ranks' shards is at most max_norm.
        One all_reduce of one number.

        Parameters
        ----------
        max_norm : float
            The largest norm allowed.
        norm_type : float
            The p of the p-norm, positive (inf: the max norm).

        Returns
        -------
        torch.Tensor
            The total norm before clipping (what `torch.nn.utils.clip_grad_norm_` gives on the
            unsharded model).

        Raises
        ------
        ValueError
            norm_type is not positive.
        """
        self.finish()
        norm_type = float(norm_type)
        if norm_type <= 0:
            raise ValueError(f"clip_grad_norm_: norm_type must be positive, got {norm_type}")
        grads = [bucket.master.grad for bucket in self.buckets if bucket.master.grad is not None]
        # float64 keeps the cross-rank sum of powers as exact as torch's per-tensor norms.
        local = torch.zeros(1, dtype=torch.float64)
        with torch.no_grad():
            for grad in grads:
                if grad.numel() == 0:
                    continue
                g = grad.detach().to(torch.float64).abs()
                if norm_type == float("inf"):
                    local = torch.maximum(local, g.max().reshape(1))
                else:
                    local += g.pow(norm_type).sum()
            self.comm.all_reduce(local, op="max" if norm_type == float("inf") else "sum")
            total = local[0] if norm_type == float("inf") else local[0].pow(1.0 / norm_type)
            total = total.to(torch.float32)
            coefficient = (max_norm / (total + 1e-6)).clamp(max=1.0)
            for grad in grads:
                grad.mul_(coefficient)
        return total

    # --- optimizer state ----------------------------------------------------------------------

    def _per_element(self, value, bucket) -> bool:
        return torch.is_tensor(value) and value.dim() == 1 and value.shape[0] == bucket.shard_size

    def sharded_state_dict(self) -> dict:
        """This rank's part, to load back at the same world size and model.

        Returns
        -------
        dict
            The optimizer's own state_dict over its shards, the fp32 master shards, and the layout
            they belong to.
        """
        self.synchronize()
        return {
            "world_size": self.world_size,
            "rank": self.rank,
            "bucket_counts": [bucket.count for bucket in self.buckets],
            # A copy: torch's state_dict() hands out the live state tensors.
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "masters": [bucket.master.detach().clone() for bucket in self.buckets],
        }

    def load_sharded_state_dict(self, state: dict):
        """Load what sharded_state_dict() gave on this rank (same world size and model).

        Parameters
        ----------
        state : dict
            What sharded_state_dict() returned on this rank.

        Raises
        ------
        ValueError
            It was saved for another rank, world size or bucket layout.
        """
        counts = [bucket.count for bucket in self.buckets]
        if (
            state.get("world_size") != self.world_size
            or state.get("rank") != self.rank
            or state.get("bucket_counts") != counts
        ):
            raise ValueError(
                f"load_sharded_state_dict: saved for rank {state.get('rank')} of "
                f"{state.get('world_size')} with buckets {state.get('bucket_counts')}, but this is rank "
                f"{self.rank} of {self.world_size} with buckets {counts}"
            )
        self.synchronize()
        self.optimizer.load_state_dict(state["optimizer"])
        with torch.no_grad():
            for bucket, master in zip(self.buckets, state["masters"]):
                bucket.master.copy_(master)
        self._publish_masters()

    def state_dict(self) -> dict:
        """The full optimizer state, as the same optimizer over model.parameters() would hold
        it, gathered from every rank. Collective.

        Returns
        -------
        dict
            State keyed by parameter index, one param group; in fp16/bf16 also the fp32
            "master_params".
        """
        self.synchronize()
        inner = self.optimizer.state_dict()
        state = {index: {} for index in range(len(self.params))}
        masters = [None] * len(self.params)
        for b, bucket in enumerate(self.buckets):
            shard_state = dict(inner["state"].get(b, {}))
            if self.param_dtype != _MASTER_DTYPE:
                shard_state[" master"] = bucket.master.detach()
            for key, value in sorted(shard_state.items()):
                if self._per_element(value, bucket):
                    full = value.new_empty(bucket.shard_size * self.world_size)
                    self.comm.all_gather(value.contiguous(), full)
                for index in bucket.indices:
                    param = self.params[index]
                    piece = (
                        bucket.region(full, index, param.numel()).view(param.shape).clone()
                        if self._per_element(value, bucket)
                        else (value.clone() if torch.is_tensor(value) else value)
                    )
                    if key == " master":
                        masters[index] = piece
                    else:
                        state[index][key] = piece
        group = {k: v for k, v in inner["param_groups"][0].items() if k != "params"}
        full_state = {
            "state": {i: s for i, s in state.items() if s},
            "param_groups": [dict(group, params=list(range(len(self.params))))],
        }
        if self.param_dtype != _MASTER_DTYPE:
            full_state["master_params"] = masters
        return full_state

    def load_state_dict(self, full_state: dict):
        """Load a full state: each rank keeps its shard. Not collective except for the
        parameter all-gather of fp16/bf16 masters at stages 1 and 2. In fp32 the parameters are
        the masters: they stay as they are (load them with gathered_parameters(writeback=True)).

        Parameters
        ----------
        full_state : dict
            state_dict(), or a plain optimizer's state_dict over model.parameters().

        Raises
        ------
        ValueError
            Not one param group over the model's parameters.
        """
        groups = full_state["param_groups"]
        if len(groups) != 1 or list(groups[0]["params"]) != list(range(len(self.params))):
            raise ValueError(
                f"load_state_dict: expected one param group over {len(self.params)} parameters, got "
                f"{[len(g['params']) for g in groups]}"
            )
        saved = full_state["state"]
        inner_state = {}
        for b, bucket in enumerate(self.buckets):
            first = saved.get(bucket.indices[0], {})
            shard_state = {}
            for key, value in first.items():
                if torch.is_tensor(value) and value.shape == self.params[bucket.indices[0]].shape and value.dim() > 0:
                    shard_state[key] = self._shard_of(bucket, [saved[i][key] for i in bucket.indices])
                else:
                    shard_state[key] = value.clone() if torch.is_tensor(value) else value
            if shard_state:
                inner_state[b] = shard_state
        group = {k: v for k, v in groups[0].items() if k != "params"}
        self.synchronize()
        self.optimizer.load_state_dict(
            {"state": inner_state, "param_groups": [dict(group, params=list(range(len(self.buckets))))]}
        )
        masters = full_state.get("master_params")
        if masters is not None:
            with torch.no_grad():
                for bucket in self.buckets:
                    bucket.master.copy_(self._shard_of(bucket, [masters[i] for i in bucket.indices]))
            self._publish_masters()

    def _shard_of(self, bucket, pieces):
        flat = torch.zeros(bucket.shard_size * self.world_size, dtype=pieces[0].dtype)
        for index, piece in zip(bucket.indices, pieces):
            bucket.region(flat, index, piece.numel()).copy_(piece.reshape(-1))
        return bucket.own_slice(flat, self.rank).clone()

    # --- public -----------------------------------------------------------------------------

    @property
    def bucket_assignment(self) -> list[list[int]]:
        """Indices into self.params of each bucket, in launch order."""
        return [list(bucket.indices) for bucket in self.buckets]

    def remove(self):
        """Finish outstanding work and detach the hooks (the parameters stay flat-buffer views;
        at stage 3 they are all-gathered first, collectively, so the model holds them in full)."""
        super().remove()
        self.synchronize()
        for handle in self._module_handles:
            handle.remove()
        self._module_handles = []
        if self.stage == 3:
            for b in range(len(self.buckets)):
                self._gather(b)
            self.synchronize()
