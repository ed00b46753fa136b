"""ringtree: ring and tree collectives for distributed training.

    import ringtree as rt
    comm = rt.init()
    comm.all_reduce(x)
"""
from __future__ import annotations

import os

from . import _core
from ._core import (Aborted, BootstrapError, CollectiveMismatch, Error, InvalidArgument, PeerFailure,
                    Timeout, UniqueId)
from ._launchers import detect as _detect
from ._nccl import nccl_info
from .bucketing import Bucketer
from .collectives import CollectiveInfo, collective_info
from .comm import ANY_SOURCE, ANY_TAG, Communicator, MessageWork, Work, live_communicators
from .elastic import Excluded, join
from .explain import explain
from .ops import PremulSum, ReduceOp, premul_sum

__all__ = [
    "init", "Communicator", "Work", "Bucketer", "UniqueId", "ReduceOp", "PremulSum", "premul_sum",
    "Error", "InvalidArgument", "Timeout", "PeerFailure", "CollectiveMismatch", "Aborted",
    "BootstrapError", "DTYPES", "default_timeout", "explain", "nccl_info", "cuda_available",
    "collective_info", "CollectiveInfo", "dump", "trace", "MessageWork", "ANY_SOURCE", "ANY_TAG",
    "Excluded", "join",
]
__version__ = "0.1.0"

DTYPES = tuple(_core.DTYPES)


def cuda_available() -> bool:
    """True when this build has the CUDA path and the CUDA runtime finds a device."""
    return bool(_core.cuda_available())


def default_timeout() -> float:
    """RINGTREE_TIMEOUT in seconds (default 300): bounds set-up and every collective."""
    value = os.environ.get("RINGTREE_TIMEOUT", "300")
    try:
        timeout = float(value)
    except ValueError:
        raise InvalidArgument(f"RINGTREE_TIMEOUT={value!r} is not a number of seconds") from None
    if timeout <= 0:
        raise InvalidArgument(f"RINGTREE_TIMEOUT must be positive, got {timeout}")
    return timeout


def init(rank: int | None = None, size: int | None = None, unique_id=None, timeout: float | None = None) -> Communicator:
    """The world communicator.

    With no arguments, rank/size/unique id come from the launcher's environment (see
    ringtree._launchers for the order). Explicit arguments override it: rank and size together,
    plus unique_id (a UniqueId or its str() token) when size > 1.
    """
    timeout = default_timeout() if timeout is None else float(timeout)
    if rank is not None or size is not None or unique_id is not None:
        if rank is None or size is None:
            raise InvalidArgument("init: give rank and size together")
        if int(size) > 1 and unique_id is None:
            raise InvalidArgument("init: a world of more than one rank needs unique_id")
        token = unique_id
    else:
        rank, size, token, _ = _detect()
    if token is None:
        if int(size) != 1:
            raise InvalidArgument(f"init: size {size} needs a unique id")
        token = UniqueId.create()
    return Communicator(rank, size, token, timeout)


def dump(dir=None, reason: str = "request") -> list:
    """Write the flight record of every live communicator of this process into `dir`
    (default RINGTREE_DUMP_DIR, else ./ringtree-dumps) as ringtree-<id>-rank<r>.json; returns
    the paths. Call it on every rank of a hung job (or send each rank SIGUSR1), then run
    `python -m ringtree.analyze DIR`."""
    if dir is not None and os.fspath(dir).endswith(".json"):
        raise InvalidArgument(f"rt.dump takes a directory, got {dir!r}; Communicator.dump takes a file")
    return [comm.dump(dir, reason) for comm in live_communicators()]


def trace(path) -> str:
    """Write this process's timeline now (every live communicator; one track per rank, on
    the clock aligned to rank 0) as Chrome / Perfetto trace-event JSON to `path`; returns it."""
    from . import timeline
    return timeline.write_trace([comm.record("trace") for comm in live_communicators()], path)
