"""Single-process micro-benchmark of the host reduce kernels (dst = a + b) through the private
test module's reduce hook (_ringtree_testing.reduce): elements per second for float32, bfloat16
and float16 sums.

    PYTHONPATH=python python bench/kernels_micro.py [--seconds 0.3]
    RINGTREE_KERNEL_ISA=scalar PYTHONPATH=python python bench/kernels_micro.py   # the fallback

"cold" cycles through buffer sets whose footprint exceeds the last-level cache, so every call
streams from memory; "warm" reuses one small set that stays in L1/L2. Each figure is the best of
several timed batches (on a shared machine others' load only ever adds time); "net" subtracts the
hook's own per-call cost, measured with count=0.
"""
from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np

import _ringtree_testing as testing
from ringtree import _core

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
SUM = _core.OPS.index("sum")


def best_call_seconds(buffer_sets, count, code, seconds):
    calls = [(d.ctypes.data, a.ctypes.data, b.ctypes.data) for d, a, b in buffer_sets]
    reduce = testing.reduce
    batch, best, deadline = max(1, 4 * len(calls)), float("inf"), time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        for i in range(batch):
            d, a, b = calls[i % len(calls)]
            reduce(d, a, b, count, code, SUM)
        best = min(best, (time.perf_counter() - t0) / batch)
        if time.perf_counter() > deadline:
            return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.3, help="timing budget per row")
    parser.add_argument("--cold-bytes", type=int, default=128 << 20, help="footprint cycled through by cold rows")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"kernel isa: {_core._kernel_isa()}")
    overhead = best_call_seconds([(np.zeros(1, np.float32),) * 3], 0, _core.DTYPES.index("float32"), args.seconds)
    print(f"hook overhead per call: {overhead * 1e9:.0f} ns")
    print(f"{'dtype':>9} {'count':>8} {'cache':>5} {'Melem/s':>9} {'net Melem/s':>12} {'GB/s (3 streams)':>17}")
    for count, cache in [(4 << 20, "cold"), (16 << 10, "warm")]:
        for name, dt in DTYPES.items():
            itemsize = np.dtype(dt).itemsize
            nsets = max(1, -(-args.cold_bytes // (3 * count * itemsize))) if cache == "cold" else 1
            sets = [tuple(rng.standard_normal(count, np.float32).astype(dt) for _ in range(3)) for _ in range(nsets)]
            t = best_call_seconds(sets, count, _core.DTYPES.index(name), args.seconds)
            net = max(t - overhead, 1e-12)
            print(f"{name:>9} {count:>8} {cache:>5} {count / t / 1e6:9.0f} {count / net / 1e6:12.0f} "
                  f"{3 * count * itemsize / t / 1e9:17.2f}")


if __name__ == "__main__":
    main()
