"""Dtype rules between real processes that the sweeps do not show: complex numbers have no order,
so min and max on them are refused on every rank before any traffic, with the collective named,
and the communicator stays usable."""

from __future__ import annotations

import numpy as np
import pytest
from harness import run_world

import ringtree as rt


def refuse_complex_order_then_work():
    comm = rt.init()
    r, P = comm.rank, comm.size
    errors = []
    for dtype in (np.complex64, np.complex128):
        for op in ("min", rt.ReduceOp.MAX):
            x = np.ones(4, dtype)
            for call in (
                lambda: comm.all_reduce(x, op=op),
                lambda: comm.reduce(x, root=0, op=op),
                lambda: comm.reduce_scatter(np.ones(4 * P, dtype), x, op=op),
            ):
                try:
                    call()
                    errors.append(f"{np.dtype(dtype).name} {op}: accepted")
                except rt.InvalidArgument as exc:
                    errors.append(str(exc))
    x = np.full(3, (r + 1) * (1 + 2j), np.complex64)
    comm.all_reduce(x, op="prod")
    comm.close()
    return {"errors": errors, "after": [[float(v.real), float(v.imag)] for v in x]}


@pytest.mark.timeout(60)
def test_complex_min_and_max_are_refused_before_traffic():
    ranks = run_world(3, refuse_complex_order_then_work, timeout=50).check_ok()
    want = np.prod([(q + 1) * (1 + 2j) for q in range(3)])
    for res in ranks:
        assert len(res["errors"]) == 12, res["errors"]
        for msg in res["errors"]:
            assert "needs an ordered dtype" in msg and "complex" in msg, msg
            assert msg.split(":")[0] in ("all_reduce", "reduce", "reduce_scatter"), msg
        assert res["after"] == [[want.real, want.imag]] * 3
