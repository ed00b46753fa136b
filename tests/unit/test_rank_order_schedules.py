"""Rank-order schedules (csrc/algorithms/rank_order.cc, deterministic mode), without a transport.

The verifier proves, for P = 1..16, counts and segments that cut blocks unevenly, and every root
of reduce, that every element ends as the rank-order left fold ((x_0 op x_1) op x_2) ... (each op's
two operands in either order), inputs untouched, no deadlock; the same check rejects the ring,
tree and hierarchical schedules, so it can fail. The schedules do not depend on the hosts, so
they hold on every topology. The step walker (the GPU executors' walk, on host threads) then runs
them on random data in every floating dtype with sum, avg and premul_sum, and the bits must be
numpy's fold in the same dtype order."""

from __future__ import annotations

import _ringtree_testing as testing
import numpy as np
import pytest
from reference import NUMPY_DTYPES, rank_order_fold, spread_input

import ringtree as rt
from ringtree import _core
from ringtree._args import ALGO_CODES, COLL_CODES
from ringtree._buffers import DTYPE_CODES
from ringtree.ops import OP_CODES

COLL = COLL_CODES
ALGO = ALGO_CODES
DTYPE = DTYPE_CODES
OP = OP_CODES
REDUCTIONS = ("all_reduce", "reduce_scatter", "reduce")
RO = ALGO["rank_order"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("coll", REDUCTIONS)
def test_rank_order_schedules_are_the_rank_order_fold(coll):
    checked = 0
    for P in range(1, 17):
        roots = sorted({0, P // 2, P - 1}) if coll == "reduce" else [0]
        for count in (0, 1, 2, P - 1, 2 * P + 3):
            for segment in (0, 1, 4):
                for root in roots:
                    summary = _core.verify_schedules(COLL[coll], RO, P, count, root, segment)
                    assert ": ok," in summary, summary
                    checked += 1
    assert checked >= 16 * 5 * 3


@pytest.mark.parametrize("coll", REDUCTIONS)
def test_the_fold_check_rejects_other_orders(coll):
    """A check of the checker: the ring, the trees and hier reduce in other shapes."""
    labels = [0, 1, 0, 1, 1]
    others = [a for a in ("ring", "tree") if ALGO[a] in _core.supported_algos(COLL[coll])]
    others += [_core.ALGOS[a] for a in _core.hier_algos(COLL[coll])]
    for algo in others:
        assert ": ok," in _core.verify_schedules(COLL[coll], ALGO[algo], 5, 11, 0, 2, hosts=labels)
        with pytest.raises(rt.Error, match="rank-order left fold"):
            _core.verify_schedules(COLL[coll], ALGO[algo], 5, 11, 0, 2, hosts=labels, claim_rank_fold=True)


def test_the_verifier_detects_every_dropped_op():
    for coll in REDUCTIONS:
        ops = sum(len(step) for step in _core.schedule(COLL[coll], RO, 4, 0, 7, 3, 2))
        assert ops > 0
        for drop in range(ops):
            with pytest.raises(rt.Error, match="schedule check failed"):
                _core.verify_schedules(COLL[coll], RO, 4, 7, 3, 2, drop_op=drop)


def test_rank_order_schedules_ignore_the_hosts():
    """The same schedule on one host, two, and ranks dealt to hosts in turn: the bits cannot
    depend on the layout."""
    for coll in REDUCTIONS:
        for r in range(6):
            flat = _core.schedule(COLL[coll], RO, 6, r, 13, 5, 3)
            for labels in ([0] * 6, [0, 0, 0, 1, 1, 1], [0, 1, 0, 1, 0, 1], [2, 0, 1, 1, 0, 2]):
                assert _core.schedule(COLL[coll], RO, 6, r, 13, 5, 3, hosts=labels) == flat


def test_rank_order_costs_what_the_readme_says():
    """all_reduce: a middle rank sends 2C and the critical path is S + 2P - 3 messages (S pieces)."""
    P, C, segment = 4, 4096, 1024
    k = _core.schedule_counts(COLL["all_reduce"], RO, P, C, 0, segment)
    ring = _core.schedule_counts(COLL["all_reduce"], ALGO["ring"], P, C, 0, 0)
    assert k["sent"] == 2 * C and ring["sent"] == 2 * C * (P - 1) // P
    assert k["hops"] == C // segment + 2 * P - 3
    assert not any(
        op[3][0] == "scratch"
        for r in range(P)
        for step in _core.schedule(COLL["all_reduce"], RO, P, r, C, 0, segment)
        for op in step
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16", "float32", "float64"])
def test_rank_order_walked_on_threads_is_numpys_fold(dtype_name):
    for coll in REDUCTIONS:
        for P in (2, 3, 5):
            for op in ("sum", "avg", "premul_sum"):
                N, root, factor = 23, P - 1, 0.37
                total = N * P if coll == "reduce_scatter" else N
                inputs = [spread_input(P, q, total, dtype_name) for q in range(P)]
                ins = [x.copy() for x in inputs]
                outputs = [
                    np.zeros(N if coll == "reduce_scatter" else total, NUMPY_DTYPES[dtype_name]) for _ in range(P)
                ]
                testing.walk_on_threads(
                    COLL[coll],
                    RO,
                    P,
                    N,
                    root,
                    4,
                    DTYPE[dtype_name],
                    OP[op],
                    factor,
                    [x.ctypes.data for x in ins],
                    [o.ctypes.data for o in outputs],
                    64,
                    2,
                    60.0,
                )
                want = rank_order_fold(inputs, dtype_name, op, factor)
                for r in range(P):
                    expect = {
                        "all_reduce": want,
                        "reduce_scatter": want[r * N : (r + 1) * N],
                        "reduce": want if r == root else None,
                    }[coll]
                    if expect is not None:
                        assert outputs[r].tobytes() == expect.tobytes(), (coll, P, op, r)
