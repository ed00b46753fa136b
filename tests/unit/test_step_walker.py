"""The CUDA IPC executor's step walker (csrc/exec/step_walker.h) for every rank in one process,
over in-memory mailboxes, against numpy. Two ways:

  host policy   each rank and channel a thread running walk_schedule with the host policy;
  walk kernel   each rank's walk the CUDA kernel itself (exec/cuda/launch.cu, walk_kernel),
                launched through the CUDA stand-in's CUDA-on-CPU layer: 512 CUDA threads per
                channel as fibers, the block barriers and the leader's shared state as on a GPU,
                thread order shuffled by seed. A divergent __syncthreads or a barrier left dirty
                fails the walk.

Small slots and few of them force many chunks per message and slot reuse, so the protocol
(chunking, flags, lane order within a step, reduction order) is checked here, on machines
without a GPU. The multi-process runs of the same kernel are gpu/test_ipc_standin.py."""

from __future__ import annotations

import _ringtree_testing as testing
import numpy as np
import pytest
from reference import (
    BITWISE,
    INTEGER_DTYPES,
    NUMPY_DTYPES,
    make_input,
    mismatches,
    ops_for,
    premul_factor,
    reduce_reference,
)

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
INTEGERS = INTEGER_DTYPES


def shifted(values, offset):
    """`values` in a new array that starts `offset` elements into its allocation (0: aligned as
    numpy aligns; else off every 16-byte boundary the slots keep)."""
    out = np.empty(len(values) + offset, values.dtype)[offset:]
    out[...] = values
    return out


def walk(
    coll,
    algo,
    P,
    N,
    dtype,
    op="sum",
    root=0,
    slot_bytes=64,
    slots=2,
    segment=0,
    salt=0,
    channels=1,
    device=False,
    offset=0,
):
    """Runs the walk (device: the walk kernel itself) on buffers `offset` elements past an
    aligned start; returns (per-rank outputs, per-rank expectations)."""
    in_n, out_n = rt.collective_info(coll).buffer_sizes(N, P, is_root=True)
    out_n = out_n or in_n  # broadcast: one buffer
    inputs = [make_input(q, in_n, dtype, op, salt) for q in range(P)]
    outputs = [shifted(np.full(out_n, 77, NUMPY_DTYPES[dtype]), offset) for _ in range(P)]
    ins = [shifted(x, offset) for x in inputs]
    factor = premul_factor(dtype) if op == "premul_sum" else 1.0
    testing.walk_on_threads(
        COLL[coll],
        ALGO[algo],
        P,
        N,
        root,
        segment,
        DTYPE[dtype],
        OP[op],
        factor,
        [x.ctypes.data for x in ins],
        [o.ctypes.data for o in outputs],
        slot_bytes,
        slots,
        60.0,
        channels=channels,
        device=device,
    )
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
            assert bad == 0, f"{coll}/{algo} P={P} N={N} {dtype} {op} {kw} rank {r}: {bad} wrong"
        if coll != "broadcast":
            assert np.array_equal(ins[r], inputs[r]), f"{coll}/{algo} P={P}: rank {r}'s input was written"


CASES = [
    (c, a)
    for c in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "gather", "scatter")
    for a in _core.ALGOS
    if a not in ("auto", "oneshot") and ALGO[a] in _core.supported_algos(COLL[c])
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("coll,algo", CASES)
@pytest.mark.parametrize("P", [1, 2, 3, 4, 5, 8])
def test_walker_matches_numpy(coll, algo, P, channels):
    # Three channels split every op into slices (some empty for tiny counts) that meet at a
    # barrier after each step; the results must be the same.
    ops = ("sum", "max", "prod") if coll in REDUCTIONS else ("sum",)
    for i, (N, dtype) in enumerate(
        [(1, "int32"), (37, "float32"), (250, "float16"), (1000, "bfloat16"), (3 * P + 1, "int8")]
    ):
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
@pytest.mark.parametrize("device", [False, True], ids=["host", "kernel"])
@pytest.mark.parametrize("channels", [1, 2, 3])
@pytest.mark.parametrize("coll,algo", [("all_reduce", "ring"), ("all_gather", "ring"), ("broadcast", "tree")])
def test_walker_mismatched_tags_stop_every_rank_with_a_mismatch(coll, algo, channels, device, schedule):
    # Rank 2 made a different call (another tag): its receivers see it in the first header and
    # stop every rank through the stop words, long before the 30 s deadline. The kernel's
    # channels that were waiting at the step barrier leave it clean for the next call.
    P, N = 4, 64
    x = [np.ones(N * P, np.float32) for _ in range(P)]
    o = [np.zeros(N * P, np.float32) for _ in range(P)]
    tags = [7, 7, 8, 7]
    with pytest.raises(testing.CollectiveMismatch, match="tag 8"):
        testing.walk_on_threads(
            COLL[coll],
            ALGO[algo],
            P,
            N,
            0,
            0,
            DTYPE["float32"],
            OP["sum"],
            1.0,
            [a.ctypes.data for a in x],
            [a.ctypes.data for a in o],
            64,
            2,
            30.0,
            tags,
            channels=channels,
            device=device,
        )


@pytest.mark.parametrize("device", [False, True], ids=["host", "kernel"])
def test_walker_timeout_is_reported(device, schedule):
    # A deadline already passed: the first round that moves nothing ends the walk (the kernel:
    # the abort word a watchdog sets).
    x = [np.ones(1000, np.float32) for _ in range(2)]
    o = [np.zeros(1000, np.float32) for _ in range(2)]
    with pytest.raises(testing.Timeout, match="still walking"):
        testing.walk_on_threads(
            COLL["all_reduce"],
            ALGO["ring"],
            2,
            1000,
            0,
            0,
            DTYPE["float32"],
            OP["sum"],
            1.0,
            [a.ctypes.data for a in x],
            [a.ctypes.data for a in o],
            16,
            1,
            0.0,
            device=device,
        )


# ---- the walk kernel itself, through the CUDA-on-CPU layer -------------------------------------


@pytest.fixture
def schedule():
    """schedule(seed, yield_percent) sets how the stand-in orders each block's threads for the
    test's launches; afterwards they run in order again, and a kernel fault the test left behind
    (a sticky error) is forgotten, so it fails this test and not the ones after it."""
    yield testing.standin_schedule
    testing.standin_schedule(0, 0)
    testing.standin_clear_fault()


# (seed, yield percent): in thread order, then shuffled with fibers handing over at fences,
# atomics and loads of flags and slots.
SCHEDULES = [(0, 0), (1, 5), (2, 20)]
DTYPES = list(NUMPY_DTYPES)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("coll,algo", CASES)
def test_walk_kernel_matches_numpy(coll, algo, schedule):
    # Every collective and algorithm, at 1 to 5 ranks and 1 to 4 channels, with the dtypes, ops,
    # roots, sizes and schedules rotating so the cases together cover each of them.
    k = CASES.index((coll, algo))
    ops = ("sum", "max", "prod", "avg", "min", "premul_sum") if coll in REDUCTIONS else ("sum",)
    for i, (P, channels) in enumerate([(1, 1), (2, 1), (3, 2), (4, 3), (5, 4)]):
        dtype = DTYPES[(k + i) % len(DTYPES)]
        if NUMPY_DTYPES[dtype] is None:
            continue
        seed, yield_percent = SCHEDULES[(k + i) % len(SCHEDULES)]
        schedule(seed, yield_percent)
        N = (37, 250, 3 * P + 1, 100, 1)[(k + i) % 5]
        check(
            coll,
            algo,
            P,
            N,
            dtype,
            (ops_for(dtype, [ops[(k + i) % len(ops)]]) or ["sum"])[0],
            root=(k + i) % P,
            segment=16,
            salt=i,
            channels=channels,
            device=True,
        )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", [d for d in DTYPES if NUMPY_DTYPES[d] is not None])
def test_walk_kernel_every_op_of_every_dtype(dtype, schedule):
    # Every instance of the kernel (walk_kernel<T, Combine<T, Op>>), through every copy and reduce
    # path: buffers where the slots are (16-byte words and packs, byte and element tails), and one
    # element further (4-byte words, or bytes, and elements only).
    ops = ops_for(dtype, ["sum", "prod", "min", "max", "avg", "premul_sum"]) + (
        list(BITWISE) if dtype in INTEGERS else []
    )
    for i, op in enumerate(ops):
        check("all_reduce", "ring", 3, 37, dtype, op, channels=2, device=True, offset=i % 2)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed,yield_percent", SCHEDULES)
@pytest.mark.parametrize(
    "coll,algo",
    [
        ("all_reduce", "ring"),
        ("all_reduce", "tree"),
        ("reduce_scatter", "ring"),
        ("all_gather", "ring"),
        ("broadcast", "tree"),
    ],
)
def test_walk_kernel_with_one_channel_finishes_a_step_before_the_next(coll, algo, seed, yield_percent, schedule):
    # One channel per rank has no barrier with other channels between steps; the block's threads
    # must still all finish a step before the leader rewrites the shared progress of the next
    # (else the lagging threads act on the new step's progress: wrong data, a hang, or here a
    # divergent __syncthreads).
    schedule(seed, yield_percent)
    for P in (2, 3, 4):
        check(coll, algo, P, 24 * P, "float32", root=P - 1, segment=64, channels=1, device=True)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("channels", [1, 2, 3, 4])
@pytest.mark.parametrize("coll,algo", CASES)
def test_walk_kernel_full_sweep(coll, algo, channels, schedule):
    # Every P from 1 to 8, dtype, op and schedule for every collective and algorithm.
    ops = ("sum", "max", "prod", "avg", "premul_sum") if coll in REDUCTIONS else ("sum",)
    for P in range(1, 9):
        for i, dtype in enumerate(DTYPES):
            if NUMPY_DTYPES[dtype] is None:
                continue
            for op in ops + (tuple(BITWISE) if coll in REDUCTIONS and dtype in INTEGERS else ()):
                for seed, yield_percent in SCHEDULES:
                    schedule(seed, yield_percent)
                    check(
                        coll,
                        algo,
                        P,
                        (1, 37, 3 * P + 1, 250)[(i + seed) % 4],
                        dtype,
                        op,
                        root=(i + seed) % P,
                        segment=16,
                        salt=i,
                        channels=channels,
                        device=True,
                    )
