"""One library alone in its own launch: the rank body that bench/launch_spread.py starts.

rt_bench --vs runs the peers inside ringtree's processes, on the same buffers, interleaved size
by size; users run one library per job. Here each launch holds exactly one library (ringtree,
MPI through mpi4py, or torch's Gloo), so its processes, buffers and page state are its own.

Per collective and size, on every rank: fill the inputs, run once and count wrong elements
against the exact expectation (rtbench/verify.py), run the warm-up calls, then B batches, each
a barrier and the size's timed calls (options.calls_per_batch); a batch's time is the average
call. Every rank writes its own JSON (PREFIX.rank<r>.json): the launcher combines ranks (slowest
rank per batch), so no library needs a control channel of its own beyond its barrier and, for
the batch's time bound, its broadcast.

Started by launch_spread.py, never by hand: `python bench/launch_worker.py --help`.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from . import collectives as colls
from . import impls as impls_mod
from . import load, verify
from . import options as options_mod

LIBS = ("ringtree", "mpi", "gloo")
_LAUNCH_VARS = ("RINGTREE_RANK", "RINGTREE_WORLD_SIZE", "RINGTREE_UNIQUE_ID", "RINGTREE_LISTEN_FD")


def _parse(argv):
    p = argparse.ArgumentParser(prog="launch_worker.py", description="one library alone (launch_spread.py's ranks)")
    p.add_argument("--lib", required=True, choices=LIBS)
    p.add_argument("--collectives", required=True, help="comma list")
    p.add_argument("--sizes", required=True, help="comma list of bytes")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--iters", type=int, required=True, help="timed calls per batch (at least)")
    p.add_argument("--batch-bytes", type=int, default=0, help="raise the calls of a batch towards this many bytes")
    p.add_argument("--max-iters", type=int, default=0, help="at most this many calls per batch")
    p.add_argument(
        "--batch-seconds", type=float, default=0.0, help="and at most this long a batch, from rank 0's warm-up calls"
    )
    p.add_argument("--batches", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--rendezvous", default=None, help="gloo: a file path for torch's FileStore")
    p.add_argument("--out", required=True, help="prefix of the per-rank JSON files")
    return p.parse_args(argv)


def _env_int(*keys):
    for key in keys:
        if key in os.environ:
            return int(os.environ[key])
    raise RuntimeError(f"none of {', '.join(keys)} is set: start this under a launcher")


def open_library(args):
    """(impl, rank, nranks, close) for the one library of this launch."""
    if args.lib == "ringtree":
        import ringtree as rt

        comm = rt.init()
        impl = impls_mod.RingtreeImpl(rt, comm, "auto", args.timeout)
        impl.description = f"ringtree {getattr(rt, '__version__', '?')} (algo auto)"
        return impl, comm.rank, comm.size, comm.close
    if args.lib == "mpi":
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        impl, reason = impls_mod.open_mpi(world.Get_rank(), world.Get_size())
        if impl is None:
            raise RuntimeError(f"MPI cannot run: {reason}")
        return impl, world.Get_rank(), world.Get_size(), impl.close
    # gloo: ranks come from ringtree.launch's environment; rendezvous through a file, so this
    # launch needs no ringtree communicator and no port of its own.
    import datetime

    torch, dist, reason = impls_mod._import_torch()
    if reason is not None:
        raise RuntimeError(reason)
    rank, nranks = _env_int("RINGTREE_RANK", "RANK"), _env_int("RINGTREE_WORLD_SIZE", "WORLD_SIZE")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo",
        init_method=f"file://{args.rendezvous}",
        rank=rank,
        world_size=nranks,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    impl = impls_mod.TorchImpl("gloo", torch, dist, f"torch {torch.__version__} Gloo")
    return impl, rank, nranks, impl.close


def _rank0_value(impl, rank, nranks, value):
    """Rank 0's `value` on every rank, through the library's own broadcast."""
    coll = colls.get("broadcast")
    placement = impl.placements(coll)[0]
    buf = np.array([value], dtype=np.float32)
    inp, out = coll.views(placement, buf, buf, 1, nranks, rank)
    impl.make_call(coll, placement, inp, out, 1, None, 0)()
    return float(out[0])


def measure(impl, rank, nranks, coll, sizes, dtype_name, args):
    """One collective over the sizes: a list of cells, and the page state of its buffers."""
    dt = verify.np_dtype(dtype_name)
    op = "sum" if coll.reduction else None
    root = 0
    counts = [coll.count_for_bytes(s, dt.itemsize, nranks) for s in sizes]
    n_max = max(counts)
    # Zeros, not empty: garbage floats could be denormals or NaNs and skew the first timings.
    send = np.zeros(max(coll.send_count(n_max, nranks), coll.recv_count(n_max, nranks)), dtype=dt)
    recv = np.zeros(coll.recv_count(n_max, nranks), dtype=dt)
    placement = impl.placements(coll)[0]
    cells = []
    for size, n in zip(sizes, counts):
        cell = {
            "collective": coll.name,
            "size": coll.size_bytes(n, dt.itemsize, nranks),
            "requested": size,
            "count": n,
            "placement": placement,
        }
        reason = impl.unsupported(coll, dtype_name, op)
        if reason is not None:
            cells.append(dict(cell, na=reason))
            continue
        inp, out = coll.views(placement, send, recv, n, nranks, rank)
        call = impl.make_call(coll, placement, inp, out, n, op, root)
        out[...] = verify.sentinel(dtype_name)
        np.copyto(inp, verify.make_input(coll, rank, n, nranks, op, dtype_name)[: inp.size].reshape(inp.shape))
        try:
            call()
        except impl.skippable as exc:
            cells.append(dict(cell, na=f"{type(exc).__name__}: {str(exc).strip()[:200]}"))
            continue
        expected = verify.make_expected(coll, rank, n, nranks, root, op, dtype_name)
        wrong = 0 if expected is None else verify.count_wrong(out, expected, verify.tolerance(op, dtype_name, nranks))
        warm_start = time.perf_counter()
        for _ in range(args.warmup):
            call()
        warm_call = (time.perf_counter() - warm_start) / max(args.warmup, 1)
        if args.batch_bytes > 0 and args.batch_seconds > 0:
            warm_call = _rank0_value(impl, rank, nranks, warm_call)  # every rank runs the same calls
        iters = options_mod.calls_per_batch(
            cell["size"], args.iters, args.batch_bytes, args.max_iters, args.batch_seconds, warm_call
        )
        batches = []
        for _ in range(args.batches):
            impl.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                call()
            batches.append((time.perf_counter() - start) / iters)
        cells.append(dict(cell, wrong=int(wrong), calls=iters, batches=batches))
    return cells, load.page_state({"send": send, "recv": recv})


def _ringtree_module():
    import sys

    module = sys.modules.get("ringtree")
    return os.path.dirname(os.path.abspath(module.__file__)) if module is not None else None


def main(argv=None) -> int:
    args = _parse(argv)
    impl, rank, nranks, close = open_library(args)
    result = {
        "lib": args.lib,
        "description": impl.description,
        "rank": rank,
        "nranks": nranks,
        "pid": os.getpid(),
        "dtype": args.dtype,
        "cells": [],
        "pages": {},
        # ringtree's settings as this rank saw them (the launcher's own variables left out)
        "settings": {k: v for k, v in os.environ.items() if k.startswith("RINGTREE_") and k not in _LAUNCH_VARS},
        # the ringtree package this rank imported (a build variant's, or the installed one)
        "module": _ringtree_module(),
    }
    try:
        for name in args.collectives.split(","):
            cells, pages = measure(
                impl, rank, nranks, colls.get(name), [int(s) for s in args.sizes.split(",")], args.dtype, args
            )
            result["cells"] += cells
            result["pages"][name] = pages
    finally:
        close()
    with open(f"{args.out}.rank{rank}.json", "w") as fh:
        json.dump(result, fh)
    return 0
