"""Transport-free checks: every schedule verified for P = 1..64 against every other rank's
schedule (rendezvous semantics, so no buffering assumption), proving each rank ends with the
right data, every element reduced from every rank exactly once, all_reduce results in one
reduction order on every rank, inputs untouched, and no deadlock. One-shot one-shot schedules also:
reductions in rank order 0..P-1, a read only after its peer published, and twice as many calls in
a row as there are one-shot slots, and payload slots, per rank (common/oneshot.h: a rank may run ahead of its peers, its
deferred steps running calls later) without a slot reused while some rank may still read it."""

import _ringtree_testing as testing
import pytest

import ringtree as rt
from ringtree import _core
from ringtree._args import ALGO_CODES, COLL_CODES

COLL = COLL_CODES
ALGO = ALGO_CODES
CASES = [
    ("all_reduce", "ring"),
    ("all_reduce", "tree"),
    ("reduce_scatter", "ring"),
    ("all_gather", "ring"),
    ("all_to_all", "direct"),
    ("broadcast", "tree"),
    ("broadcast", "ring"),
    ("broadcast", "direct"),
    ("reduce", "tree"),
    ("reduce", "ring"),
    ("gather", "direct"),
    ("scatter", "direct"),
    ("barrier", "direct"),
]
ONESHOT = list(dict.fromkeys(coll for coll, _ in CASES))  # every collective above has a one-shot schedule
CASES += [(coll, "oneshot") for coll in ONESHOT]
ROOTED = {"broadcast", "reduce", "gather", "scatter"}


def counts_for(P):
    return sorted({0, 1, P - 1, 2 * P + 1})


# Every rank count to 32, then the shapes above it that differ (a prime, 2^k - 1, 2^k + 1, 3 * 2^k,
# powers of two); the whole range 1..64 runs with -m slow (it takes a minute and a half more).
RANK_COUNTS = [*range(1, 33), 33, 37, 48, 55, 63, 64]


def _verify_schedules(coll, algo, rank_counts):
    checked = 0
    for P in rank_counts:
        roots = sorted({0, P // 2, P - 1}) if coll in ROOTED else [0]
        counts = counts_for(P) if P <= 16 or P in (31, 32, 33, 63, 64) else [2 * P + 1]
        for count in counts:
            for root in roots:
                pipelined = algo != "oneshot" and (
                    coll in ("broadcast", "reduce") or (coll, algo) == ("all_reduce", "tree")
                )
                segments = [0, 1, 2] if pipelined else [0]
                for segment in segments:
                    summary = _core.verify_schedules(COLL[coll], ALGO[algo], P, count, root, segment)
                    assert ": ok," in summary
                    assert summary.endswith("payload slots per rank" if algo == "oneshot" else "messages")
                    checked += 1
    assert checked >= len(rank_counts)


@pytest.mark.parametrize("coll,algo", CASES)
def test_schedules_verify_for_1_to_32_ranks_and_larger_shapes(coll, algo):
    _verify_schedules(coll, algo, RANK_COUNTS)


@pytest.mark.slow
@pytest.mark.parametrize("coll,algo", CASES)
def test_schedules_verify_for_every_rank_count_to_64(coll, algo):
    _verify_schedules(coll, algo, range(1, 65))


def test_ring_schedule_has_the_textbook_shape():
    # P=4: three reduce-scatter steps (send + receive-and-reduce), three all-gather steps.
    steps = _core.schedule(COLL["all_reduce"], ALGO["ring"], 4, 0, 10)
    assert len(steps) == 6 and all(len(s) == 2 for s in steps)
    kinds = [[op[0] for op in s] for s in steps]
    assert kinds[:3] == [["send", "recv_reduce"]] * 3 and kinds[3:] == [["send", "recv"]] * 3


def test_ring_all_gather_sends_its_own_block_from_the_input():
    # A next rank that read the copy in our output would hold its lines, and with the cores on
    # different core complexes the next call's copy into that block would have to take them back.
    for P in (2, 3, 5):
        for r in range(P):
            steps = _core.schedule(COLL["all_gather"], ALGO["ring"], P, r, 10)
            sends = [op for s in steps for op in s if op[0] == "send"]
            assert sends[0][4] == ("input", 0), (P, r, sends)
            assert all(op[4][0] == "output" for op in sends[1:]), (P, r, sends)
            assert [op for s in steps for op in s if op[0] == "copy"] == [
                ("copy", -1, 10, ("output", 10 * r), ("input", 0), -1)
            ]


def test_oneshot_schedule_reduces_in_rank_order():
    # P=4, rank 1: publish, then published(0) (op) published(1), then (op) 2, then (op) 3.
    steps = _core.schedule(COLL["all_reduce"], ALGO["oneshot"], 4, 1, 10)
    assert steps[0] == [("publish", -1, 10, ("published", 0), ("input", 0), -1)]
    chain = [(op[0], op[5], op[1]) for s in steps[1:] for op in s]
    assert chain == [("reduce_published", 0, 1), ("reduce_published", -1, 2), ("reduce_published", -1, 3)]
    # reduce_scatter reads block r of every publication.
    steps = _core.schedule(COLL["reduce_scatter"], ALGO["oneshot"], 4, 2, 5)
    assert steps[0][0][2] == 20 and all(
        op[4] == ("published", 10) and op[3] == ("output", 0) for s in steps[1:] for op in s
    )


def test_one_shot_broadcast_root_publishes_then_only_waits():
    root_steps = _core.schedule(COLL["broadcast"], ALGO["oneshot"], 4, 2, 6, 2)
    assert [op[0] for op in root_steps[0]] == ["publish"] and root_steps[0][0][2] == 6
    assert sorted(op[1] for op in root_steps[1]) == [0, 1, 3] and all(op[2] == 0 for op in root_steps[1])
    other = _core.schedule(COLL["broadcast"], ALGO["oneshot"], 4, 0, 6, 2)
    assert other[0][0][2] == 0 and other[1] == [("copy_published", 2, 6, ("output", 0), ("published", 0), -1)]
    assert sorted(op[1] for op in other[2]) == [1, 3]


def test_one_shot_gather_and_scatter_read_only_where_the_data_goes():
    # gather, P=4, root 2: every rank publishes its 6 elements; the root copies each publication
    # to its block, the others return at once and wait for every publication in a deferred step.
    root_steps = _core.schedule(COLL["gather"], ALGO["oneshot"], 4, 2, 6, 2)
    assert root_steps[0] == [("publish", -1, 6, ("published", 0), ("input", 0), -1)]
    assert sorted((op[0], op[1], op[3]) for op in root_steps[1]) == [
        ("copy_published", q, ("output", 6 * q)) for q in range(4)
    ]
    assert len(root_steps) == 2
    other = _core.schedule(COLL["gather"], ALGO["oneshot"], 4, 1, 6, 2)
    assert other[0][0][2] == 6 and len(other) == 2
    assert sorted(op[1] for op in other[1]) == [0, 2, 3] and all(op[2] == 0 for op in other[1])
    # scatter: the root publishes all 4 blocks; every rank copies its own block of the root's.
    root_steps = _core.schedule(COLL["scatter"], ALGO["oneshot"], 4, 2, 6, 2)
    assert root_steps[0][0][2] == 24
    assert root_steps[1] == [("copy_published", 2, 6, ("output", 0), ("published", 12), -1)]
    other = _core.schedule(COLL["scatter"], ALGO["oneshot"], 4, 3, 6, 2)
    assert other[0][0][2] == 0
    assert other[1] == [("copy_published", 2, 6, ("output", 0), ("published", 18), -1)]
    assert sorted(op[1] for op in other[2]) == [0, 1]


def test_step_walker_refuses_oneshot_schedules():
    buf = [0] * 2
    with pytest.raises(testing.InvalidArgument, match="one-shot"):
        testing.walk_on_threads(COLL["all_reduce"], ALGO["oneshot"], 2, 0, 0, 0, 0, 0, 1.0, buf, buf, 1 << 12, 2)


def test_the_verifier_detects_faults():
    # The fault hook drops one op of rank 0's schedule; every such fault must be reported.
    for coll, algo in CASES:
        if (coll, algo) == ("barrier", "direct"):
            continue
        steps = _core.schedule(COLL[coll], ALGO[algo], 5, 0, 11, 0, 2)
        n_ops = sum(len(s) for s in steps)
        for k in range(n_ops):
            with pytest.raises(rt.Error, match="schedule check failed"):
                _core.verify_schedules(COLL[coll], ALGO[algo], 5, 11, 0, 2, drop_op=k)


def test_one_buffer_all_to_all_verifies_with_input_and_output_aliased():
    # The schedule for an in-place all_to_all whose input is its output: checked with the two
    # buffers as one, so a block overwritten before it is sent would be reported.
    for P in range(2, 65):
        for count in counts_for(P) if P <= 16 else [2 * P + 1]:
            summary = _core.verify_schedules(COLL["all_to_all"], ALGO["direct"], P, count, same_buffer=True)
            assert "in one buffer: ok," in summary


@pytest.mark.parametrize("P", [2, 3, 4, 5, 8])
def test_one_buffer_all_to_all_stages_only_what_it_overwrites_before_sending(P):
    N = 7
    for r in range(P):
        steps = _core.schedule(COLL["all_to_all"], ALGO["direct"], P, r, N, same_buffer=True)
        staged = [op for op in steps[0] if op[0] == "copy"]
        # Block r-s is received in step s and sent in step P-s: staged when s <= P/2, never block r.
        assert [op[4] for op in staged] == [("input", ((r - s) % P) * N) for s in range(1, P // 2 + 1)]
        assert all(op[3][0] == "scratch" for op in staged) and len(steps) == P
        copies = [op for s in steps[1:] for op in s if op[0] == "copy"]
        assert copies == []  # the own block stays where it is
        for step in range(1, P):
            (send,) = [op for op in steps[step] if op[0] == "send"]
            assert send[1] == (r + step) % P
            assert send[4][0] == ("scratch" if P - step <= P // 2 else "input")
    # Out of place the same collective stages nothing: its first exchange also copies its own
    # block, which the executor does once that step's messages are under way.
    steps = _core.schedule(COLL["all_to_all"], ALGO["direct"], P, 0, N)
    assert len(steps) == P - 1
    assert steps[0] == [
        ("send", 1, N, ("input", 0), ("input", N), -1),
        ("recv", P - 1, N, ("output", (P - 1) * N), ("input", 0), -1),
        ("copy", -1, N, ("output", 0), ("input", 0), -1),
    ]


def test_a_one_buffer_schedule_is_refused_for_other_collectives():
    for coll, algo in (("all_gather", "ring"), ("all_to_all", "oneshot"), ("broadcast", "tree")):
        with pytest.raises(rt.InvalidArgument, match="one-buffer schedule is direct all_to_all's alone"):
            _core.schedule(COLL[coll], ALGO[algo], 4, 0, 10, same_buffer=True)


def test_the_verifier_finds_a_one_buffer_fault():
    # Every dropped op of the one-buffer schedule is reported.
    steps = _core.schedule(COLL["all_to_all"], ALGO["direct"], 5, 0, 11, same_buffer=True)
    for k in range(sum(len(s) for s in steps)):
        with pytest.raises(rt.Error, match="in one buffer"):
            _core.verify_schedules(COLL["all_to_all"], ALGO["direct"], 5, 11, drop_op=k, same_buffer=True)


def test_unsupported_algorithm_is_rejected_by_name():
    world = rt.init()
    try:
        with pytest.raises(rt.InvalidArgument, match="not available for reduce_scatter"):
            world.choose_algo("reduce_scatter", 1024, "tree")
        assert world.choose_algo("all_reduce", 1 << 30) == "ring"
    finally:
        world.close()


@pytest.mark.parametrize("coll", ONESHOT)
@pytest.mark.parametrize("P,root", [(2, 0), (3, 2), (5, 0), (5, 3)])
def test_oneshot_faults_are_found_without_the_oneshot_rules(coll, P, root):
    # A dropped op that moves data is found by the walk alone (oneshot_rules=False). A dropped wait
    # (a read of 0 elements) moves nothing; with many slots the walk may still see that peer's
    # publications through the other ranks, so the one-shot rules must report it: it breaks that
    # peer's fingerprint check.
    ops = [op for step in _core.schedule(COLL[coll], ALGO["oneshot"], P, 0, 3, root) for op in step]
    for k, (kind, _peer, count, *_rest) in enumerate(ops):
        wait = kind != "publish" and count == 0
        with pytest.raises(rt.Error, match="schedule check failed"):
            _core.verify_schedules(COLL[coll], ALGO["oneshot"], P, 3, root, 0, drop_op=k, oneshot_rules=wait)
