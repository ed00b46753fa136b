#!/usr/bin/env python3
"""GPU bench for device collectives on a multi-process communicator (one process per rank).

    python -m ringtree.launch -n 4 bench/gpu_comm_bench.py [-b 8] [-e 256M] [-f 4] [-n 20] [-w 5]
                                                           [--collectives all_reduce,all_gather]
                                                           [--algos auto,nccl]

Buffers are torch CUDA tensors on device rank % device_count. For each size it prints, as
nccl-tests does, the slowest rank's mean time and algbw/busbw of every ringtree algorithm
asked for (its executor too: 'ipc' or 'staged'), NCCL through algo='nccl' where NCCL can run
(one rank per GPU: on a one-GPU machine only -n 1), and copybw, a device-to-device copy of the
same bytes timed in the same run; busbw/copybw is the ratio issue 6 asks about. Each result is
checked once per size against exact integer expectations (#wrong).
RINGTREE_CUDA_IPC=0 in the environment measures the staged executor instead of the IPC one.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import ringtree as rt

BUS_FACTOR = {"all_reduce": lambda P: 2 * (P - 1) / P, "reduce_scatter": lambda P: (P - 1) / P,
              "all_gather": lambda P: (P - 1) / P, "all_to_all": lambda P: (P - 1) / P,
              "broadcast": lambda P: 1.0, "reduce": lambda P: 1.0}


def parse_size(text):
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if text[-1:] in "KMG" else text) * mult)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-b", default="8")
    p.add_argument("-e", default="64M")
    p.add_argument("-f", type=int, default=4)
    p.add_argument("-n", type=int, default=20)
    p.add_argument("-w", type=int, default=5)
    p.add_argument("--collectives", default="all_reduce,reduce_scatter,all_gather,broadcast")
    p.add_argument("--algos", default="auto,nccl")
    p.add_argument("--if-gpu", action="store_true",
                   help="exit quietly (status 0) when there is no usable GPU, instead of failing")
    a = p.parse_args()
    why_not = None if rt.cuda_available() else "ringtree finds no CUDA device (or was built without CUDA)"
    if why_not is None:
        try:
            import torch
            if not torch.cuda.is_available():
                why_not = "torch has no CUDA (a CPU build of torch?)"
        except ImportError:
            why_not = "torch is not installed"
    if why_not is not None:
        if os.environ.get("RINGTREE_RANK", "0") == "0":
            print(f"# gpu_comm_bench: no device bench on this machine: {why_not}")
        return 0 if a.if_gpu else 1
    comm = rt.init()
    r, P = comm.rank, comm.size
    torch.cuda.set_device(r % torch.cuda.device_count())
    dev = torch.device("cuda")
    sizes, s = [], parse_size(a.b)
    while s <= parse_size(a.e):
        sizes.append(s)
        s *= a.f
    if r == 0:
        print(f"# gpu_comm_bench: {P} ranks, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
              f"ringtree {rt.__version__}; float32 sum; times are the slowest rank's mean (us)")
    for coll in a.collectives.split(","):
        if r == 0:
            print(f"#\n# {coll}\n# {'size':>12} {'algo':>8} {'executor':>9} {'time':>10} {'algbw':>8} {'busbw':>8} "
                  f"{'copybw':>8} {'bus/copy':>8} {'#wrong':>7}")
        for size in sizes:
            n = max(1, size // 4)
            if coll in ("reduce_scatter", "all_gather", "all_to_all"):
                n = max(1, n // P)
            copy_src = torch.ones(max(n * P, n), dtype=torch.float32, device=dev)
            copy_dst = torch.empty_like(copy_src)
            nbytes = 4 * (n * P if coll in ("reduce_scatter", "all_gather", "all_to_all") else n)
            copy_t = timed(lambda: copy_dst[: nbytes // 4].copy_(copy_src[: nbytes // 4]), a, comm, torch)
            for algo in a.algos.split(","):
                row = measure(coll, algo, n, a, comm, torch, dev)
                if r == 0:
                    if isinstance(row, str):
                        print(f"  {nbytes:>12} {algo:>8} {'':>9} n/a: {row}")
                        continue
                    t, wrong, executor = row
                    algbw = nbytes / t / 1e9
                    busbw = algbw * BUS_FACTOR[coll](P)
                    copybw = nbytes / copy_t / 1e9
                    print(f"  {nbytes:>12} {algo:>8} {executor:>9} {t * 1e6:>10.1f} {algbw:>8.2f} {busbw:>8.2f} "
                          f"{copybw:>8.2f} {busbw / copybw:>8.2f} {wrong:>7}")
    comm.close()
    return 0


def timed(fn, a, comm, torch):
    """Slowest rank's mean seconds per call of fn (synchronized before and after)."""
    for _ in range(a.w):
        fn()
    torch.cuda.synchronize()
    comm.barrier()
    start = time.perf_counter()
    for _ in range(a.n):
        fn()
    torch.cuda.synchronize()
    t = np.array([(time.perf_counter() - start) / a.n], dtype=np.float64)
    comm.all_reduce(t, op="max")
    return float(t[0])


def measure(coll, algo, n, a, comm, torch, dev):
    r, P = comm.rank, comm.size
    kw = {"algo": algo}
    x = torch.full((n * P if coll in ("reduce_scatter", "all_to_all") else n,), float(r + 1), device=dev)
    out = torch.empty(n * P if coll in ("all_gather", "all_to_all") else n, device=dev)
    calls = {
        "all_reduce": lambda: comm.all_reduce(x, out, **kw),
        "reduce_scatter": lambda: comm.reduce_scatter(x, out, **kw),
        "all_gather": lambda: comm.all_gather(x, out, **kw),
        "all_to_all": lambda: comm.all_to_all(x, out, **kw),
        "broadcast": lambda: comm.broadcast(x, root=0, **kw),
        "reduce": lambda: comm.reduce(x, out, root=0, **kw),
    }
    try:
        calls[coll]()
        torch.cuda.synchronize()
    except rt.Error as exc:
        return f"{type(exc).__name__}: {str(exc)[:100]}"
    # Check once, from fresh inputs (broadcast and in-place runs change x).
    x.fill_(float(r + 1))
    calls[coll]()
    got = (x if coll == "broadcast" else out).cpu().numpy()
    total = P * (P + 1) / 2
    want = {"all_reduce": np.full(n, total), "reduce_scatter": np.full(n, total),
            "all_gather": np.repeat(np.arange(1, P + 1, dtype=np.float64), n),
            "all_to_all": np.repeat(np.arange(1, P + 1, dtype=np.float64), n),
            "broadcast": np.full(n, 1.0), "reduce": np.full(n, total)}[coll]
    wrong = 0 if (coll == "reduce" and r != 0) else int(np.count_nonzero(got != want))
    w = np.array([wrong], dtype=np.int64)
    comm.all_reduce(w)
    t = timed(calls[coll], a, comm, torch)
    return t, int(w[0]), comm.cuda_executor().split(":")[0] if algo != "nccl" else "nccl"


if __name__ == "__main__":
    sys.exit(main())
