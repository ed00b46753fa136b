"""What a call in flight returns: Work for a collective, MessageWork for a tagged message."""

from __future__ import annotations

import collections

from . import _core


class KeptBuffers:
    """Buffers kept alive until the call or message that uses them is done: the core reads and
    writes them from its own threads, so they must outlive a Work or MessageWork the caller
    drops. Pruned of finished entries as it grows, so it holds at most about twice what is in
    flight (plus `floor`). Safe from any thread and from a finalizer run by the garbage
    collector in the middle of a prune: deque appends and pops are atomic, and a prune puts
    back what is still running instead of replacing the deque."""

    __slots__ = ("_items", "_cap", "_floor")

    def __init__(self, floor: int = 0):
        self._items = collections.deque()
        self._floor = self._cap = floor

    def add(self, work, keep):
        self._items.append((work, keep))
        if len(self._items) > self._cap:
            self.prune()

    def prune(self):
        items = self._items
        for _ in range(len(items)):
            try:
                item = items.popleft()
            except IndexError:  # another thread pruned at the same time
                break
            if not item[0].is_completed():
                items.append(item)
        self._cap = max(self._floor, 2 * len(items))

    def clear(self):
        self._items.clear()


# The buffers of collectives whose Work was dropped before they finished.
_DROPPED = KeptBuffers()


def release_finished():
    """Let go of the kept buffers of dropped Works that have finished."""
    _DROPPED.prune()


class Work:
    """A collective in flight. wait() returns the output buffer or raises the collective's error.

    Dropping it does not stop the collective: its buffers stay alive until it is done."""

    __slots__ = ("_work", "_keepalive", "_result")

    def __init__(self, work, keepalive, result):
        self._work, self._keepalive, self._result = work, keepalive, result

    def __del__(self):
        if self._keepalive is not None and not self._work.is_completed():
            _DROPPED.add(self._work, self._keepalive)

    def wait(self, timeout: float | None = None):
        """Wait for the collective and hand back its output.

        Parameters
        ----------
        timeout : float or None
            Seconds to wait; None waits until the collective completes or fails (it is bounded
            by the call's own timeout).

        Returns
        -------
        buffer
            The output buffer the call was given (the input, for an in-place call).

        Raises
        ------
        Timeout
            `timeout` passed first; the collective keeps running, so wait again.
        Error
            The collective's own error (CollectiveMismatch, PeerFailure, ...).
        """
        if not self._work.wait(-1.0 if timeout is None else float(timeout)):
            raise _core.Timeout(f"Work.wait: not completed within {timeout} s (the collective is still running)")
        self._keepalive = None
        return self._result

    def is_completed(self) -> bool:
        """Whether the collective has finished, without waiting.

        Returns
        -------
        bool
            True once it completed or failed (wait() then returns or raises at once).
        """
        return self._work.is_completed()

    def result(self):
        """The output buffer, as wait() returns it, without waiting (read it after wait()).

        Returns
        -------
        buffer
            The output buffer the call was given.
        """
        return self._result


class MessageWork:
    """One isend or irecv in flight (see Communicator.isend / irecv).

    wait(timeout=None) waits up to `timeout` seconds (None: the communicator's timeout) and
    returns the message's buffer, or raises its error (PeerFailure, Aborted, InvalidArgument
    for a message larger than the receive buffer); past the timeout it cancels the message
    and raises Timeout, after which the buffer is never touched again. After completion,
    source, tag and nbytes say what a receive got (a send reports its own)."""

    __slots__ = ("_work", "_buffer")

    def __init__(self, work, buffer):
        self._work, self._buffer = work, buffer

    def wait(self, timeout: float | None = None):
        """Wait for the message and hand back its buffer.

        Parameters
        ----------
        timeout : float or None
            Seconds to wait, positive; None: the communicator's timeout.

        Returns
        -------
        buffer
            The buffer the isend or irecv was given (a receive's now holds the message).

        Raises
        ------
        InvalidArgument
            `timeout` is not positive, or the message is larger than the receive buffer.
        Timeout
            `timeout` passed first; the message is cancelled and its buffer never touched again.
        PeerFailure
            The peer died or its connection broke.
        Aborted
            The message was cancelled, or the communicator aborted.
        """
        if timeout is None:
            seconds = 0.0
        else:
            seconds = float(timeout)
            if seconds <= 0:
                raise _core.InvalidArgument(f"MessageWork.wait: timeout must be positive, got {timeout}")
        self._work.wait(seconds)
        return self._buffer

    def is_completed(self) -> bool:
        """Whether the message has completed (or failed), without waiting.

        Returns
        -------
        bool
            True once wait() would return or raise at once.
        """
        return self._work.is_completed()

    def cancel(self) -> bool:
        """Stop the message unless it completed already. A send partly written finishes from a
        copy.

        Returns
        -------
        bool
            True when it was cancelled (wait() then raises Aborted); False when it had completed.
        """
        return self._work.cancel()

    @property
    def source(self) -> int:
        """The rank the message came from (a receive from ANY_SOURCE learns it here)."""
        return self._work.status()[0]

    @property
    def tag(self) -> int:
        """The message's tag (a receive with ANY_TAG learns it here)."""
        return self._work.status()[1]

    @property
    def nbytes(self) -> int:
        """The message's size in bytes (what a receive got, or what a send sent)."""
        return self._work.status()[2]

    def __repr__(self):
        source, tag, nbytes = self._work.status()
        state = "done" if self.is_completed() else "pending"
        return f"<ringtree.MessageWork {state} source={source} tag={tag} nbytes={nbytes}>"
