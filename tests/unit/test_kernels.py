"""The float16/bfloat16 host kernels, single process, through the private test module's hooks, against
numpy: a op b computed in float32 and rounded to the half type (numpy's astype(float16) and
ml_dtypes' astype(bfloat16) round to nearest even). Results are compared bit for bit; a NaN
matches any quiet NaN. The same cases under RINGTREE_KERNEL_ISA=scalar (a fresh process, as the
setting is read once) must give the same bits as the kernels this CPU selects.

    python tests/unit/test_kernels.py OUT.npz   # writes every case's result bits (used by the test)
"""

from __future__ import annotations

import os
import subprocess
import sys

import _ringtree_testing as testing
import numpy as np
import pytest

from ringtree import _core

try:
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # the test extra installs it
    BFLOAT16 = None

HALF = {"float16": np.dtype(np.float16), "bfloat16": BFLOAT16}
DTYPE_PARAMS = [
    pytest.param(name, marks=pytest.mark.skipif(dt is None, reason="needs ml_dtypes")) for name, dt in HALF.items()
]
BITWISE = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
# The half types' ops (avg and premul_sum reduce with sum; their scaling is a separate pass).
OPS = [op for op in _core.OPS if op not in BITWISE]
LENGTHS = [0, 1, 7, 8, 15, 16, 17, 1000, 4099]
FACTORS = [0.5, 1 / 3, -2.5, 3.0, 1e-3, 7e4, 1e-30, 1e30, 0.0, float("inf"), float("nan")]
DIVISORS = [1, 2, 3, 5, 7, 8, 1000, -3]
CANARY = 0x5A5A  # fills dst beyond count: a kernel must not write there

# Bit patterns worth meeting: zeros, infinities, quiet and signalling NaNs of both signs, the
# smallest and largest subnormals, the smallest and largest normals, one, and near-maxima.
SPECIAL_BITS = {
    "float16": [
        0x0000,
        0x8000,
        0x7C00,
        0xFC00,
        0x7E00,
        0xFE00,
        0x7C01,
        0xFD55,
        0x0001,
        0x8001,
        0x03FF,
        0x83FF,
        0x0400,
        0x7BFF,
        0xFBFF,
        0x7BFE,
        0x3C00,
        0xBC00,
        0x3555,
    ],
    "bfloat16": [
        0x0000,
        0x8000,
        0x7F80,
        0xFF80,
        0x7FC0,
        0xFFC0,
        0x7F81,
        0xFFA5,
        0x0001,
        0x8001,
        0x007F,
        0x807F,
        0x0080,
        0x7F7F,
        0xFF7F,
        0x7F7E,
        0x3F80,
        0xBF80,
        0x3EAB,
    ],
}
MANTISSA_BITS = {"float16": 10, "bfloat16": 7}


def nan_mask(bits: np.ndarray, name: str) -> np.ndarray:
    return (bits & 0x7FFF) > (0x7C00 if name == "float16" else 0x7F80)


def widen(bits: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # signalling NaNs
        return bits.view(HALF[name]).astype(np.float32)


def narrow(values: np.ndarray, name: str) -> np.ndarray:
    return values.astype(HALF[name]).view(np.uint16)


def operands(name: str, n: int, seed: int):
    """Two inputs of n elements: random bit patterns, ordinary values, special values, and pairs
    whose exact sum is a rounding tie (b is half an ulp of a), including ties at the largest
    finite value, which round to infinity when its last bit is odd."""
    rng = np.random.default_rng([seed, n, len(name)])
    special = np.array(SPECIAL_BITS[name], np.uint16)
    ordinary = narrow(rng.standard_normal(n).astype(np.float32) * np.float32(100), name)
    a = np.where(rng.random(n) < 0.4, rng.integers(0, 1 << 16, n, dtype=np.uint16), ordinary)
    b = np.where(
        rng.random(n) < 0.4,
        rng.integers(0, 1 << 16, n, dtype=np.uint16),
        narrow(rng.standard_normal(n).astype(np.float32), name),
    )
    a = np.where(rng.random(n) < 0.15, rng.choice(special, n), a).astype(np.uint16)
    b = np.where(rng.random(n) < 0.15, rng.choice(special, n), b).astype(np.uint16)
    # Ties: a in [2^-4, 2^4), so half its ulp is representable in both types.
    tie = rng.random(n) < 0.15
    tie_a = narrow(np.ldexp(rng.uniform(1, 2, n), rng.integers(-4, 4, n)).astype(np.float32), name)
    _, exponent = np.frexp(widen(tie_a, name))
    tie_b = narrow(np.ldexp(np.float32(1), exponent - 2 - MANTISSA_BITS[name]).astype(np.float32), name)
    largest = np.uint16(0x7BFF if name == "float16" else 0x7F7F)
    largest_exponent = 15 if name == "float16" else 127
    half_ulp_of_largest = narrow(np.array([2.0 ** (largest_exponent - MANTISSA_BITS[name] - 1)], np.float32), name)[0]
    a = np.where(tie, tie_a, a)
    b = np.where(tie, tie_b, b)
    if n >= 4:  # the largest value plus half its ulp, and a little less than half
        a[-4:] = [largest, largest, largest - 1, largest - 1]
        b[-4:] = [half_ulp_of_largest, half_ulp_of_largest - 1, half_ulp_of_largest, half_ulp_of_largest - 1]
    return a.astype(np.uint16), b.astype(np.uint16)


def expected_reduce(a: np.ndarray, b: np.ndarray, op: str, name: str) -> np.ndarray:
    x, y = widen(a, name), widen(b, name)
    with np.errstate(all="ignore"):
        if op == "prod":
            r = x * y
        elif op == "min":  # b < a ? b : a, so a NaN in either keeps a
            r = np.where(y < x, y, x)
        elif op == "max":  # a < b ? b : a
            r = np.where(x < y, y, x)
        else:
            r = x + y
        return narrow(r.astype(np.float32), name)


def expected_map(src: np.ndarray, name: str, factor=None, divisor=None) -> np.ndarray:
    # The kernels take the product or quotient in double and round to float, then to the half type.
    with np.errstate(all="ignore"):
        x = widen(src, name).astype(np.float64)
        r = x * factor if divisor is None else x / float(divisor)
        return narrow(r.astype(np.float32), name)


def with_canary(n: int) -> np.ndarray:
    return np.full(n + 16, CANARY, np.uint16)


def run_reduce(dst, a, b, n, name, op):
    testing.reduce(dst.ctypes.data, a.ctypes.data, b.ctypes.data, n, _core.DTYPES.index(name), _core.OPS.index(op))


def reduce_bits(a, b, name, op):
    dst = with_canary(len(a))
    run_reduce(dst, a, b, len(a), name, op)
    assert (dst[len(a) :] == CANARY).all(), "wrote past count"
    return dst[: len(a)]


def scale_bits(src, name, factor):
    dst = with_canary(len(src))
    testing.scale(dst.ctypes.data, src.ctypes.data, len(src), _core.DTYPES.index(name), factor)
    assert (dst[len(src) :] == CANARY).all(), "wrote past count"
    return dst[: len(src)]


def divide_bits(src, name, divisor):
    dst = with_canary(len(src))
    dst[: len(src)] = src
    testing.divide(dst.ctypes.data, len(src), _core.DTYPES.index(name), divisor)
    assert (dst[len(src) :] == CANARY).all(), "wrote past count"
    return dst[: len(src)]


def assert_same_bits(got: np.ndarray, want: np.ndarray, name: str, what: str, loose=None):
    """Bit-exact, except that where want is NaN, got must be a quiet NaN (any); `loose` marks
    further positions where any NaN matches a NaN."""
    got_nan, want_nan = nan_mask(got, name), nan_mask(want, name)
    assert (got_nan == want_nan).all(), (
        f"{what}: NaN where not expected, or missing, at {np.nonzero(got_nan != want_nan)[0][:8]}"
    )
    quiet_bit = 0x0200 if name == "float16" else 0x0040
    assert (got[got_nan] & quiet_bit).all(), f"{what}: signalling NaN in the result"
    compare = ~want_nan if loose is None else ~(want_nan & loose)
    wrong = np.nonzero((got != want) & compare)[0]
    assert len(wrong) == 0, (
        f"{what}: {len(wrong)} wrong, first at {wrong[:4]}: "
        f"got {[hex(v) for v in got[wrong[:4]]]} want {[hex(v) for v in want[wrong[:4]]]}"
    )


@pytest.mark.parametrize("op", list(BITWISE))
@pytest.mark.parametrize("name", ["int8", "uint8", "int32", "int64"])
def test_bitwise_kernels_match_numpy(name, op):
    dtype = np.dtype(name)
    rng = np.random.default_rng(7)
    for n in LENGTHS:
        a, b = (rng.integers(0, 1 << 63, n, dtype=np.uint64).astype(dtype) for _ in range(2))
        dst = np.full(n + 16, 0x5A, dtype)
        testing.reduce(dst.ctypes.data, a.ctypes.data, b.ctypes.data, n, _core.DTYPES.index(name), _core.OPS.index(op))
        assert np.array_equal(dst[:n], BITWISE[op](a, b)), f"{name} {op} n={n}"
        assert (dst[n:] == dtype.type(0x5A)).all(), "wrote past count"


@pytest.mark.parametrize("op", list(BITWISE))
@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64"])
def test_bitwise_kernels_refuse_floating_types(name, op):
    x = np.zeros(4, np.float64)
    with pytest.raises(testing.InvalidArgument, match="integer dtype"):
        testing.reduce(x.ctypes.data, x.ctypes.data, x.ctypes.data, 1, _core.DTYPES.index(name), _core.OPS.index(op))


@pytest.mark.parametrize("name", DTYPE_PARAMS)
@pytest.mark.parametrize("op", OPS)
def test_reduce_matches_numpy(name, op):
    for n in LENGTHS:
        a, b = operands(name, n, seed=1)
        assert_same_bits(reduce_bits(a, b, name, op), expected_reduce(a, b, op, name), name, f"{name} {op} n={n}")


@pytest.mark.parametrize("name", DTYPE_PARAMS)
def test_reduce_every_value_against_special_values(name):
    every = np.arange(1 << 16, dtype=np.uint16)
    special = np.array(SPECIAL_BITS[name], np.uint16)
    a, b = np.repeat(every, len(special)), np.tile(special, 1 << 16)
    for op in ("sum", "prod", "min", "max"):
        assert_same_bits(reduce_bits(a, b, name, op), expected_reduce(a, b, op, name), name, f"{name} {op}")
        assert_same_bits(reduce_bits(b, a, name, op), expected_reduce(b, a, op, name), name, f"{name} {op} swapped")


@pytest.mark.parametrize("name", DTYPE_PARAMS)
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_reduce_in_place(name, op):
    for n in (1, 17, 4099):
        a, b = operands(name, n, seed=2)
        want = reduce_bits(a, b, name, op)
        for dst_is in ("a", "b"):
            x, y = a.copy(), b.copy()
            dst = x if dst_is == "a" else y
            run_reduce(dst, x, y, n, name, op)
            assert (dst == want).all(), f"{name} {op} n={n} with dst aliasing {dst_is}"


@pytest.mark.parametrize("name", DTYPE_PARAMS)
def test_scale_matches_numpy(name):
    for n in LENGTHS:
        src, _ = operands(name, n, seed=3)
        for factor in FACTORS:
            assert_same_bits(
                scale_bits(src, name, factor),
                expected_map(src, name, factor=factor),
                name,
                f"{name} scale by {factor} n={n}",
            )


@pytest.mark.parametrize("name", DTYPE_PARAMS)
def test_divide_matches_numpy(name):
    for n in LENGTHS:
        src, _ = operands(name, n, seed=4)
        for divisor in DIVISORS:
            assert_same_bits(
                divide_bits(src, name, divisor),
                expected_map(src, name, divisor=divisor),
                name,
                f"{name} divide by {divisor} n={n}",
            )


def all_results() -> dict:
    """Every kernel on a fixed set of inputs, keyed by case; compared across processes."""
    out = {}
    for name in [n for n, dt in HALF.items() if dt is not None]:
        a, b = operands(name, 4099, seed=5)
        every = np.arange(1 << 16, dtype=np.uint16)
        shuffled = np.random.default_rng(6).permutation(every)
        for op in OPS:
            out[f"{name}/{op}/random"] = reduce_bits(a, b, name, op)
            out[f"{name}/{op}/every"] = reduce_bits(every, shuffled, name, op)
        for i, factor in enumerate(FACTORS):
            out[f"{name}/scale{i}"] = scale_bits(every, name, factor)
        for divisor in DIVISORS:
            out[f"{name}/divide{divisor}"] = divide_bits(every, name, divisor)
    return out


def both_nan_inputs(key: str):
    """Where both operands of a sum or product are NaN, which NaN comes out depends on the
    operand order the compiler picked for the scalar path, not on any contract."""
    name, case = key.split("/", 1)
    every = np.arange(1 << 16, dtype=np.uint16)
    if case.startswith("scale"):
        return nan_mask(every, name) if np.isnan(FACTORS[int(case[len("scale") :])]) else None
    if case.startswith("divide"):
        return None
    op, inputs = case.split("/")
    if op not in ("sum", "prod", "avg", "premul_sum"):
        return None
    a, b = operands(name, 4099, seed=5) if inputs == "random" else (every, np.random.default_rng(6).permutation(every))
    return nan_mask(a, name) & nan_mask(b, name)


def test_cpu_with_avx2_and_f16c_selects_the_vector_kernels():
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    want = (
        "avx2+f16c"
        if {"avx2", "f16c"} <= set(flags) and os.environ.get("RINGTREE_KERNEL_ISA") != "scalar"
        else "scalar"
    )
    assert _core._kernel_isa() == want


def test_scalar_fallback_gives_the_same_bits(tmp_path):
    out = tmp_path / "scalar.npz"
    env = dict(os.environ, RINGTREE_KERNEL_ISA="scalar")
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), str(out)], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "scalar"
    scalar = np.load(out)
    mine = all_results()
    assert sorted(scalar.files) == sorted(mine)
    for key, bits in mine.items():
        assert_same_bits(
            bits, scalar[key], key.split("/")[0], f"{_core._kernel_isa()} vs scalar: {key}", loose=both_nan_inputs(key)
        )


def test_unknown_kernel_isa_setting_is_an_error():
    env = dict(os.environ, RINGTREE_KERNEL_ISA="avx512")
    proc = subprocess.run(
        [sys.executable, "-c", "from ringtree import _core; _core._kernel_isa()"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "RINGTREE_KERNEL_ISA" in proc.stderr


if __name__ == "__main__":
    np.savez(sys.argv[1], **all_results())
    print(_core._kernel_isa())
