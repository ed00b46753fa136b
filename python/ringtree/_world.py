"""Where a process gets its communicators and what it does with all of them at once: init()
(the world, from the launcher's environment or explicit arguments), join() (a place in a
communicator that grow() made), dump() and trace() (every live communicator of the process)."""

from __future__ import annotations

import os

from . import _core, timeline
from ._args import default_timeout, timeout_arg
from ._launchers import detect
from .comm import Communicator, live_communicators
from .elastic import grow_token_place

__all__ = ["init", "join", "dump", "trace", "cuda_available"]


def cuda_available() -> bool:
    """Whether CUDA buffers can be used.

    Returns
    -------
    bool
        True when this build has the CUDA path and the CUDA runtime finds a device.
    """
    return bool(_core.cuda_available())


def init(
    rank: int | None = None, size: int | None = None, unique_id=None, timeout: float | None = None
) -> Communicator:
    """The world communicator.

    With no arguments, rank/size/unique id come from the launcher's environment (ringtree's own
    launcher, mpiexec, torchrun or Slurm; the manual's launching page gives the order). Explicit
    arguments override it: rank and size together, plus unique_id (a UniqueId or its str() token)
    when size > 1. Collective: every rank of the world calls it.

    Parameters
    ----------
    rank : int or None
        This process's rank, 0..size-1.
    size : int or None
        The number of ranks.
    unique_id : UniqueId, str or None
        Rank 0's rendezvous token; None with size 1 makes a fresh one.
    timeout : float or None
        Seconds every call of the communicator may take, set-up included; None:
        default_timeout() (RINGTREE_TIMEOUT).

    Returns
    -------
    Communicator
        The world communicator, connected to every other rank.

    Raises
    ------
    InvalidArgument
        Only one of rank and size, or no unique id for a world of more than one rank.
    BootstrapError
        The ranks could not meet (a wrong secret, or rank 0 unreachable).
    Timeout
        Not every rank arrived within `timeout`.
    """
    timeout = default_timeout() if timeout is None else float(timeout)
    if rank is not None or size is not None or unique_id is not None:
        if rank is None or size is None:
            raise _core.InvalidArgument("init: give rank and size together")
        if int(size) > 1 and unique_id is None:
            raise _core.InvalidArgument("init: a world of more than one rank needs unique_id")
        token = unique_id
    else:
        rank, size, token, _ = detect()
    if token is None:
        if int(size) != 1:
            raise _core.InvalidArgument(f"init: size {size} needs a unique id")
        token = _core.UniqueId.create()
    return Communicator(rank, size, token, timeout)


def join(token: str, index: int = 0, timeout=None) -> Communicator:
    """A new process's place in the communicator that Communicator.grow() forms: `token` is what
    grow's publish callback received, `index` this process's number among the joiners
    (0..joiners-1). It becomes rank old size + index. Collective with the grow and the other
    joiners.

    Parameters
    ----------
    token : str
        The token grow's publish callback received.
    index : int
        This process's number among the joiners, 0..joiners-1.
    timeout : float or None
        Seconds the communicator's calls may take; None: default_timeout().

    Returns
    -------
    Communicator
        The grown communicator, with this process as rank old size + index.

    Raises
    ------
    InvalidArgument
        The token is malformed or `index` is out of range.
    """
    rank, size, uid = grow_token_place(token, index)
    timeout = timeout_arg(None, timeout, "join")
    return Communicator(rank, size, uid, default_timeout() if timeout is None else timeout)


def dump(dir=None, reason: str = "request") -> list:
    """Write the flight record of every live communicator of this process into `dir`
    (default RINGTREE_DUMP_DIR, else ./ringtree-dumps) as ringtree-<id>-rank<r>.json; returns
    the paths. Call it on every rank of a hung job (or send each rank SIGUSR1), then run
    `python -m ringtree.analyze DIR`.

    Parameters
    ----------
    dir : str, os.PathLike or None
        The directory to write into.
    reason : str
        Recorded in each dump, e.g. why it was taken.

    Returns
    -------
    list of str
        The paths written, one per live communicator.

    Raises
    ------
    InvalidArgument
        `dir` ends in .json (Communicator.dump writes one file).
    """
    if dir is not None and os.fspath(dir).endswith(".json"):
        raise _core.InvalidArgument(f"rt.dump takes a directory, got {dir!r}; Communicator.dump takes a file")
    return [comm.dump(dir, reason) for comm in live_communicators()]


def trace(path) -> str:
    """Write this process's timeline now (every live communicator; one track per rank, on
    the clock aligned to rank 0) as Chrome / Perfetto trace-event JSON to `path`.

    Parameters
    ----------
    path : str or os.PathLike
        The file to write.

    Returns
    -------
    str
        `path`.
    """
    return timeline.write_trace([comm.record("trace") for comm in live_communicators()], path)
