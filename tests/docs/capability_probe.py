"""Rank bodies of test_capability_matrix.py: every row of the manual's capability matrix
(docs/capabilities_page.py) run on one column's buffers and path, each reported as what happened:
"ok" (the outputs are the semantics pictures' values), "ok staged" (a call on CUDA buffers that
the host communicator ran, through pinned copies), "wrong ..." or "<Error>: <message>"."""

from __future__ import annotations

import os
import sys

import numpy as np
from markdown_examples import REPO
from reference import NUMPY_DTYPES

import ringtree as rt

sys.path.insert(0, os.path.join(REPO, "docs"))
try:
    import semantics_page
finally:
    sys.path.pop(0)


def _device_arrays():
    sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))
    try:
        from ipc_standin_workers import StandinArrays
    finally:
        sys.path.pop(0)
    return StandinArrays()


class Host:
    """numpy buffers: upload and download are the identity."""

    def upload(self, a):
        return a

    def download(self, dev, like):
        return np.asarray(dev)


class Device:
    """Buffers in the CUDA stand-in's device memory."""

    def __init__(self):
        self.arrays = _device_arrays()

    def upload(self, a):
        return None if a is None else self.arrays.upload(a)

    def download(self, dev, like):
        host = np.empty_like(like)
        self.arrays.download_into(dev, host)
        return host


PICTURES = {p.name: p for p in semantics_page.pictures()}


def _expect(name, r):
    after = PICTURES[name].after[r]
    return None if after is None else list(after)


def _x(name, r):
    before = PICTURES[name].before[r]
    return None if before is None else np.array(before, np.int64)


def _zeros(n):
    return np.zeros(n, np.int64) if n else None


def run_row(comm, row, mem, algo):
    """Runs one row of the matrix; returns (its outputs as a list or None, the picture it shows)."""
    r, P, N, root = comm.rank, comm.size, semantics_page.N, semantics_page.ROOT
    kw = {} if algo is None else {"algo": algo}
    if row in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
        x, out = _x(row, r), _zeros(rt.collective_info(row).buffer_sizes(N, P)[1])
        dx, dout = mem.upload(x), mem.upload(out)
        getattr(comm, row)(dx, dout, **kw)
        return mem.download(dout, out).tolist(), row
    if row in ("reduce", "gather", "scatter"):
        x, out = _x(row, r), _zeros(rt.collective_info(row).buffer_sizes(N, P, r == root)[1])
        dx, dout = mem.upload(x), mem.upload(out)
        getattr(comm, row)(dx, dout, root=root, **kw)
        return (None if out is None else mem.download(dout, out).tolist()), row
    if row == "broadcast":
        x = _x(row, r)
        dx = mem.upload(x)
        comm.broadcast(dx, root=root, **kw)
        return mem.download(dx, x).tolist(), row
    if row == "all_to_all_v":
        counts = PICTURES[row].send_counts
        recv = [counts[i][r] for i in range(P)]
        x, out = _x(row, r), _zeros(sum(recv))
        dx, dout = mem.upload(x), mem.upload(out)
        comm.all_to_all_v(dx, dout, list(counts[r]), recv)
        return mem.download(dout, out).tolist(), row
    if row == "barrier":
        comm.barrier()
        return None, None
    if row == "send/recv":
        x, out = _x("send_recv", r), _zeros(N) if r == 1 else None
        dx, dout = mem.upload(x), mem.upload(out)
        if r == 0:
            comm.send(dx, 1)
        elif r == 1:
            comm.recv(dout, 0)
        return (None if out is None else mem.download(dout, out).tolist()), "send_recv"
    x, out = _x("sendrecv", r), _zeros(N)
    dx, dout = mem.upload(x), mem.upload(out)
    if row == "sendrecv":
        comm.sendrecv(dx, (r + 1) % P, dout, (r - 1) % P)
        return mem.download(dout, out).tolist(), "sendrecv"
    if row == "isend/irecv":
        recv = comm.irecv(dout, (r - 1) % P, tag=7)
        comm.isend(dx, (r + 1) % P, tag=7).wait()
        recv.wait()
        return mem.download(dout, out).tolist(), "sendrecv"
    x, out = _x("all_reduce", r), _zeros(N)
    dx, dout = mem.upload(x), mem.upload(out)
    if row == "deterministic":  # a floating-point all_reduce in rank order (integers: any order)
        x, out = x.astype(np.float32), out.astype(np.float32)
        dx, dout = mem.upload(x), mem.upload(out)
        comm.all_reduce(dx, dout, deterministic=True, **kw)
        return [int(v) for v in mem.download(dout, out)], "all_reduce"
    if row == "grouped":
        with comm.group():
            comm.all_reduce(dx, dout, **kw)
    elif row == "persistent":
        comm.all_reduce_init(dx, dout, **kw).start()
    elif row == "coalesced":
        comm.all_reduce_coalesced([dx], [dout], **kw)
    else:
        raise ValueError(f"no such row {row!r}")
    return mem.download(dout, out).tolist(), "all_reduce"


def probe_column(rows, device=False, algo=None) -> dict:
    """Rank body: each of `rows` on host buffers, or on CUDA buffers (the stand-in's) with `algo`."""
    comm = rt.init()
    mem = Device() if device else Host()
    found = {}
    if device:  # the first call on CUDA buffers sets the executor up; leave that out of the counts
        warm = mem.upload(np.ones(4, np.int64))
        comm.all_reduce(warm)
        mem.download(warm, np.ones(4, np.int64))
    for row in rows:
        before = comm.record()["recorded"]
        try:
            got, pic = run_row(comm, row, mem, algo)
            want = None if pic is None else _expect(pic, comm.rank)
            ok = got == want
            staged = device and comm.record()["recorded"] > before
            found[row] = ("ok staged" if staged else "ok") if ok else f"wrong: {got} != {want}"
        except rt.Error as e:
            found[row] = f"{type(e).__name__}: {e}"
        if comm.is_aborted:
            found[row] += " (aborted)"
            break
        comm.barrier()  # a failed row must not overlap the next one
    found["executor"] = comm.status().cuda_executor
    found["transports"] = sorted(set(comm.status().transports) - {"self"})
    return found


# Every rank's input is rank + 1 (1, 2, 3): each op's result, exact in every dtype.
REDUCED = {"sum": 6, "prod": 6, "min": 1, "max": 3, "avg": 2, "premul_sum": 12, "band": 0, "bor": 3, "bxor": 0}


def probe_reductions(dtypes, ops, device=False, algo=None) -> dict:
    """Rank body: all_reduce of every dtype with every op ("dtype op" -> outcome, as probe_column).
    Dtypes numpy lacks (bfloat16, float8) are ml_dtypes' numpy dtypes."""
    comm = rt.init()
    mem = Device() if device else Host()
    kw = {} if algo is None else {"algo": algo}
    found = {}
    for dtype in dtypes:
        for op in ops:
            value = comm.rank + 1
            try:
                host = np.full(4, value, NUMPY_DTYPES[dtype])
                x = mem.upload(host)
                comm.all_reduce(x, op=rt.premul_sum(2.0) if op == "premul_sum" else op, **kw)
                back = mem.download(x, host)
                got = [complex(v).real if np.iscomplexobj(host) else float(v) for v in back]
                want = float(REDUCED[op])
                found[f"{dtype} {op}"] = "ok" if got == [want] * 4 else f"wrong: {got} != {want}"
            except rt.Error as e:
                found[f"{dtype} {op}"] = f"{type(e).__name__}: {e}"
            if comm.is_aborted:
                found[f"{dtype} {op}"] += " (aborted)"
                return found
            comm.barrier()
    return found
