"""algo='nccl' and the dtypes NCCL lacks, across real rank processes over the CUDA stand-in and the
fake NCCL the test module exports (which sets up like NCCL and moves no data): int16 and uint16
reductions and complex products are refused with InvalidArgument on every rank before any NCCL
traffic, naming the dtype and algo 'auto'; a complex sum gets past that check into NCCL (the fake
one then refuses to move data, which is how the test tells); the host communicator stays usable."""

from __future__ import annotations

import _ringtree_testing as testing
import numpy as np
import pytest
import standin
from harness import run_world
from ipc_standin_workers import DeviceArrays

import ringtree as rt


def nccl_dtype_refusals():
    arrays = DeviceArrays("standin")
    comm = rt.init()
    out = {}
    cases = [("int16", "sum"), ("uint16", "max"), ("complex64", "prod"), ("complex128", "sum")]
    for dtype, op in cases:
        x = arrays.upload(np.ones(64, dtype))
        try:
            comm.all_reduce(x, op=op, algo="nccl", timeout=10.0)
            out[f"{dtype} {op}"] = {"raised": None}
        except rt.Error as exc:
            out[f"{dtype} {op}"] = {"raised": type(exc).__name__, "message": str(exc)}
    y = np.full(8, comm.rank, np.int64)
    comm.all_reduce(y)
    out["host_ok"] = bool(np.all(y == comm.size * (comm.size - 1) // 2))
    return out


@pytest.mark.timeout(60)
def test_nccl_refuses_what_it_cannot_reduce_before_any_traffic():
    env = {**standin.ENV, "RINGTREE_NCCL_LIBRARY": testing.__file__}
    for rank, res in enumerate(run_world(2, nccl_dtype_refusals, timeout=50, env=env).check_ok()):
        assert res["host_ok"], (rank, res)
        for case in ("int16 sum", "uint16 max", "complex64 prod"):
            got = res[case]
            assert got["raised"] == "InvalidArgument", (rank, case, got)
            assert "algo 'nccl' cannot reduce" in got["message"] and "algo 'auto'" in got["message"], (rank, got)
            assert case.split()[0] in got["message"], (rank, got)
        # complex sums go to NCCL as float pairs: past the dtype check, into the fake NCCL's refusal
        got = res["complex128 sum"]
        assert got["raised"] is not None and "moves no data" in got["message"], (rank, got)
