"""algo="auto" as a unit (runtime/algo_choice.h), driven with a stated machine and topology and no
ranks: its rules in order, the memo of its answers, and the replaceable last step (the hook).

The expected choices come from the rules as the docs state them, applied here in Python to the
candidates and predictions the unit reports (estimate()), so the test checks that choose() does
what estimate() and the rules say, on every collective, size, rank count and host layout."""

import random

import pytest

import ringtree as rt
from ringtree import _core
from ringtree._args import ALGO_CODES, COLL_CODES
from ringtree._buffers import DTYPE_CODES
from ringtree._choice import core_hook
from ringtree.ops import OP_CODES

COLL = COLL_CODES
ALGO = ALGO_CODES
DTYPE = DTYPE_CODES
OP = OP_CODES
PRICED = [
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "all_to_all",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "barrier",
]
SIZES = [0, 1, 8, 100, 4096, 65536, 1 << 20, 3 << 22, 1 << 28]
ONESHOT = 64 << 10
LAYOUTS = {  # name: (P, host labels)
    "P2": (2, []),
    "P4": (4, []),
    "P8": (8, []),
    "2x2": (4, [0, 0, 1, 1]),
    "uneven": (5, [0, 1, 0, 0, 1]),
    "4x2": (8, [0, 0, 1, 1, 2, 2, 3, 3]),
}


def make(layout, oneshot=ONESHOT, costs=None, forced="auto"):
    P, hosts = LAYOUTS[layout]
    on_one_host = not hosts or len(set(hosts)) == 1
    return _core.AlgoChoice(P, hosts, costs or _core.MachineCosts(), oneshot if on_one_host else 0, ALGO[forced])


def choose(choice, coll, nbytes, dtype="float32", algo="auto", op="sum", deterministic=False):
    return _core.ALGOS[choice.choose(COLL[coll], ALGO[algo], nbytes, DTYPE[dtype], OP[op], deterministic)]


def candidates(choice, coll, nbytes, dtype="float32", deterministic=False):
    return [(_core.ALGOS[a], t) for a, t, _ in choice.estimate(COLL[coll], nbytes, DTYPE[dtype], deterministic)]


def rule_six(cands):
    """The cheapest candidate, near-ties (within 1%) going to the earlier one."""
    best, best_t = cands[0]
    for algo, t in cands[1:]:
        if t < best_t * 0.99:
            best, best_t = algo, t
    return best


def expected(choice, coll, nbytes, dtype="float32"):
    cands = candidates(choice, coll, nbytes, dtype)
    names = [a for a, _ in cands]
    if nbytes == 0 and "oneshot" in names and coll != "barrier":
        return "oneshot"  # rule 4: count 0 is priced as oneshot (the call runs no traffic)
    return names[0] if len(names) == 1 else rule_six(cands)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_auto_takes_the_cheapest_candidate_with_near_ties_to_the_earlier(layout):
    choice = make(layout)
    P, hosts = LAYOUTS[layout]
    for coll in PRICED:
        for nbytes in SIZES:
            for dtype in ("float32", "int8"):
                cands = candidates(choice, coll, nbytes, dtype)
                names = [a for a, _ in cands]
                assert names and len(set(names)) == len(names), (coll, nbytes, cands)
                assert all(t > 0 for _, t in cands), (coll, nbytes, cands)
                # The hierarchical algorithms are candidates across hosts only; one-shot on one host.
                assert any(a.startswith("hier") for a in names) == (
                    len(set(hosts)) > 1
                    and coll in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")
                ), (coll, names)
                assert ("oneshot" in names) == bool(choice.oneshot_fits(COLL[coll], nbytes)), (coll, nbytes)
                assert choose(choice, coll, nbytes, dtype) == expected(choice, coll, nbytes, dtype), (
                    coll,
                    nbytes,
                    dtype,
                )


def test_the_one_shot_capacity_decides_what_fits():
    choice = make("P4", oneshot=4096)
    fits = lambda coll, n: choice.oneshot_fits(COLL[coll], n)
    # all_reduce publishes its whole buffer, gather its block; reduce_scatter, all_to_all and
    # scatter's root every rank's block (P x N).
    assert fits("all_reduce", 4096) and not fits("all_reduce", 4097)
    assert fits("gather", 4096) and not fits("gather", 4097)
    assert fits("reduce_scatter", 1024) and not fits("reduce_scatter", 1025)
    assert fits("scatter", 1024) and not fits("scatter", 1025)
    assert fits("barrier", 0) and not fits("send", 8)
    assert not make("P4", oneshot=0).oneshot_fits(COLL["all_reduce"], 8)
    assert not make("2x2").oneshot_fits(COLL["all_reduce"], 8)  # ranks on two hosts


def test_a_stated_machine_moves_the_choice_as_its_figures_say():
    """Latency-bound calls go to the algorithm with fewer hops on the critical path, bandwidth-
    bound ones to the one that moves fewer bytes per rank: a dear hop makes the tree win a small
    all_reduce at P=8, the ring wins a large one (2(P-1)/P of the buffer per rank, not 2x)."""
    slow_hops = _core.MachineCosts()
    slow_hops.hop_s = slow_hops.switch_s = 50e-6
    choice = make("P8", oneshot=0, costs=slow_hops)
    assert choose(choice, "all_reduce", 1024) == "tree"
    assert choose(choice, "all_reduce", 1 << 28) == "ring"
    # The same small call with free hops has nothing to save on latency: the ring's fewer bytes win.
    free_hops = _core.MachineCosts()
    free_hops.hop_s = free_hops.switch_s = free_hops.call_s = 1e-12
    assert choose(make("P8", oneshot=0, costs=free_hops), "all_reduce", 1 << 20) == "ring"
    # Estimates scale with the figures: a slower memory costs a large call more.
    slow_copy = _core.MachineCosts()
    slow_copy.copy_cold_Bps, slow_copy.reduce_cold_Bps = 1e9, 1e9
    fast = dict(candidates(make("P4"), "all_reduce", 1 << 28))["ring"]
    slow = dict(candidates(make("P4", costs=slow_copy), "all_reduce", 1 << 28))["ring"]
    assert slow > 2 * fast


def test_named_algorithms_run_where_they_exist_and_are_refused_elsewhere():
    choice = make("P4")
    assert choose(choice, "all_reduce", 1 << 20, algo="tree") == "tree"
    assert choose(choice, "all_reduce", 1 << 20, algo="hier") == "hier"  # runs on one host too
    with pytest.raises(rt.InvalidArgument, match="not available for all_gather; choose from ring"):
        choose(choice, "all_gather", 4096, algo="tree")
    with pytest.raises(rt.InvalidArgument, match="at most 65536 bytes per rank"):
        choose(choice, "all_reduce", 1 << 20, algo="oneshot")
    with pytest.raises(rt.InvalidArgument, match="spans hosts or uses TCP"):
        choose(make("2x2"), "all_reduce", 64, algo="oneshot")
    with pytest.raises(rt.InvalidArgument, match="unknown algo code"):
        choice.choose(COLL["all_reduce"], 99, 8, 0, 0, False)


def test_deterministic_mode_keeps_floating_point_reductions_in_rank_order():
    choice = make("P4")
    for nbytes in (64, 1 << 20):
        cands = candidates(choice, "all_reduce", nbytes, deterministic=True)
        names = [a for a, _ in cands]
        assert names == (["rank_order", "oneshot"] if nbytes <= ONESHOT else ["rank_order"])
        times = dict(cands)
        want = "oneshot" if "oneshot" in times and times["oneshot"] < times["rank_order"] else "rank_order"
        assert choose(choice, "all_reduce", nbytes, deterministic=True) == want
        # min and max stay on the chain (the one-shot order of operands may differ), whatever was asked
        assert choose(choice, "all_reduce", nbytes, op="max", deterministic=True) == "rank_order"
        assert choose(choice, "all_reduce", nbytes, algo="ring", deterministic=True) == "rank_order"
    # Integers are exact in any order: deterministic mode leaves them to auto.
    assert choose(choice, "all_reduce", 1 << 20, "int32", deterministic=True) == choose(
        choice, "all_reduce", 1 << 20, "int32"
    )
    assert choose(choice, "all_gather", 1 << 20, deterministic=True) == "ring"


def test_the_algo_setting_applies_where_the_collective_has_it():
    tree = make("P4", forced="tree")
    assert choose(tree, "all_reduce", 1 << 28) == "tree"
    assert choose(tree, "all_gather", 1 << 20) == expected(make("P4"), "all_gather", 1 << 20)  # no tree there
    assert choose(tree, "all_reduce", 1 << 28, algo="ring") == "ring"  # a named algorithm beats the setting


def test_the_memo_answers_as_the_rules_do_in_any_order_and_at_any_size():
    """Keys that share memo entries (64 of them), dtypes and collectives interleaved, and sizes
    beyond the memo's bytes field (2^53), asked in random orders, three rounds each."""
    choice = make("P4")
    keys = []
    for coll in PRICED:
        for dtype in ("float32", "float64", "bfloat16", "int8"):
            for nbytes in SIZES + [64 * k + 3 for k in range(1, 9)] + [(1 << 53) + 64, (1 << 60) + 5, (1 << 64) - 1]:
                keys.append((coll, nbytes, dtype))
    want = {k: expected(choice, *k) for k in keys}
    rng = random.Random(7)
    for _ in range(3):
        rng.shuffle(keys)
        got = {k: choose(choice, *k) for k in keys}
        assert got == want


def test_a_hook_makes_the_last_decision_from_the_candidates_and_their_costs():
    choice = make("P4")
    seen = []

    def prefer_tree_past_64k(request):
        seen.append(request)
        names = [a for a, _, _ in request.candidates]
        return "tree" if request.nbytes > 65536 and "tree" in names else None

    model = {n: choose(choice, "all_reduce", n) for n in (4096, 1 << 20)}
    choice.set_choice_hook(core_hook(prefer_tree_past_64k))
    assert choose(choice, "all_reduce", 1 << 20) == "tree"
    assert choose(choice, "all_reduce", 4096) == model[4096]  # None: the model's pick
    first = seen[0]
    assert isinstance(first, rt.ChoiceRequest)
    assert (first.collective, first.nbytes, first.dtype, first.nranks, first.nhosts) == (
        "all_reduce",
        1 << 20,
        "float32",
        4,
        1,
    )
    assert [(a, t) for a, t, _ in first.candidates] == candidates(choice, "all_reduce", 1 << 20)
    assert first.model_choice == model[1 << 20]
    # Remembered like the model's answers: asked again right away, the hook is not called again.
    assert choose(choice, "all_reduce", 1 << 20) == "tree"
    calls = len(seen)
    assert choose(choice, "all_reduce", 1 << 20) == "tree" and len(seen) == calls
    # The rules before the last step still hold: named algorithms, one candidate, count 0.
    assert choose(choice, "all_reduce", 1 << 20, algo="ring") == "ring"
    assert choose(choice, "gather", 1 << 20) == "direct" and len(seen) == calls
    choice.set_choice_hook(None)
    assert choose(choice, "all_reduce", 1 << 20) == model[1 << 20]


def test_a_hook_that_answers_wrong_fails_the_call_with_a_clear_error():
    choice = make("P4")
    choice.set_choice_hook(core_hook(lambda request: "oneshot"))  # too large to fit at 1 MiB
    with pytest.raises(
        rt.InvalidArgument,
        match="hook chose 'oneshot' for all_reduce of 1048576 bytes, which is not "
        "a candidate; it must return one of ring, tree",
    ):
        choose(choice, "all_reduce", 1 << 20)
    choice.set_choice_hook(core_hook(lambda request: "fastest"))
    with pytest.raises(rt.InvalidArgument, match="returned 'fastest'.*algorithm's name"):
        choose(choice, "all_reduce", 1 << 20)

    def broken(request):
        raise KeyError("the hook's own bug")

    choice.set_choice_hook(core_hook(broken))
    with pytest.raises(KeyError, match="own bug"):
        choose(choice, "all_reduce", 1 << 20)
    with pytest.raises(rt.InvalidArgument, match="must be callable"):
        core_hook("ring")
    choice.set_choice_hook(None)
    assert choose(choice, "all_reduce", 1 << 20) == expected(choice, "all_reduce", 1 << 20)


def test_broadcast_runs_direct_only_when_named():
    # The flat broadcast is a schedule like any other, but auto does not weigh it (its gain, the
    # single-copy reads of the root's buffer, is not priced): never a candidate, never chosen,
    # and it runs when named or set, at every size and layout.
    for layout in LAYOUTS:
        choice = make(layout)
        for nbytes in SIZES:
            assert "direct" not in [a for a, _ in candidates(choice, "broadcast", nbytes)]
            assert choose(choice, "broadcast", nbytes) != "direct"
            assert choose(choice, "broadcast", nbytes, algo="direct") == "direct"
        assert choose(make(layout, forced="direct"), "broadcast", 1 << 20) == "direct"
    with pytest.raises(rt.InvalidArgument, match="not available for reduce; choose from tree, ring, .*auto"):
        choose(make("P4"), "reduce", 1 << 20, algo="direct")
