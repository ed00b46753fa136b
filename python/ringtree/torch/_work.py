"""The torch.distributed Work of ringtree calls, and the threads that complete it."""

from __future__ import annotations

import queue
import threading

import torch.distributed as dist
from torch.futures import Future

from ringtree._core import Timeout

from ._convert import timeout_seconds


class _Failure:
    """A ringtree error travelling as a future's value (see RingtreeWork)."""

    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error


def _raise_failure(fut):
    value = fut.value()
    if isinstance(value, _Failure):
        raise value.error
    return value


class RingtreeWork(dist.Work):
    """A torch.distributed Work for one or more ringtree calls.

    wait() blocks until they finish and re-raises their error as is (ringtree.Timeout,
    ringtree.PeerFailure, ...). get_future() is a torch Future whose value is the list of output
    tensors; on failure it completes with a RuntimeError whose message starts with the
    ringtree error's type.

    Why the two futures: torch.futures.Future.set_exception() stores the exception as the
    future's *value*, which C++ consumers such as DDP's reducer then take for a tensor list
    (and crash). An error raised inside a then() callback, though, becomes a real error of
    the child future. So the completion thread always sets a value on a private future, a
    _Failure for errors, and the public future is its then() child that raises it.
    """

    def __init__(self, outputs, keep=None):
        super().__init__()
        self._settled = Future()
        self._future = None  # made by the first get_future(): most works are only waited for
        self._done = threading.Event()
        self._outputs = outputs
        self._keep = keep  # inputs the call reads, alive until it is done
        self._error = None

    def _complete(self, error):
        self._error = error
        self._keep = None
        # Future first, so that once wait() returns, get_future() is done too.
        self._settled.set_result(self._outputs if error is None else _Failure(error))
        self._done.set()

    def wait(self, timeout=None):
        """Block until the calls finish and re-raise their error as is.

        Parameters
        ----------
        timeout : datetime.timedelta, float or None
            How long to wait; None: until they finish (each call is bounded by its own timeout).

        Returns
        -------
        bool
            True.

        Raises
        ------
        Timeout
            `timeout` passed first; the calls keep running.
        Error
            The calls' own error (PeerFailure, CollectiveMismatch, ...).
        """
        seconds = timeout_seconds(timeout)
        if not self._done.wait(seconds):
            raise Timeout(f"ringtree work not completed within {seconds} s of wait(); the call is still running")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        """Whether the calls have finished, successfully or not, without waiting.

        Returns
        -------
        bool
            True once wait() would return or raise at once.
        """
        return self._done.is_set()

    def is_success(self):
        """Whether the calls finished without an error.

        Returns
        -------
        bool
            False while they run, and after a failure.
        """
        return self._done.is_set() and self._error is None

    def exception(self):
        """The calls' error, if they failed.

        Returns
        -------
        Exception or None
            The ringtree error; None while they run or after a success.
        """
        return self._error

    def get_future(self):
        """A torch Future of the outputs, for fut.then() chains (DDP's comm hooks).

        Returns
        -------
        torch.futures.Future
            Its value is the list of output tensors; on failure it completes with a RuntimeError
            whose message starts with the ringtree error's type.
        """
        if self._future is None:
            # A then() child of a future already settled is settled at once.
            self._future = self._settled.then(_raise_failure)
        return self._future

    def result(self):
        """Wait, then hand back the outputs.

        Returns
        -------
        list of torch.Tensor
            The output tensors of the calls.

        Raises
        ------
        Error
            The calls' error, as wait() raises it.
        """
        self.wait()
        return self._outputs

    def source_rank(self):
        """The sender of a receive from any source; only the work of recv_anysource has one.

        Raises
        ------
        RuntimeError
            Always: a collective has no source rank.
        """
        raise RuntimeError(
            "ringtree: source_rank() is only meaningful for recv from any source, which "
            "the ringtree backend does not support"
        )

    def synchronize(self):
        """Nothing to do: CPU tensors queue nothing on a stream, and a CUDA collective was
        enqueued on the caller's current stream, so later work on that stream is already ordered.
        """
        # CPU tensors: nothing is queued on a stream. CUDA tensors: the collective was enqueued
        # on the caller's current stream, so work after it on that stream is already ordered.
        pass


class Completer:
    """Threads that wait for ringtree work and complete the matching RingtreeWork.

    Completing a future runs its then-callbacks on the completing thread, and a callback may
    itself start a collective and wait for it (PowerSGD's hooks do). So a thread is never
    the only one left to finish other work: each submission either reserves an idle thread
    or starts a new one; idle threads exit after a while.
    """

    _IDLE_SECONDS = 30.0

    def __init__(self, name):
        self._name = name
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, rt_works, finish, work):
        self._queue.put((rt_works, finish, work))
        with self._lock:
            if self._idle > 0:
                self._idle -= 1  # that thread will take this item
                return
        threading.Thread(target=self._loop, name=f"{self._name}-completion", daemon=True).start()

    def _loop(self):
        while True:
            try:
                rt_works, finish, work = self._queue.get(timeout=self._IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # not reserved by a submit that is about to put
                        self._idle -= 1
                        return
                continue
            error = None
            try:
                for rt_work in rt_works:
                    rt_work.wait()
                if finish is not None:
                    finish()
            except BaseException as exc:  # noqa: BLE001 - delivered to whoever waits
                error = exc
            work._complete(error)
            with self._lock:
                self._idle += 1


class RingtreeMessageWork(RingtreeWork):
    """A RingtreeWork over messages: after a receive, source_rank() names the sender."""

    def __init__(self, outputs, messages):
        super().__init__(outputs)
        self.messages = messages

    def source_rank(self):
        self.wait()
        return self.messages[0].source

    _source_rank = source_rank  # what torch.distributed.recv(src=None) calls
