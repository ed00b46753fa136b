"""The CUDA IPC executor's step walker (csrc/exec/step_walker.h), run on host threads: every
rank a thread walking its own schedule over in-memory mailboxes with the very code the kernel
runs. Small slots and few of them force many chunks per message and slot reuse, so the
protocol (chunking, flags, lane order within a step, reduction order) is checked here, on
machines without a GPU, against numpy."""
from __future__ import annotations

import numpy as np
import pytest

import _ringtree_testing as testing
import ringtree as rt
from ringtree import _core
from reference import NUMPY_DTYPES, make_input, mismatches, reduce_reference

COLL = {name: code for code, name in enumerate(_core.COLLECTIVES)}
ALGO = {name: code for code, name in enumerate(_core.ALGOS)}
DTYPE = {name: code for code, name in enumerate(_core.DTYPES)}
OP = {name: code for code, name in enumerate(_core.OPS)}
REDUCTIONS = ("all_reduce", "reduce_scatter", "reduce")


def walk(coll, algo, P, N, dtype, op="sum", root=0, slot_bytes=64, slots=2, segment=0, salt=0, channels=1):
    """Runs the walk; returns (per-rank outputs, per-rank expectations)."""
    in_n, out_n = rt.collective_info(coll).buffer_sizes(N, P, is_root=True)
    out_n = out_n or in_n  # broadcast: one buffer
    inputs = [make_input(q, in_n, dtype, op, salt) for q in range(P)]
    outputs = [np.full(out_n, 77, NUMPY_DTYPES[dtype]) for _ in range(P)]
    ins = [x.copy() for x in inputs]
    testing.walk_on_threads(COLL[coll], ALGO[algo], P, N, root, segment, DTYPE[dtype], OP[op], 1.0,
                          [x.ctypes.data for x in ins], [o.ctypes.data for o in outputs], slot_bytes, slots, 60.0,
                          channels=channels)
    wants = []
    for r in range(P):
        block = slice(r * N, (r + 1) * N)
        if coll == "all_reduce":
            wants.append(reduce_reference(inputs, op, dtype))
        elif coll == "reduce_scatter":
            wants.append(reduce_reference(inputs, op, dtype)[block])
        elif coll == "reduce":
            wants.append(reduce_reference(inputs, op, dtype) if r == root else None)
        elif coll == "all_gather":
            wants.append(np.concatenate(inputs))
        elif coll == "all_to_all":
            wants.append(np.concatenate([inputs[q][block] for q in range(P)]))
        elif coll == "gather":
            wants.append(np.concatenate(inputs) if r == root else None)
        elif coll == "scatter":
            wants.append(inputs[root][block])
        elif coll == "broadcast":
            wants.append(inputs[root])
    got = ins if coll == "broadcast" else outputs
    return got, wants, ins, inputs


def check(coll, algo, P, N, dtype, op="sum", root=0, **kw):
    got, wants, ins, inputs = walk(coll, algo, P, N, dtype, op, root, **kw)
    for r in range(P):
        if wants[r] is not None:
            bad = mismatches(got[r], wants[r], dtype, op)
            assert bad == 0, f"{coll}/{algo} P={P} N={N} {dtype} {op} rank {r}: {bad} wrong"
        if coll != "broadcast":
            assert np.array_equal(ins[r], inputs[r]), f"{coll}/{algo} P={P}: rank {r}'s input was written"


CASES = [(c, a) for c in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "gather",
                          "scatter")
         for a in _core.ALGOS if a not in ("auto", "oneshot")
         and ALGO[a] in _core.supported_algos(COLL[c])]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("coll,algo", CASES)
@pytest.mark.parametrize("P", [1, 2, 3, 4, 5, 8])
def test_walker_matches_numpy(coll, algo, P, channels):
    # Three channels split every op into slices (some empty for tiny counts) that meet at a
    # barrier after each step; the results must be the same.
    ops = ("sum", "max", "prod") if coll in REDUCTIONS else ("sum",)
    for i, (N, dtype) in enumerate([(1, "int32"), (37, "float32"), (250, "float16"), (1000, "bfloat16"),
                                    (3 * P + 1, "int8")]):
        if NUMPY_DTYPES[dtype] is None:
            continue
        for op in ops:
            # Segments smaller than the buffer make the tree and chain pipeline.
            check(coll, algo, P, N, dtype, op, root=(i % P), segment=16, salt=i, channels=channels)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("slot_bytes,slots,channels", [(16, 1, 1), (48, 3, 2), (4096, 8, 4)])
def test_walker_slot_shapes(slot_bytes, slots, channels):
    # One slot forces strict lockstep; odd sizes split elements across chunk boundaries never
    # (slots hold whole elements) but leave short last chunks.
    for coll, algo in (("all_reduce", "ring"), ("all_reduce", "tree"), ("all_to_all", "direct"), ("broadcast", "tree")):
        check(coll, algo, 4, 301, "float32", slot_bytes=slot_bytes, slots=slots, segment=40, channels=channels)


def test_walker_avg_divides_after_the_walk():
    check("all_reduce", "ring", 4, 100, "float32", "avg")
    check("reduce_scatter", "ring", 4, 25, "int32", "avg")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("coll,algo", [("all_reduce", "ring"), ("all_gather", "ring"), ("broadcast", "tree")])
def test_walker_mismatched_tags_stop_every_rank_with_a_mismatch(coll, algo, channels):
    # Rank 2 made a different call (another tag): its receivers see it in the first header and
    # stop every rank through the stop words, long before the 30 s deadline.
    P, N = 4, 64
    x = [np.ones(N * P, np.float32) for _ in range(P)]
    o = [np.zeros(N * P, np.float32) for _ in range(P)]
    tags = [7, 7, 8, 7]
    with pytest.raises(testing.CollectiveMismatch, match="tag 8"):
        testing.walk_on_threads(COLL[coll], ALGO[algo], P, N, 0, 0, DTYPE["float32"], OP["sum"], 1.0,
                              [a.ctypes.data for a in x], [a.ctypes.data for a in o], 64, 2, 30.0, tags,
                              channels=channels)


def test_walker_timeout_is_reported():
    # A deadline already passed: the first round that moves nothing ends the walk.
    x = [np.ones(1000, np.float32) for _ in range(2)]
    o = [np.zeros(1000, np.float32) for _ in range(2)]
    with pytest.raises(testing.Timeout, match="still walking"):
        testing.walk_on_threads(COLL["all_reduce"], ALGO["ring"], 2, 1000, 0, 0, DTYPE["float32"], OP["sum"], 1.0,
                              [a.ctypes.data for a in x], [a.ctypes.data for a in o], 16, 1, 0.0)
