"""The Python communicator: argument conversion around the C++ core.

Every collective is validated before any traffic; a rejected call raises InvalidArgument and
leaves the communicator usable. Blocking calls return the output buffer; async_op=True
returns a Work whose wait() returns it (and re-raises the collective's error).
"""

from __future__ import annotations

import atexit
import inspect
import weakref

import numpy as np

from . import _child_ids, _core, _settings, elastic, timeline
from ._args import ANY_SOURCE, ANY_TAG, COLL_CODES, algo_code, coll_code, counts, dtype_code, rank_arg, user_tag
from ._buffers import call_buffers, call_fields, host_bytes, torch_host_view
from ._choice import core_hook
from ._grouped import DeviceCall, Grouping, Request
from ._nccl import wheel_library
from ._recording import Recording
from ._status import Status
from ._work import KeptBuffers, MessageWork, Work, release_finished
from .ops import resolve_op

__all__ = ["Communicator", "Work", "MessageWork", "Request", "ANY_SOURCE", "ANY_TAG", "live_communicators"]

_LIVE: weakref.WeakSet[Communicator] = weakref.WeakSet()
# The collectives' codes, for the methods' one C call.
_ALL_REDUCE = COLL_CODES["all_reduce"]
_REDUCE_SCATTER = COLL_CODES["reduce_scatter"]
_ALL_GATHER = COLL_CODES["all_gather"]
_ALL_TO_ALL = COLL_CODES["all_to_all"]
_BROADCAST = COLL_CODES["broadcast"]
_REDUCE = COLL_CODES["reduce"]
_GATHER = COLL_CODES["gather"]
_SCATTER = COLL_CODES["scatter"]
_BARRIER = COLL_CODES["barrier"]
_SEND = COLL_CODES["send"]
_RECV = COLL_CODES["recv"]
_SENDRECV = COLL_CODES["sendrecv"]


class Communicator(Recording, Grouping):
    """A group of ranks that run collectives together. Create with ringtree.init() or split().

    Parameters
    ----------
    rank : int
        This process's rank, 0..size-1.
    size : int
        The number of ranks.
    unique_id : UniqueId or str
        Rank 0's rendezvous token (str(uid) works too); the same on every rank.
    timeout : float
        Seconds set-up and each call may take (a call may give its own).

    Raises
    ------
    InvalidArgument
        The unique id does not parse, or rank is outside 0..size-1.
    BootstrapError
        The ranks could not meet (a wrong secret, or rank 0 unreachable).
    Timeout
        Not every rank arrived within `timeout`.
    """

    __slots__ = (
        "_core",
        "_fast",
        "_plain_fast",
        "_fast_many",
        "_cuda",
        "_label",
        "_closed",
        "_inflight",
        "_shrink_attempts",
        "_grouping",
        "__weakref__",
    )

    def __init__(self, rank: int, size: int, unique_id, timeout: float):
        if isinstance(unique_id, str):
            unique_id = _core.UniqueId.parse(unique_id)
        self._core = _core.Communicator(int(rank), int(size), unique_id, float(timeout))
        # Calls on numpy arrays (or read torch tensors) with named ops and algos: one C call, no
        # argument conversion in Python; NotImplemented sends anything else to _run (see _call).
        self._fast = self._plain_fast = self._core.fast_call_function()  # a group swaps in its own
        self._fast_many = self._core.fast_many_function()  # the *_coalesced calls' list entry
        self._cuda = None  # made at the first call on CUDA buffers
        self._label = -1  # what the flight recorder tags calls with (see label())
        self._closed = False
        # Messages in flight and their buffers: a buffer stays alive until its message is done,
        # even if the caller drops the MessageWork.
        self._inflight = KeptBuffers(floor=64)
        self._shrink_attempts = 0  # shrink's messages carry the attempt (ringtree.elastic)
        self._grouping = None  # inside a group: the buffers of its calls, held until it has run
        _LIVE.add(self)

    @property
    def rank(self) -> int:
        """This process's rank in the communicator, 0 to size - 1."""
        return self._core.rank

    @property
    def size(self) -> int:
        """The number of ranks."""
        return self._core.size

    @property
    def timeout(self) -> float:
        """Seconds that bound each call unless the call gives its own `timeout=`."""
        return self._core.default_timeout

    def __repr__(self):
        return f"<ringtree.Communicator rank {self.rank} of {self.size}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # Dropped without close(): the core's threads must stop writing into the buffers of
        # messages in flight before _inflight lets go of them, and fields are released in no
        # order that guarantees it (the fast entries keep the core alive past _inflight).
        try:
            self._end_calls()
        except Exception:  # noqa: BLE001 - a finalizer has no one to tell
            pass

    def status(self) -> Status:
        """What this communicator found at set-up and has counted since (read it between calls).

        Returns
        -------
        Status
            Transports, hosts, how it waits, single-copy, NUMA, stores, the cost model's figures
            and the counters; str() of it is a readable summary.
        """
        cuda = "not set up" if self._cuda is None else self._cuda.executor()
        return Status.of(self._core.status(), cuda)

    def set_algo_hook(self, hook) -> None:
        """Let hook(request) make algo="auto"'s last decision on this communicator.

        The request is a ringtree.ChoiceRequest (the call, every candidate algorithm with its
        predicted seconds and formula, and the cost model's pick). Set the same hook on every rank,
        between calls: it must answer from the request alone (ranks that choose differently fail
        with CollectiveMismatch). Its answers are remembered per (collective, bytes, dtype), like
        the model's. See the manual's "How auto chooses".

        Parameters
        ----------
        hook : callable or None
            hook(request) returns a candidate's name, or None for the model's pick; None removes
            the hook.
        """
        self._core.set_choice_hook(core_hook(hook))

    def choose_algo(
        self,
        collective: str,
        nbytes: int,
        algo: str = "auto",
        dtype: str = "float32",
        op="sum",
        deterministic: bool = False,
    ) -> str:
        """The algorithm a call would use, without running it.

        Parameters
        ----------
        collective : str
            The collective's name ("all_reduce", ...).
        nbytes : int
            One rank's block, count x itemsize: the whole buffer for all_reduce, broadcast and
            reduce; one rank's block for reduce_scatter, all_gather and all_to_all (the bench's
            count column).
        algo : str
            What the call would pass: "auto", or a name, which is checked and returned.
        dtype : str
            The element type's name.
        op : str or ReduceOp
            The reduction, for the collectives that reduce.
        deterministic : bool
            As a call with deterministic=True (RINGTREE_DETERMINISTIC=1 counts too).

        Returns
        -------
        str
            The algorithm's name.

        Raises
        ------
        InvalidArgument
            An unknown collective, algorithm, dtype or op, or one the collective cannot take.
        """
        code = self._core.choose_algo(
            coll_code(collective),
            algo_code(algo),
            int(nbytes),
            dtype_code(dtype),
            resolve_op(op)[0],
            bool(deterministic),
        )
        return _core.ALGOS[code]

    def estimate(self, collective: str, nbytes: int, dtype: str = "float32", deterministic: bool = False) -> list:
        """The cost model's prediction for every algorithm available to a call.

        Parameters
        ----------
        collective : str
            The collective's name ("all_reduce", ...).
        nbytes : int
            One rank's block, as choose_algo counts it.
        dtype : str
            The element type's name.
        deterministic : bool
            True: only those a deterministic call of a floating-point reduction chooses from
            (rank_order, and oneshot where the call fits its slots), to weigh their cost against
            auto's.

        Returns
        -------
        list of tuple
            (algo, predicted seconds, formula) per algorithm.

        Raises
        ------
        InvalidArgument
            An unknown collective or dtype.
        """
        return [
            (_core.ALGOS[a], t, formula)
            for a, t, formula in self._core.estimate(
                coll_code(collective), int(nbytes), dtype_code(dtype), bool(deterministic)
            )
        ]

    # --- the collectives -------------------------------------------------------------------

    def _call(
        self,
        coll,
        x,
        out,
        op,
        root,
        peer,
        algo,
        timeout,
        async_op,
        result,
        deterministic=False,
        recv_peer=-1,
        done=NotImplemented,
    ):
        """A collective's entry after its method's own try. Each method first makes one C call
        (self._fast: numpy arrays, a named op and algorithm, a bool async_op; inside a group,
        the group's entry, which also keeps the call's buffers) and returns a blocking call's
        result itself: a Python frame between the method and the core costs about half as much
        as a small call's whole path through the core. Here `done` is what that C call
        returned: an async call's core Work, wrapped with its buffers, or NotImplemented, and
        then torch CPU tensors, read in a few attribute reads, take the C call and everything
        else goes through _run, which converts, checks and explains."""
        if done is NotImplemented:
            vin = None if x is None else torch_host_view(x)
            vout = vin if out is x else None if out is None else torch_host_view(out)  # in place: read once
            if (vin or vout) and (x is None or vin) and (out is None or vout):
                if self._grouping is not None:  # the views are bare pointers: the group keeps the tensors
                    self._grouping.append((x, out))
                code = COLL_CODES[coll]
                done = self._fast(
                    code, vin, vout, op, root, peer, algo, timeout, deterministic, async_op, result, recv_peer
                )
            if done is NotImplemented:
                return self._run(
                    coll,
                    x,
                    out,
                    op=op,
                    root=root,
                    peer=peer,
                    algo=algo,
                    timeout=timeout,
                    async_op=async_op,
                    result=result,
                    deterministic=deterministic,
                    recv_peer=recv_peer,
                )
        return done if async_op is False else Work(done, (x, out), result)

    def _run(
        self,
        coll,
        x,
        out,
        *,
        op="sum",
        root=0,
        peer=-1,
        algo="auto",
        timeout=None,
        async_op=False,
        result=None,
        send_counts=(),
        recv_counts=(),
        recv_peer=-1,
        deterministic=False,
    ):
        keep = []
        inb, outb = call_buffers(x, out, coll)
        op_code, factor = resolve_op(op)
        if inb:
            keep.append(inb.keepalive)
        if outb:
            keep.append(outb.keepalive)
        t = -1.0 if timeout is None else float(timeout)
        if timeout is not None and t <= 0:
            raise _core.InvalidArgument(f"{coll}: timeout must be positive, got {timeout}")
        on_device = bool((inb or outb) and (inb or outb).device)
        use_nccl = isinstance(algo, str) and algo.lower() == "nccl"
        if use_nccl and not on_device:
            raise _core.InvalidArgument(
                f"{coll}: algo='nccl' needs CUDA buffers (torch CUDA tensors, cupy arrays); "
                f"host buffers take the ringtree algorithms"
            )
        if on_device:
            head = (COLL_CODES[coll], *call_fields(inb, outb), op_code, factor, int(root), int(peer), int(recv_peer))
            head += (0 if use_nccl else algo_code(algo), t, (inb or outb).stream, use_nccl)
            call = DeviceCall(
                self._cuda_comm,
                head,
                counts(send_counts, "send_counts"),
                counts(recv_counts, "recv_counts"),
                bool(deterministic),
            )
            if self._grouping is not None:  # enqueued when the group ends (see group_end)
                return self._collect_device(call, keep, async_op, result)
            work = call.run(async_op)
            return Work(work, keep, result) if async_op else result
        if self._grouping is not None:
            self._grouping.append(keep)
        work = self._core.run(
            COLL_CODES[coll],
            *call_fields(inb, outb),
            op_code,
            factor,
            int(root),
            int(peer),
            algo_code(algo),
            t,
            bool(async_op),
            counts(send_counts, "send_counts"),
            counts(recv_counts, "recv_counts"),
            int(recv_peer),
            deterministic=bool(deterministic),
        )
        if async_op:
            return Work(work, keep, result)
        return result

    def all_reduce(self, x, out=None, op="sum", algo="auto", async_op=False, timeout=None, deterministic=False):
        """Reduce x over all ranks into out (in place when out is None).

        Parameters
        ----------
        x : buffer
            This rank's input: a numpy array, a torch tensor (CPU or CUDA) or any contiguous buffer;
            every rank passes the same count and dtype.
        out : buffer or None
            Receives the result, the shape of x; None: x itself.
        op : str, ReduceOp or PremulSum
            "sum", "prod", "min", "max", "avg", "band", "bor", "bxor" (integer dtypes), a ReduceOp,
            or premul_sum(factor).
        algo : str
            "auto" (the cost model's choice, see choose_algo) or an algorithm's name; "nccl" runs
            NCCL on CUDA buffers.
        async_op : bool
            True: return a Work at once; wait() on it finishes the call.
        timeout : float or None
            Seconds the call may take; None: the communicator's `timeout`.
        deterministic : bool
            True: a floating-point reduction in rank order, the same bits whatever the algorithm and
            layout (the manual's Concepts page, Deterministic mode); every rank passes the same.

        Returns
        -------
        buffer or Work
            `out` (x when out is None), or with `async_op`, a Work whose wait() returns it.

        Raises
        ------
        InvalidArgument
            Buffers, dtype, op or algo the call cannot take, on the calling rank before any traffic.
        CollectiveMismatch
            The ranks called different collectives, counts, dtypes or roots.
        Timeout
            The call did not finish within `timeout`; the communicator is aborted.
        PeerFailure
            A peer died or its connection broke.
        Aborted
            The communicator was aborted.
        """
        out = x if out is None else out
        done = self._fast(_ALL_REDUCE, x, out, op, 0, -1, algo, timeout, deterministic, async_op, out, -1)
        if done is not NotImplemented and async_op is False:  # the common case: one C call
            return done
        return self._call("all_reduce", x, out, op, 0, -1, algo, timeout, async_op, out, deterministic, done=done)

    def reduce_scatter(self, x, out, op="sum", algo="auto", async_op=False, timeout=None, deterministic=False):
        """Reduce x over all ranks and give rank r block r of the result.

        Parameters
        ----------
        x : buffer
            N*P elements: P blocks of N, block r for rank r.
        out : buffer
            N elements: the reduction of every rank's block r, on rank r.
        op : str, ReduceOp or PremulSum
            "sum", "prod", "min", "max", "avg", "band", "bor", "bxor" (integer dtypes), a ReduceOp,
            or premul_sum(factor).
        algo : str
            "auto" (the cost model's choice, see choose_algo) or an algorithm's name; "nccl" runs
            NCCL on CUDA buffers.
        async_op : bool
            True: return a Work at once; wait() on it finishes the call.
        timeout : float or None
            Seconds the call may take; None: the communicator's `timeout`.
        deterministic : bool
            True: a floating-point reduction in rank order, the same bits whatever the algorithm and
            layout (the manual's Concepts page, Deterministic mode); every rank passes the same.

        Returns
        -------
        buffer or Work
            `out`, or with `async_op`, a Work whose wait() returns it.

        Raises
        ------
        InvalidArgument
            Buffers, dtype, op or algo the call cannot take, on the calling rank before any traffic.
        CollectiveMismatch
            The ranks called different collectives, counts, dtypes or roots.
        Timeout
            The call did not finish within `timeout`; the communicator is aborted.
        PeerFailure
            A peer died or its connection broke.
        Aborted
            The communicator was aborted.
        """
        done = self._fast(_REDUCE_SCATTER, x, out, op, 0, -1, algo, timeout, deterministic, async_op, out, -1)
        if done is not NotImplemented and async_op is False:  # the common case: one C call
            return done
        return self._call("reduce_scatter", x, out, op, 0, -1, algo, timeout, async_op, out, deterministic, done=done)

    def all_gather(self, x, out, algo="auto", async_op=False, timeout=None):
        """Every rank's out receives every rank's x, block r from rank r.

        Parameters
        ----------
        x : buffer
            This rank's N elements.
        out : buffer
            N*P elements of the same dtype.
        algo : str
            "auto" (the cost model's choice, see choose_algo) or an algorithm's name; "nccl" runs
            NCCL on CUDA buffers.
        async_op : bool
            True: return a Work at once; wait() on it finishes the call.
        timeout : float or None
            Seconds the call may take; None: the communicator's `timeout`.

        Returns
        -------
        buffer or Work
            `out`, or with `async_op`, a Work whose wait() returns it.

        Raises
        ------
        InvalidArgument
            Buffers, dtype, op or algo the call cannot take, on the calling rank before any traffic.
        CollectiveMismatch
            The ranks called different collectives, counts, dtypes or roots.
        Timeout
            The call did not finish within `timeout`; the communicator is aborted.
        PeerFailure
            A peer died or its connection broke.
        Aborted
            The communicator was aborted.
        """
        done = self._fast(_ALL_GATHER, x, out, "sum", 0, -1, algo, timeout, False, async_op, out, -1)
        if done is not NotImplemented and async_op is False:  # the common case: one C call
            return done
        return self._call("all_gather", x, out, "sum", 0, -1, algo, timeout, async_op, out, done=done)

    def all_to_all(self, x, out, algo="auto", async_op=False, timeout=None):
        """Block j of rank i's x lands in block i of rank j's out.

        Parameters
        ----------
        x : buffer
            N*P elements: block j goes to rank j.
        out : buffer
            N*P elements: block i comes from rank i.
        algo : str
            "auto" (the cost model's choice, see choose_algo) or an algorithm's name; "nccl" runs
            NCCL on CUDA buffers.
        async_op : bool
            True: return a Work at once; wait() on it finishes the call.
        timeout : float or None
            Seconds the call may take; None: the communicator's `timeout`.

        Returns
        -------
        buffer or Work
            `out`, or with `async_op`, a Work whose wait() returns it.

        Raises
        ------
        InvalidArgument
            Buffers, dtype, op or algo the call cannot take, on the calling rank before any traffic.
        CollectiveMismatch
            The ranks called different collectives, counts, dtypes or roots.
        Timeout
            The call did not finish within `timeout`; the communicator is aborted.
        PeerFailure
            A peer died or its connection broke.
        Aborted
            The communicator was aborted.
        """
        done = self._fast(_ALL_TO_ALL, x, out, "sum", 0, -1, algo, timeout, False, async_op, out, -1)
        if done is not NotImplemented and async_op is False:  # the common case: one C call
            return done
        return self._call("all_to_all", x, out, "sum", 0, -1, algo, timeout, async_op, out, done=done)

    def all_to_all_v(self, x, out, send_counts, recv_counts, async_op=False, timeout=None):
        """Like all_to_all with per-rank sizes: rank i sends send_counts[j] elements to rank j,
        which receives them as recv_counts[i]. Blocks are contiguous in rank order.

        Parameters
        ----------
        x : buffer
            At least sum(send_counts) elements.
        out : buffer
            At least sum(recv_counts) elements of the same dtype.
        send_counts : sequence of int
            P counts: how many elements go to each rank.
        recv_counts : sequence of int
            P counts: how many elements come from each rank; rank j's recv_counts[i] equals rank i's
            send_counts[j].
        async_op : bool
            True: return a Work at once; wait() on it finishes the call.
        timeout : float or None
            Seconds the call may take; None: the communicator's `timeout`.

        Returns
        -------
        buffer or Work
            `out`, or with `async_op`, a Work whose wait() returns it.

        Raises
        ------
        InvalidArgument
            Buffers, dtype, op or algo the call cannot take, on the calling rank before any traffic.
        CollectiveMismatch
            The ranks called different collectives, counts, dtypes or roots.
        Timeout
            The call did not finish within `timeout`; the communicator is aborted.
        PeerFailure
            A peer died or its connection broke.
        Aborted
            The communicator was aborted.
        """
        return self._run(
            "all_to_all_v",
            x,
            out,
            timeout=timeout,
            async_op=async_op,
            result=out,
            send_counts=send_counts,
            recv_counts=recv_counts,
        )

    def broadcast(self, x, root=0, algo="auto", async_op=False, timeout=None):
        """Every rank's x receives root's x.

        Parameters
        ----------
        x : buffer
            The data on the root; the buffer to fill elsewhere (same count and dtype).
        root : int
            The root rank; every rank passes the same.
        algo : str
            "auto" (the cost model's choice, see choose_algo) or an algorithm's name; "nccl" runs
            NCCL on CUDA buffers.
        async_op : bool
            True: return a Work at once; wait() on it finishes the call.
        timeout : float or None
            Seconds the call may take; None: the communicator's `timeout`.

        Returns
        -------
        buffer or Work
            `x`, or with `async_op`, a Work whose wait() returns it.

        Raises
        ------
        InvalidArgument
            Buffers, dtype, op or algo the call cannot take, on the calling rank before any traffic.
        CollectiveMismatch
            The ranks called different collectives, counts, dtypes or roots.
        Timeout
            The call did not finish within `timeout`; the communicator is aborted.
        PeerFailure
            A peer died or its connection broke.
        Aborted
            The communicator was aborted.
        """
        done = self._fast(_BROADCAST, x, None, "sum", root, -1, algo, timeout, False, async_op, x, -1)
        if done is not NotImplemented and async_op is False:  # the common case: one C call
            return done
        return self._call("broadcast", x, None, "sum", root, -1, algo, timeout, async_op, x, done=done)

    def reduce(self, x, out=None, root=0, op="sum", algo="auto", async_op=False, timeout=None, deterministic=False):
        """The root receives the reduction of every rank's x; x is untouched elsewhere.

        Parameters
        ----------
        x : buffer
            This rank's input; every rank passes the same count and dtype.
        out : buffer or None
            The root's result, the shape of x; None: x itself. Ignored on the other ranks.
        root : int
            The root rank; every rank passes the same.
        op : str, ReduceOp or PremulSum
            "sum", "prod", "min", "max", "avg", "band", "bor", "bxor" (integer dtypes), a ReduceOp,
            or premul_sum(factor).
        algo : str
            "auto" (the cost model's choice, see choose_algo) or an algorithm's name; "nccl" runs
            NCCL on CUDA buffers.
        async_op : bool
            True: return a Work at once; wait() on it finishes the call.
        timeout : float or None
            Seconds the call may take; None: the communicator's `timeout`.
        deterministic : bool
            True: a floating-point reduction in rank order, the same bits whatever the algorithm and
            layout (the manual's Concepts page, Deterministic mode); every rank passes the same.

        Returns
        -------
        buffer or Work
            On the root `out` (x when out is None), elsewhere None, or with `async_op`, a Work whose wait() returns it.

        Raises
        ------
        InvalidArgument
            Buffers, dtype, op or algo the call cannot take, on the calling rank before any traffic.
        CollectiveMismatch
            The ranks called different collectives, counts, dtypes or roots.
        Timeout
            The call did not finish within `timeout`; the communicator is aborted.
        PeerFailure
            A peer died or its connection broke.
        Aborted
            The communicator was aborted.
        """
        if out is None and self.rank == root:
            out = x
        if self.rank != root:
            out = None
        done = self._fast(_REDUCE, x, out, op, root, -1, algo, timeout, bool(deterministic), async_op, out, -1)
        if done is not NotImplemented and async_op is False:  # the common case: one C call
            return done
        return self._call("reduce", x, out, op, root, -1, algo, timeout, async_op, out, bool(deterministic), done=done)

    def gather(self, x, out=None, root=0, algo="auto", async_op=False, timeout=None):
        """The root's out receives every rank's x, block r from rank r.

        Parameters
        ----------
        x : buffer
            This rank's N elements.
        out : buffer or None
            N*P elements on the root; ignored (None will do) elsewhere.
        root : int
            The root rank; every rank passes the same.
        algo : str
            "auto" (the cost model's choice, see choose_algo) or an algorithm's name; "nccl" runs
            NCCL on CUDA buffers.
        async_op : bool
            True: return a Work at once; wait() on it finishes the call.
        timeout : float or None
            Seconds the call may take; None: the communicator's `timeout`.

        Returns
        -------
        buffer or Work
            On the root `out`, elsewhere None, or with `async_op`, a Work whose wait() returns it.

        Raises
        ------
        InvalidArgument
            Buffers, dtype, op or algo the call cannot take, on the calling rank before any traffic.
        CollectiveMismatch
            The ranks called different collectives, counts, dtypes or roots.
        Timeout
            The call did not finish within `timeout`; the communicator is aborted.
        PeerFailure
            A peer died or its connection broke.
        Aborted
            The communicator was aborted.
        """
        out = out if self.rank == root else None
        done = self._fast(_GATHER, x, out, "sum", root, -1, algo, timeout, False, async_op, out, -1)
        if done is not NotImplemented and async_op is False:  # the common case: one C call
            return done
        return self._call("gather", x, out, "sum", root, -1, algo, timeout, async_op, out, done=done)

    def scatter(self, x, out, root=0, algo="auto", async_op=False, timeout=None):
        """Rank r's out receives block r of the root's x.

        Parameters
        ----------
        x : buffer or None
            N*P elements on the root; ignored (None will do) elsewhere.
        out : buffer
            N elements.
        root : int
            The root rank; every rank passes the same.
        algo : str
            "auto" (the cost model's choice, see choose_algo) or an algorithm's name; "nccl" runs
            NCCL on CUDA buffers.
        async_op : bool
            True: return a Work at once; wait() on it finishes the call.
        timeout : float or None
            Seconds the call may take; None: the communicator's `timeout`.

        Returns
        -------
        buffer or Work
            `out`, or with `async_op`, a Work whose wait() returns it.

        Raises
        ------
        InvalidArgument
            Buffers, dtype, op or algo the call cannot take, on the calling rank before any traffic.
        CollectiveMismatch
            The ranks called different collectives, counts, dtypes or roots.
        Timeout
            The call did not finish within `timeout`; the communicator is aborted.
        PeerFailure
            A peer died or its connection broke.
        Aborted
            The communicator was aborted.
        """
        x = x if self.rank == root else None
        done = self._fast(_SCATTER, x, out, "sum", root, -1, algo, timeout, False, async_op, out, -1)
        if done is not NotImplemented and async_op is False:  # the common case: one C call
            return done
        return self._call("scatter", x, out, "sum", root, -1, algo, timeout, async_op, out, done=done)

    def barrier(self, async_op=False, timeout=None):
        """Return once every rank has entered the barrier.

        Parameters
        ----------
        async_op : bool
            True: return a Work at once; wait() on it finishes the call.
        timeout : float or None
            Seconds the call may take; None: the communicator's `timeout`.

        Returns
        -------
        None or Work
            None, or with `async_op`, a Work that completes when every rank has entered.

        Raises
        ------
        InvalidArgument
            Buffers, dtype, op or algo the call cannot take, on the calling rank before any traffic.
        CollectiveMismatch
            The ranks called different collectives, counts, dtypes or roots.
        Timeout
            The call did not finish within `timeout`; the communicator is aborted.
        PeerFailure
            A peer died or its connection broke.
        Aborted
            The communicator was aborted.
        """
        done = self._fast(_BARRIER, None, None, "sum", 0, -1, "auto", timeout, False, async_op, None, -1)
        if done is not NotImplemented and async_op is False:  # the common case: one C call
            return done
        return self._call("barrier", None, None, "sum", 0, -1, "auto", timeout, async_op, None, done=done)

    def send(self, x, peer, async_op=False, timeout=None):
        """Send x to `peer`, which must call recv with the same count and dtype (in the call order).

        Parameters
        ----------
        x : buffer
            The data to send.
        peer : int
            The receiving rank.
        async_op : bool
            True: return a Work at once; wait() on it finishes the call.
        timeout : float or None
            Seconds the call may take; None: the communicator's `timeout`.

        Returns
        -------
        None or Work
            None, or with `async_op`, a Work that completes when x has been sent.

        Raises
        ------
        InvalidArgument
            Buffers, dtype, op or algo the call cannot take, on the calling rank before any traffic.
        CollectiveMismatch
            The ranks called different collectives, counts, dtypes or roots.
        Timeout
            The call did not finish within `timeout`; the communicator is aborted.
        PeerFailure
            A peer died or its connection broke.
        Aborted
            The communicator was aborted.
        """
        done = self._fast(_SEND, x, None, "sum", 0, peer, "auto", timeout, False, async_op, None, -1)
        if done is not NotImplemented and async_op is False:  # the common case: one C call
            return done
        return self._call("send", x, None, "sum", 0, peer, "auto", timeout, async_op, None, done=done)

    def recv(self, x, peer, async_op=False, timeout=None):
        """Receive into x from `peer`, which calls send with the same count and dtype.

        Parameters
        ----------
        x : buffer
            Receives the data.
        peer : int
            The sending rank.
        async_op : bool
            True: return a Work at once; wait() on it finishes the call.
        timeout : float or None
            Seconds the call may take; None: the communicator's `timeout`.

        Returns
        -------
        buffer or Work
            `x`, or with `async_op`, a Work whose wait() returns it.

        Raises
        ------
        InvalidArgument
            Buffers, dtype, op or algo the call cannot take, on the calling rank before any traffic.
        CollectiveMismatch
            The ranks called different collectives, counts, dtypes or roots.
        Timeout
            The call did not finish within `timeout`; the communicator is aborted.
        PeerFailure
            A peer died or its connection broke.
        Aborted
            The communicator was aborted.
        """
        done = self._fast(_RECV, None, x, "sum", 0, peer, "auto", timeout, False, async_op, x, -1)
        if done is not NotImplemented and async_op is False:  # the common case: one C call
            return done
        return self._call("recv", None, x, "sum", 0, peer, "auto", timeout, async_op, x, done=done)

    def sendrecv(self, x, dst, out, src, async_op=False, timeout=None):
        """Send x to `dst` and receive `out` from `src` at the same time (NCCL's grouped
        send/recv). Calls on one communicator run in order, so an exchange in a ring must use this
        (or the peers must order their sends and recvs) once messages outgrow the transport's
        buffering. Matches a plain send/recv on the other side.

        Parameters
        ----------
        x : buffer
            The data to send.
        dst : int
            The rank x goes to.
        out : buffer
            Receives the data from `src`.
        src : int
            The rank `out` comes from.
        async_op : bool
            True: return a Work at once; wait() on it finishes the call.
        timeout : float or None
            Seconds the call may take; None: the communicator's `timeout`.

        Returns
        -------
        buffer or Work
            `out`, or with `async_op`, a Work whose wait() returns it.

        Raises
        ------
        InvalidArgument
            Buffers, dtype, op or algo the call cannot take, on the calling rank before any traffic.
        CollectiveMismatch
            The ranks called different collectives, counts, dtypes or roots.
        Timeout
            The call did not finish within `timeout`; the communicator is aborted.
        PeerFailure
            A peer died or its connection broke.
        Aborted
            The communicator was aborted.
        """
        done = self._fast(_SENDRECV, x, out, "sum", 0, dst, "auto", timeout, False, async_op, out, src)
        if done is not NotImplemented and async_op is False:  # the common case: one C call
            return done
        return self._call("sendrecv", x, out, "sum", 0, dst, "auto", timeout, async_op, out, recv_peer=src, done=done)

    # --- tagged messages -------------------------------------------------------------------

    def isend(self, x, dst, tag=0) -> MessageWork:
        """Send x's bytes to rank `dst` with `tag`, beside the call order.

        Returns at once; the MessageWork completes when the bytes are written (x may then be
        reused), and never waits for dst to post its receive. Messages from one rank to another
        with the same tag arrive in the order sent.

        Parameters
        ----------
        x : buffer
            The bytes to send (any contiguous buffer).
        dst : int
            The receiving rank.
        tag : int
            A tag >= 0 that the receive matches.

        Returns
        -------
        MessageWork
            The message in flight.

        Raises
        ------
        InvalidArgument
            `dst` is not a rank, `tag` is negative or reserved (2**62 and up), or x is over
            RINGTREE_MAX_MESSAGE_BYTES.
        """
        return self._isend(x, rank_arg(dst, "isend: dst"), user_tag(tag, "isend"), "isend")

    def irecv(self, x, src=ANY_SOURCE, tag=ANY_TAG) -> MessageWork:
        """Receive into x the first message from `src` with `tag`.

        The message may be shorter than x (MessageWork.nbytes says how long it was); a longer one
        fails this receive with InvalidArgument and is discarded. Keep x alive until the work is
        done (the communicator also holds it).

        Parameters
        ----------
        x : buffer
            Receives the message's bytes.
        src : int
            The sending rank, or ANY_SOURCE.
        tag : int
            The tag to match, or ANY_TAG.

        Returns
        -------
        MessageWork
            The receive in flight; wait() returns x.

        Raises
        ------
        InvalidArgument
            `src` is not a rank or ANY_SOURCE, `tag` is not >= 0 or ANY_TAG, or x is read-only.
        """
        return self._irecv(x, rank_arg(src, "irecv: src"), user_tag(tag, "irecv"), "irecv")

    # Any tag, reserved ones included: ringtree's own protocols (shrink) use these.
    def _isend(self, x, dst, tag, what) -> MessageWork:
        ptr, nbytes, _, keep = host_bytes(x, what)
        return self._track(self._core.isend(ptr, nbytes, dst, tag), x, keep)

    def _irecv(self, x, src, tag, what) -> MessageWork:
        ptr, nbytes, readonly, keep = host_bytes(x, what)
        return self._track(self._core.irecv(ptr, nbytes, readonly, src, tag), x, keep)

    def probe(self, src=ANY_SOURCE, tag=ANY_TAG, timeout=None) -> tuple:
        """Wait for a matching message that no receive has taken yet, without receiving it.

        Parameters
        ----------
        src : int
            The sending rank, or ANY_SOURCE.
        tag : int
            The tag to match, or ANY_TAG.
        timeout : float or None
            Seconds to wait, positive; None: the communicator's timeout.

        Returns
        -------
        tuple
            (source, tag, nbytes) of the message.

        Raises
        ------
        InvalidArgument
            `timeout` is not positive.
        Timeout
            No matching message arrived in time.
        """
        seconds = 0.0 if timeout is None else float(timeout)
        if timeout is not None and seconds <= 0:
            raise _core.InvalidArgument(f"probe: timeout must be positive, got {timeout}")
        return self._core.probe(rank_arg(src, "probe: src"), rank_arg(tag, "probe: tag"), seconds)

    def iprobe(self, src=ANY_SOURCE, tag=ANY_TAG):
        """Look for a matching message that no receive has taken yet, without waiting.

        Parameters
        ----------
        src : int
            The sending rank, or ANY_SOURCE.
        tag : int
            The tag to match, or ANY_TAG.

        Returns
        -------
        tuple or None
            (source, tag, nbytes) of the message, or None when there is none.
        """
        return self._core.iprobe(rank_arg(src, "iprobe: src"), rank_arg(tag, "iprobe: tag"))

    def _track(self, work, x, keep) -> MessageWork:
        self._inflight.add(work, keep)
        return MessageWork(work, x)

    # --- structure -----------------------------------------------------------------------

    def split(self, color, key=None, timeout=None):
        """Like MPI_Comm_split: ranks with the same color form a new communicator,
        ordered by (key, rank). Collective: every rank calls it.

        Parameters
        ----------
        color : int or None
            The group to join; None or < 0 takes part but gets None back.
        key : int or None
            Orders the ranks of a group; None: this rank.
        timeout : float or None
            Seconds the exchanges may take, and the new communicator's timeout; None: this one's.

        Returns
        -------
        Communicator or None
            The new communicator, or None for a color of None or < 0.
        """
        my_color = -1 if color is None or color < 0 else int(color)
        mine = np.array([my_color, self.rank if key is None else int(key)], dtype=np.int64)
        table = np.empty(2 * self.size, dtype=np.int64)
        self.all_gather(mine, table, timeout=timeout)
        colors, keys = table[0::2], table[1::2]
        members = sorted((int(keys[r]), r) for r in range(self.size) if my_color >= 0 and colors[r] == my_color)
        new_rank = [r for _, r in members].index(self.rank) if members else -1
        # The new rank 0 of each group reserves a port; one all_gather delivers every group's
        # public token, from which its members derive the new secret (_child_ids).
        n = _child_ids.TOKEN_BYTES
        token = np.zeros(n, dtype=np.uint8)
        if new_rank == 0:
            raw = _child_ids.lead(self)[0].encode()
            token[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        tokens = np.empty(n * self.size, dtype=np.uint8)
        self.all_gather(token, tokens, timeout=timeout)
        if my_color < 0:
            return None
        leader = members[0][1]
        public = tokens[n * leader : n * (leader + 1)].tobytes().rstrip(b"\0").decode()
        return Communicator(
            new_rank, len(members), _child_ids.follow(self, public), self.timeout if timeout is None else timeout
        )

    def shrink(self, exclude=(), timeout=None) -> Communicator:
        """After a PeerFailure or Timeout (or on purpose): the survivors agree on who is alive
        and return a communicator of them, densely renumbered in old-rank order; this one is closed.

        Every survivor calls it; the ranks in `exclude` (never this rank) and the dead do not. See
        the manual's Shrink and grow page for the protocol and what it guarantees.

        Parameters
        ----------
        exclude : iterable of int
            Ranks to leave out although they are alive.
        timeout : float or None
            Seconds each exchange waits for a peer before leaving it out; None: this
            communicator's.

        Returns
        -------
        Communicator
            The survivors' communicator.

        Raises
        ------
        Excluded
            The others left this rank out.
        InvalidArgument
            `exclude` names this rank or a rank out of range.
        """
        return elastic.shrink(self, exclude, timeout)

    def grow(self, joiners: int, publish=None, timeout=None) -> Communicator:
        """A communicator of this one's ranks (same numbers) and `joiners` new processes
        (the next numbers). Collective over this communicator, which stays usable.

        Parameters
        ----------
        joiners : int
            How many new processes join.
        publish : callable or None
            On rank 0, publish(token) hands the token to the new processes (a file, a store, an
            environment variable...); each then calls rt.join(token, index) with index
            0..joiners-1. The others may pass None.
        timeout : float or None
            Seconds the set-up may take; None: this communicator's.

        Returns
        -------
        Communicator
            The grown communicator.
        """
        return elastic.grow(self, joiners, publish, timeout)

    def _cuda_comm(self):
        if self._cuda is None:
            self._cuda = _core.CudaComm(self._core, wheel_library())
        return self._cuda

    def close(self):
        """Finish queued work, tell the peers this rank is leaving, release everything.
        With RINGTREE_TRACE=DIR set, then write this rank's trace there (see timeline.py)."""
        self._end_calls()
        first, self._closed = not self._closed, True
        trace_dir = _settings.get("RINGTREE_TRACE")
        if trace_dir and first:
            try:
                timeline.write_rank_trace(self, trace_dir)
            except Exception as exc:  # noqa: BLE001 - a trace must not break a close
                print(f"ringtree: rank {self.rank}: writing the trace to {trace_dir} failed: {exc}")

    def _end_calls(self):
        """Close the executors, the CUDA one first (its goodbye to its peers uses the core), and
        the core even if that fails; then let go of the buffers kept for what was in flight."""
        try:
            if self._cuda is not None:
                self._cuda.close()
        finally:
            self._core.close()
            self._inflight.clear()  # every message is done or failed now
            release_finished()  # and every call this communicator ran, whose Work was dropped

    def abort(self, reason: str = ""):
        """Make the calls in flight and every later call raise Aborted, on this rank and on
        every peer. Safe from any thread (a watchdog, say); close the communicator afterwards.

        Parameters
        ----------
        reason : str
            Carried in the Aborted errors' messages.
        """
        self._core.abort(str(reason))

    @property
    def is_aborted(self) -> bool:
        """Whether the communicator was aborted (by a mismatch, a timeout, a peer's failure or
        abort()); later calls then raise Aborted."""
        return self._core.is_aborted


class _Param:
    """In a fast method's recipe: the method's parameter `name`, or `if_none` where it is None."""

    __slots__ = ("name", "if_none")

    def __init__(self, name, if_none=None):
        self.name, self.if_none = name, if_none


def _make_fast(name, *fast_args):
    # The method becomes a method descriptor (csrc/bindings/fast_method.cc) that binds its
    # arguments and calls self._fast with `fast_args` in C: the Python frame costs as much as a
    # fifth of a small call. Anything else goes to the method as written, which stays the
    # reference (a unit test checks that both make the same fast call).
    func = Communicator.__dict__[name]
    params = list(inspect.signature(func).parameters.values())[1:]
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params), name
    names = tuple(p.name for p in params)
    defaults = tuple(_core.FAST_METHOD_REQUIRED if p.default is p.empty else p.default for p in params)
    source, if_none, consts = [], [], []
    for a in fast_args:
        param = isinstance(a, _Param)
        source.append(names.index(a.name) if param else -1)
        if_none.append(names.index(a.if_none) if param and a.if_none else -1)
        consts.append(None if param else a)
    method = _core.fast_method(
        func,
        Communicator,
        Communicator.__dict__["_fast"],
        names,
        defaults,
        names.index("async_op"),
        source,
        if_none,
        tuple(consts),
    )
    setattr(Communicator, name, method)


def _make_fast_methods():
    x, out, op, algo, timeout = _Param("x"), _Param("out"), _Param("op"), _Param("algo"), _Param("timeout")
    async_op, det, root, peer = _Param("async_op"), _Param("deterministic"), _Param("root"), _Param("peer")
    out_or_x = _Param("out", "x")  # all_reduce's: x where out is None
    # The fast entry's arguments, as each method passes them: coll, x, out, op, root, peer, algo,
    # timeout, deterministic, async_op, result, recv_peer.
    _make_fast("all_reduce", _ALL_REDUCE, x, out_or_x, op, 0, -1, algo, timeout, det, async_op, out_or_x, -1)
    _make_fast("reduce_scatter", _REDUCE_SCATTER, x, out, op, 0, -1, algo, timeout, det, async_op, out, -1)
    _make_fast("all_gather", _ALL_GATHER, x, out, "sum", 0, -1, algo, timeout, False, async_op, out, -1)
    _make_fast("all_to_all", _ALL_TO_ALL, x, out, "sum", 0, -1, algo, timeout, False, async_op, out, -1)
    _make_fast("broadcast", _BROADCAST, x, None, "sum", root, -1, algo, timeout, False, async_op, x, -1)
    _make_fast("barrier", _BARRIER, None, None, "sum", 0, -1, "auto", timeout, False, async_op, None, -1)
    _make_fast("send", _SEND, x, None, "sum", 0, peer, "auto", timeout, False, async_op, None, -1)
    _make_fast("recv", _RECV, None, x, "sum", 0, peer, "auto", timeout, False, async_op, x, -1)
    _make_fast(
        "sendrecv", _SENDRECV, x, out, "sum", 0, _Param("dst"), "auto", timeout, False, async_op, out, _Param("src")
    )


_make_fast_methods()


def live_communicators() -> list:
    """The communicators of this process that are still referenced (largest first)."""
    return sorted(_LIVE, key=lambda c: (-c.size, c.id))


@atexit.register
def _close_live_communicators():
    # Peers must see a goodbye, not a dropped connection, when a rank simply exits. In the same
    # order on every rank: closing a communicator whose CUDA IPC executor is set up waits for its
    # peers to close it too.
    for comm in live_communicators():
        try:
            comm.close()
        except Exception as exc:  # noqa: BLE001 - report and keep closing the others
            print(f"ringtree: closing {comm!r} at exit failed: {exc}")
