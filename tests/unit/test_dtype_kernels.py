"""The host kernels of the dtypes added after the first release (int16, uint16/32/64, float8 e4m3fn
and e5m2, complex64/128), single process, through the test module's hooks, against independent
expectations: numpy for the integers (which wrap like C), torch's float32 -> float8 conversion for
rounding (round to nearest even; e4m3fn saturates at +-448, e5m2 overflows to inf), and complex
products written out part by part. A NaN matches any NaN."""

from __future__ import annotations

import _ringtree_testing as testing
import numpy as np
import pytest

from ringtree import _core

ml_dtypes = pytest.importorskip("ml_dtypes")
torch = pytest.importorskip("torch")

CODE = {name: code for code, name in enumerate(_core.DTYPES)}
OP = {name: code for code, name in enumerate(_core.OPS)}
FLOAT8 = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
INTEGERS = {"int16": np.int16, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64}
COMPLEX = {"complex64": np.complex64, "complex128": np.complex128}


def reduce(name, op, a, b):
    out = np.empty_like(a)
    testing.reduce(out.ctypes.data, a.ctypes.data, b.ctypes.data, a.size, CODE[name], OP[op])
    return out


def scale(name, x, factor):
    out = np.empty_like(x)
    testing.scale(out.ctypes.data, x.ctypes.data, x.size, CODE[name], factor)
    return out


def divide(name, x, divisor):
    out = x.copy()
    testing.divide(out.ctypes.data, out.size, CODE[name], divisor)
    return out


def torch_float8(name, x32):
    """float32 values -> float8 bit patterns, rounded by torch."""
    return torch.from_numpy(np.ascontiguousarray(x32, np.float32)).to(FLOAT8[name]).view(torch.uint8).numpy()


def same(got_bits, want_bits, name):
    """Bit patterns equal, or both NaN."""
    dt = np.dtype(getattr(ml_dtypes, name))
    nan = np.isnan(got_bits.view(dt).astype(np.float32)) & np.isnan(want_bits.view(dt).astype(np.float32))
    return (got_bits == want_bits) | nan


EVERY_PAIR = np.array(np.meshgrid(np.arange(256), np.arange(256))).reshape(2, -1).astype(np.uint8)


@pytest.mark.parametrize("name", list(FLOAT8))
def test_float8_codes_widen_to_ml_dtypes_values(name):
    """Every code widens exactly: scaling by 1 returns every non-NaN code unchanged (widening and
    narrowing are inverse), and summing with -0 gives ml_dtypes' float32 value rounded back."""
    dt = np.dtype(getattr(ml_dtypes, name))
    codes = np.arange(256, dtype=np.uint8)
    values = codes.view(dt).astype(np.float32)
    keep = ~np.isnan(values)
    assert np.array_equal(scale(name, codes, 1.0)[keep], codes[keep])
    assert np.isnan(scale(name, codes, 1.0).view(dt).astype(np.float32)[~keep]).all()
    # -0.0 is code 0x80 in both formats: x + (-0) == x for every x, -0 + -0 == -0.
    minus_zero = np.full(256, 0x80, np.uint8)
    assert np.array_equal(reduce(name, "sum", codes, minus_zero)[keep], codes[keep])


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
@pytest.mark.parametrize("name", list(FLOAT8))
def test_float8_every_pair_of_codes(name, op):
    """All 65536 (a, b) pairs: computed in float32, rounded once by torch's conversion."""
    dt = np.dtype(getattr(ml_dtypes, name))
    a, b = EVERY_PAIR[0].copy(), EVERY_PAIR[1].copy()
    x, y = a.view(dt).astype(np.float32), b.view(dt).astype(np.float32)
    with np.errstate(all="ignore"):
        exact = {"sum": x + y, "prod": x * y, "min": np.where(y < x, y, x), "max": np.where(x < y, y, x)}[op]
    got = reduce(name, op, a, b)
    ok = same(got, torch_float8(name, exact), name)
    assert ok.all(), f"{int((~ok).sum())} wrong, first a={a[~ok][0]:#x} b={b[~ok][0]:#x} got {got[~ok][0]:#x}"


@pytest.mark.parametrize("factor", [0.5, 1 / 3, -2.5, 3.0, 1e-3, 600.0, 1e30, float("inf"), float("nan")])
@pytest.mark.parametrize("name", list(FLOAT8))
def test_float8_scale_and_divide(name, factor):
    """premul_sum's and avg's maps: the product (quotient) in double, rounded to float32, then to float8."""
    dt = np.dtype(getattr(ml_dtypes, name))
    codes = np.arange(256, dtype=np.uint8)
    v = codes.view(dt).astype(np.float64)
    with np.errstate(all="ignore"):
        want = torch_float8(name, (v * factor).astype(np.float32))
    assert same(scale(name, codes, factor), want, name).all()
    for divisor in (2, 3, 7, -3):
        assert same(divide(name, codes, divisor), torch_float8(name, (v / divisor).astype(np.float32)), name).all()


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "band", "bor", "bxor"])
@pytest.mark.parametrize("name", list(INTEGERS))
def test_integer_kernels_wrap_like_numpy(name, op):
    t = INTEGERS[name]
    rng = np.random.default_rng([len(name), len(op)])
    info = np.iinfo(t)
    a = rng.integers(info.min, info.max, size=4099, endpoint=True, dtype=t)
    b = rng.integers(info.min, info.max, size=4099, endpoint=True, dtype=t)
    f = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
    f.update(band=np.bitwise_and, bor=np.bitwise_or, bxor=np.bitwise_xor)
    with np.errstate(over="ignore"):
        assert np.array_equal(reduce(name, op, a, b), f[op](a, b))


@pytest.mark.parametrize("name", list(INTEGERS))
def test_integer_scale_wraps_and_divide_truncates(name):
    t = INTEGERS[name]
    info = np.iinfo(t)
    x = np.random.default_rng(len(name)).integers(info.min, info.max, size=1001, endpoint=True, dtype=t)
    x[:4] = [info.max, info.min, 0, 1]
    with np.errstate(over="ignore"):
        assert np.array_equal(scale(name, x, 3.0), (x.astype(np.uint64) * np.uint64(3)).astype(t))
    if info.min == 0:  # unsigned: the whole range divides as unsigned (uint64 above 2^63 too)
        assert np.array_equal(divide(name, x, 3), x // t(3))
    else:
        w = x.astype(np.int64)
        assert np.array_equal(divide(name, x, 3), (np.sign(w) * (np.abs(w) // 3)).astype(t))


@pytest.mark.parametrize("name", list(COMPLEX))
def test_complex_sum_and_product_part_by_part(name):
    t = COMPLEX[name]
    rng = np.random.default_rng(len(name))
    a = (rng.standard_normal(4099) + 1j * rng.standard_normal(4099)).astype(t)
    b = (rng.standard_normal(4099) + 1j * rng.standard_normal(4099)).astype(t)
    assert np.array_equal(reduce(name, "sum", a, b), a + b)
    want = np.empty_like(a)
    want.real = a.real * b.real - a.imag * b.imag  # each product and difference rounded in the part type
    want.imag = a.real * b.imag + a.imag * b.real
    assert np.array_equal(reduce(name, "prod", a, b), want)
    part = a.real.dtype
    want_scaled = np.empty_like(a)
    want_scaled.real = (a.real.astype(np.float64) * 0.3).astype(part)
    want_scaled.imag = (a.imag.astype(np.float64) * 0.3).astype(part)
    assert np.array_equal(scale(name, a, 0.3), want_scaled)
    want_divided = np.empty_like(a)
    want_divided.real = (a.real.astype(np.float64) / 3).astype(part)
    want_divided.imag = (a.imag.astype(np.float64) / 3).astype(part)
    assert np.array_equal(divide(name, a, 3), want_divided)


@pytest.mark.parametrize("op", ["min", "max"])
@pytest.mark.parametrize("name", list(COMPLEX))
def test_complex_min_and_max_are_refused(name, op):
    a = np.ones(4, COMPLEX[name])
    with pytest.raises(testing.InvalidArgument, match="ordered dtype"):
        reduce(name, op, a, a)
