"""Independent expectations for every collective, computed with numpy from every rank's input.

Inputs are small integers, so sums, products, minima and maxima are exact in every dtype
(float16, bfloat16 and the float8 types included: their inputs are kept small enough that every
partial result of up to 8 ranks is representable, whatever order a schedule reduces in) and
results are compared exactly. Complex inputs have small-integer real and imaginary parts
(products: powers of 2 times 1, -1, i or -i), exact too. Integer sums and products wrap like C
(two's complement); integer avg truncates toward zero. Only avg on floating types is compared
with a tolerance (one rounding of the division; see AVG_RTOL).
"""

from __future__ import annotations

import functools

import numpy as np

import ringtree as rt


def _ml_dtype(name):
    """ml_dtypes' dtype `name`, or None without ml_dtypes. Imported on first use: it takes most of
    a second, and most rank processes of the suite never meet bfloat16 or float8."""
    try:
        import ml_dtypes
    except ImportError:  # the test extra installs it; without it bfloat16 and float8 run only through torch
        return None
    return np.dtype(getattr(ml_dtypes, name))


class _DtypeTable(dict):
    """Dtype name -> numpy dtype; the ml_dtypes entries (None placeholders) resolve on first read."""

    def __getitem__(self, name):
        value = dict.__getitem__(self, name)
        if value is None:
            value = _ml_dtype(name)
            if value is not None:
                self[name] = value
        return value


NUMPY_DTYPES = _DtypeTable(
    {
        "int8": np.dtype(np.int8),
        "uint8": np.dtype(np.uint8),
        "int32": np.dtype(np.int32),
        "int64": np.dtype(np.int64),
        "float16": np.dtype(np.float16),
        "bfloat16": None,
        "float32": np.dtype(np.float32),
        "float64": np.dtype(np.float64),
        "int16": np.dtype(np.int16),
        "uint16": np.dtype(np.uint16),
        "uint32": np.dtype(np.uint32),
        "uint64": np.dtype(np.uint64),
        "float8_e4m3fn": None,
        "float8_e5m2": None,
        "complex64": np.dtype(np.complex64),
        "complex128": np.dtype(np.complex128),
    }
)


OPS = ["sum", "prod", "min", "max", "avg", "premul_sum"]
INTEGER_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
FLOAT8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
COMPLEX_DTYPES = ("complex64", "complex128")
# The dtypes added after the first release's eight, which the sweeps run at fewer sizes.
NEW_DTYPES = ("int16", "uint16", "uint32", "uint64", *FLOAT8_DTYPES, *COMPLEX_DTYPES)
BITWISE = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
AVG_RTOL = {
    "float16": 2e-3,
    "bfloat16": 1.6e-2,
    "float32": 2e-7,
    "float64": 1e-15,
    "float8_e4m3fn": 1.3e-1,
    "float8_e5m2": 2.5e-1,
    "complex64": 2e-7,
    "complex128": 1e-15,
}


def is_int(dtype_name: str) -> bool:
    return dtype_name in INTEGER_DTYPES


def ops_for(dtype_name: str, ops):
    """The ops of `ops` a dtype has: complex numbers have no min or max (refused before traffic)."""
    return [op for op in ops if not (dtype_name in COMPLEX_DTYPES and op in ("min", "max"))]


def premul_factor(dtype_name: str) -> float:
    return 3.0 if is_int(dtype_name) else 0.5


def op_argument(op: str, dtype_name: str):
    return rt.premul_sum(premul_factor(dtype_name)) if op == "premul_sum" else op


# Inputs longer than PERIOD repeat with this prime period, so a reference is computed on one
# period and tiled. No block or segment boundary of the sweeps is a multiple of it, so data
# landing at the wrong offset still shows up as wrong elements.
PERIOD = 4099


@functools.lru_cache(maxsize=24)
def _input(rank: int, n: int, dtype_name: str, op: str, salt: int) -> np.ndarray:
    if n > PERIOD:
        base = _input(rank, PERIOD, dtype_name, op, salt)
        out = np.tile(base, -(-n // PERIOD))[:n]
        out.flags.writeable = False
        return out
    rng = np.random.default_rng([salt, rank, n, len(dtype_name), len(op)])
    unsigned = dtype_name.startswith("uint")
    if op == "prod":
        choices = [1, 2, 3] if unsigned else ([1, 2, -1] if is_int(dtype_name) else [1, 2, -1, 0.5])
        values = rng.choice(np.array(choices, dtype=np.float64), size=n)
    elif unsigned:
        values = rng.integers(0, 7, size=n).astype(np.float64)
    elif dtype_name in FLOAT8_DTYPES:  # partial sums of up to 8 ranks stay within [-8, 8]: exact
        values = rng.integers(-1, 2, size=n).astype(np.float64)
    else:
        values = rng.integers(-3, 4, size=n).astype(np.float64)
    if dtype_name in COMPLEX_DTYPES:
        if op == "prod":  # times 1, -1, i or -i: exact products
            values = values * rng.choice(np.array([1, -1, 1j, -1j]), size=n)
        else:
            values = values + 1j * rng.integers(-3, 4, size=n)
    wide = values.astype(np.int64) if is_int(dtype_name) else values
    out = wide.astype(NUMPY_DTYPES[dtype_name])
    out.flags.writeable = False
    return out


def make_input(rank, n, dtype_name, op="sum", salt=0) -> np.ndarray:
    return _input(rank, n, dtype_name, op, salt).copy()


def reduce_reference(arrays, op: str, dtype_name: str) -> np.ndarray:
    n = len(arrays[0])
    if n > PERIOD:  # periodic inputs (see PERIOD): reduce one period, then tile
        return np.tile(reduce_reference([a[:PERIOD] for a in arrays], op, dtype_name), -(-n // PERIOD))[:n]
    dtype = NUMPY_DTYPES[dtype_name]
    P = len(arrays)
    if op in BITWISE:  # integer dtypes only
        return BITWISE[op].reduce(np.stack(arrays), axis=0).astype(dtype)
    if is_int(dtype_name):
        wide = [a.astype(np.int64) for a in arrays]
        if op == "premul_sum":
            wide = [w * int(premul_factor(dtype_name)) for w in wide]
        if op in ("sum", "premul_sum", "avg"):
            total = functools.reduce(np.add, wide).astype(dtype)  # wraps like the runtime
            if op != "avg":
                return total
            if dtype_name.startswith("uint"):
                return total // dtype.type(P)
            t = total.astype(np.int64)
            return (np.abs(t) // P * np.sign(t)).astype(dtype)
        if op == "prod":
            return functools.reduce(np.multiply, wide).astype(dtype)
        return (np.minimum if op == "min" else np.maximum).reduce(wide).astype(dtype)
    wide = [a.astype(np.complex128 if dtype_name in COMPLEX_DTYPES else np.float64) for a in arrays]
    if op == "premul_sum":
        wide = [w * premul_factor(dtype_name) for w in wide]
    if op in ("sum", "premul_sum"):
        return functools.reduce(np.add, wide).astype(dtype)
    if op == "avg":
        return divide_parts(functools.reduce(np.add, wide).astype(dtype).astype(wide[0].dtype), P).astype(dtype)
    if op == "prod":
        return functools.reduce(np.multiply, wide).astype(dtype)
    return (np.minimum if op == "min" else np.maximum).reduce(wide).astype(dtype)


def divide_parts(x: np.ndarray, divisor: int) -> np.ndarray:
    """x / divisor, a complex x part by part as the kernels divide (numpy's complex division
    multiplies by 1/divisor, which can round differently)."""
    if x.dtype.kind != "c":
        return x / divisor
    out = np.empty_like(x)
    out.real, out.imag = x.real / divisor, x.imag / divisor
    return out


def mismatches(got: np.ndarray, want: np.ndarray, dtype_name: str, op: str) -> int:
    """Number of differing elements (exact, except avg on floating types)."""
    if got.shape != want.shape:
        return max(got.size, want.size)
    if is_int(dtype_name):  # exact integers: compare the bits (uint64 does not fit int64)
        g, w = got.view(got.dtype), want.astype(got.dtype)
    else:
        wide = np.complex128 if dtype_name in COMPLEX_DTYPES else np.float64
        g, w = got.astype(wide), want.astype(wide)
    if op == "avg" and not is_int(dtype_name):
        return int(np.count_nonzero(~np.isclose(g, w, rtol=AVG_RTOL[dtype_name], atol=0)))
    return int(np.count_nonzero(g != w))


def spread_input(seed: int, rank: int, n: int, dtype_name: str) -> np.ndarray:
    """Random values over six orders of magnitude, so that the order of a sum changes its bits
    (deterministic mode's tests; the small integers above are exact in any order)."""
    rng = np.random.default_rng([seed, rank, n])
    values = rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n)
    if dtype_name in COMPLEX_DTYPES:
        values = values + 1j * rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n)
    elif dtype_name in FLOAT8_DTYPES:  # within e4m3fn's range (448): no saturation
        values = rng.standard_normal(n) * 4.0 ** rng.uniform(-2, 2, n)
    return values.astype(NUMPY_DTYPES[dtype_name])


def rank_order_fold(arrays, dtype_name: str, op: str = "sum", factor: float = 1.0) -> np.ndarray:
    """((x_0 + x_1) + x_2) ... in the dtype, as the kernels compute it: half and float8 types add in
    float32 and round after every step; premul_sum scales each input first and avg divides the sum
    (both in double), once. Complex types add part by part."""
    dtype = NUMPY_DTYPES[dtype_name]
    wide = {"float64": np.float64, "complex64": np.complex64, "complex128": np.complex128}.get(dtype_name, np.float32)
    double = np.complex128 if dtype_name in COMPLEX_DTYPES else np.float64
    if op == "premul_sum":
        arrays = [(x.astype(double) * factor).astype(dtype) for x in arrays]
    acc = arrays[0].copy()
    for x in arrays[1:]:
        acc = (acc.astype(wide) + x.astype(wide)).astype(dtype)
    if op == "avg":
        acc = divide_parts(acc.astype(double), len(arrays)).astype(dtype)
    return acc
