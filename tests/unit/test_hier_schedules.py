"""Hierarchical schedules (csrc/algorithms/hier.cc), without a transport.

The verifier proves, for hosts x local ranks up to 8 x 8, uneven hosts and ranks of a host
spread through the rank order, that every rank ends with the right data (every element reduced
from every rank exactly once, all_reduce in one order on every rank), inputs untouched, no
deadlock under rendezvous semantics. The step walker (the GPU executors' walk, on host threads)
then runs the same schedules on real data against numpy for every op. The structure the design
promises is checked on the schedules themselves: message ops only, cross-host traffic only
between counterparts, one inter-host message per host pair for all_to_all."""

from __future__ import annotations

import random

import _ringtree_testing as testing
import numpy as np
import pytest
from reference import NUMPY_DTYPES, make_input, mismatches, reduce_reference

import ringtree as rt
from ringtree import _core
from ringtree._args import ALGO_CODES, COLL_CODES
from ringtree._buffers import DTYPE_CODES
from ringtree.ops import OP_CODES

COLL = COLL_CODES
ALGO = ALGO_CODES
DTYPE = DTYPE_CODES
OP = OP_CODES
ROOTED = {"broadcast", "reduce"}
CASES = [
    (c, _core.ALGOS[a])
    for c in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce")
    for a in _core.hier_algos(COLL[c])
]


def contiguous(sizes):
    return [h for h, n in enumerate(sizes) for _ in range(n)]


def interleaved(sizes):
    """Ranks dealt to hosts round-robin (skipping full hosts): no host is contiguous."""
    left, labels = list(sizes), []
    while any(left):
        for h in range(len(sizes)):
            if left[h]:
                labels.append(h)
                left[h] -= 1
    return labels


UNEVEN = [[3, 1, 4], [1, 1], [8, 2, 5], [1, 8], [2, 7, 1, 3], [5, 5, 1]]


def layouts():
    """(name, labels): every hosts x local ranks grid point up to 8 x 8, contiguous, and the
    uneven hosts both contiguous and interleaved; a few random placements."""
    out = []
    for G in range(1, 9):
        for L in range(1, 9):
            out.append((f"{G}x{L}", contiguous([L] * G)))
            if G > 1 and L > 1 and G * L <= 24:
                out.append((f"{G}x{L}-interleaved", interleaved([L] * G)))
    for sizes in UNEVEN:
        out.append((f"{sizes}", contiguous(sizes)))
        out.append((f"{sizes}-interleaved", interleaved(sizes)))
    rng = random.Random(15)
    for _ in range(6):
        labels = [rng.randrange(4) for _ in range(rng.randrange(2, 13))]
        out.append((f"random{labels}", labels))
    return out


LAYOUTS = layouts()


def counts_for(P, large):
    return [0, 1, 2 * P + 3] if large else [0, 1, 2, 5, P - 1, 2 * P + 3]


def test_layouts_cover_the_promised_shapes():
    names = {name for name, _ in LAYOUTS}
    assert "8x8" in names and "[3, 1, 4]-interleaved" in names and "[8, 2, 5]" in names and "[1, 1]" in names
    assert max(len(labels) for _, labels in LAYOUTS) == 64


@pytest.mark.timeout(600)
@pytest.mark.parametrize("coll,algo", CASES)
def test_hier_schedules_verify(coll, algo):
    checked = 0
    for name, labels in LAYOUTS:
        P = len(labels)
        roots = sorted({0, P // 2, P - 1}) if coll in ROOTED else [0]
        pipelined = coll in ROOTED or algo == "hier_tree"
        for count in counts_for(P, large=P > 24):
            for root in roots:
                for segment in [0, 2] if pipelined else [0]:
                    summary = _core.verify_schedules(COLL[coll], ALGO[algo], P, count, root, segment, hosts=labels)
                    assert ": ok," in summary, (name, summary)
                    checked += 1
    assert checked > len(LAYOUTS)


def test_hier_needs_a_topology_and_a_collective_it_has():
    with pytest.raises(rt.InvalidArgument, match="topology"):
        _core.verify_schedules(COLL["all_reduce"], ALGO["hier"], 4, 8)
    with pytest.raises(rt.InvalidArgument, match="no schedule for gather"):
        _core.verify_schedules(COLL["gather"], ALGO["hier"], 4, 8, hosts=[0, 0, 1, 1])
    with pytest.raises(rt.InvalidArgument, match="no schedule for all_gather"):
        _core.verify_schedules(COLL["all_gather"], ALGO["hier_tree"], 4, 8, hosts=[0, 0, 1, 1])


def test_the_verifier_detects_faults_in_hier_schedules():
    labels = interleaved([3, 1, 2])
    for coll, algo in CASES:
        ops = sum(len(step) for step in _core.schedule(COLL[coll], ALGO[algo], 6, 0, 7, hosts=labels))
        for drop in range(ops):
            with pytest.raises(rt.Error, match="schedule check failed"):
                _core.verify_schedules(COLL[coll], ALGO[algo], 6, 7, 0, 0, drop_op=drop, hosts=labels)


def ops_of(coll, algo, labels, count, root=0):
    P = len(labels)
    return [
        [op for step in _core.schedule(COLL[coll], ALGO[algo], P, r, count, root, 4, hosts=labels) for op in step]
        for r in range(P)
    ]


@pytest.mark.parametrize("coll,algo", CASES)
def test_hier_schedules_are_message_ops_and_cross_hosts_between_counterparts(coll, algo):
    labels = interleaved([3, 2, 4])  # smallest host: 2 ranks, so columns 0 and 1
    hosts = sorted(set(labels), key=labels.index)
    local = {r: [q for q in range(len(labels)) if labels[q] == labels[r]].index(r) for r in range(len(labels))}
    for r, ops in enumerate(ops_of(coll, algo, labels, 40, root=len(labels) - 1)):
        assert {op[0] for op in ops} <= {"send", "recv", "recv_reduce", "copy"}
        for kind, peer, *_ in ops:
            if kind == "copy" or labels[peer] == labels[r]:
                continue
            if coll in ("broadcast", "reduce"):
                continue  # host leaders, checked below
            if coll == "all_to_all":
                continue  # round agents, checked below
            assert local[r] % 2 == local[peer] % 2 and local[r] < 2 and local[peer] < 2, (coll, r, peer)
    assert len(hosts) == 3


def test_hier_all_to_all_sends_one_message_per_host_pair():
    for sizes in ([3, 1, 4], [2, 2], [1, 5, 2, 3]):
        labels = interleaved(sizes)
        N = 3
        pairs = {}
        for r, ops in enumerate(ops_of("all_to_all", "hier", labels, N)):
            for kind, peer, count, *_ in ops:
                if kind == "send" and labels[peer] != labels[r]:
                    key = (labels[r], labels[peer])
                    assert key not in pairs, f"two messages from host {key[0]} to host {key[1]}"
                    pairs[key] = count
        G = len(sizes)
        assert len(pairs) == G * (G - 1)
        for (a, b), count in pairs.items():
            assert count == sizes[a] * sizes[b] * N


def test_hier_broadcast_crosses_hosts_once_per_host():
    labels = interleaved([3, 1, 4])
    for algo in ("hier", "hier_tree"):
        for root in (0, 4, len(labels) - 1):
            cross = [
                (r, peer)
                for r, ops in enumerate(ops_of("broadcast", algo, labels, 8, root))
                for kind, peer, *_ in ops
                if kind == "recv" and labels[peer] != labels[r]
            ]
            receivers = {r for r, _ in cross}
            assert len(receivers) == 2 and all(labels[r] != labels[root] for r in receivers), (algo, root, cross)


def walk(coll, algo, labels, N, dtype, op, root):
    P = len(labels)
    in_n, out_n = rt.collective_info(coll).buffer_sizes(N, P, is_root=True)
    out_n = out_n or in_n
    inputs = [make_input(q, in_n, dtype, op, 3) for q in range(P)]
    ins = [x.copy() for x in inputs]
    outputs = [np.full(out_n, 77, NUMPY_DTYPES[dtype]) for _ in range(P)]
    testing.walk_on_threads(
        COLL[coll],
        ALGO[algo],
        P,
        N,
        root,
        5,
        DTYPE[dtype],
        OP[op],
        1.0,
        [x.ctypes.data for x in ins],
        [o.ctypes.data for o in outputs],
        256,
        2,
        60.0,
        hosts=labels,
    )
    got = ins if coll == "broadcast" else outputs
    for r in range(P):
        block = slice(r * N, (r + 1) * N)
        want = {
            "all_reduce": lambda: reduce_reference(inputs, op, dtype),
            "reduce_scatter": lambda: reduce_reference(inputs, op, dtype)[block],
            "reduce": lambda: reduce_reference(inputs, op, dtype) if r == root else None,
            "all_gather": lambda: np.concatenate(inputs),
            "all_to_all": lambda: np.concatenate([inputs[q][block] for q in range(P)]),
            "broadcast": lambda: inputs[root],
        }[coll]()
        if want is not None:
            bad = mismatches(got[r], want, dtype, op)
            assert bad == 0, f"{coll}/{algo} on {labels} N={N} {dtype} {op} rank {r}: {bad} wrong"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("coll,algo", CASES)
def test_hier_schedules_walked_on_threads_match_numpy(coll, algo):
    ops = ("sum", "prod", "min", "max") if coll in ("all_reduce", "reduce_scatter", "reduce") else ("sum",)
    for labels in (interleaved([3, 1, 2]), contiguous([2, 2]), interleaved([1, 1])):
        P = len(labels)
        for op in ops:
            for N, dtype in ((1, "int32"), (3 * P + 1, "float32"), (37, "bfloat16"), (11, "int8")):
                walk(coll, algo, labels, N, dtype, op, root=P - 1)
