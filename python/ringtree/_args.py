"""Checks and conversions of the arguments every part of the package takes: ranks and tags,
element counts, timeouts, and the names of collectives, dtypes and algorithms as the core's codes.
Each raises InvalidArgument, naming what was wrong, before anything is sent."""

from __future__ import annotations

from . import _core, _settings
from ._buffers import DTYPE_CODES

COLL_CODES = {name: code for code, name in enumerate(_core.COLLECTIVES)}
ALGO_CODES = {name: code for code, name in enumerate(_core.ALGOS)}
#: recv, irecv and probe from any rank; probe and a receive's MessageWork say which sent it.
ANY_SOURCE = -1
#: recv, irecv and probe with any tag; probe and a receive's MessageWork say which it had.
ANY_TAG = -1
# Tags from here up belong to ringtree's own protocols (shrink); users cannot send on them, and
# the messenger's any-tag receive never matches them.
RESERVED_TAGS = _core.FIRST_RESERVED_TAG  # 2**62


def default_timeout() -> float:
    """The timeout a communicator gets when none is given: it bounds set-up and every collective.

    Returns
    -------
    float
        RINGTREE_TIMEOUT in seconds (default 300).

    Raises
    ------
    InvalidArgument
        RINGTREE_TIMEOUT is not a positive number.
    """
    value = _settings.get("RINGTREE_TIMEOUT")
    try:
        timeout = float(value)
    except ValueError:
        raise _core.InvalidArgument(f"RINGTREE_TIMEOUT={value!r} is not a number of seconds") from None
    if timeout <= 0:
        raise _core.InvalidArgument(f"RINGTREE_TIMEOUT must be positive, got {timeout}")
    return timeout


def timeout_arg(default, timeout, what):
    """`timeout` as positive seconds, or `default` when it is None."""
    if timeout is None:
        return default
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise _core.InvalidArgument(f"{what}: timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


def rank_arg(value, what):
    if isinstance(value, (bool, float)) or not hasattr(value, "__index__"):
        raise _core.InvalidArgument(f"{what} must be an int, got {value!r}")
    return int(value)


def user_tag(value, what):
    tag = rank_arg(value, f"{what}: tag")
    if tag >= RESERVED_TAGS:
        raise _core.InvalidArgument(f"{what}: tags from 2**62 up are reserved for shrink(), got {tag}")
    return tag


def counts(values, name):
    try:
        out = [int(c) for c in values]
    except (TypeError, ValueError):
        raise _core.InvalidArgument(f"{name} must be a sequence of element counts, got {values!r}") from None
    if any(c < 0 for c in out):
        raise _core.InvalidArgument(f"{name} must be non-negative, got {out}")
    return out


def coll_code(collective) -> int:
    if collective in COLL_CODES:
        return COLL_CODES[collective]
    raise _core.InvalidArgument(f"unknown collective {collective!r}; expected one of {', '.join(_core.COLLECTIVES)}")


def dtype_code(dtype) -> int:
    name = getattr(dtype, "name", dtype)  # numpy dtypes and names alike
    if isinstance(name, str) and name in DTYPE_CODES:
        return DTYPE_CODES[name]
    raise _core.InvalidArgument(f"unknown dtype {dtype!r}; expected one of {', '.join(_core.DTYPES)}")


def algo_code(algo) -> int:
    if isinstance(algo, str) and algo.lower() in ALGO_CODES:
        return ALGO_CODES[algo.lower()]
    raise _core.InvalidArgument(
        f"unknown algo {algo!r}; expected 'auto', 'ring', 'tree', 'direct', 'oneshot', "
        f"'hier', 'hier_tree', 'rank_order' or (CUDA buffers) 'nccl'"
    )
