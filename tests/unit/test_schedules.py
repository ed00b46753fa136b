"""Transport-free checks: every schedule simulated for P = 1..64 against every other rank's
schedule (rendezvous semantics, so no buffering assumption), proving each rank ends with the
right data, every element reduced from every rank exactly once, all_reduce results in one
reduction order on every rank, inputs untouched, and no deadlock."""
import pytest

import ringtree as rt
from ringtree import _core

COLL = {name: code for code, name in enumerate(_core.COLLECTIVES)}
ALGO = {name: code for code, name in enumerate(_core.ALGOS)}
CASES = [("all_reduce", "ring"), ("all_reduce", "tree"), ("reduce_scatter", "ring"), ("all_gather", "ring"),
         ("all_to_all", "direct"), ("broadcast", "tree"), ("broadcast", "ring"), ("reduce", "tree"),
         ("reduce", "ring"), ("gather", "direct"), ("scatter", "direct"), ("barrier", "direct")]
ROOTED = {"broadcast", "reduce", "gather", "scatter"}


def counts_for(P):
    return sorted({0, 1, P - 1, 2 * P + 1})


@pytest.mark.parametrize("coll,algo", CASES)
def test_schedules_simulate_for_1_to_64_ranks(coll, algo):
    checked = 0
    for P in range(1, 65):
        roots = sorted({0, P // 2, P - 1}) if coll in ROOTED else [0]
        counts = counts_for(P) if P <= 16 or P in (31, 32, 33, 63, 64) else [2 * P + 1]
        for count in counts:
            for root in roots:
                pipelined = coll in ("broadcast", "reduce") or (coll, algo) == ("all_reduce", "tree")
                segments = [0, 1, 2] if pipelined else [0]
                for segment in segments:
                    summary = _core.simulate(COLL[coll], ALGO[algo], P, count, root, segment)
                    assert summary.endswith("messages") and ": ok," in summary
                    checked += 1
    assert checked >= 64


def test_ring_schedule_has_the_textbook_shape():
    # P=4: three reduce-scatter steps (send + receive-and-reduce), three all-gather steps.
    steps = _core.schedule(COLL["all_reduce"], ALGO["ring"], 4, 0, 10)
    assert len(steps) == 6 and all(len(s) == 2 for s in steps)
    kinds = [[op[0] for op in s] for s in steps]
    assert kinds[:3] == [["send", "recv_reduce"]] * 3 and kinds[3:] == [["send", "recv"]] * 3


def test_simulator_detects_faults():
    # The fault hook drops one op of rank 0's schedule; every such fault must be reported.
    for coll, algo in CASES:
        if coll == "barrier":
            continue
        steps = _core.schedule(COLL[coll], ALGO[algo], 5, 0, 11, 0, 2)
        n_ops = sum(len(s) for s in steps)
        for k in range(n_ops):
            with pytest.raises(rt.Error, match="schedule check failed"):
                _core.simulate(COLL[coll], ALGO[algo], 5, 11, 0, 2, drop_op=k)


def test_unsupported_algorithm_is_rejected_by_name():
    world = rt.init()
    try:
        with pytest.raises(rt.InvalidArgument, match="not available for reduce_scatter"):
            world.choose_algo("reduce_scatter", 1024, "tree")
        assert world.choose_algo("all_reduce", 1 << 30) == "ring"
    finally:
        world.close()
