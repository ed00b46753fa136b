"""The flight-recorder side of a communicator: its id, records and dumps, call labels, and the
clock offset to rank 0 that dumps and traces are aligned by."""

from __future__ import annotations

import contextlib
import json

import numpy as np

from . import _core
from ._files import dump_path, write_json


class Recording:
    """What Communicator adds for the flight recorder (runtime/flight_recorder.h): its methods
    read the communicator's core and label."""

    __slots__ = ()

    @property
    def id(self) -> str:
        """The communicator's id, the same on every rank (it names dump and trace files)."""
        return self._core.id

    def record(self, reason: str = "request") -> dict:
        """This rank's flight record: its last calls (RINGTREE_FLIGHT_RECORDER) with their
        times, states and errors, and this rank's clock offset to rank 0 (see the manual's
        troubleshooting page).

        Parameters
        ----------
        reason : str
            Why the record is taken; stored in it.

        Returns
        -------
        dict
            The record, as dump() writes it.
        """
        return json.loads(self._core.dump_json(reason))

    def dump(self, path=None, reason: str = "request") -> str:
        """Write this rank's flight record as JSON.

        Parameters
        ----------
        path : str, os.PathLike or None
            A file (ending in .json) or a directory (None: RINGTREE_DUMP_DIR, else
            ./ringtree-dumps), which then gets ringtree-<id>-rank<r>.json, the name automatic
            dumps use.
        reason : str
            Why the dump is taken; stored in it.

        Returns
        -------
        str
            The file's path.
        """
        return write_json(dump_path(path, f"ringtree-{self.id}-rank{self.rank}.json"), self._core.dump_json(reason))

    @contextlib.contextmanager
    def label(self, value: int):
        """A context manager: calls issued inside the block carry `value` in the flight
        recorder, its dumps and traces; the previous label comes back afterwards.

        Parameters
        ----------
        value : int
            The label, e.g. a bucket id or a step.
        """
        previous = self._label
        self._label = int(value)
        self._core.set_label(self._label)
        try:
            yield self
        finally:
            self._label = previous
            self._core.set_label(previous)

    def sync_clocks(self, rounds: int = 8, timeout=None) -> tuple[int, int]:
        """Re-estimate every rank's clock offset to rank 0 (NTP-style, best of `rounds`
        round trips over this communicator's own send/recv) and record it for dumps and traces.
        Collective.

        Parameters
        ----------
        rounds : int
            Round trips per rank, at least 1.
        timeout : float or None
            Seconds each send and recv may take; None: the communicator's.

        Returns
        -------
        tuple of int
            (offset_ns, error_ns): this rank's clock minus rank 0's, good to +- error_ns (half the
            best round trip); (0, 0) on rank 0.

        Raises
        ------
        InvalidArgument
            `rounds` is less than 1.
        """
        if rounds < 1:
            raise _core.InvalidArgument(f"sync_clocks: rounds must be at least 1, got {rounds}")
        stamp = np.zeros(2, np.int64)
        best = np.zeros(2, np.int64)
        if self.rank == 0:
            for peer in range(1, self.size):
                best[:] = (0, np.iinfo(np.int64).max)
                for _ in range(rounds):
                    stamp[0] = t0 = _core.now_ns()
                    self.send(stamp, peer, timeout=timeout)
                    self.recv(stamp, peer, timeout=timeout)
                    t1 = _core.now_ns()
                    half_rtt = (t1 - t0 + 1) // 2
                    if half_rtt < best[1]:
                        best[:] = (int(stamp[0]) - (t0 + (t1 - t0) // 2), half_rtt)
                self.send(best, peer, timeout=timeout)
            best[:] = 0
        elif self.size > 1:
            for _ in range(rounds):
                self.recv(stamp, 0, timeout=timeout)
                stamp[0] = _core.now_ns()
                self.send(stamp, 0, timeout=timeout)
            self.recv(best, 0, timeout=timeout)
        offset_ns, error_ns = int(best[0]), int(best[1])
        self._core.set_clock_offset(offset_ns, error_ns)
        return offset_ns, error_ns
