"""Grouped and persistent calls: what Communicator adds to run many calls as one operation
(comm.group()) and to plan a call once and run it again (comm.all_reduce_init() and the others).

On host buffers (numpy arrays, torch CPU tensors) the core checks, chooses and plans them
(runtime/batch.cc). Calls on CUDA buffers are enqueued on their stream by the device path
(CudaComm), one by one: a group issues its device calls when it ends, after its host calls, in
issue order with each send paired with a receive; a persistent device call is converted and
checked once and enqueued again at each start.
"""

from __future__ import annotations

from . import _core
from ._args import COLL_CODES, algo_code, counts
from ._buffers import call_buffers, call_fields
from ._work import Work
from .ops import resolve_op

__all__ = ["Group", "Request", "DeviceCall"]

_SEND, _RECV, _SENDRECV = COLL_CODES["send"], COLL_CODES["recv"], COLL_CODES["sendrecv"]
_ALL_REDUCE, _ALL_GATHER = COLL_CODES["all_reduce"], COLL_CODES["all_gather"]
_REDUCE_SCATTER = COLL_CODES["reduce_scatter"]


class DeviceCall:
    """A call on CUDA buffers, converted and checked: run() enqueues it on its stream.

    `head` is the device path's argument list up to use_nccl: (coll, the nine buffer fields of
    call_fields, op, factor, root, peer, recv_peer, algo, timeout, stream, use_nccl)."""

    __slots__ = ("_cuda", "head", "send_counts", "recv_counts", "deterministic")

    def __init__(self, cuda, head, send_counts, recv_counts, deterministic):
        self._cuda, self.head = cuda, head
        self.send_counts, self.recv_counts, self.deterministic = send_counts, recv_counts, deterministic

    def run(self, async_op):
        return self._cuda().run(*self.head, bool(async_op), self.send_counts, self.recv_counts, self.deterministic)

    def paired(self, recv):
        """This send and `recv` as one sendrecv (both directions progress together), or None
        when they cannot be one call (other dtypes or streams)."""
        s, r = self.head, recv.head
        if s[1] != r[1] or s[17] != r[17] or s[18] != r[18]:
            return None
        head = (_SENDRECV, *s[1:6], *r[6:10], *s[10:14], r[13], s[15], max(s[16], r[16], key=_timeout_key), *s[17:])
        return DeviceCall(self._cuda, head, [], [], False)


def _timeout_key(t):
    return float("inf") if t < 0 else t  # < 0: the communicator's default, which bounds nothing tighter


def run_device_calls(calls, async_op):
    """Enqueue a group's device calls: the collectives in issue order, then the sends and receives,
    the k-th send with the k-th receive as one sendrecv (as the host path runs a group). Returns
    their works (async_op) or an empty list."""
    collectives = [c for c in calls if c.head[0] not in (_SEND, _RECV)]
    sends = [c for c in calls if c.head[0] == _SEND]
    recvs = [c for c in calls if c.head[0] == _RECV]
    ordered = list(collectives)
    for k in range(max(len(sends), len(recvs))):
        pair = sends[k].paired(recvs[k]) if k < len(sends) and k < len(recvs) else None
        if pair is not None:
            ordered.append(pair)
            continue
        ordered.extend(c[k] for c in (sends, recvs) if k < len(c))
    works = [c.run(async_op) for c in ordered]
    return [w for w in works if w is not None]


class AllWorks:
    """Several works in flight as one (a group's host part and its device calls)."""

    __slots__ = ("_works",)

    def __init__(self, works):
        self._works = [w for w in works if w is not None]

    def wait(self, timeout=-1.0):
        return all(w.wait(timeout) is not False for w in self._works)

    def is_completed(self):
        return all(w.is_completed() for w in self._works)


class PendingWork:
    """What an async call on CUDA buffers inside a group returns: the group's device work, once
    the group has ended."""

    __slots__ = ("works",)

    def __init__(self):
        self.works = None

    def wait(self, timeout=-1.0):
        if self.works is None:
            raise _core.Aborted("this call's group has not run: it has not ended, or it was discarded")
        return self.works.wait(timeout)

    def is_completed(self):
        return self.works is not None and self.works.is_completed()


class DeviceRequest:
    """What Request runs for persistent calls with device buffers: the host part (a core Request,
    or None) and then the device calls, in that order, at each start."""

    __slots__ = ("_host", "_calls")

    def __init__(self, host, calls):
        self._host, self._calls = host, calls

    def start(self, async_op):
        works = [self._host.start(async_op)] if self._host is not None else []
        works += run_device_calls(self._calls, async_op)
        return AllWorks(works) if async_op else None

    def start_function(self):
        return lambda: self.start(False)


class Request:
    """A persistent call, or a persistent group: validated, chosen and planned once, run again on
    the same buffers by each start() with only the data moving (MPI's persistent collectives).

    Made by ``comm.all_reduce_init()`` and the other ``*_init`` methods, or by
    ``comm.group(persistent=True)``. Every start is a call in the communicator's order, with its
    own sequence number and fingerprint: every rank must start its requests in the same order.
    The buffers are held until the request is dropped and its last start is done.
    """

    __slots__ = ("_req", "_run", "_keep", "_result", "_work")

    def __init__(self, req, keep, result):
        self._req, self._keep, self._result = req, keep, result
        self._run = req.start_function()
        self._work = None

    def start(self, async_op: bool = False):
        """Run the call (or the group) once more.

        Parameters
        ----------
        async_op : bool
            False: run it now and return when it is done. True: queue it behind this
            communicator's earlier calls and return at once.

        Returns
        -------
        object
            Blocking: the call's output buffer (None for a barrier, a send or a group). Async: a
            ringtree.Work whose wait() returns it; wait() on the request does the same.

        Raises
        ------
        InvalidArgument
            An async start of this request is still running, or a group is open.
        CollectiveMismatch, PeerFailure, Timeout, Aborted
            As the plain call would.
        """
        if async_op is False:
            self._run()
            return self._result
        work = Work(self._req.start(True), self._keep, self._result)  # a dropped request's too
        self._work = work
        return work

    def wait(self, timeout: float | None = None):
        """Wait for the last async start.

        Parameters
        ----------
        timeout : float or None
            Seconds to wait; None waits for as long as the call's own timeout allows.

        Returns
        -------
        object
            The output buffer, as start() returns it.

        Raises
        ------
        Timeout
            Still running after `timeout` seconds.
        """
        work, self._work = self._work, None
        return self._result if work is None else work.wait(timeout)

    def is_completed(self) -> bool:
        """Whether the last start has finished, without waiting.

        Returns
        -------
        bool
            True once it completed or failed, and when it ran blocking or never ran.
        """
        return self._work is None or self._work.is_completed()


class Group:
    """``with comm.group():`` collects the calls made in the block and runs them as one operation
    when it ends (NCCL's ncclGroupStart/ncclGroupEnd).

    Calls inside the block return at once; their buffers hold results once the block has ended
    (or, with async_op=True, once wait() returned). An exception inside the block discards the
    group: nothing was sent and the communicator stays usable. After an async block, the Group
    is its Work (wait(), is_completed()); after a persistent block, it holds a Request that runs
    the group at each start().
    """

    __slots__ = ("_comm", "_async", "_persistent", "_work", "_request")

    def __init__(self, comm, async_op: bool, persistent: bool):
        if async_op and persistent:
            raise _core.InvalidArgument("group: a persistent group is started later; pass async_op to its start()")
        self._comm, self._async, self._persistent = comm, bool(async_op), bool(persistent)
        self._work = None
        self._request = None

    @property
    def work(self):
        """The group's Work after an ``async_op=True`` block (None before the block ends, and for
        a blocking or persistent group)."""
        return self._work

    @property
    def request(self):
        """The group's Request after a ``persistent=True`` block: ``start()`` runs the group again
        on the same buffers (None otherwise)."""
        return self._request

    def __enter__(self):
        self._comm.group_start()
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self._comm._group_discard()
            return False
        if self._persistent:
            self._request = self._comm._group_end_persistent()
        else:
            self._work = self._comm.group_end(async_op=self._async)
        return False

    def wait(self, timeout: float | None = None):
        """Wait for an async group (returns at once after a blocking one).

        Parameters
        ----------
        timeout : float or None
            Seconds to wait; None: until the group's calls finish or time out.

        Returns
        -------
        None

        Raises
        ------
        Timeout
            Still running after `timeout` seconds.
        """
        if self.work is not None:
            self.work.wait(timeout)

    def is_completed(self) -> bool:
        """Whether the group has run, without waiting.

        Returns
        -------
        bool
            True once its calls completed or failed; always True after a blocking group.
        """
        return self.work is None or self.work.is_completed()

    def start(self, async_op: bool = False):
        """Run a persistent group once more (Request.start of its request).

        Parameters
        ----------
        async_op : bool
            True: queue it and return a Work at once.

        Returns
        -------
        ringtree.Work or None
            The Work with async_op=True, else None once the group has run.

        Raises
        ------
        InvalidArgument
            The group was not made with persistent=True, or its block has not ended.
        """
        if self.request is None:
            raise _core.InvalidArgument("group: start() needs a group made with persistent=True, after its block")
        return self.request.start(async_op)


class Grouping:
    """What Communicator adds for grouped and persistent calls (see Group and Request)."""

    __slots__ = ()

    # --- groups -------------------------------------------------------------------------

    def group(self, async_op: bool = False, persistent: bool = False) -> Group:
        """Collect the calls made inside a ``with`` block and run them as one operation.

        The group is checked once (every rank must issue the same collectives in the same order;
        a mismatch names the call within the group, on every rank), small all_reduces of one
        dtype and op are fused into one call, the other collectives run in issue order and the
        sends and receives after them, paired so that an exchange cannot deadlock. Groups nest;
        the outermost one runs them.

        Parameters
        ----------
        async_op : bool
            True: the block's end queues the group and returns; the Group is then its Work.
        persistent : bool
            True: the block's end runs nothing; the Group's start() (or .request) runs it, again
            and again, on the same buffers.

        Returns
        -------
        Group
            The context manager.

        Raises
        ------
        InvalidArgument
            Both async_op and persistent were given, or a call in the block was bad (the group
            is then discarded).
        """
        return Group(self, async_op, persistent)

    # --- coalesced calls: a list of one collective's calls as one group ---------------------

    def all_reduce_coalesced(
        self, xs, outs=None, op="sum", algo="auto", async_op: bool = False, timeout=None, deterministic: bool = False
    ):
        """all_reduce(xs[i], outs[i]) for every i, as one group (torch's all_reduce_coalesced;
        the same as ``with comm.group():`` and one all_reduce per buffer).

        One call from Python for the whole list: small buffers of one dtype are fused into one
        reduction, and the calls are checked as a group (a mismatch names the call's index).

        Parameters
        ----------
        xs : list or tuple
            The inputs (buffers); they may differ in dtype and size.
        outs : list or tuple or None
            One output buffer per input; None: each input is reduced in place.
        op, algo, timeout, deterministic
            As for all_reduce, for every call.
        async_op : bool
            True: return one Work for the whole list at once.

        Returns
        -------
        list or Work
            `outs` (`xs` in place), or with `async_op`, a Work whose wait() returns it.

        Raises
        ------
        InvalidArgument
            The lists differ in length, or a call is bad (its index is named); nothing was sent.
        CollectiveMismatch, PeerFailure, Timeout, Aborted
            As the calls of a group would.
        """
        result = xs if outs is None else outs
        done = self._fast_many(_ALL_REDUCE, xs, outs, op, algo, timeout, deterministic, async_op, result)
        if done is not NotImplemented and async_op is False:  # the common case: one C call
            return done
        return self._coalesced("all_reduce", xs, outs, op, algo, async_op, timeout, deterministic, result, done)

    def all_gather_coalesced(self, xs, outs, algo="auto", async_op: bool = False, timeout=None):
        """all_gather(xs[i], outs[i]) for every i, as one group (torch's
        all_gather_into_tensor_coalesced).

        Parameters
        ----------
        xs, outs : list or tuple
            Buffers, as many outputs as inputs: call i gathers every rank's xs[i] into outs[i]
            (P times its size), in rank order.
        algo, timeout
            As for all_gather, for every call.
        async_op : bool
            True: return one Work for the whole list at once.

        Returns
        -------
        list or Work
            `outs`, or with `async_op`, a Work whose wait() returns it.

        Raises
        ------
        InvalidArgument
            The lists differ in length, or a call is bad (its index is named); nothing was sent.
        CollectiveMismatch, PeerFailure, Timeout, Aborted
            As the calls of a group would.
        """
        done = self._fast_many(_ALL_GATHER, xs, outs, "sum", algo, timeout, False, async_op, outs)
        if done is not NotImplemented and async_op is False:
            return done
        return self._coalesced("all_gather", xs, outs, "sum", algo, async_op, timeout, False, outs, done)

    def reduce_scatter_coalesced(
        self, xs, outs, op="sum", algo="auto", async_op: bool = False, timeout=None, deterministic: bool = False
    ):
        """reduce_scatter(xs[i], outs[i]) for every i, as one group (torch's
        reduce_scatter_tensor_coalesced).

        Parameters
        ----------
        xs, outs : list or tuple
            Buffers, as many outputs as inputs: call i reduces xs[i] (P blocks) and gives this
            rank its block in outs[i].
        op, algo, timeout, deterministic
            As for reduce_scatter, for every call.
        async_op : bool
            True: return one Work for the whole list at once.

        Returns
        -------
        list or Work
            `outs`, or with `async_op`, a Work whose wait() returns it.

        Raises
        ------
        InvalidArgument
            The lists differ in length, or a call is bad (its index is named); nothing was sent.
        CollectiveMismatch, PeerFailure, Timeout, Aborted
            As the calls of a group would.
        """
        done = self._fast_many(_REDUCE_SCATTER, xs, outs, op, algo, timeout, deterministic, async_op, outs)
        if done is not NotImplemented and async_op is False:
            return done
        return self._coalesced("reduce_scatter", xs, outs, op, algo, async_op, timeout, deterministic, outs, done)

    def _coalesced(self, coll, xs, outs, op, algo, async_op, timeout, deterministic, result, done):
        """A *_coalesced call after its method's C call returned `done`: an async call's core Work
        and the buffers it keeps, or NotImplemented (torch tensors, device buffers, bad arguments,
        an open group), and then the list is issued call by call inside a group, where each call
        converts and explains."""
        if done is not NotImplemented:
            work, keep = done
            return Work(work, keep, result)
        name = f"{coll}_coalesced"
        for what, seq in (("xs", xs), ("outs", outs)):
            if seq is not None and not isinstance(seq, (list, tuple)):
                got = type(seq).__name__
                raise _core.InvalidArgument(f"{name}: {what} must be a list or tuple of buffers, got {got}")
        if outs is not None and len(outs) != len(xs):
            raise _core.InvalidArgument(f"{name}: {len(xs)} inputs but {len(outs)} outputs; give one output per input")
        call = getattr(self, coll)
        kw = dict(algo=algo, timeout=timeout)
        if coll != "all_gather":
            kw.update(op=op, deterministic=deterministic)
        enclosed = self._grouping is not None
        self.group_start()
        try:
            for i, x in enumerate(xs):
                call(x, x if outs is None else outs[i], **kw)
        except BaseException:
            if enclosed:  # as for calls issued one by one there: the enclosing group decides
                self.group_end()
            else:
                self._group_discard()
            raise
        work = self.group_end(async_op)
        if work is None:
            return result
        work._result = result  # the group's Work hands back the list, as the fast route's does
        return work

    def group_start(self) -> None:
        """Start collecting calls (the explicit form of ``with comm.group():``).

        Returns
        -------
        None
        """
        self._core.group_start()
        if self._grouping is None:
            self._grouping = []
            # The group's own C entry keeps each call's buffers in this list until the group runs.
            self._fast = self._core.fast_call_function(self._grouping)

    def group_end(self, async_op: bool = False):
        """Run the calls collected since group_start() as one operation.

        Parameters
        ----------
        async_op : bool
            True: queue the group and return its Work at once.

        Returns
        -------
        ringtree.Work or None
            The group's Work (async_op=True), else None once every call is done.

        Raises
        ------
        InvalidArgument
            No group is open.
        CollectiveMismatch
            The ranks' groups differ; the message names the first call that differs.
        PeerFailure, Timeout, Aborted
            As the calls would.
        """
        try:
            work = self._core.group_end(bool(async_op))
        finally:
            keep = self._leave_group()
        device = [] if self._grouping is not None else [k for k in keep if type(k) is DeviceCall]
        if device:  # the outermost end: its device calls follow its host calls
            pending = [k for k in keep if type(k) is PendingWork]
            work = AllWorks([work, *run_device_calls(device, async_op or pending)])
            for p in pending:
                p.works = work
        return Work(work, keep, None) if async_op else None

    def _group_end_persistent(self) -> Request:
        try:
            req = self._core.group_end_persistent()
        finally:
            keep = self._leave_group()
        if any(type(k) is PendingWork for k in keep):
            raise _core.InvalidArgument("a persistent group cannot hold async calls: start() it async instead")
        device = [k for k in keep if type(k) is DeviceCall]
        if device:
            req = DeviceRequest(req, device)
        return Request(req, keep, None)

    def _collect_device(self, call, keep, async_op, result):
        """A call on CUDA buffers inside a group: checked now by the core (no traffic), enqueued
        on its stream when the group ends."""
        h = call.head
        if h[0] == COLL_CODES["all_to_all_v"]:
            raise _core.InvalidArgument(
                "all_to_all_v: on CUDA buffers it runs outside a group; issue it after the group"
            )
        self._core.persistent(*h[:14], h[15], h[16], h[14], call.deterministic)
        self._grouping += (keep, call)
        if async_op is False:
            return result
        pending = PendingWork()
        self._grouping.append(pending)
        return Work(pending, None, result)  # the group keeps the buffers, and its Work after it ends

    def _group_discard(self) -> None:
        self._core.group_discard()  # the whole group, nested ones too
        self._leave_group()

    def _leave_group(self):
        keep = self._grouping
        if not self._core.in_group:
            self._grouping = None
            self._fast = self._plain_fast
        return keep

    # --- persistent calls ---------------------------------------------------------------

    def _init(
        self, coll, x, out, op="sum", root=0, peer=-1, algo="auto", timeout=None, recv_peer=-1, det=False, vc=None
    ):
        inb, outb = call_buffers(x, out, f"{coll}_init")
        if timeout is not None and not float(timeout) > 0:
            raise _core.InvalidArgument(f"{coll}_init: timeout must be positive, got {timeout}")
        op_code, factor = resolve_op(op)
        t = -1.0 if timeout is None else float(timeout)
        fields = call_fields(inb, outb)
        # The core checks the call here either way (no traffic, and it reads no buffer); a call
        # on CUDA buffers then runs on the device path at each start, on the stream it has now.
        send_counts, recv_counts = (counts(c, n) for c, n in zip(vc or ((), ()), ("send_counts", "recv_counts")))
        some = inb or outb
        use_nccl = isinstance(algo, str) and algo.lower() == "nccl"
        if use_nccl and not (some and some.device):
            raise _core.InvalidArgument(
                f"{coll}_init: algo='nccl' needs CUDA buffers (torch CUDA tensors, cupy arrays); "
                f"host buffers take the ringtree algorithms"
            )
        code = 0 if use_nccl else algo_code(algo)  # the core checks the rest as an auto call
        req = self._core.persistent(
            COLL_CODES[coll],
            *fields,
            op_code,
            factor,
            int(root),
            int(peer),
            code,
            t,
            int(recv_peer),
            bool(det),
            send_counts,
            recv_counts,
        )
        if some and some.device:
            head = (COLL_CODES[coll], *fields, op_code, factor, int(root), int(peer), int(recv_peer))
            head += (code, t, some.stream, use_nccl)
            req = DeviceRequest(None, [DeviceCall(self._cuda_comm, head, send_counts, recv_counts, bool(det))])
        result = out if coll not in ("broadcast", "send", "barrier") else (x if coll == "broadcast" else None)
        return Request(req, (x, out), result)

    def all_reduce_init(self, x, out=None, op="sum", algo="auto", timeout=None, deterministic=False) -> Request:
        """A persistent all_reduce (see all_reduce): checked, chosen and planned now.

        Parameters
        ----------
        x, out, op, algo, timeout, deterministic
            As all_reduce takes them; out=None reduces in place.

        Returns
        -------
        Request
            Its start() runs the all_reduce on these buffers and returns out.

        Raises
        ------
        InvalidArgument
            As all_reduce would, now, before any traffic.
        """
        return self._init("all_reduce", x, x if out is None else out, op, algo=algo, timeout=timeout, det=deterministic)

    def reduce_scatter_init(self, x, out, op="sum", algo="auto", timeout=None, deterministic=False) -> Request:
        """A persistent reduce_scatter (see reduce_scatter and all_reduce_init).

        Parameters
        ----------
        x, out, op, algo, timeout, deterministic
            As reduce_scatter takes them.

        Returns
        -------
        Request
            Its start() runs the reduce_scatter on these buffers and returns out.

        Raises
        ------
        InvalidArgument
            As reduce_scatter would.
        """
        return self._init("reduce_scatter", x, out, op, algo=algo, timeout=timeout, det=deterministic)

    def all_gather_init(self, x, out, algo="auto", timeout=None) -> Request:
        """A persistent all_gather (see all_gather and all_reduce_init).

        Parameters
        ----------
        x, out, algo, timeout
            As all_gather takes them.

        Returns
        -------
        Request
            Its start() runs the all_gather on these buffers and returns out.

        Raises
        ------
        InvalidArgument
            As all_gather would.
        """
        return self._init("all_gather", x, out, algo=algo, timeout=timeout)

    def all_to_all_init(self, x, out, algo="auto", timeout=None) -> Request:
        """A persistent all_to_all (see all_to_all and all_reduce_init).

        Parameters
        ----------
        x, out, algo, timeout
            As all_to_all takes them.

        Returns
        -------
        Request
            Its start() runs the all_to_all on these buffers and returns out.

        Raises
        ------
        InvalidArgument
            As all_to_all would.
        """
        return self._init("all_to_all", x, out, algo=algo, timeout=timeout)

    def all_to_all_v_init(self, x, out, send_counts, recv_counts, timeout=None) -> Request:
        """A persistent all_to_all_v (see all_to_all_v and all_reduce_init): the counts are fixed
        with the buffers.

        Parameters
        ----------
        x, out, send_counts, recv_counts, timeout
            As all_to_all_v takes them.

        Returns
        -------
        Request
            Its start() runs the all_to_all_v on these buffers and returns out.

        Raises
        ------
        InvalidArgument
            As all_to_all_v would, now, before any traffic.
        """
        return self._init("all_to_all_v", x, out, timeout=timeout, vc=(send_counts, recv_counts))

    def broadcast_init(self, x, root=0, algo="auto", timeout=None) -> Request:
        """A persistent broadcast (see broadcast and all_reduce_init).

        Parameters
        ----------
        x, root, algo, timeout
            As broadcast takes them.

        Returns
        -------
        Request
            Its start() returns x.

        Raises
        ------
        InvalidArgument
            As broadcast would.
        """
        return self._init("broadcast", x, None, root=root, algo=algo, timeout=timeout)

    def reduce_init(self, x, out=None, root=0, op="sum", algo="auto", timeout=None, deterministic=False) -> Request:
        """A persistent reduce (see reduce and all_reduce_init).

        Parameters
        ----------
        x, out, root, op, algo, timeout, deterministic
            As reduce takes them.

        Returns
        -------
        Request
            Its start() returns the root's result (None elsewhere).

        Raises
        ------
        InvalidArgument
            As reduce would.
        """
        if out is None and self.rank == root:
            out = x
        if self.rank != root:
            out = None
        return self._init("reduce", x, out, op, root, algo=algo, timeout=timeout, det=deterministic)

    def gather_init(self, x, out=None, root=0, algo="auto", timeout=None) -> Request:
        """A persistent gather (see gather and all_reduce_init).

        Parameters
        ----------
        x, out, root, algo, timeout
            As gather takes them.

        Returns
        -------
        Request
            Its start() returns the root's out (None elsewhere).

        Raises
        ------
        InvalidArgument
            As gather would.
        """
        return self._init("gather", x, out if self.rank == root else None, root=root, algo=algo, timeout=timeout)

    def scatter_init(self, x, out, root=0, algo="auto", timeout=None) -> Request:
        """A persistent scatter (see scatter and all_reduce_init).

        Parameters
        ----------
        x, out, root, algo, timeout
            As scatter takes them.

        Returns
        -------
        Request
            Its start() returns out.

        Raises
        ------
        InvalidArgument
            As scatter would.
        """
        return self._init("scatter", x if self.rank == root else None, out, root=root, algo=algo, timeout=timeout)

    def barrier_init(self, timeout=None) -> Request:
        """A persistent barrier (see barrier and all_reduce_init).

        Parameters
        ----------
        timeout : float or None
            As barrier takes it.

        Returns
        -------
        Request
            Its start() runs the barrier and returns None.

        Raises
        ------
        InvalidArgument
            A bad timeout.
        """
        return self._init("barrier", None, None, timeout=timeout)

    def send_init(self, x, peer, timeout=None) -> Request:
        """A persistent send (see send and all_reduce_init); the peer receives each start with a
        recv (persistent or not).

        Parameters
        ----------
        x, peer, timeout
            As send takes them.

        Returns
        -------
        Request
            Its start() sends x again and returns None.

        Raises
        ------
        InvalidArgument
            As send would.
        """
        return self._init("send", x, None, peer=peer, timeout=timeout)

    def recv_init(self, x, peer, timeout=None) -> Request:
        """A persistent recv (see recv and all_reduce_init).

        Parameters
        ----------
        x, peer, timeout
            As recv takes them.

        Returns
        -------
        Request
            Its start() returns x.

        Raises
        ------
        InvalidArgument
            As recv would.
        """
        return self._init("recv", None, x, peer=peer, timeout=timeout)

    def sendrecv_init(self, x, dst, out, src, timeout=None) -> Request:
        """A persistent sendrecv (see sendrecv and all_reduce_init).

        Parameters
        ----------
        x, dst, out, src, timeout
            As sendrecv takes them.

        Returns
        -------
        Request
            Its start() returns out.

        Raises
        ------
        InvalidArgument
            As sendrecv would.
        """
        return self._init("sendrecv", x, out, peer=dst, timeout=timeout, recv_peer=src)

    def start_all(self, requests, async_op: bool = False) -> list:
        """Start several requests, in order (MPI_Startall).

        Parameters
        ----------
        requests : list of Request
            Every rank must start the same requests in the same order.
        async_op : bool
            True: queue each and return their Works (or wait() on each request).

        Returns
        -------
        list
            What each start() returned: output buffers, or Works with async_op=True.

        Raises
        ------
        InvalidArgument
            An item is not a Request, or one of them is still running.
        """
        requests = list(requests)
        for r in requests:
            if not isinstance(r, Request):
                raise _core.InvalidArgument(f"start_all: expected ringtree Requests, got {type(r).__name__}")
        return [r.start(async_op) for r in requests]
