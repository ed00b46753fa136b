"""The wait policy (exec/host/wait_policy.h) as a pure function of the counts it is decided from:
each rule alone, with the figures the docs state (spin 1000 us and yield 2000 us while every local
rank has a core; spin 1 us when oversubscribed or without a peer on this host; no yield without
one; the two settings override)."""

import pytest

from ringtree import _core


def policy(local, sharers, cpus, online, spin=-1, yield_=-1):
    p = _core.wait_policy(local, sharers, cpus, online, spin, yield_)
    return p["spin_ns"] // 1000, p["yield_ns"] // 1000, p["oversubscribed"], p["text"]


@pytest.mark.parametrize("local, sharers, cpus, online", [(2, 2, 2, 2), (4, 4, 8, 8), (8, 8, 8, 8)])
def test_ranks_that_each_have_a_core_spin_long_then_yield(local, sharers, cpus, online):
    spin, yld, over, text = policy(local, sharers, cpus, online)
    assert (spin, yld, over) == (1000, 2000, False)
    assert (
        text == f"spin 1000 us, yield 2000 us, then block; {local} ranks on this host, {sharers} allowed the "
        f"same {cpus} CPUs"
    )


@pytest.mark.parametrize(
    "local, sharers, cpus, online",
    [
        (3, 3, 2, 2),  # more ranks on this host than CPUs
        (4, 4, 8, 2),  # ... than CPUs this process may use
        (2, 4, 2, 2),  # other hosts (namespaces, containers) on this kernel share the same CPUs
    ],
)
def test_oversubscribed_ranks_hand_the_core_over_at_once(local, sharers, cpus, online):
    spin, yld, over, text = policy(local, sharers, cpus, online)
    assert (spin, yld, over) == (1, 2000, True)
    assert text.endswith(": oversubscribed")


@pytest.mark.parametrize("sharers, cpus", [(1, 2), (4, 2)])
def test_a_rank_alone_on_its_host_neither_spins_nor_yields(sharers, cpus):
    """Its data arrive through the kernel (TCP), which needs the core a spinner would hold."""
    spin, yld, over, _ = policy(1, sharers, cpus, 2)
    assert (spin, yld) == (1, 0)
    assert over == (sharers > cpus)


def test_the_settings_replace_either_figure_and_say_so():
    spin, yld, over, text = policy(2, 2, 2, 2, spin=50)
    assert (spin, yld, over) == (50, 2000, False) and "spin 50 us (RINGTREE_SPIN_US), yield 2000 us," in text
    spin, yld, _, text = policy(3, 3, 2, 2, yield_=0)
    assert (spin, yld) == (1, 0) and "yield 0 us (RINGTREE_YIELD_US)" in text
    spin, yld, _, text = policy(1, 1, 2, 2, spin=0, yield_=7)
    assert (spin, yld) == (0, 7) and "(RINGTREE_SPIN_US)" in text and "(RINGTREE_YIELD_US)" in text
