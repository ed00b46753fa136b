"""Reduce operations: strings ("sum", ...), the ReduceOp enum, or premul_sum(factor)."""

from __future__ import annotations

import enum
import math

from . import _core

OP_CODES = {name: code for code, name in enumerate(_core.OPS)}


class ReduceOp(enum.IntEnum):
    """The reduction ops, as torch.distributed names them; every call's `op` also takes the
    lower-case name as a string ("sum"). The value is the core's op code.

    Parameters
    ----------
    value : int
        An op code: ReduceOp(0) is ReduceOp.SUM.
    """

    #: The sum over ranks.
    SUM = OP_CODES["sum"]
    #: The product over ranks.
    PROD = OP_CODES["prod"]
    #: The minimum over ranks (not for complex dtypes).
    MIN = OP_CODES["min"]
    #: The maximum over ranks (not for complex dtypes).
    MAX = OP_CODES["max"]
    #: The sum divided by the number of ranks (integers truncate toward zero).
    AVG = OP_CODES["avg"]
    #: The sum of each input times a factor; pass premul_sum(factor), not this member, to a call.
    PREMUL_SUM = OP_CODES["premul_sum"]
    # Integer dtypes only (torch's BAND/BOR/BXOR).
    #: Bitwise and over ranks (integer dtypes only).
    BAND = OP_CODES["band"]
    #: Bitwise or over ranks (integer dtypes only).
    BOR = OP_CODES["bor"]
    #: Bitwise exclusive or over ranks (integer dtypes only).
    BXOR = OP_CODES["bxor"]


class PremulSum:
    """Sum of every rank's input multiplied by `factor` first (NCCL's ncclRedOpCreatePreMulSum).

    Parameters
    ----------
    factor : float
        What each input is multiplied by before the sum (integer dtypes use int(factor)).

    Raises
    ------
    InvalidArgument
        `factor` is not finite.
    """

    __slots__ = {"factor": "The factor each input is multiplied by, as a float."}

    def __init__(self, factor: float):
        factor = float(factor)
        if not math.isfinite(factor):
            raise _core.InvalidArgument(f"premul_sum factor must be finite, got {factor}")
        self.factor = factor

    def __repr__(self):
        return f"premul_sum({self.factor})"


def premul_sum(factor: float) -> PremulSum:
    """The op that sums every rank's input times `factor`.

    Parameters
    ----------
    factor : float
        What each input is multiplied by before the sum; finite.

    Returns
    -------
    PremulSum
        An op to pass as `op=` to a reducing call.

    Raises
    ------
    InvalidArgument
        `factor` is not finite.
    """
    return PremulSum(factor)


def resolve_op(op) -> tuple[int, float]:
    """Returns (op code, premul factor)."""
    if isinstance(op, PremulSum):
        return ReduceOp.PREMUL_SUM, op.factor
    if isinstance(op, ReduceOp):
        if op == ReduceOp.PREMUL_SUM:
            raise _core.InvalidArgument("use ringtree.premul_sum(factor) to give premul_sum its factor")
        return int(op), 1.0
    if isinstance(op, str) and op.lower() in OP_CODES and op.lower() != "premul_sum":
        return OP_CODES[op.lower()], 1.0
    raise _core.InvalidArgument(
        f"unsupported reduce op {op!r}; expected one of 'sum', 'prod', 'min', 'max', 'avg', 'band', 'bor', "
        f"'bxor', a ringtree.ReduceOp, or ringtree.premul_sum(factor)"
    )
