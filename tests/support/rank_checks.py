"""Helpers for rank bodies: one collective call on this rank checked against reference.py
(run_case), shared by the host sweeps (multiproc/test_collectives.py) and the device sweeps
(gpu/test_device_comm.py), which pass a communicator whose calls run on device buffers; and how
an issued call ended (outcome), for the host and device halves of the device path; and what a
rank's wait policy says (report_wait_policy)."""

from __future__ import annotations

import os
import time

import numpy as np
from reference import NUMPY_DTYPES, make_input, mismatches, op_argument, reduce_reference

import ringtree as rt

REDUCTIONS = ("all_reduce", "reduce_scatter", "reduce")


def input_elems(coll, N, P):
    """Elements of the root's input (everyone's for unrooted collectives): the core's table."""
    return rt.collective_info(coll).buffer_sizes(N, P, is_root=True)[0]


def run_case(comm, coll, N, dtype_name, op, algo, in_place, root, salt):
    """Runs one collective on this rank; returns (#wrong elements, description)."""
    r, P = comm.rank, comm.size
    dtype = NUMPY_DTYPES[dtype_name]
    op = op if coll in REDUCTIONS else "sum"
    inputs = [make_input(q, input_elems(coll, N, P), dtype_name, op, salt) for q in range(P)]
    x = inputs[r].copy()
    original = x.copy()
    opa = op_argument(op, dtype_name)
    block = slice(r * N, (r + 1) * N)
    want, got, untouched = None, None, x
    if coll == "all_reduce":
        want = reduce_reference(inputs, op, dtype_name)
        out = None if in_place else np.full(N, 77, dtype)
        got = comm.all_reduce(x, out, op=opa, algo=algo)
        if in_place:
            untouched = None
    elif coll == "reduce_scatter":
        want = reduce_reference(inputs, op, dtype_name)[block]
        if in_place:
            got = comm.reduce_scatter(x, x[block], op=opa, algo=algo)
            untouched = None
        else:
            got = comm.reduce_scatter(x, np.full(N, 77, dtype), op=opa, algo=algo)
    elif coll == "all_gather":
        want = np.concatenate(inputs)
        out = np.full(N * P, 77, dtype)
        if in_place:
            out[block] = x
            x = out[block]
            untouched = None
        got = comm.all_gather(x, out, algo=algo)
    elif coll == "all_to_all":
        want = np.concatenate([inputs[q][block] for q in range(P)])
        if in_place:
            got = comm.all_to_all(x, x, algo=algo)
            untouched = None
        else:
            got = comm.all_to_all(x, np.full(N * P, 77, dtype), algo=algo)
    elif coll == "broadcast":
        want = inputs[root]
        got = comm.broadcast(x, root=root, algo=algo)
        untouched = None
    elif coll == "reduce":
        out = None if in_place else np.full(N, 77, dtype)
        res = comm.reduce(x, out, root=root, op=opa, algo=algo)
        if r == root:
            want, got = reduce_reference(inputs, op, dtype_name), res
            if in_place:
                untouched = None
    elif coll == "gather":
        out = np.full(N * P, 77, dtype) if r == root else None
        if in_place and r == root:
            out[root * N : (root + 1) * N] = x
            x = out[root * N : (root + 1) * N]
            untouched = None
        res = comm.gather(x, out, root=root, algo=algo)
        if r == root:
            want, got = np.concatenate(inputs), res
    elif coll == "scatter":
        want = inputs[root][block]
        if in_place and r == root:
            got = comm.scatter(x, x[block], root=root, algo=algo)
        else:
            got = comm.scatter(x if r == root else None, np.full(N, 77, dtype), root=root, algo=algo)
    wrong = 0
    if want is not None:
        wrong += mismatches(np.asarray(got), want, dtype_name, op)
    if untouched is not None and not np.array_equal(untouched, original):
        wrong += 1_000_000  # the input of an out-of-place call (or a non-root reduce) was written
    desc = f"{coll} N={N} {dtype_name} {op} algo={algo} {'in' if in_place else 'out-of'}-place root={root}"
    return wrong, desc


def outcome(work, start):
    """How an issued call ended ({'raised': None} or its error type and message), and the
    seconds since `start`."""
    try:
        work.wait(60.0)
        out = {"raised": None}
    except rt.Error as exc:
        out = {"raised": type(exc).__name__, "message": str(exc)}
    out["seconds"] = time.monotonic() - start
    return out


def report_wait_policy(timeout=30.0):
    """A rank body: this rank's comm.status().wait_policy and how many CPUs it may run on."""
    comm = rt.init(timeout=timeout)
    out = {"policy": comm.status().wait_policy, "cpus": len(os.sched_getaffinity(0))}
    comm.close()
    return out
