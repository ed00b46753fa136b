"""The GPU path: CUDA reduce kernels and the single-process multi-rank executor ("thread ranks"
sharing one GPU), checked against numpy on the host.

Tests marked `gpu` need the CUDA build, a device and torch (CUDA) or cupy for device buffers;
they are skipped, with the reason, anywhere else. The `standin` tests run a slice of the same
checks everywhere, over the CUDA stand-in of the test module: the same executor and the same
kernel sources (reduce.cu through the CUDA-on-CPU layer), in its memory. The other unmarked tests
check that the CUDA entry points exist and fail clearly when there is no CUDA build or no device.

Expected values are exact: integers wrap as in C (numpy does the same), and floating inputs are
small integers (products of +-1, +-2; -1..1 for float8) so every partial result is representable
in every float type, whatever order the schedule reduces in; ranks are powers of two so avg
divides exactly. Complex inputs are such integers times 1 or i.
"""

from __future__ import annotations

import functools
import importlib.util
import zlib

import numpy as np
import pytest

import ringtree as rt
from ringtree import _core

try:
    import ml_dtypes
except ImportError:  # the test extra installs it
    ml_dtypes = None
from ringtree._args import ALGO_CODES, COLL_CODES
from ringtree._buffers import DTYPE_CODES
from ringtree.ops import OP_CODES

COLL = COLL_CODES
ALGO = ALGO_CODES
DTYPE = DTYPE_CODES
OP = OP_CODES
DTYPES = list(_core.DTYPES)
OPS = list(_core.OPS)
BITWISE = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
CASES = [
    ("all_reduce", "ring"),
    ("all_reduce", "tree"),
    ("reduce_scatter", "ring"),
    ("all_gather", "ring"),
    ("all_to_all", "direct"),
    ("broadcast", "tree"),
    ("broadcast", "ring"),
    ("reduce", "tree"),
    ("reduce", "ring"),
    ("gather", "direct"),
    ("scatter", "direct"),
    ("broadcast", "direct"),
]
REDUCTIONS = {"all_reduce", "reduce_scatter", "reduce"}
ROOTED = {"broadcast", "reduce", "gather", "scatter"}
# numpy storage for each ringtree dtype: bfloat16 travels as its raw 16-bit pattern.
NP_STORAGE = {
    "int8": np.int8,
    "uint8": np.uint8,
    "int32": np.int32,
    "int64": np.int64,
    "float16": np.float16,
    "bfloat16": np.uint16,
    "float32": np.float32,
    "float64": np.float64,
    "int16": np.int16,
    "uint16": np.uint16,
    "uint32": np.uint32,
    "uint64": np.uint64,
    "float8_e4m3fn": getattr(ml_dtypes, "float8_e4m3fn", np.uint8),
    "float8_e5m2": getattr(ml_dtypes, "float8_e5m2", np.uint8),
    "complex64": np.complex64,
    "complex128": np.complex128,
}
FLOAT8 = ("float8_e4m3fn", "float8_e5m2")
COMPLEX = ("complex64", "complex128")
if ml_dtypes is None:
    DTYPES = [d for d in DTYPES if d not in FLOAT8]
PREMUL = {True: 0.5, False: 3.0}  # floating: exact halving; integers: multiply by 3 (wrapping)


# ---- device buffers: torch or cupy, as raw bytes -------------------------------------------------


class _Torch:
    name = "torch"
    core = _core

    def __init__(self):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        self.torch = torch

    def upload(self, host: np.ndarray):
        raw = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        return self.torch.from_numpy(raw.copy()).to("cuda")

    def filled(self, nbytes: int, byte: int):
        return self.torch.full((nbytes,), byte, dtype=self.torch.uint8, device="cuda")

    def ptr(self, buf) -> int:
        return buf.data_ptr()

    def download(self, buf, dtype) -> np.ndarray:
        return buf.cpu().numpy().view(dtype)

    def stream(self) -> int:
        return self.torch.cuda.current_stream().cuda_stream

    def synchronize(self):
        self.torch.cuda.synchronize()


class _Cupy:
    name = "cupy"
    core = _core

    def __init__(self):
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        self.cp = cupy

    def upload(self, host):
        return self.cp.asarray(np.ascontiguousarray(host).reshape(-1).view(np.uint8))

    def filled(self, nbytes, byte):
        return self.cp.full((nbytes,), byte, dtype=self.cp.uint8)

    def ptr(self, buf):
        return buf.data.ptr

    def download(self, buf, dtype):
        return self.cp.asnumpy(buf).view(dtype)

    def stream(self):
        return self.cp.cuda.get_current_stream().ptr

    def synchronize(self):
        self.cp.cuda.Device().synchronize()


class _StandinBuffer:
    """Bytes of the stand-in's device memory, freed with the object."""

    def __init__(self, testing, nbytes):
        self.testing, self.nbytes = testing, nbytes
        self.ptr = testing.standin_malloc(max(nbytes, 1))

    def __del__(self):
        self.testing.standin_free(self.ptr)


class _Standin:
    """The CUDA stand-in of the test module: its thread ranks and kernels (`core`), in its memory;
    copies in and out on the legacy default stream, where the collectives are enqueued too."""

    name = "standin"

    def __init__(self):
        import _ringtree_testing

        self.core = self.testing = _ringtree_testing

    def upload(self, host):
        raw = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        buf = _StandinBuffer(self.testing, raw.nbytes)
        self.testing.standin_memcpy(buf.ptr, raw.ctypes.data, raw.nbytes)
        return buf

    def filled(self, nbytes, byte):
        return self.upload(np.full(nbytes, byte, np.uint8))

    def ptr(self, buf):
        return buf.ptr

    def download(self, buf, dtype):
        out = np.empty(buf.nbytes, np.uint8)
        self.testing.standin_memcpy(out.ctypes.data, buf.ptr, buf.nbytes)
        return out.view(dtype)

    def stream(self):
        return 0

    def synchronize(self):
        self.testing.standin_stream_synchronize(0)


@functools.lru_cache(maxsize=1)
def _backend_and_reason():
    if not _core.cuda_built():
        return None, "ringtree was built without CUDA (RINGTREE_CUDA=OFF or no nvcc at build time)"
    if not _core.cuda_available():
        return None, f"no CUDA device: {_core.cuda_unavailable_reason()}"
    errors = []
    for cls in (_Torch, _Cupy):
        try:
            return cls(), None
        except Exception as e:  # noqa: BLE001 - any import/driver failure means "try the next"
            errors.append(f"{cls.name}: {e}")
    return None, "no device array library (" + "; ".join(errors) + ")"


def _skip_reason():
    return _backend_and_reason()[1]


gpu = pytest.mark.gpu


@pytest.fixture(scope="module")
def dev():
    backend, reason = _backend_and_reason()
    if backend is None:
        print(f"\nGPU tests skipped: {reason}")
        pytest.skip(reason)
    return backend


@pytest.fixture(scope="module")
def standin():
    if importlib.util.find_spec("_ringtree_testing") is None:
        pytest.fail("the test module _ringtree_testing is missing: build with RINGTREE_TESTING=ON (the default)")
    return _Standin()


# ---- host-side arithmetic (numpy), the reference ---------------------------------------------------


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, round to nearest even (as the kernels)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def _bf16_value(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _is_float(dtype: str) -> bool:
    """Not an integer: the float, float8 and complex types."""
    return dtype.startswith("float") or dtype == "bfloat16" or dtype in COMPLEX


def _ops_for(dtype: str, ops):
    """The ops a dtype has: bitwise for integers only, min and max not for complex."""
    return [
        op for op in ops if not (op in BITWISE and _is_float(dtype)) and not (dtype in COMPLEX and op in ("min", "max"))
    ]


def _float8_round(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> float8 as the kernels round (to nearest even): ml_dtypes' conversion, except
    that e4m3fn saturates out-of-range values and infinities to +-448 (as torch), where ml_dtypes
    gives NaN."""
    x = np.asarray(x, np.float32)
    out = x.astype(NP_STORAGE[dtype])
    if dtype == "float8_e4m3fn":
        over = ~np.isnan(x) & np.isnan(out.astype(np.float32))
        out[over] = np.where(x[over] > 0, 448.0, -448.0).astype(out.dtype)
    return out


def _same_bits(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Elementwise: the same bits, or both NaN (a NaN's payload and sign are the hardware's)."""
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    if got.dtype.kind == "c":
        return _same_bits(got.real, want.real) & _same_bits(got.imag, want.imag)
    raw = got.view(f"u{got.itemsize}") == want.view(f"u{want.itemsize}")
    if _is_float(got.dtype.name) or got.dtype.kind == "V":
        raw |= np.isnan(got.astype(np.float64)) & np.isnan(want.astype(np.float64))
    return raw


def _values(dtype: str, op: str, shape, rng) -> np.ndarray:
    """Inputs as float64 for floating types (small integers, exact everywhere) or the integer type."""
    if _is_float(dtype):
        if op == "prod":
            v = rng.choice(np.array([-2.0, -1.0, 1.0, 2.0]), size=shape)
        elif dtype in FLOAT8:  # partial sums of up to 8 ranks within [-8, 8]: exact in both formats
            v = rng.integers(-1, 2, size=shape).astype(np.float64)
        else:
            v = rng.integers(-4, 5, size=shape).astype(np.float64)
        return v * rng.choice(np.array([1, 1j]), size=shape) if dtype in COMPLEX else v
    info = np.iinfo(NP_STORAGE[dtype])
    if dtype == "uint64":
        return rng.integers(0, info.max, size=shape, endpoint=True, dtype=np.uint64)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=np.int64).astype(NP_STORAGE[dtype])


def _store(dtype: str, values: np.ndarray) -> np.ndarray:
    """Values -> the storage array uploaded to the device."""
    if dtype == "bfloat16":
        return _bf16_bits(values.astype(np.float32))
    return values.astype(NP_STORAGE[dtype])


def _load(dtype: str, stored: np.ndarray) -> np.ndarray:
    """Device storage -> comparable values (float64 for floating types)."""
    if dtype == "bfloat16":
        return _bf16_value(stored).astype(np.float64)
    if dtype in COMPLEX:
        return stored.astype(np.complex128)
    if _is_float(dtype):
        return stored.astype(np.float64)
    return stored


def _reduce_ranks(dtype: str, op: str, factor: float, xs: list[np.ndarray], P: int) -> np.ndarray:
    """The reduction of every rank's array, in the storage's arithmetic (floats exact by construction)."""
    if op == "premul_sum":
        if _is_float(dtype):
            xs = [x * factor for x in xs]
        else:
            xs = [(x.astype(np.int64) * int(factor)).astype(x.dtype) for x in xs]
    base = {
        "sum": np.add,
        "avg": np.add,
        "premul_sum": np.add,
        "prod": np.multiply,
        "min": np.minimum,
        "max": np.maximum,
        **BITWISE,
    }[op]
    with np.errstate(over="ignore"):
        acc = functools.reduce(base, xs)
    if op == "avg":
        if dtype in COMPLEX:  # part by part (numpy's complex division multiplies by 1/P)
            out = np.empty_like(acc)
            out.real, out.imag = acc.real / P, acc.imag / P
            acc = out
        elif _is_float(dtype):
            acc = acc / P
        elif dtype.startswith("uint"):
            acc = acc // acc.dtype.type(P)
        else:
            s = acc.astype(np.int64)
            acc = np.where(s >= 0, s // P, -((-s) // P)).astype(acc.dtype)  # truncate toward zero
    return acc


# ---- one collective on P thread ranks ----------------------------------------------------------------

SENTINEL = 0xAB


def _buffer_counts(coll: str, P: int, N: int):
    """The root's (input, output) element counts from the core's table; broadcast's one buffer both."""
    n_in, n_out = rt.collective_info(coll).buffer_sizes(N, P, is_root=True)
    return n_in, n_out or n_in


def run_and_check(dev, coll, algo, P, N, dtype, op="sum", root=0, in_place=False, seed=0, segment_bytes=0):
    rng = np.random.default_rng(seed)
    esz = np.dtype(NP_STORAGE[dtype]).itemsize
    n_in, n_out = _buffer_counts(coll, P, N)
    reduces = coll in REDUCTIONS
    op = op if reduces else "sum"
    factor = PREMUL[_is_float(dtype)] if op == "premul_sum" else 1.0
    vals = [_values(dtype, op, n_in, rng) for _ in range(P)]
    ins = [dev.upload(_store(dtype, v)) for v in vals]
    outs = [dev.filled(n_out * esz, SENTINEL) for _ in range(P)]
    in_ptrs = [dev.ptr(b) for b in ins]
    out_ptrs = [dev.ptr(b) for b in outs]
    out_bufs = list(outs)  # where each rank's result is read from
    if in_place:
        for r in range(P):
            if coll == "all_reduce" or (coll == "reduce" and r == root) or coll == "broadcast":
                out_ptrs[r], out_bufs[r] = 0, ins[r]
            elif coll == "all_gather" or (coll == "gather" and r == root):
                outs[r] = dev.upload(
                    np.concatenate(
                        [_store(dtype, vals[r]) if q == r else np.full(N, 0, NP_STORAGE[dtype]) for q in range(P)]
                    )
                )
                out_ptrs[r], out_bufs[r] = dev.ptr(outs[r]), outs[r]
                in_ptrs[r] = out_ptrs[r] + r * N * esz
            elif coll == "reduce_scatter" or (coll == "scatter" and r == root):
                out_ptrs[r], out_bufs[r] = in_ptrs[r] + r * N * esz, None  # block r of the input
        if coll == "all_reduce":
            out_ptrs = list(in_ptrs)
    if coll == "scatter":
        in_ptrs = [p if r == root else 0 for r, p in enumerate(in_ptrs)]
    stats = dev.core.cuda_local_run(
        COLL[coll], ALGO[algo], DTYPE[dtype], OP[op], factor, root, N, in_ptrs, out_ptrs, dev.stream(), segment_bytes
    )
    dev.synchronize()
    dev.core.cuda_synchronize()

    def result(r):
        if out_bufs[r] is None:  # in-place reduce_scatter / scatter: block r of the input buffer
            return _load(dtype, dev.download(ins[r], NP_STORAGE[dtype])[r * N : (r + 1) * N])
        return _load(dtype, dev.download(out_bufs[r], NP_STORAGE[dtype]))

    where = f"{coll}/{algo} P={P} N={N} {dtype} {op} root={root} {'in-place' if in_place else 'out-of-place'}"
    cmp = [_load(dtype, _store(dtype, v)) for v in vals]  # inputs as the device saw them
    for r in range(P):
        if coll == "all_reduce" or (coll == "reduce" and r == root) or coll == "reduce_scatter":
            full = _reduce_ranks(dtype, op, factor, [_store(dtype, v) if not _is_float(dtype) else v for v in vals], P)
            want = full if coll != "reduce_scatter" else full[r * N : (r + 1) * N]
            if _is_float(dtype):
                want = _load(dtype, _store(dtype, want))
        elif coll == "all_gather" or (coll == "gather" and r == root):
            want = np.concatenate(cmp)
        elif coll == "all_to_all":
            want = np.concatenate([cmp[q][r * N : (r + 1) * N] for q in range(P)])
        elif coll == "broadcast":
            want = cmp[root]
        elif coll == "scatter":
            want = cmp[root][r * N : (r + 1) * N]
        else:
            want = None  # non-root reduce / gather: output untouched
        got = result(r)
        if want is None:
            raw = dev.download(outs[r], np.uint8)
            assert (raw == SENTINEL).all(), f"{where}: rank {r}'s output was written"
            continue
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (
            f"{where}: rank {r}: {bad.size} wrong elements, first at {bad[0]}: got {got[bad[0]]}, want {want[bad[0]]}"
        )
        if not in_place and coll != "broadcast" and (coll != "scatter" or r == root):
            assert np.array_equal(_load(dtype, dev.download(ins[r], NP_STORAGE[dtype])), cmp[r]), (
                f"{where}: rank {r}'s input was modified"
            )
    return stats


def _plan(coll, P):
    """(count, dtype, op, root, in_place) runs for one collective: every dtype (x every op for
    reductions) at the small counts, a rotation of them at 1<<20."""
    roots = sorted({0, P - 1, P // 2}) if coll in ROOTED else [0]
    runs, i = [], 0
    for N in (0, 1, 7, 3 * P + 1):
        for dtype in DTYPES:
            for op in _ops_for(dtype, OPS) if coll in REDUCTIONS else ["sum"]:
                runs.append((N, dtype, op, roots[i % len(roots)], i % 2 == 1))
                i += 1
    big_dtypes = ["float32", "bfloat16", "int8", "float16", "int32", "float64", "uint8", "int64"]
    for j in range(2):
        k = P + 3 * j + (len(coll) % 5)
        dtype = big_dtypes[k % len(big_dtypes)]
        if coll not in ("all_reduce", "broadcast", "reduce") and np.dtype(NP_STORAGE[dtype]).itemsize > 4:
            dtype = "float32"  # N*P-element buffers: keep host memory and time bounded
        op = OPS[k % len(OPS)] if coll in REDUCTIONS else "sum"
        if op in BITWISE and _is_float(dtype):
            op = "max"
        runs.append((1 << 20, dtype, op, roots[k % len(roots)], j == 1))
    return runs


@gpu
@pytest.mark.parametrize("P", [2, 4, 8])
@pytest.mark.parametrize("coll,algo", CASES)
def test_collective_matches_numpy(dev, coll, algo, P):
    for n, (N, dtype, op, root, in_place) in enumerate(_plan(coll, P)):
        run_and_check(
            dev, coll, algo, P, N, dtype, op, root, in_place, seed=zlib.crc32(f"{coll}/{algo}/{P}/{n}".encode())
        )


@gpu
@pytest.mark.parametrize("segment_bytes", [64, 4096, 1 << 22])
def test_tree_segments(dev, segment_bytes):
    """Pipelined trees with tiny, medium and huge segments (the schedule changes, the answer doesn't)."""
    for coll, algo in [("all_reduce", "tree"), ("broadcast", "tree"), ("reduce", "ring")]:
        run_and_check(dev, coll, algo, 4, 100_003, "float32", "sum", root=1, segment_bytes=segment_bytes)


@gpu
def test_odd_rank_counts(dev):
    """3, 5 and 6 ranks: uneven ring blocks and incomplete trees."""
    for P in (3, 5, 6):
        for coll, algo in CASES:
            run_and_check(dev, coll, algo, P, 2 * P + 1, "int32", "sum", root=P - 1, seed=P)


@gpu
def test_enqueue_is_ordered_on_the_callers_stream(dev):
    """Stream semantics: the collective waits for what the caller enqueued before it, and what the
    caller enqueues after waits for the collective; no host synchronisation in between."""
    if dev.name != "torch":
        pytest.skip("uses torch streams")
    torch = dev.torch
    P, N = 4, 1 << 24
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        xs = [torch.zeros(N, dtype=torch.float32, device="cuda") for _ in range(P)]
        outs = [torch.empty_like(x) for x in xs]
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(100_000_000)  # hold the stream ~50 ms so a missing wait would show
        for r, x in enumerate(xs):
            x.fill_(float(r + 1))  # enqueued, not yet run when the collective is enqueued
        _core.cuda_local_run(
            COLL["all_reduce"],
            ALGO["ring"],
            DTYPE["float32"],
            OP["sum"],
            1.0,
            0,
            N,
            [x.data_ptr() for x in xs],
            [o.data_ptr() for o in outs],
            s.cuda_stream,
            0,
        )
        checks = [o.eq(P * (P + 1) / 2).all() for o in outs]  # enqueued after, on the same stream
    s.synchronize()
    assert all(bool(c) for c in checks)


@gpu
def test_back_to_back_calls_reuse_buffers_safely(dev):
    """Many calls enqueued without waiting: scratch and premul buffers are reused across calls."""
    P, N = 8, 3 * 8 + 1
    rng = np.random.default_rng(7)
    vals = [rng.integers(-100, 100, size=N * P).astype(np.int32) for _ in range(P)]
    ins = [dev.upload(v) for v in vals]
    outs = [[dev.filled(N * 4, 0) for _ in range(P)] for _ in range(6)]
    for k in range(6):
        _core.cuda_local_run(
            COLL["reduce_scatter"],
            ALGO["ring"],
            DTYPE["int32"],
            OP["premul_sum"],
            3.0,
            0,
            N,
            [dev.ptr(b) for b in ins],
            [dev.ptr(b) for b in outs[k]],
            dev.stream(),
            0,
        )
    _core.cuda_synchronize()
    dev.synchronize()
    want = sum(v.astype(np.int64) * 3 for v in vals).astype(np.int32)
    for k in range(6):
        for r in range(P):
            assert np.array_equal(dev.download(outs[k][r], np.int32), want[r * N : (r + 1) * N])


@gpu
def test_stats_count_the_schedule(dev):
    """A ring all_reduce on P ranks moves 2(P-1) messages per rank."""
    P, N = 4, 4096
    ins = [dev.upload(np.ones(N, np.float32)) for _ in range(P)]
    outs = [dev.filled(N * 4, 0) for _ in range(P)]
    stats = _core.cuda_local_run(
        COLL["all_reduce"],
        ALGO["ring"],
        DTYPE["float32"],
        OP["sum"],
        1.0,
        0,
        N,
        [dev.ptr(b) for b in ins],
        [dev.ptr(b) for b in outs],
        dev.stream(),
        0,
    )
    _core.cuda_synchronize()
    assert stats["transfers"] == P * 2 * (P - 1)
    assert stats["kernels"] == P * (P - 1)  # the reduce-scatter half reduces, the all-gather half copies


# ---- the kernels alone: every dtype x op, aligned and misaligned ---------------------------------------


def _kernel_expect(dtype, op, a, b):
    """a (op) b for storage arrays, computed as the kernels do (halves in float32, RNE)."""
    f = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum, **BITWISE}[op]
    if op in ("min", "max"):  # b < a ? b : a, as the kernels: a NaN operand picks a side, not NaN
        f = (lambda x, y: np.where(y < x, y, x)) if op == "min" else (lambda x, y: np.where(x < y, y, x))
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "bfloat16":
            return _bf16_bits(f(_bf16_value(a), _bf16_value(b)))
        if dtype == "float16":
            return f(a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
        if dtype in FLOAT8:
            return _float8_round(f(a.astype(np.float32), b.astype(np.float32)), dtype)
        if dtype in COMPLEX and op == "prod":  # (ac - bd, ad + bc), each step rounded in the part type
            re = a.real * b.real - a.imag * b.imag
            im = a.real * b.imag + a.imag * b.real
            out = np.empty_like(a)
            out.real, out.imag = re, im
            return out
        return f(a, b)


def _random_storage(dtype, n, rng):
    if dtype == "bfloat16":
        return _bf16_bits(rng.standard_normal(n).astype(np.float32) * 8)
    if dtype in FLOAT8:  # every bit pattern: subnormals, NaN, e5m2's infinities, near-maxima
        return rng.integers(0, 256, size=n).astype(np.uint8).view(NP_STORAGE[dtype])
    if dtype in COMPLEX:
        return (rng.standard_normal(n) * 8 + 1j * rng.standard_normal(n) * 8).astype(NP_STORAGE[dtype])
    if _is_float(dtype):
        return (rng.standard_normal(n) * 8).astype(NP_STORAGE[dtype])
    info = np.iinfo(NP_STORAGE[dtype])
    if dtype == "uint64":
        return rng.integers(0, info.max, size=n, endpoint=True, dtype=np.uint64)
    return rng.integers(info.min, info.max, size=n, endpoint=True, dtype=np.int64).astype(NP_STORAGE[dtype])


def check_reduce_kernel(dev, dtype, sizes):
    rng = np.random.default_rng(DTYPE[dtype])
    esz = np.dtype(NP_STORAGE[dtype]).itemsize
    for op in _ops_for(dtype, ("sum", "prod", "min", "max", *BITWISE)):
        for n in sizes:
            # (dst, a, b) element offsets: all aligned, equally misaligned (head/packs/tail), unequal (scalar)
            for offs in ((0, 0, 0), (1, 1, 1), (3, 3, 3), (0, 1, 2)):
                a = _random_storage(dtype, n + 4, rng)
                b = _random_storage(dtype, n + 4, rng)
                da, db = dev.upload(a), dev.upload(b)
                dd = dev.filled((n + 4) * esz, SENTINEL)
                dev.core.cuda_kernel_reduce(
                    dev.ptr(dd) + offs[0] * esz,
                    dev.ptr(da) + offs[1] * esz,
                    dev.ptr(db) + offs[2] * esz,
                    n,
                    DTYPE[dtype],
                    OP[op],
                    dev.stream(),
                )
                got = dev.download(dd, NP_STORAGE[dtype])
                want = _kernel_expect(dtype, op, a[offs[1] : offs[1] + n], b[offs[2] : offs[2] + n])
                seg = got[offs[0] : offs[0] + n]
                assert _same_bits(seg, want).all(), f"{dtype} {op} n={n} offsets={offs}"
                raw = dev.download(dd, np.uint8)
                assert (raw[: offs[0] * esz] == SENTINEL).all() and (raw[(offs[0] + n) * esz :] == SENTINEL).all(), (
                    f"{dtype} {op} n={n} offsets={offs}: wrote outside the range"
                )
        # in place: dst aliases a
        a = _random_storage(dtype, 4099, rng)
        b = _random_storage(dtype, 4099, rng)
        da, db = dev.upload(a), dev.upload(b)
        dev.core.cuda_kernel_reduce(dev.ptr(da), dev.ptr(da), dev.ptr(db), 4099, DTYPE[dtype], OP[op], dev.stream())
        assert _same_bits(dev.download(da, NP_STORAGE[dtype]), _kernel_expect(dtype, op, a, b)).all(), (
            f"{dtype} {op} in place"
        )


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_kernel_every_op_and_alignment(dev, dtype):
    check_reduce_kernel(dev, dtype, (0, 1, 15, 16, 17, 1000, 100_003))


def check_scale_and_divide(dev, dtype, n):
    rng = np.random.default_rng(100 + DTYPE[dtype])
    x = _random_storage(dtype, n, rng)
    factor = 0.3 if _is_float(dtype) else 3.0
    dx, dy = dev.upload(x), dev.filled(n * x.itemsize, 0)
    dev.core.cuda_kernel_scale(dev.ptr(dy), dev.ptr(dx), n, DTYPE[dtype], factor, dev.stream())
    dev.core.cuda_kernel_divide(dev.ptr(dx), n, DTYPE[dtype], 3, dev.stream())
    scaled, divided = dev.download(dy, NP_STORAGE[dtype]), dev.download(dx, NP_STORAGE[dtype])
    if dtype in COMPLEX:  # each part as its real type
        part = np.float32 if dtype == "complex64" else np.float64
        ws, wd = np.empty_like(x), np.empty_like(x)
        ws.real = (x.real.astype(np.float64) * factor).astype(part)
        ws.imag = (x.imag.astype(np.float64) * factor).astype(part)
        wd.real = (x.real.astype(np.float64) / 3.0).astype(part)
        wd.imag = (x.imag.astype(np.float64) / 3.0).astype(part)
    elif _is_float(dtype):
        v = _bf16_value(x).astype(np.float64) if dtype == "bfloat16" else x.astype(np.float64)
        # host rule: compute in double, round to float, then to the storage type
        ws, wd = (v * factor).astype(np.float32), (v / 3.0).astype(np.float32)
        if dtype == "bfloat16":
            ws, wd = _bf16_bits(ws), _bf16_bits(wd)
        elif dtype in FLOAT8:
            ws, wd = _float8_round(ws, dtype), _float8_round(wd, dtype)
        elif dtype != "float32":
            ws, wd = ws.astype(NP_STORAGE[dtype]), wd.astype(NP_STORAGE[dtype])
        if dtype == "float64":
            ws, wd = v * factor, v / 3.0
    elif dtype.startswith("uint"):  # unsigned: wraps, divides unsigned
        ws = (x.astype(np.uint64) * np.uint64(3)).astype(x.dtype)
        wd = x // x.dtype.type(3)
    else:
        v = x.astype(np.int64)
        ws = (v * 3).astype(x.dtype)
        wd = np.where(v >= 0, v // 3, -((-v) // 3)).astype(x.dtype)
    assert _same_bits(scaled, ws).all(), f"{dtype} scale"
    assert _same_bits(divided, wd).all(), f"{dtype} divide"


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_and_divide_kernels(dev, dtype):
    check_scale_and_divide(dev, dtype, 10_001)


# ---- the same over the CUDA stand-in (no GPU needed) ----------------------------------------------


@pytest.mark.parametrize("coll,algo", CASES)
def test_standin_thread_ranks_match_numpy(standin, coll, algo):
    # The thread ranks over the stand-in: every dtype (and, for reductions, every op) at small
    # counts, in and out of place, rotating across the collectives.
    k = CASES.index((coll, algo))
    runs = [run for run in _plan(coll, 3) if run[0] < 100]
    for n, (N, dtype, op, root, in_place) in enumerate(runs[k % 5 :: 5]):
        run_and_check(
            standin, coll, algo, 3, N, dtype, op, root, in_place, seed=zlib.crc32(f"{coll}/{algo}/{n}".encode())
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_standin_reduce_kernel_every_op_and_alignment(standin, dtype):
    check_reduce_kernel(standin, dtype, (0, 1, 17, 1000))


@pytest.mark.parametrize("dtype", DTYPES)
def test_standin_scale_and_divide_kernels(standin, dtype):
    check_scale_and_divide(standin, dtype, 1001)


def test_standin_models_stream_capture_and_graph_replay(standin):
    # What the refusal tests below rely on: work enqueued on a capturing stream is recorded, not
    # run; a launched graph runs it, as often as it is launched; a synchronization with a
    # capturing stream fails and invalidates the capture, as CUDA's does.
    t = standin.testing
    stream = t.standin_stream_create()
    src, dst = standin.upload(np.arange(8, dtype=np.int32)), standin.filled(32, 0)
    t.standin_begin_capture(stream)
    t.standin_memcpy(standin.ptr(dst), standin.ptr(src), 32, stream=stream, wait=False)
    graph = t.standin_end_capture(stream)
    t.standin_stream_synchronize(stream)
    assert t.standin_graph_nodes(graph) == 1
    assert standin.download(dst, np.int32).tolist() == [0] * 8  # recorded, not run
    for k in range(2):  # each replay copies what the source holds then
        t.standin_memcpy(standin.ptr(src), np.full(8, k + 5, np.int32).ctypes.data, 32)
        t.standin_graph_launch(graph, stream)
        t.standin_stream_synchronize(stream)
        assert standin.download(dst, np.int32).tolist() == [k + 5] * 8
    t.standin_graph_destroy(graph)
    t.standin_begin_capture(stream)
    with pytest.raises(standin.testing.Error, match="capturing"):
        t.standin_stream_synchronize(stream)
    with pytest.raises(standin.testing.Error, match="previous error during capture"):
        t.standin_end_capture(stream)
    t.standin_stream_destroy(stream)


def test_standin_thread_ranks_and_kernels_refuse_stream_capture(standin):
    # Nothing is enqueued or allocated before the refusal: the capture stays empty and valid, and
    # the same calls work once the stream is no longer captured.
    t = standin.testing
    stream = t.standin_stream_create()
    x, x2 = standin.upload(np.ones(64, np.float32)), standin.upload(np.ones(64, np.float32))
    y, y2 = standin.filled(256, 0), standin.filled(256, 0)
    local_run = [COLL["all_reduce"], ALGO["ring"], DTYPE["float32"], OP["sum"], 1.0, 0, 64]
    t.standin_begin_capture(stream)
    with pytest.raises(t.InvalidArgument, match="cuda_local_run: the stream is being captured into a CUDA graph"):
        t.cuda_local_run(*local_run, [standin.ptr(x), standin.ptr(x2)], [standin.ptr(y), standin.ptr(y2)], stream, 0)
    with pytest.raises(t.InvalidArgument, match="cuda_kernel_scale: the stream is being captured.*outside the capture"):
        t.cuda_kernel_scale(standin.ptr(y), standin.ptr(x), 64, DTYPE["float32"], 2.0, stream)
    graph = t.standin_end_capture(stream)
    assert t.standin_graph_nodes(graph) == 0
    t.standin_graph_destroy(graph)
    t.cuda_kernel_scale(standin.ptr(y), standin.ptr(x), 64, DTYPE["float32"], 2.0, stream)
    t.standin_stream_synchronize(stream)
    assert standin.download(y, np.float32).tolist() == [2.0] * 64
    t.standin_stream_destroy(stream)


@gpu
def test_bad_pointers_are_invalid_arguments(dev):
    host = np.zeros(16, np.float32)
    good, out0, out1 = (dev.upload(np.zeros(16, np.float32)) for _ in range(3))
    with pytest.raises(rt.InvalidArgument, match="not device memory|not a CUDA pointer"):
        _core.cuda_local_run(
            COLL["all_reduce"],
            ALGO["ring"],
            DTYPE["float32"],
            OP["sum"],
            1.0,
            0,
            16,
            [host.ctypes.data, dev.ptr(good)],
            [dev.ptr(out0), dev.ptr(out1)],
        )
    with pytest.raises(rt.InvalidArgument, match="needs an output"):
        _core.cuda_local_run(
            COLL["all_reduce"],
            ALGO["ring"],
            DTYPE["float32"],
            OP["sum"],
            1.0,
            0,
            16,
            [dev.ptr(good), dev.ptr(good)],
            [0, 0],
        )


# ---- everywhere (no GPU needed) --------------------------------------------------------------------


def test_cuda_entry_points_exist():
    assert isinstance(_core.cuda_built(), bool)
    assert isinstance(_core.cuda_available(), bool)
    assert isinstance(_core.cuda_device_count(), int)
    if not _core.cuda_available():
        assert _core.cuda_unavailable_reason()
        print(f"\nCUDA unavailable here: {_core.cuda_unavailable_reason()}")


def test_cuda_path_fails_clearly_without_a_gpu():
    if _core.cuda_available():
        pytest.skip("a GPU is present; test_bad_pointers_are_invalid_arguments covers the error path")
    # Well-separated fake pointers pass argument validation; the missing device is the error.
    args = (
        COLL["all_reduce"],
        ALGO["ring"],
        DTYPE["float32"],
        OP["sum"],
        1.0,
        0,
        4,
        [1 << 20, 2 << 20],
        [3 << 20, 4 << 20],
    )
    with pytest.raises(rt.Error, match="CUDA"):
        _core.cuda_local_run(*args)
    with pytest.raises(rt.Error, match="CUDA"):
        _core.cuda_synchronize()
    with pytest.raises(rt.Error, match="CUDA"):
        _core.cuda_kernel_reduce(1 << 20, 2 << 20, 3 << 20, 4, DTYPE["float32"], OP["sum"])


def test_cuda_local_run_rejects_bad_arguments():
    if not _core.cuda_built():
        pytest.skip("no CUDA build: every CUDA call raises the 'built without CUDA' Error (checked above)")
    base = dict(
        coll=COLL["all_reduce"],
        algo=ALGO["ring"],
        dtype=DTYPE["float32"],
        op=OP["sum"],
        premul_factor=1.0,
        root=0,
        count=4,
        input_ptrs=[1 << 20, 2 << 20],
        output_ptrs=[3 << 20, 4 << 20],
    )
    bad = [
        dict(coll=99),
        dict(dtype=42),
        dict(op=17),
        dict(coll=COLL["barrier"]),
        dict(coll=COLL["all_gather"], algo=ALGO["tree"]),
        dict(coll=COLL["broadcast"], root=2),
        dict(input_ptrs=[]),
        dict(output_ptrs=[3 << 20]),
        dict(op=OP["premul_sum"], premul_factor=float("inf")),
        dict(output_ptrs=[(1 << 20) + 4, 4 << 20]),
    ]
    for change in bad:
        with pytest.raises(rt.InvalidArgument):
            _core.cuda_local_run(**{**base, **change})
