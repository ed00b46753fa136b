"""Reduce operations: strings ("sum", ...), the ReduceOp enum, or premul_sum(factor)."""

from __future__ import annotations

import enum
import math

from . import _core

OP_CODES = {name: code for code, name in enumerate(_core.OPS)}


class ReduceOp(enum.IntEnum):
    SUM = OP_CODES["sum"]
    PROD = OP_CODES["prod"]
    MIN = OP_CODES["min"]
    MAX = OP_CODES["max"]
    AVG = OP_CODES["avg"]
    PREMUL_SUM = OP_CODES["premul_sum"]
    # Integer dtypes only (torch's BAND/BOR/BXOR).
    BAND = OP_CODES["band"]
    BOR = OP_CODES["bor"]
    BXOR = OP_CODES["bxor"]


class PremulSum:
    """Sum of every rank's input multiplied by `factor` first (NCCL's ncclRedOpCreatePreMulSum)."""

    __slots__ = ("factor",)

    def __init__(self, factor: float):
        factor = float(factor)
        if not math.isfinite(factor):
            raise _core.InvalidArgument(f"premul_sum factor must be finite, got {factor}")
        self.factor = factor

    def __repr__(self):
        return f"premul_sum({self.factor})"


def premul_sum(factor: float) -> PremulSum:
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
