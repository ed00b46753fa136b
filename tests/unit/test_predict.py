"""ringtree.predict's formulas: hand-computed prices, the C++ schedule counts they stand in for,
monotonicity in size and ranks, and the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ringtree import _core, predict
from ringtree.predict import Machine

# Figures that make the arithmetic easy: no cache blend (l2 = l3 = 1 byte: always from memory),
# 1 GB/s copy, 0.5 GB/s reduce, 1 us a local hop, 10 us a remote one, 0.1 GB/s between hosts.
FLAT = Machine(
    call_s=2e-6,
    hop_s=1e-6,
    tcp_hop_s=10e-6,
    tcp_Bps=0.1e9,
    copy_hot_Bps=1e9,
    copy_cold_Bps=1e9,
    reduce_hot_Bps=0.5e9,
    reduce_cold_Bps=0.5e9,
    l2_bytes=1,
    l3_bytes=1,
)
MB = 1_000_000


def test_ring_on_one_host_by_hand():
    # P = 4, N = 1 MB: 6 hops (the first step's messages stand in for the handshake); sends 1.5 MB,
    # receives 0.75 MB (copies), reduces 0.75 MB
    want = 2e-6 + 6 * 1e-6 + (1.5 + 0.75) * MB / 1e9 + 0.75 * MB / 0.5e9
    assert predict.predict("ring", 1, 4, MB, FLAT) == pytest.approx(want)


def test_ring_across_two_hosts_by_hand():
    # 2 x 2: every hop waits on the slow link (rank 0 receives from rank 3 every step); rank 0
    # sends 1.5 MB locally and receives 0.75 MB + reduces 0.75 MB from the other host at 0.1 GB/s
    want = 2e-6 + 6 * 10e-6 + 1.5 * MB / 1e9 + 1.5 * MB / 0.1e9
    assert predict.predict("ring", 2, 2, MB, FLAT) == pytest.approx(want)


def test_hier_across_two_hosts_by_hand():
    # 2 x 2: intra ring reduce-scatter + all-gather (2 local hops, 1 MB sent, 0.5 MB received,
    # 0.5 MB reduced), then a ring of 2 hosts on a 0.5 MB column (2 remote hops; each step sends
    # 0.25 MB and receives 0.25 MB across at once, so the link carries 0.5 MB one way, and
    # that, not the 1 MB both ways, sets the remote time), and the handshake (remote)
    local = 1 * MB / 1e9 + 0.5 * MB / 1e9 + 0.5 * MB / 0.5e9
    remote = 0.5 * MB / 0.1e9
    want = 2e-6 + 2 * 1e-6 + 3 * 10e-6 + local + remote
    assert predict.predict("hier", 2, 2, MB, FLAT) == pytest.approx(want)


def test_a_ring_of_two_hosts_uses_both_directions_at_once():
    # 2 x 1: each rank sends 1 MB and receives 1 MB across, a half each step, both ways at once
    want = 2e-6 + 2 * 10e-6 + 1 * MB / 0.1e9
    assert predict.predict("ring", 2, 1, MB, FLAT) == pytest.approx(want)
    k = predict.counts("ring", 2, 1, MB, FLAT)
    assert (k.remote_sent, k.remote_received + k.remote_reduced, k.link) == (MB, MB, MB)


def test_a_tree_of_two_hosts_uses_one_direction_at_a_time():
    # 2 x 1 tree: all of the reduce goes up, then all of the broadcast comes down (tree.cc runs
    # the phases one after the other), so the link carries 2 MB one way in turn
    k = predict.counts("tree", 2, 1, MB, FLAT)
    assert k.link == 2 * MB
    want = 2e-6 + predict.tree_hops(2, 8) * 10e-6 + 10e-6 + 2 * MB / 0.1e9
    assert predict.predict("tree", 2, 1, MB, FLAT) == pytest.approx(want)


def test_reduce_scatter_and_all_gather_by_hand():
    # 4 ranks on one host, blocks of 1 MB: 3 ring steps, each sends and receives (or reduces) a block
    want_rs = 2e-6 + 3 * 1e-6 + 3 * MB / 1e9 + 3 * MB / 0.5e9
    assert predict.predict("ring", 1, 4, MB, FLAT, collective="reduce_scatter") == pytest.approx(want_rs)
    want_ag = 2e-6 + 3 * 1e-6 + 6 * MB / 1e9 + MB / 1e9  # and the own block copied into place
    assert predict.predict("ring", 1, 4, MB, FLAT, collective="all_gather") == pytest.approx(want_ag)
    # hier reduce_scatter on 2 x 2: pack (4 MB) and the own block out (1 MB), an intra-host ring
    # step of 2 MB, then one ring step of 1 MB between hosts (sent and reduced at once)
    local = 5 * MB / 1e9 + 2 * MB / 1e9 + 2 * MB / 0.5e9
    want = 2e-6 + 1e-6 + 2 * 10e-6 + local + MB / 0.1e9
    assert predict.predict("hier", 2, 2, MB, FLAT, collective="reduce_scatter") == pytest.approx(want)
    assert predict.busbw(4 * MB, 1e-3, 4, "all_gather") == pytest.approx(4 * MB / 1e-3 * 3 / 4)


def test_a_shared_host_link_divides_among_the_ranks_that_cross_it():
    one_nic = Machine(**{**FLAT.__dict__, "nics": 1})
    # hier on 2 x 4 drives 4 streams per host: each gets a quarter of the link; ring drives one
    assert predict.counts("hier", 2, 4, MB, one_nic).streams == 4
    assert predict.counts("ring", 2, 4, MB, one_nic).streams == 1
    assert predict.rates(one_nic, MB, 4, streams=4).link == pytest.approx(4 / 0.1e9)
    assert predict.predict("ring", 2, 4, MB, one_nic) == pytest.approx(predict.predict("ring", 2, 4, MB, FLAT))
    assert predict.predict("hier", 2, 4, MB, one_nic) > predict.predict("hier", 2, 4, MB, FLAT)


def test_tree_hops_by_hand():
    assert predict.tree_hops(2, 5) == 10  # a chain of two: up and down, a hop a segment each
    assert predict.tree_hops(3, 5) == 15  # a root with two leaves: two reductions and a broadcast a segment
    assert predict.tree_hops(8, 1) == 3 + 3 * 3 - 4
    assert predict.tree_hops(9, 1) == 3 + 3 * 3 - 4 + 1


SHAPES = [(1, 4), (2, 1), (4, 1), (2, 2), (2, 4), (4, 4), (3, 2), (8, 2), (2, 8), (5, 3)]
CASES = [(c, a) for c, algos in predict.COLLECTIVES.items() for a in algos]


@pytest.mark.parametrize("hosts,local", SHAPES)
@pytest.mark.parametrize("coll,algo", CASES)
@pytest.mark.parametrize("nbytes", [4096, 1 << 20, 3 << 22, 15 << 16])
def test_counts_match_the_cpp_schedule_counts(hosts, local, coll, algo, nbytes):
    """The closed forms against the C++ model's counts of the built schedules (busiest rank,
    total critical-path hops, and what the host link carries one way; the C++ count weighs both
    links alike, so the figures here do too)."""
    P = hosts * local
    segment = predict.TREE_SEGMENT if algo in ("tree", "hier_tree") else 0
    want = _core.schedule_counts(
        _core.COLLECTIVES.index(coll), _core.ALGOS.index(algo), P, nbytes, 0, segment, [r // local for r in range(P)]
    )
    got = predict.counts(algo, hosts, local, nbytes, Machine(tcp_Bps=1e12), collective=coll)
    # less the executor's handshake (none for the rings), which the C++ adds when pricing
    assert got.hops - want["handshakes"] == want["hops"]
    for kind in ("sent", "received", "reduced", "copied"):
        assert getattr(got, kind) == pytest.approx(want[kind], abs=P), kind  # blocks round to whole bytes
    if nbytes % P == 0:  # uneven blocks make ranks that tie here differ by a byte, and another is the busiest
        for kind in ("remote_sent", "remote_received", "remote_reduced"):
            assert getattr(got, kind) == pytest.approx(want[kind], abs=P), kind
        assert got.link == pytest.approx(want["remote_link"], abs=P)


@pytest.mark.parametrize("algo", predict.ALGOS)
def test_time_grows_with_size_and_busbw_with_size(algo):
    sizes = [1 << k for k in range(10, 30, 2)]
    times = [predict.predict(algo, 4, 8, n) for n in sizes]
    assert times == sorted(times) and len(set(times)) == len(times)
    bw = [predict.busbw(n, t, 32) for n, t in zip(sizes, times)]
    assert bw[-1] > bw[0]


def test_more_hosts_never_make_a_call_faster():
    for algo in predict.ALGOS:
        times = [predict.predict(algo, h, 8, 64 << 20) for h in (1, 2, 4, 8, 16, 64, 512)]
        assert times == sorted(times), (algo, times)


def test_hierarchical_beats_flat_ring_at_scale_where_hops_dominate():
    # the flat ring pays 2(P-1) slow hops; the hierarchical one 2(G-1) and 2(L-1) fast ones
    m = Machine(tcp_Bps=12.5e9, tcp_hop_s=5e-6)
    ring, hier = predict.predict("ring", 512, 8, 1 << 20, m), predict.predict("hier", 512, 8, 1 << 20, m)
    assert hier < ring / 4
    assert ring == pytest.approx(predict.counts("ring", 512, 8, 1 << 20, m).hops * 5e-6, rel=0.1)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="unknown algorithm"):
        predict.predict("nccl", 2, 2, MB)
    with pytest.raises(ValueError, match="at least 1"):
        predict.counts("ring", 0, 2, MB)
    with pytest.raises(ValueError, match="do not fill"):
        predict.sweep(Machine(), 8, [12], MB)
    with pytest.raises(ValueError, match="unknown algorithm 'tree' for reduce_scatter"):
        predict.predict("tree", 2, 2, MB, collective="reduce_scatter")
    with pytest.raises(ValueError, match="unknown collective"):
        predict.predict("ring", 2, 2, MB, collective="all_to_all")


def test_cli_prints_a_table_json_and_a_plot(tmp_path):
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "ringtree.predict", *a],  # noqa: E731
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run("--inter-GBps", "25", "--inter-hop-us", "5", "--ranks", "8,64,4096", "--size", "16M")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if not line.startswith("#")]
    assert lines[0].split()[:3] == ["ranks", "hosts", "x"] and [line.split()[0] for line in lines[1:]] == [
        "8",
        "64",
        "4096",
    ]
    got = json.loads(run("--json", "--ranks", "16", "--local", "4", "--size", "1M", "--inter-GBps", "1").stdout)
    assert got["rows"][0]["hosts"] == 4
    assert got["rows"][0]["ring"]["seconds"] == pytest.approx(
        predict.predict("ring", 4, 4, 1 << 20, Machine(tcp_Bps=1e9))
    )
    plot = tmp_path / "busbw.png"
    if run("--plot", str(plot), "--ranks", "8,16").returncode == 0:
        assert plot.stat().st_size > 1000
    bad = run("--ranks", "12", "--local", "8")
    assert bad.returncode == 2 and "multiple of --local" in bad.stderr
    both = json.loads(
        run(
            "--json", "--ranks", "16", "--local", "4", "--size", "1M", "--collective", "reduce_scatter,all_gather"
        ).stdout
    )["collectives"]
    assert set(both["all_gather"][0]) == {"ranks", "hosts", "local", "ring", "hier"}
    assert both["all_gather"][0]["hier"]["seconds"] == pytest.approx(  # 1 MiB over 16 ranks: blocks of 64 KiB
        predict.predict("hier", 4, 4, 1 << 16, Machine(), collective="all_gather")
    )
    assert run("--collective", "gather").returncode == 2


def test_ranks_sharing_cores_take_the_hosts_work_over_its_cores():
    # 1 host x 4 ranks on 2 cores, 1 MB: the ring's busiest rank and the host's work over the
    # cores agree (every rank does the same): 2 x (1.5 + 0.75) MB of copies and 2 x 0.75 MB of
    # reductions at a core's pace. A handoff waits for the peer's turn: 2 x share x switch.
    two = Machine(**{**FLAT.__dict__, "cores": 2, "switch_s": 5e-6})
    data = 2 * (2.25 * MB / 1e9 + 0.75 * MB / 0.5e9)
    want = 2 * 2e-6 + 6 * 2 * 2 * 5e-6 + data  # 6 hops, no handshake
    assert predict.predict("ring", 1, 4, MB, two) == pytest.approx(want)
    k = predict.counts("tree", 1, 4, MB, two)
    assert (k.host_net, k.host_reduced) == pytest.approx((9 * MB, 3 * MB), abs=8)
