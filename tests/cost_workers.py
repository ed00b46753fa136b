"""Rank functions for test_cost_model.py: the cost model, explain, and the one-shot board's
size boundary, in real multi-rank worlds."""
from __future__ import annotations

import io

import numpy as np

import ringtree as rt

COLLS = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "barrier"]
SIZES = [0, 8, 256, 4096, 65536, 1 << 20, 1 << 24]


def choices_and_estimates():
    """Every rank reports auto's choice and the model's candidates for a grid of calls, plus
    what explain printed for one of them."""
    comm = rt.init()
    choices, estimates = {}, {}
    for coll in COLLS:
        for nbytes in SIZES:
            for dtype in ("float32", "bfloat16"):
                key = f"{coll}/{nbytes}/{dtype}"
                choices[key] = comm.choose_algo(coll, nbytes, "auto", dtype)
                estimates[key] = [(a, t) for a, t, _ in comm.estimate(coll, nbytes, dtype)]
    text = rt.explain("all_reduce", 4096, comm=comm, file=io.StringIO())
    costs = comm.machine_costs()
    comm.close()
    return {"choices": choices, "estimates": estimates, "explain": text, "costs": costs}


def board_boundary(limit_bytes):
    """With RINGTREE_ONESHOT_BYTES=limit_bytes, the largest all_reduce that fits runs on the
    board and the next size up does not; both give numpy's answer."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    fits = limit_bytes // 4
    report = {}
    for n in (fits, fits + 1):
        report[f"algo_{n}"] = comm.choose_algo("all_reduce", n * 4)
        x = (np.arange(n, dtype=np.int64) * (r + 1)).astype(np.float32)
        got = comm.all_reduce(x.copy())
        want = np.arange(n, dtype=np.float32) * sum(q + 1 for q in range(P))
        report[f"ok_{n}"] = bool(np.array_equal(got, want))
    x = np.full(fits, r + 1, np.float32)
    report["explicit_fits"] = bool((comm.all_reduce(x, algo="oneshot") == P * (P + 1) / 2).all())
    try:
        comm.all_reduce(np.ones(fits + 1, np.float32), algo="oneshot")
        report["oversize"] = "no error"
    except rt.InvalidArgument as exc:
        report["oversize"] = str(exc)
    report["after"] = float(comm.all_reduce(np.ones(1, np.float32))[0])  # still usable
    comm.close()
    return report
