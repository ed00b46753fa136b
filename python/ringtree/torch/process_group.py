"""The "ringtree" backend of torch.distributed: a Python ProcessGroup over a ringtree
Communicator.

torch calls these methods by name, from Python (torch.distributed.all_reduce and friends)
and from C++ through its ProcessGroup trampoline (DistributedDataParallel). Each method
checks its arguments, issues ringtree calls with async_op=async_op (so it returns at once and
DDP overlaps communication with backward), and returns a RingtreeWork. A small pool of
completion threads waits for ringtree's work, copies results where a staging buffer was
needed, and completes the work's torch Future, which runs any fut.then() callbacks.

Errors: bad arguments raise from the torch call itself (ringtree checks before any
traffic). Timeouts, dead peers and mismatched calls raise ringtree's typed exceptions
(rt.Timeout, rt.PeerFailure, rt.CollectiveMismatch) from Work.wait(), from
get_future().wait(), and so from every blocking torch call.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d
from torch.distributed.constants import default_pg_timeout

from ringtree import _core, _launchers
from ringtree._args import ANY_SOURCE, default_timeout
from ringtree.comm import Communicator
from ringtree.ops import resolve_op

from ._buffer_pool import POOL_BYTES, AllocatingBackend, BufferPool
from ._convert import (
    BITWISE_OPS,
    BOOL_OPS,
    MessageBuffer,
    StagedTensor,
    as_buffer,
    concatenated,
    copy_blocks,
    cuda_device_of,
    elements_per_item,
    host_view,
    ringtree_op,
    row_elements,
    tensor_list,
    timeout_seconds,
)
from ._work import Completer, RingtreeMessageWork, RingtreeWork

__all__ = ["ProcessGroupRingtree", "RingtreeWork", "create_process_group", "BACKEND_NAME", "DEVICES", "bucket_label"]

BACKEND_NAME = "ringtree"
# CUDA tensors are staged through the host communicator on the caller's stream; a build without
# CUDA (or a machine without a GPU) raises a clear error at the first CUDA call.
DEVICES = ("cpu", "cuda")

_COLL_CODE = {name: code for code, name in enumerate(_core.COLLECTIVES)}
_ALL_REDUCE, _REDUCE_SCATTER, _ALL_GATHER, _BROADCAST = (
    _COLL_CODE["all_reduce"],
    _COLL_CODE["reduce_scatter"],
    _COLL_CODE["all_gather"],
    _COLL_CODE["broadcast"],
)
_AUTO_ALGO = list(_core.ALGOS).index("auto")


def bucket_label(group, index: int):
    """A context manager: the collectives a ringtree group (None: the default group) issues
    inside it carry `index` (a DDP bucket's) as their flight-recorder label; any other group
    is left alone. torch's DDP passes no bucket to the group, so its comm hooks
    (ringtree.torch.comm_hooks) set the label around their calls."""
    comm = getattr(dist.group.WORLD if group is None else group, "comm", None)
    return comm.label(index) if isinstance(comm, Communicator) else contextlib.nullcontext()


# --- the process group --------------------------------------------------------------------


class ProcessGroupRingtree(dist.ProcessGroup):
    """torch.distributed ProcessGroup backed by a ringtree Communicator (CPU and CUDA tensors;
    CUDA collectives are enqueued on the caller's current stream, see the manual's GPU page).

    Usually made by torch through the registered creator: dist.init_process_group("ringtree")
    or dist.new_group(backend="ringtree"). It can also wrap an existing communicator:
    ProcessGroupRingtree(comm) (its rank and size become the group's).

    Parameters
    ----------
    comm : Communicator
        Carries the group's traffic; the group's rank and size are its.
    store : torch.distributed.Store or None
        The store torch made the group with, if any.
    timeout : datetime.timedelta, float or None
        Bounds each call; None: the communicator's timeout.
    """

    def __init__(self, comm: Communicator, store=None, timeout=None):
        # (The store-taking constructor cannot build a Python subclass.)
        super().__init__(comm.rank, comm.size)
        self._store = store
        self._comm = comm
        self._timeout = timeout_seconds(timeout)
        self._completer = Completer(f"ringtree-pg-r{comm.rank}")
        self._pool = BufferPool(POOL_BYTES)
        self._register_devices()

    def _register_devices(self):
        """Report cpu and cuda as this group's devices (pg._device_types), as Gloo's group does.

        torch reads them to pick a device for DCP's broadcast_from_rank0, to allow async_save, and
        for object collectives, and pg._get_backend(device) must then answer. A Python group cannot
        give torch a C++ backend of its own, so each device gets torch's FakeProcessGroup set to
        refuse every collective: torch issues collectives through this group's methods, and a
        caller that goes around them gets an error rather than a silent no-op. (The stand-in's
        point-to-point calls do nothing, but torch's send and recv reach this group's own.)
        """
        options = _c10d.FakeProcessGroup.Options()
        options.error_on_collective = True
        stand_in = _c10d.FakeProcessGroup._create_internal(self._comm.rank, self._comm.size, options)
        for device in DEVICES:
            self._register_backend(torch.device(device), dist.ProcessGroup.BackendType.CUSTOM, stand_in)
        self._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)

    # FSDP2's allocation hook (fully_shard module .set_allocate_memory_from_process_group_for_comm(True))

    def _get_backend(self, device):
        return AllocatingBackend(super()._get_backend(device), self)

    def supports_tensor_alloc(self, device) -> bool:
        """Whether allocate_tensor gives this group's own buffers on `device`.

        Parameters
        ----------
        device : torch.device or str
            The device FSDP2 would allocate on.

        Returns
        -------
        bool
            True for the CPU (pooled host buffers); CUDA tensors are staged through the host by the
            core, whatever memory they live in.
        """
        return torch.device(device).type == "cpu"

    def allocate_tensor(self, size, *, dtype, device):
        """A 1-D tensor for a collective's buffer (FSDP2's all-gather output and
        reduce-scatter input); on the CPU from the group's pool of reused buffers.

        Parameters
        ----------
        size : int
            Number of elements.
        dtype : torch.dtype
            Its dtype.
        device : torch.device or str
            Where it lives; other than the CPU, a plain torch.empty.

        Returns
        -------
        torch.Tensor
            The tensor, contents undefined.
        """
        if torch.device(device).type != "cpu":
            return torch.empty(int(size), dtype=dtype, device=device)
        return self._pool.take(int(size), dtype)

    # identity ---------------------------------------------------------------------------

    @property
    def comm(self) -> Communicator:
        """The ringtree communicator that carries this group's traffic."""
        return self._comm

    def getBackendName(self):  # noqa: N802 - name fixed by torch's C++ trampoline
        """The backend's name, for torch.

        Returns
        -------
        str
            "ringtree".
        """
        return BACKEND_NAME

    def name(self):
        """The backend's name, for torch.

        Returns
        -------
        str
            "ringtree".
        """
        return BACKEND_NAME

    # torch keeps a group's name in its C++ backends, which a Python group has none of.
    def setGroupName(self, name):  # noqa: N802 - name fixed by torch's C++ trampoline
        """Keep the name torch gives the group (a Python group has no C++ backend to keep it).

        Parameters
        ----------
        name : str
            The group's name.
        """
        self._group_name = name

    def getGroupName(self):  # noqa: N802
        """The name torch gave the group.

        Returns
        -------
        str
            The name, or "" before torch set one.
        """
        return getattr(self, "_group_name", "")

    def setGroupDesc(self, desc):  # noqa: N802
        """Keep the description torch gives the group.

        Parameters
        ----------
        desc : str
            The group's description.
        """
        self._group_desc = desc

    def getGroupDesc(self):  # noqa: N802
        """The description torch gave the group.

        Returns
        -------
        str
            The description, or "" before torch set one.
        """
        return getattr(self, "_group_desc", "")

    def __repr__(self):
        return f"<ProcessGroupRingtree rank {self._comm.rank} of {self._comm.size}>"

    def abort(self):
        """Stop every call in flight on every rank (they raise rt.Aborted) and release the group."""
        self.shutdown()

    def shutdown(self):
        """Close the group's communicator: queued work finishes, peers learn this rank left."""
        self._comm.close()

    # plumbing ---------------------------------------------------------------------------

    def _call_timeout(self, opts):
        seconds = timeout_seconds(getattr(opts, "timeout", None)) if opts is not None else None
        return seconds if seconds is not None else self._timeout

    def _launch(self, issue, outputs, finish=None, opts=None):
        """Start the ringtree calls of one torch call: issue(async_op) makes them.

        A blocking torch call (opts.asyncOp False) runs them blocking on this thread, which
        saves the hand-off to a completion thread, and raises their errors right here. Other
        calls (DDP's, async_op=True, p2p) return at once; completion threads finish them.
        Bad arguments raise from issue() either way, before any traffic."""
        work = RingtreeWork(outputs)
        if opts is not None and not getattr(opts, "asyncOp", True):
            issue(False)
            if finish is not None:
                finish()  # on the caller's stream, after the collective: nothing to wait for
            work._complete(None)
            return work
        device = cuda_device_of(outputs)
        if finish is not None and device is not None:
            copy_back = finish

            def finish():
                copy_back()
                # On a completion thread the copies go to that thread's stream, which the caller's
                # stream knows nothing of: they are done before the work counts as complete.
                torch.cuda.current_stream(device).synchronize()

        self._completer.submit(issue(True), finish, work)
        return work

    def _direct(self, coll, inp, out, op, outputs, keep, opts, timeout, root=0):
        """One core call on host views (host_view) of tensors used in place: no staging, no
        closures, no conversion by the Python communicator. The core checks the call (counts,
        dtypes, root) before any traffic, as on the staged route."""
        op_code, factor = resolve_op(op)
        blocking = opts is not None and not getattr(opts, "asyncOp", True)
        in_ptr, in_count, dtype = inp if inp is not None else (0, 0, out[2])
        out_ptr, out_count, _ = out if out is not None else (0, 0, 0)
        core_work = self._comm._core.run(
            coll,
            dtype,
            inp is not None,
            in_ptr,
            in_count,
            False,
            out is not None,
            out_ptr,
            out_count,
            False,
            op_code,
            factor,
            root,
            -1,
            _AUTO_ALGO,
            -1.0 if timeout is None else timeout,
            not blocking,
        )
        if blocking:
            work = RingtreeWork(outputs)
            work._complete(None)
            return work
        work = RingtreeWork(outputs, keep)
        self._completer.submit((core_work,), None, work)
        return work

    def _check_root(self, root, what):
        if not 0 <= root < self._comm.size:
            raise ValueError(f"ringtree: {what}: root {root} is not a rank of this group of {self._comm.size}")

    # collectives ------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        """All-reduce each tensor in place (dist.all_reduce). Bitwise ops take integer or bool
        tensors; bool tensors reduce MIN and MAX as bytes; dtypes the core lacks are staged.

        Parameters
        ----------
        tensors : list of torch.Tensor
            The tensors, CPU or CUDA; every rank passes the same shapes and dtypes.
        opts : torch.distributed options or None
            torch's options object for the call; its `reduceOp` and `timeout` are read. None: the defaults.

        Returns
        -------
        RingtreeWork
            The call in flight; wait() re-raises a ringtree error (Timeout, PeerFailure, ...) as is.

        Raises
        ------
        ValueError
            Tensors, root or op the call cannot take, before any traffic.
        """
        tensors = tensor_list(tensors, "allreduce")
        requested = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        kind = getattr(requested, "op", requested)
        timeout = self._call_timeout(opts)
        if kind in BITWISE_OPS:
            for t in tensors:
                if isinstance(t, torch.Tensor) and (t.dtype.is_floating_point or t.dtype.is_complex):
                    raise ValueError(
                        f"ringtree: all_reduce with ReduceOp.{kind.name} needs integer or bool tensors, got {t.dtype}"
                    )
            op, as_bytes = BITWISE_OPS[kind], True
        elif kind in BOOL_OPS and all(t.dtype == torch.bool for t in tensors):
            op, as_bytes = BOOL_OPS[kind], True
        else:
            op, as_bytes = ringtree_op(requested), False
        # One dense CPU tensor of a dtype the core knows (DDP's buckets): the tensor itself, in place.
        view = host_view(tensors[0]) if len(tensors) == 1 else None
        if view is not None:
            return self._direct(_ALL_REDUCE, view, view, op, tensors, None, opts, timeout)
        # Bytes-wise reductions stage dtypes the core lacks (bool, int16...) as uint8.
        staged = [StagedTensor(t, "allreduce tensor", reduction=not as_bytes) for t in tensors]

        def issue(async_op):
            return [self._comm.all_reduce(s.buffer, op=op, async_op=async_op, timeout=timeout) for s in staged]

        return self._launch(issue, tensors, lambda: [s.write_back() for s in staged], opts=opts)

    def _grouped(self, one, items, tensors):
        """issue(async_op) of a torch coalesced call: one(item) for each item inside one ringtree
        group (one check, small calls fused into one) when every tensor is in host memory, which
        groups need; CUDA tensors take one call each."""
        if any(t.device.type != "cpu" for t in tensors):
            return lambda async_op: [one(item, async_op) for item in items]

        def issue(async_op):
            with self._comm.group(async_op=async_op) as group:
                for item in items:
                    one(item, False)
            return [group.work] if async_op else []

        return issue

    def allreduce_coalesced(self, tensors, opts=None):
        """All-reduce each tensor of ``tensors`` in place, as one ringtree group (one check,
        small tensors fused into one call); what ``dist.all_reduce_coalesced`` and the coalescing
        manager call.

        Parameters
        ----------
        tensors : list of torch.Tensor
            The tensors; every rank passes the same list of shapes and dtypes.
        opts : torch.distributed options or None
            torch's options object for the call; its `reduceOp` and `timeout` are read. None: the defaults.

        Returns
        -------
        RingtreeWork
            One work for the whole list.
        """
        tensors = tensor_list(tensors, "allreduce_coalesced")
        op = ringtree_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        timeout = self._call_timeout(opts)
        staged = [StagedTensor(t, "allreduce_coalesced tensor", reduction=True) for t in tensors]
        if all(t.device.type == "cpu" for t in tensors):  # one group: no concatenation, no copies back

            def one(s, async_op):
                return self._comm.all_reduce(s.buffer, op=op, async_op=async_op, timeout=timeout)

            return self._launch(
                self._grouped(one, staged, tensors), tensors, lambda: [s.write_back() for s in staged], opts=opts
            )
        # One call per dtype, in first-appearance order (the same on every rank).
        groups = {}
        for t in tensors:
            groups.setdefault(t.dtype, []).append(t)
        flats = [(members, torch.cat([t.reshape(-1) for t in members])) for members in groups.values()]

        def issue(async_op):
            return [self._comm.all_reduce(flat, op=op, async_op=async_op, timeout=timeout) for _, flat in flats]

        def finish():
            for members, flat in flats:
                copy_blocks(flat, members)

        return self._launch(issue, tensors, finish, opts=opts)

    def broadcast(self, tensors, opts=None):
        """Every rank's tensors receive the root's, in place (dist.broadcast).

        Parameters
        ----------
        tensors : list of torch.Tensor
            The data on the root; the tensors to fill elsewhere (same shapes and dtypes).
        opts : torch.distributed options or None
            torch's options object for the call; its `rootRank` and `timeout` are read. None: the defaults.

        Returns
        -------
        RingtreeWork
            The call in flight; wait() re-raises a ringtree error (Timeout, PeerFailure, ...) as is.

        Raises
        ------
        ValueError
            Tensors, root or op the call cannot take, before any traffic.
        """
        tensors = tensor_list(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "broadcast")
        timeout = self._call_timeout(opts)
        if len(tensors) == 1:
            view = host_view(tensors[0])
            if view is not None:
                return self._direct(_BROADCAST, view, None, "sum", tensors, None, opts, timeout, root=root)
        staged = [StagedTensor(t, "broadcast tensor") for t in tensors]

        def issue(async_op):
            return [self._comm.broadcast(s.buffer, root=root, async_op=async_op, timeout=timeout) for s in staged]

        return self._launch(issue, tensors, lambda: [s.write_back() for s in staged], opts=opts)

    def reduce(self, tensors, opts=None):
        """The root's tensors receive the reduction over ranks, in place (dist.reduce); the
        others' are left as they were.

        Parameters
        ----------
        tensors : list of torch.Tensor
            Each rank's inputs; the root's receive the result.
        opts : torch.distributed options or None
            torch's options object for the call; its `rootRank`, `reduceOp` and `timeout` are read. None: the defaults.

        Returns
        -------
        RingtreeWork
            The call in flight; wait() re-raises a ringtree error (Timeout, PeerFailure, ...) as is.

        Raises
        ------
        ValueError
            Tensors, root or op the call cannot take, before any traffic.
        """
        tensors = tensor_list(tensors, "reduce")
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "reduce")
        op = ringtree_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        timeout = self._call_timeout(opts)
        staged = [StagedTensor(t, "reduce tensor", reduction=True) for t in tensors]

        def issue(async_op):
            return [self._comm.reduce(s.buffer, root=root, op=op, async_op=async_op, timeout=timeout) for s in staged]

        def finish():
            if self._comm.rank == root:
                for s in staged:
                    s.write_back()

        return self._launch(issue, tensors, finish, opts=opts)

    def allgather(self, output_tensors, input_tensors, opts=None):
        """output_tensors[i][r] receives rank r's input_tensors[i] (dist.all_gather).

        Parameters
        ----------
        output_tensors : list of list of torch.Tensor
            One list per input, of P tensors of the input's size and dtype.
        input_tensors : list of torch.Tensor
            This rank's inputs.
        opts : torch.distributed options or None
            torch's options object for the call; its `timeout` are read. None: the defaults.

        Returns
        -------
        RingtreeWork
            The call in flight; wait() re-raises a ringtree error (Timeout, PeerFailure, ...) as is.

        Raises
        ------
        ValueError
            Tensors, root or op the call cannot take, before any traffic.
        """
        input_tensors = tensor_list(input_tensors, "allgather")
        if len(output_tensors) != len(input_tensors):
            raise ValueError(f"ringtree: allgather: {len(output_tensors)} output lists for {len(input_tensors)} inputs")
        P, timeout = self._comm.size, self._call_timeout(opts)
        plans = []
        for outputs, x in zip(output_tensors, input_tensors):
            outputs = list(outputs)
            if len(outputs) != P:
                raise ValueError(f"ringtree: allgather needs {P} output tensors (one per rank), got {len(outputs)}")
            for out in outputs:
                if out.dtype != x.dtype:
                    raise ValueError(
                        f"ringtree: allgather: output dtype {out.dtype} differs from input dtype {x.dtype}"
                    )
            plans.append((outputs, StagedTensor(x, "allgather input")))

        even = all(out.numel() == x.numel() for outputs, x in zip(output_tensors, input_tensors) for out in outputs)
        flats = (
            [torch.empty(P * s.tensor.numel(), dtype=s.tensor.dtype, device=s.tensor.device) for _, s in plans]
            if even
            else []
        )
        staged_outputs = (
            [] if even else [[StagedTensor(out, "allgather output") for out in outputs] for outputs, _ in plans]
        )

        def issue(async_op):
            works = []
            if even:
                for (_outputs, s), flat in zip(plans, flats):
                    works.append(self._comm.all_gather(s.buffer, as_buffer(flat), async_op=async_op, timeout=timeout))
                return works
            # Uneven sizes: one broadcast per rank; ringtree's count check catches ranks whose
            # output sizes disagree with the sender's input.
            for (_outputs, s), outs in zip(plans, staged_outputs):
                own = outs[self._comm.rank]
                if own.buffer.numel() != s.buffer.numel():
                    raise ValueError(
                        f"ringtree: allgather: output {self._comm.rank} has {own.tensor.numel()} "
                        f"elements but this rank's input has {s.tensor.numel()}"
                    )
                own.buffer.view(-1).copy_(s.buffer.view(-1))
                for r in range(P):
                    works.append(self._comm.broadcast(outs[r].buffer, root=r, async_op=async_op, timeout=timeout))
            return works

        def finish():
            if even:
                for (outputs, _), flat in zip(plans, flats):
                    copy_blocks(flat, outputs)
            else:
                for outs in staged_outputs:
                    for s in outs:
                        s.write_back()

        return self._launch(issue, [t for outputs, _ in plans for t in outputs], finish, opts=opts)

    def _gather_single(self, output, input, what):
        P = self._comm.size
        if output.dtype != input.dtype:
            raise ValueError(f"ringtree: {what}: output dtype {output.dtype} differs from input dtype {input.dtype}")
        if output.numel() != P * input.numel():
            raise ValueError(
                f"ringtree: {what}: output has {output.numel()} elements, expected {P} x "
                f"{input.numel()} (group size x input)"
            )
        out = StagedTensor(output, f"{what} output")
        x = StagedTensor(input, f"{what} input")
        return out, x

    def all_gather_single(self, output, input, opts=None):
        """`output` (P times the input's size, same dtype) receives every rank's `input`, rank r's
        at block r (dist.all_gather_into_tensor).

        Parameters
        ----------
        output : torch.Tensor
            P x input.numel() elements.
        input : torch.Tensor
            This rank's block.
        opts : torch.distributed options or None
            torch's options object for the call; its `timeout` are read. None: the defaults.

        Returns
        -------
        RingtreeWork
            The call in flight; wait() re-raises a ringtree error (Timeout, PeerFailure, ...) as is.

        Raises
        ------
        ValueError
            Tensors, root or op the call cannot take, before any traffic.
        """
        timeout = self._call_timeout(opts)
        if output.dtype == input.dtype and output.numel() == self._comm.size * input.numel():
            out, x = host_view(output), host_view(input)
            if out is not None and x is not None:  # FSDP's gathers: straight into the output
                return self._direct(_ALL_GATHER, x, out, "sum", [output], input, opts, timeout)
        out, x = self._gather_single(output, input, "all_gather_single")

        def issue(async_op):
            return [self._comm.all_gather(x.buffer, out.buffer, async_op=async_op, timeout=timeout)]

        return self._launch(issue, [output], out.write_back, opts=opts)

    _allgather_base = all_gather_single  # the name torch used before 2.12

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        """All-gather each ``inputs[i]`` into ``outputs[i]`` (P times its size), as one ringtree
        group; torch's ``allgather_into_tensor_coalesced``.

        Parameters
        ----------
        outputs : list of torch.Tensor
            P x inputs[i].numel() elements each.
        inputs : list of torch.Tensor
            This rank's blocks.
        opts : torch.distributed options or None
            torch's options object for the call; its `timeout` are read. None: the defaults.

        Returns
        -------
        RingtreeWork
            One work for the whole list.
        """
        timeout = self._call_timeout(opts)
        pairs = [self._gather_single(o, i, "all_gather_single_coalesced") for o, i in zip(outputs, inputs)]

        def one(pair, async_op):
            out, x = pair
            return self._comm.all_gather(x.buffer, out.buffer, async_op=async_op, timeout=timeout)

        issue = self._grouped(one, pairs, list(outputs) + list(inputs))
        return self._launch(issue, list(outputs), lambda: [out.write_back() for out, _ in pairs], opts=opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """output_lists[r][i] receives rank r's input_list[i]: one all_gather of the inputs back to back.

        Parameters
        ----------
        output_lists : list of list of torch.Tensor
            P lists, each shaped as input_list.
        input_list : list of torch.Tensor
            This rank's inputs.
        opts : torch.distributed options or None
            torch's options object for the call; its `timeout` are read. None: the defaults.

        Returns
        -------
        RingtreeWork
            The call in flight; wait() re-raises a ringtree error (Timeout, PeerFailure, ...) as is.

        Raises
        ------
        ValueError
            Tensors, root or op the call cannot take, before any traffic.
        """
        inputs = tensor_list(input_list, "allgather_coalesced")
        P, timeout = self._comm.size, self._call_timeout(opts)
        for x in inputs:
            StagedTensor(x, "allgather_coalesced input")  # argument checks only
        output_lists = [list(outputs) for outputs in output_lists]
        if len(output_lists) != P:
            raise ValueError(
                f"ringtree: allgather_coalesced needs {P} output lists (one per rank), got {len(output_lists)}"
            )
        for outputs in output_lists:
            if len(outputs) != len(inputs):
                raise ValueError(
                    f"ringtree: allgather_coalesced: an output list holds {len(outputs)} tensors for "
                    f"{len(inputs)} inputs"
                )
            for out, x in zip(outputs, inputs):
                StagedTensor(out, "allgather_coalesced output")  # argument checks only
                if out.dtype != x.dtype or out.numel() != x.numel():
                    raise ValueError(
                        f"ringtree: allgather_coalesced: output ({out.numel()} x {out.dtype}) does not "
                        f"match its input ({x.numel()} x {x.dtype})"
                    )
        flat = concatenated(inputs, "allgather_coalesced")
        gathered = torch.empty((P, flat.numel()), dtype=flat.dtype, device=flat.device)

        def issue(async_op):
            return [self._comm.all_gather(as_buffer(flat), as_buffer(gathered), async_op=async_op, timeout=timeout)]

        def finish():
            for outputs, block in zip(output_lists, gathered):
                copy_blocks(block, outputs)

        return self._launch(issue, [t for outputs in output_lists for t in outputs], finish, opts=opts)

    def _scatter_single(self, output, input, what, reduction):
        P = self._comm.size
        if output.dtype != input.dtype:
            raise ValueError(f"ringtree: {what}: output dtype {output.dtype} differs from input dtype {input.dtype}")
        if input.numel() != P * output.numel():
            raise ValueError(
                f"ringtree: {what}: input has {input.numel()} elements, expected {P} x "
                f"{output.numel()} (group size x output)"
            )
        return StagedTensor(output, f"{what} output", reduction), StagedTensor(input, f"{what} input", reduction)

    def reduce_scatter_single(self, output, input, opts=None):
        """Rank r's `output` receives the reduction of block r of every rank's `input`
        (dist.reduce_scatter_tensor).

        Parameters
        ----------
        output : torch.Tensor
            One block.
        input : torch.Tensor
            P blocks of output's size and dtype.
        opts : torch.distributed options or None
            torch's options object for the call; its `reduceOp` and `timeout` are read. None: the defaults.

        Returns
        -------
        RingtreeWork
            The call in flight; wait() re-raises a ringtree error (Timeout, PeerFailure, ...) as is.

        Raises
        ------
        ValueError
            Tensors, root or op the call cannot take, before any traffic.
        """
        op = ringtree_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        timeout = self._call_timeout(opts)
        if output.dtype == input.dtype and input.numel() == self._comm.size * output.numel():
            out, x = host_view(output), host_view(input)
            if out is not None and x is not None:
                return self._direct(_REDUCE_SCATTER, x, out, op, [output], input, opts, timeout)
        out, x = self._scatter_single(output, input, "reduce_scatter_single", True)

        def issue(async_op):
            return [self._comm.reduce_scatter(x.buffer, out.buffer, op=op, async_op=async_op, timeout=timeout)]

        return self._launch(issue, [output], out.write_back, opts=opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        """Reduce-scatter each ``inputs[i]`` (P times the output's size) into ``outputs[i]``, as
        one ringtree group; torch's ``reduce_scatter_tensor_coalesced``.

        Parameters
        ----------
        outputs : list of torch.Tensor
            One block each.
        inputs : list of torch.Tensor
            P blocks of the matching output's size each.
        opts : torch.distributed options or None
            torch's options object for the call; its `reduceOp` and `timeout` are read. None: the defaults.

        Returns
        -------
        RingtreeWork
            One work for the whole list.
        """
        op = ringtree_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        timeout = self._call_timeout(opts)
        pairs = [self._scatter_single(o, i, "reduce_scatter_single_coalesced", True) for o, i in zip(outputs, inputs)]

        def one(pair, async_op):
            out, x = pair
            return self._comm.reduce_scatter(x.buffer, out.buffer, op=op, async_op=async_op, timeout=timeout)

        issue = self._grouped(one, pairs, list(outputs) + list(inputs))
        return self._launch(issue, list(outputs), lambda: [out.write_back() for out, _ in pairs], opts=opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        """Rank r's output_tensors[i] receives the reduction over ranks of input_tensors[i][r] (dist.reduce_scatter).

        Parameters
        ----------
        output_tensors : list of torch.Tensor
            This rank's results.
        input_tensors : list of list of torch.Tensor
            One list of P tensors per output, each of the output's size and dtype.
        opts : torch.distributed options or None
            torch's options object for the call; its `reduceOp` and `timeout` are read. None: the defaults.

        Returns
        -------
        RingtreeWork
            The call in flight; wait() re-raises a ringtree error (Timeout, PeerFailure, ...) as is.

        Raises
        ------
        ValueError
            Tensors, root or op the call cannot take, before any traffic.
        """
        output_tensors = tensor_list(output_tensors, "reduce_scatter")
        op = ringtree_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        timeout = self._call_timeout(opts)
        P = self._comm.size
        pairs = []
        for output, inputs in zip(output_tensors, input_tensors):
            inputs = list(inputs)
            if len(inputs) != P:
                raise ValueError(f"ringtree: reduce_scatter needs {P} input tensors (one per rank), got {len(inputs)}")
            if any(t.numel() != output.numel() or t.dtype != output.dtype for t in inputs):
                raise ValueError(
                    "ringtree: reduce_scatter: every input must match the output's size and dtype "
                    f"({output.numel()} x {output.dtype})"
                )
            out = StagedTensor(output, "reduce_scatter output", reduction=True)
            pairs.append((out, torch.cat([t.reshape(-1) for t in inputs])))

        def issue(async_op):
            return [
                self._comm.reduce_scatter(flat, out.buffer, op=op, async_op=async_op, timeout=timeout)
                for out, flat in pairs
            ]

        return self._launch(issue, output_tensors, lambda: [out.write_back() for out, _ in pairs], opts=opts)

    def _all_to_all_counts(self, send_counts, recv_counts, x, out, timeout, async_op):
        """Start one all-to-all with per-rank element counts; every torch all-to-all variant
        goes through here, so ranks that phrase the same exchange differently (with or
        without split sizes) still issue the same ringtree call."""
        return self._comm.all_to_all_v(x, out, send_counts, recv_counts, async_op=async_op, timeout=timeout)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """Rank i's input block j lands in rank j's output block i (dist.all_to_all_single);
        blocks are split evenly over the first dimension, or by the split sizes.

        Parameters
        ----------
        output : torch.Tensor
            Receives the blocks, in rank order.
        input : torch.Tensor
            The blocks to send, in rank order; same dtype as output.
        output_split_sizes : list of int or None
            Rows of output from each rank; None or empty: even blocks.
        input_split_sizes : list of int or None
            Rows of input for each rank; None or empty: even blocks.
        opts : torch.distributed options or None
            torch's options object for the call; its `timeout` are read. None: the defaults.

        Returns
        -------
        RingtreeWork
            The call in flight; wait() re-raises a ringtree error (Timeout, PeerFailure, ...) as is.

        Raises
        ------
        ValueError
            Tensors, root or op the call cannot take, before any traffic.
        """
        timeout = self._call_timeout(opts)
        if output.dtype != input.dtype:
            raise ValueError(
                f"ringtree: all_to_all_single: output dtype {output.dtype} differs from input dtype {input.dtype}"
            )
        send_counts = self._split_counts(input, input_split_sizes, "input")
        recv_counts = self._split_counts(output, output_split_sizes, "output")
        out, x = StagedTensor(output, "all_to_all_single output"), StagedTensor(input, "all_to_all_single input")
        send_counts = [c * elements_per_item(input.dtype) for c in send_counts]
        recv_counts = [c * elements_per_item(output.dtype) for c in recv_counts]

        def issue(async_op):
            return [self._all_to_all_counts(send_counts, recv_counts, x.buffer, out.buffer, timeout, async_op)]

        return self._launch(issue, [output], out.write_back, opts=opts)

    alltoall_base = all_to_all_single

    def _split_counts(self, tensor, split_sizes, what):
        P = self._comm.size
        split_sizes = list(split_sizes or [])
        if not split_sizes:
            rows = tensor.size(0) if tensor.dim() else 1
            if rows % P:
                raise ValueError(
                    f"ringtree: all_to_all_single: {what} dim 0 ({rows}) is not divisible by the "
                    f"group size {P}; give split sizes"
                )
            return [tensor.numel() // P] * P
        if len(split_sizes) != P:
            raise ValueError(f"ringtree: all_to_all_single: {len(split_sizes)} {what} split sizes for {P} ranks")
        if sum(split_sizes) != (tensor.size(0) if tensor.dim() else 1):
            raise ValueError(
                f"ringtree: all_to_all_single: {what} split sizes {split_sizes} do not add up to "
                f"dim 0 ({tensor.size(0) if tensor.dim() else 1})"
            )
        return [int(s) * row_elements(tensor) for s in split_sizes]

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """Rank i's input_tensors[j] lands in rank j's output_tensors[i] (dist.all_to_all).

        Parameters
        ----------
        output_tensors : list of torch.Tensor
            P tensors, one from each rank.
        input_tensors : list of torch.Tensor
            P tensors, one for each rank; one dtype throughout.
        opts : torch.distributed options or None
            torch's options object for the call; its `timeout` are read. None: the defaults.

        Returns
        -------
        RingtreeWork
            The call in flight; wait() re-raises a ringtree error (Timeout, PeerFailure, ...) as is.

        Raises
        ------
        ValueError
            Tensors, root or op the call cannot take, before any traffic.
        """
        P, timeout = self._comm.size, self._call_timeout(opts)
        output_tensors, input_tensors = list(output_tensors), list(input_tensors)
        if len(output_tensors) != P or len(input_tensors) != P:
            raise ValueError(
                f"ringtree: alltoall needs {P} input and {P} output tensors, got "
                f"{len(input_tensors)} and {len(output_tensors)}"
            )
        for t in output_tensors + input_tensors:
            StagedTensor(t, "alltoall tensor")  # argument checks only
        x = concatenated(input_tensors, "alltoall")
        if any(t.dtype != x.dtype for t in output_tensors):
            raise ValueError("ringtree: alltoall: inputs and outputs must share one dtype")
        out = torch.empty(sum(t.numel() for t in output_tensors), dtype=x.dtype, device=x.device)
        xb, outb = as_buffer(x), as_buffer(out)
        send_counts = [t.numel() * elements_per_item(x.dtype) for t in input_tensors]
        recv_counts = [t.numel() * elements_per_item(x.dtype) for t in output_tensors]

        def issue(async_op):
            return [self._all_to_all_counts(send_counts, recv_counts, xb, outb, timeout, async_op)]

        return self._launch(issue, output_tensors, lambda: copy_blocks(out, output_tensors), opts=opts)

    def gather(self, output_tensors, input_tensors, opts=None):
        """The root's output_tensors[0][r] receives rank r's input (dist.gather).

        Parameters
        ----------
        output_tensors : list of list of torch.Tensor
            On the root, one list of P tensors of the input's size and dtype; empty elsewhere.
        input_tensors : list of torch.Tensor
            One tensor.
        opts : torch.distributed options or None
            torch's options object for the call; its `rootRank` and `timeout` are read. None: the defaults.

        Returns
        -------
        RingtreeWork
            The call in flight; wait() re-raises a ringtree error (Timeout, PeerFailure, ...) as is.

        Raises
        ------
        ValueError
            Tensors, root or op the call cannot take, before any traffic.
        """
        input_tensors = tensor_list(input_tensors, "gather")
        if len(input_tensors) != 1:
            raise ValueError(f"ringtree: gather takes one input tensor, got {len(input_tensors)}")
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "gather")
        timeout, P = self._call_timeout(opts), self._comm.size
        x = StagedTensor(input_tensors[0], "gather input")
        outputs = []
        if self._comm.rank == root:
            if len(output_tensors) != 1 or len(output_tensors[0]) != P:
                raise ValueError(f"ringtree: gather: the root needs one list of {P} output tensors")
            outputs = list(output_tensors[0])
            if any(o.numel() != x.tensor.numel() or o.dtype != x.tensor.dtype for o in outputs):
                raise ValueError("ringtree: gather: every output must match the input's size and dtype")
        elif output_tensors and any(len(o) for o in output_tensors):
            raise ValueError(f"ringtree: gather: only the root (rank {root}) passes output tensors")
        flat = torch.empty(P * x.tensor.numel(), dtype=x.tensor.dtype, device=x.tensor.device) if outputs else None

        def issue(async_op):
            out = as_buffer(flat) if flat is not None else None
            return [self._comm.gather(x.buffer, out, root=root, async_op=async_op, timeout=timeout)]

        return self._launch(issue, outputs, (lambda: copy_blocks(flat, outputs)) if outputs else None, opts=opts)

    def scatter(self, output_tensors, input_tensors, opts=None):
        """Rank r's output receives the root's input_tensors[0][r] (dist.scatter).

        Parameters
        ----------
        output_tensors : list of torch.Tensor
            One tensor.
        input_tensors : list of list of torch.Tensor
            On the root, one list of P tensors of the output's size and dtype; empty elsewhere.
        opts : torch.distributed options or None
            torch's options object for the call; its `rootRank` and `timeout` are read. None: the defaults.

        Returns
        -------
        RingtreeWork
            The call in flight; wait() re-raises a ringtree error (Timeout, PeerFailure, ...) as is.

        Raises
        ------
        ValueError
            Tensors, root or op the call cannot take, before any traffic.
        """
        output_tensors = tensor_list(output_tensors, "scatter")
        if len(output_tensors) != 1:
            raise ValueError(f"ringtree: scatter takes one output tensor, got {len(output_tensors)}")
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "scatter")
        timeout, P = self._call_timeout(opts), self._comm.size
        out = StagedTensor(output_tensors[0], "scatter output")
        flat = None
        if self._comm.rank == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != P:
                raise ValueError(f"ringtree: scatter: the root needs one list of {P} input tensors")
            inputs = list(input_tensors[0])
            if any(t.numel() != out.tensor.numel() or t.dtype != out.tensor.dtype for t in inputs):
                raise ValueError("ringtree: scatter: every input must match the output's size and dtype")
            flat = as_buffer(concatenated(inputs, "scatter"))
        elif input_tensors and any(len(i) for i in input_tensors):
            raise ValueError(f"ringtree: scatter: only the root (rank {root}) passes input tensors")

        def issue(async_op):
            return [self._comm.scatter(flat, out.buffer, root=root, async_op=async_op, timeout=timeout)]

        return self._launch(issue, output_tensors, out.write_back, opts=opts)

    def barrier(self, opts=None):
        """Complete once every rank has entered (dist.barrier).

        Parameters
        ----------
        opts : torch.distributed options or None
            torch's options object for the call; its `timeout` are read. None: the defaults.

        Returns
        -------
        RingtreeWork
            The barrier in flight.
        """
        timeout = self._call_timeout(opts)
        return self._launch(lambda async_op: [self._comm.barrier(async_op=async_op, timeout=timeout)], [], opts=opts)

    # point to point ---------------------------------------------------------------------
    # Tagged messages (Communicator.isend / irecv): beside the group's call order, so a send
    # never waits for a collective or for the peer's receive, and recv may name no source.

    def _check_p2p(self, peer, tag, what):
        if not 0 <= peer < self._comm.size or peer == self._comm.rank:
            raise ValueError(f"ringtree: {what}: peer {peer} must be another rank of this group of {self._comm.size}")
        self._check_tag(tag, what)

    @staticmethod
    def _check_tag(tag, what):
        if tag < 0:
            raise ValueError(f"ringtree: {what}: tag must be >= 0, got {tag}")

    def _messages(self, issue, outputs, finish=None):
        """Start the messages issue() makes; a completion thread waits for them, runs
        finish(messages) (checks sizes, copies into CUDA or non-contiguous tensors) and
        completes the work."""
        work = RingtreeMessageWork(outputs, issue())
        done = None
        if finish is not None:
            device = cuda_device_of(outputs)

            def done():
                finish(work.messages)
                if device is not None:  # the copies ran on this thread's stream
                    torch.cuda.current_stream(device).synchronize()

        self._completer.submit(work.messages, done, work)
        return work

    def send(self, tensors, dstRank, tag=0):  # noqa: N803 - torch's argument names
        """Send each tensor to `dstRank` as a tagged message (dist.send), beside the call order.

        Parameters
        ----------
        tensors : list of torch.Tensor
            The data.
        dstRank : int
            Another rank of the group.
        tag : int
            A tag >= 0 that the receive matches.

        Returns
        -------
        RingtreeWork
            The call in flight; wait() re-raises a ringtree error (Timeout, PeerFailure, ...) as is.

        Raises
        ------
        ValueError
            A peer that is not another rank of the group, or a negative tag, before any traffic.
        """
        tensors = tensor_list(tensors, "send")
        self._check_p2p(dstRank, tag, "send")
        staged = [MessageBuffer(t, "send tensor", copy_in=True) for t in tensors]
        return self._messages(lambda: [self._comm.isend(s.buffer, dstRank, tag) for s in staged], tensors)

    def recv(self, tensors, srcRank, tag=0):  # noqa: N803
        """Receive into each tensor a message from `srcRank` with `tag` (dist.recv).

        Parameters
        ----------
        tensors : list of torch.Tensor
            Receive the data.
        srcRank : int
            Another rank of the group.
        tag : int
            The tag to match, >= 0.

        Returns
        -------
        RingtreeWork
            The call in flight; wait() re-raises a ringtree error (Timeout, PeerFailure, ...) as is.

        Raises
        ------
        ValueError
            A peer that is not another rank of the group, or a negative tag, before any traffic.
        """
        tensors = tensor_list(tensors, "recv")
        self._check_p2p(srcRank, tag, "recv")
        return self._receive(tensors, srcRank, tag)

    def recv_anysource(self, tensors, tag=0):
        """Receive into one tensor the first message with `tag` from any rank (dist.recv with
        src=None); the work's source_rank() then says who sent it.

        Parameters
        ----------
        tensors : list of torch.Tensor
            One tensor.
        tag : int
            The tag to match, >= 0.

        Returns
        -------
        RingtreeWork
            The call in flight; wait() re-raises a ringtree error (Timeout, PeerFailure, ...) as is.

        Raises
        ------
        ValueError
            More than one tensor, or a negative tag, before any traffic.
        """
        tensors = tensor_list(tensors, "recv")
        if len(tensors) != 1:
            raise ValueError(f"ringtree: recv from any source takes one tensor, got {len(tensors)}")
        self._check_tag(tag, "recv")
        return self._receive(tensors, ANY_SOURCE, tag)

    def _receive(self, tensors, src, tag):
        staged = [MessageBuffer(t, "recv tensor", copy_in=False) for t in tensors]
        return self._messages(
            lambda: [self._comm.irecv(s.buffer, src, tag) for s in staged],
            tensors,
            lambda messages: [s.write_back(m) for s, m in zip(staged, messages)],
        )


# --- creation -----------------------------------------------------------------------------


def _unique_id_through_store(store, rank, size, timeout):
    """The group's unique id through the store, as rt.init() gets one under torchrun (the same
    code: only public parts when the job has a secret).

    torch gives each group its own prefixed store, but the same store may serve several
    groups in a row (an explicit store, or creation retried), so every rank also counts
    its creations on this store: the k-th group each rank builds reads the k-th id.
    """
    generation = store.add(f"ringtree/creations/rank{rank}", 1)
    seconds = default_timeout() if timeout is None else timeout
    return _launchers.unique_id_through_store(
        store, f"ringtree/uid/{generation}", rank, seconds, _launchers.spans_hosts_under_torch(size)
    )


def create_process_group(store, rank, size, timeout):
    """The creator torch calls for backend "ringtree": (store, rank, size, timeout) -> group.

    The group's timeout bounds set-up and every collective. A timeout given to
    init_process_group / new_group is used as is; torch's default (30 minutes) gives way to
    ringtree's own RINGTREE_TIMEOUT (default 300 s), so a stalled peer surfaces in minutes.

    Parameters
    ----------
    store : torch.distributed.Store
        Carries rank 0's unique id to the other ranks.
    rank : int
        This process's rank in the group.
    size : int
        The group's size.
    timeout : datetime.timedelta or None
        torch's timeout for the group.

    Returns
    -------
    ProcessGroupRingtree
        The group, over a new communicator.
    """
    seconds = timeout_seconds(timeout)
    if seconds is None or timeout == default_pg_timeout:
        seconds = default_timeout()
    token = _unique_id_through_store(store, rank, size, seconds)
    comm = Communicator(rank, size, token, seconds)
    return ProcessGroupRingtree(comm, store=store, timeout=seconds)
