"""Exactly predictable inputs and expected outputs, and #wrong counting.

Inputs are small integers chosen per (op, dtype, P) so that every partial and final
result of the reduction is representable in the dtype: then any reduction order
gives the same bits, and a result is either exactly right or wrong. The bounds:
  cap(dtype)  largest integer n such that 0..n are all exact in the dtype
              (int8 127, bfloat16 256, float16 2048, float32 2^24, ...)
  sum   values in 0..m with P*m <= cap
  prod  values in {1, 2} with at most floor(log2(cap)) twos per element
  min/max  values in 0..16
  avg   a(i) + d(r, i) where the d's of one element add to 0, so the sum is P*a(i)
        and the average a(i) is exact; float avg may be computed as sum * (1/P) or
        by pre-multiplying, so floats get a tolerance of (P+1) ulp there (ints none;
        float8, which ringtree divides and rounds once and no peer runs, 1 ulp)
  copy (non-reductions)  (29 r + 7 i + 3) mod 97: differs between ranks and offsets
Values are generated in int64 and cast once, so the expected result is computed in
exact integer arithmetic. Where a value is not exact in the dtype (copies and min/max in
float8), input and expected round alike, and min/max commute with rounding. Complex values
are v - v i (both parts checked), real for prod.
"""

from __future__ import annotations

import math

import numpy as np

from . import collectives as colls

try:  # bfloat16 for numpy; without it the bfloat16 dtype is reported unavailable
    import ml_dtypes
except ImportError:  # pragma: no cover - depends on the environment
    ml_dtypes = None

REDUCTION_KINDS = ("sum", "prod", "min", "max", "avg")
EXACT_CAP = {
    "int8": 127,
    "uint8": 255,
    "int32": 2**31 - 1,
    "int64": 2**63 - 1,
    "float16": 2048,
    "bfloat16": 256,
    "float32": 2**24,
    "float64": 2**53,
    "int16": 2**15 - 1,
    "uint16": 2**16 - 1,
    "uint32": 2**32 - 1,
    "uint64": 2**63 - 1,  # values are made in int64
    "float8_e4m3fn": 16,
    "float8_e5m2": 8,
    "complex64": 2**24,  # each part as float32
    "complex128": 2**53,
}
# Spacing of floats at 1.0, for the avg tolerance.
FLOAT_EPS = {
    "float16": 2.0**-10,
    "bfloat16": 2.0**-7,
    "float32": 2.0**-23,
    "float64": 2.0**-52,
    "float8_e4m3fn": 2.0**-3,
    "float8_e5m2": 2.0**-2,
    "complex64": 2.0**-23,
    "complex128": 2.0**-52,
}
ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")  # numpy has them through ml_dtypes
# nccl-tests' names for the type column.
NCCL_TYPE_NAMES = {
    "int8": "int8",
    "uint8": "uint8",
    "int32": "int32",
    "int64": "int64",
    "float16": "half",
    "bfloat16": "bfloat16",
    "float32": "float",
    "float64": "double",
    "int16": "int16",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "float8_e4m3fn": "f8e4m3",
    "float8_e5m2": "f8e5m2",
    "complex64": "cfloat",
    "complex128": "cdouble",
}


def np_dtype(name: str) -> np.dtype:
    if name in ML_DTYPES:
        if ml_dtypes is None:
            raise RuntimeError(f"{name} needs the ml_dtypes package (pip install ml_dtypes)")
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def to_dtype(vals: np.ndarray, kind: str, dtype_name: str) -> np.ndarray:
    """Exact int64 values in the dtype. Complex values carry -v in the imaginary part, so both
    parts are moved and reduced (not for prod, where (1+i)(1+i) leaves the integers' grid)."""
    dt = np_dtype(dtype_name)
    if dt.kind == "c":
        return (vals if kind == "prod" else vals - 1j * vals).astype(dt)
    if dtype_name in ML_DTYPES:
        return vals.astype(np.float32).astype(dt)  # small integers: exact in float32, then in the dtype
    return vals.astype(dt)


def is_float(dtype_name: str) -> bool:
    return dtype_name in FLOAT_EPS


def input_values(kind: str, rank: int, idx: np.ndarray, nranks: int, dtype_name: str) -> np.ndarray:
    """int64 input values of `rank` at element indices `idx` for an op kind (or 'copy')."""
    cap = EXACT_CAP[dtype_name]
    idx = np.asarray(idx, dtype=np.int64)
    if kind == "copy":
        return (29 * rank + 7 * idx + 3) % 97
    if kind == "sum":
        top = max(0, min(15, cap // nranks))
        return (3 * rank + idx) % (top + 1)
    if kind in ("min", "max"):
        return (5 * rank + 3 * idx) % 17
    if kind == "prod":
        twos_allowed = int(math.floor(math.log2(cap)))
        period = max(3, -(-nranks // twos_allowed))  # ranks holding a 2 for one element <= twos_allowed
        return np.where((rank + idx) % period == 0, 2, 1).astype(np.int64)
    if kind == "avg":
        base = avg_base(idx, nranks, dtype_name)
        if nranks < 2:
            return base
        plus = (idx % nranks) == rank
        minus = ((idx + 1) % nranks) == rank
        return base + plus.astype(np.int64) - minus.astype(np.int64)
    raise ValueError(f"unknown value kind {kind!r}")


def avg_base(idx: np.ndarray, nranks: int, dtype_name: str) -> np.ndarray:
    # 1 + i mod m, with P*m + 1 <= cap so partial sums (which may include one +1) stay exact.
    top = max(1, min(15, (EXACT_CAP[dtype_name] - 1) // nranks))
    return 1 + np.asarray(idx, dtype=np.int64) % top


def reduce_over_ranks(kind: str, idx: np.ndarray, nranks: int, dtype_name: str) -> np.ndarray:
    """Exact int64 reduction over all ranks' inputs at indices idx."""
    if kind == "avg":
        return avg_base(idx, nranks, dtype_name)
    combine = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[kind]
    acc = input_values(kind, 0, idx, nranks, dtype_name)
    for rank in range(1, nranks):
        acc = combine(acc, input_values(kind, rank, idx, nranks, dtype_name))
    return acc


def value_kind(coll: colls.Collective, op: str | None) -> str:
    return op if coll.reduction else "copy"


def make_input(coll: colls.Collective, rank: int, n: int, nranks: int, op: str | None, dtype_name: str) -> np.ndarray:
    """This rank's whole input buffer (send count elements), in the dtype."""
    count = coll.send_count(n, nranks)
    kind = value_kind(coll, op)
    return to_dtype(input_values(kind, rank, np.arange(count), nranks, dtype_name), kind, dtype_name)


def make_expected(
    coll: colls.Collective, rank: int, n: int, nranks: int, root: int, op: str | None, dtype_name: str
) -> np.ndarray | None:
    """What this rank's output must hold, or None where the output is undefined."""
    if not coll.output_checked_on(rank, root):
        return None
    kind = value_kind(coll, op)
    own = np.arange(rank * n, (rank + 1) * n)
    first = np.arange(n)

    def block_of(src_rank, idx):
        return input_values(kind, src_rank, idx, nranks, dtype_name)

    name = coll.name
    if name in ("all_reduce", "reduce"):
        vals = reduce_over_ranks(kind, first, nranks, dtype_name)
    elif name == "reduce_scatter":
        vals = reduce_over_ranks(kind, own, nranks, dtype_name)
    elif name in ("all_gather", "gather"):
        vals = np.concatenate([block_of(b, first) for b in range(nranks)])
    elif name == "all_to_all":
        vals = np.concatenate([block_of(b, own) for b in range(nranks)])
    elif name == "broadcast":
        vals = block_of(root, first)
    elif name == "scatter":
        vals = block_of(root, own)
    elif name == "sendrecv":
        vals = block_of((rank - 1) % nranks, first)
    else:
        raise ValueError(f"no expected result for {name!r}")
    return to_dtype(vals, kind, dtype_name)


def tolerance(op: str | None, dtype_name: str, nranks: int) -> float:
    """Relative tolerance: 0 (exact) except float avg, see the module docstring."""
    if op == "avg" and dtype_name in ML_DTYPES[1:]:
        return FLOAT_EPS[dtype_name]  # float8: one rounding, after the division (no peer runs it)
    if op == "avg" and is_float(dtype_name):
        return (nranks + 1) * FLOAT_EPS[dtype_name]
    return 0.0


def count_wrong(got: np.ndarray, expected: np.ndarray, rel_tol: float = 0.0) -> int:
    """Elements of got that differ from expected (NaN always counts as wrong)."""
    if got.shape != expected.shape:
        raise ValueError(f"output has {got.size} elements, expected {expected.size}")
    if got.size == 0:
        return 0
    if got.dtype.kind in "iu":
        return int(np.count_nonzero(got != expected))
    # 8- and 16-bit floats compare through float64, which holds their values exactly; complex
    # values through complex128.
    wide = np.complex128 if got.dtype.kind == "c" else np.float64
    g, e = got.astype(wide), expected.astype(wide)
    if rel_tol == 0.0:
        return int(np.count_nonzero(~(g == e)))
    allowed = rel_tol * np.maximum(1.0, np.abs(e))
    return int(np.count_nonzero(~(np.abs(g - e) <= allowed)))


def sentinel(dtype_name: str):
    """Pre-fill for outputs so an output the collective never wrote is caught:
    0.5 is exact in every float type and never produced; ints get a value outside
    the copy range that reductions rarely produce."""
    return 0.5 if is_float(dtype_name) else (-7 if dtype_name.startswith("int") else 251)


def corrupt(out: np.ndarray, expected: np.ndarray | None) -> bool:
    """Make out[0] wrong by 5 (well beyond any tolerance). For the --inject-error hook."""
    if expected is None or expected.size == 0:
        return False
    exp0 = float(expected[:1].real.astype(np.float64)[0]) if expected.dtype.kind == "c" else None
    exp0 = float(expected[:1].astype(np.float64)[0]) if exp0 is None else exp0
    out[:1] = np.asarray([exp0 - 5 if exp0 >= 5 else exp0 + 5], np.float32).astype(out.dtype)
    return True
