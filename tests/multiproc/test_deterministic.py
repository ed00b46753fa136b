"""Deterministic mode between real processes: float32, bfloat16, float8 and complex sums of random data give the
same bits whatever algorithm is requested (ring, tree, oneshot, hier, hier_tree, rank_order,
auto) and however the ranks are spread over emulated hosts (one host, two contiguous hosts,
ranks dealt to two hosts in turn), and those bits are numpy's left fold in rank order in the
same dtype. Without the mode, the same calls differ from that fold, so the comparison can fail.
A rank that alone turns the mode on makes every rank raise CollectiveMismatch.

The rank bodies run in every rank of a test's world (harness.py) and return JSON reports."""

from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest
from harness import run_world
from rank_checks import outcome
from reference import rank_order_fold, spread_input

import ringtree as rt

ALGOS = {
    "all_reduce": ["auto", "ring", "tree", "oneshot", "hier", "hier_tree", "rank_order"],
    "reduce_scatter": ["auto", "ring", "oneshot", "hier", "rank_order"],
    "reduce": ["auto", "ring", "tree", "oneshot", "hier", "hier_tree", "rank_order"],
}
SIZES = [999, 70001]  # 70001 float32: three pipeline segments of the chain
ROOT = 1


def run_one(comm, coll, x, N, algo, deterministic):
    r = comm.rank
    if coll == "all_reduce":
        return comm.all_reduce(x.copy(), algo=algo, deterministic=deterministic)
    if coll == "reduce_scatter":
        return comm.reduce_scatter(x, np.empty(N, x.dtype), algo=algo, deterministic=deterministic)
    out = np.empty_like(x) if r == ROOT else None
    comm.reduce(x, out, root=ROOT, algo=algo, deterministic=deterministic)
    return out


def results(seed, dtypes=("float32", "bfloat16"), sizes=SIZES):
    """Every collective x dtype x size x algorithm in deterministic mode: a digest of the result
    and whether it equals numpy's rank-order fold; then ring and tree without the mode."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    one_host = comm.status().machine["hosts"].startswith("1 host")
    digests, wrong, ran, differs = {}, [], set(), []
    for coll, algos in ALGOS.items():
        for dtype_name in dtypes:
            for n in sizes:
                N = n if coll != "reduce_scatter" else n // P
                total = N * P if coll == "reduce_scatter" else N
                inputs = [spread_input(seed, q, total, dtype_name) for q in range(P)]
                want = rank_order_fold(inputs, dtype_name)
                if coll == "reduce_scatter":
                    want = want[r * N : (r + 1) * N]
                for algo in algos:
                    if algo == "oneshot" and (not one_host or total * want.itemsize > 65536):
                        continue  # oneshot: one host, small calls (else InvalidArgument, as without the mode)
                    got = run_one(comm, coll, inputs[r], N, algo, deterministic=True)
                    ran.add(comm.choose_algo(coll, total * want.itemsize, algo, dtype_name, deterministic=True))
                    if got is None:
                        continue
                    key = f"{coll}/{dtype_name}/{n}"
                    digests.setdefault(key, set()).add(hashlib.sha256(got.tobytes()).hexdigest())
                    if got.tobytes() != want.tobytes():
                        wrong.append(f"{key}/{algo}: {int(np.sum(got != want))} of {N} differ from the rank-order fold")
                for algo in ("ring", "tree") if coll != "reduce_scatter" else ("ring",):
                    got = run_one(comm, coll, inputs[r], N, algo, deterministic=False)
                    if got is not None and got.tobytes() != want.tobytes():
                        differs.append(f"{coll}/{dtype_name}/{n}/{algo}")
    integer = comm.choose_algo("all_reduce", 4096, "ring", "int32", deterministic=True)
    comm.close()
    return {
        "digests": {k: sorted(v) for k, v in digests.items()},
        "wrong": wrong,
        "ran": sorted(ran),
        "differs": differs,
        "integer": integer,
    }


def interleaved(labels):
    return lambda r: {"RINGTREE_HOSTNAME": f"emulated-host-{labels[r]}"}


LAYOUTS = [
    ("one host", dict(hosts=1)),
    ("two hosts", dict(hosts=2)),
    ("two hosts interleaved", dict(per_rank_env=interleaved([0, 1] * 3))),
]


@pytest.mark.timeout(240)
def test_deterministic_sums_are_the_rank_order_fold_on_every_algorithm_and_layout():
    seen = {}  # (P, key) -> digests over layouts
    for P in (3, 4, 5):
        for name, layout in LAYOUTS:
            world = run_world(P, results, dict(seed=P), timeout=120, **layout)
            reports = world.check_ok()
            for rank, res in enumerate(reports):
                assert not res["wrong"], (P, name, rank, res["wrong"])
                assert set(res["ran"]) <= {"rank_order", "oneshot"}, (P, name, res["ran"])
                assert res["integer"] == "ring"  # integer sums are exact in any order: no change
                for key, digests in res["digests"].items():
                    assert len(digests) == 1, (P, name, rank, key, "algorithms disagree")
                    seen.setdefault((P, key, rank if "scatter" in key else None), set()).update(digests)
            # The check can fail: without the mode, ring or tree sums differ from the fold.
            assert any(res["differs"] for res in reports), (P, name)
    for where, digests in seen.items():
        assert len(digests) == 1, (where, "layouts disagree")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name,layout", LAYOUTS[:2], ids=[name for name, _ in LAYOUTS[:2]])
def test_deterministic_float8_and_complex_sums_are_the_rank_order_fold(name, layout):
    """The same promise for the float8 types (every step rounded to float8, as the fold) and complex
    (part by part), at P = 4."""
    dtypes = ("float8_e4m3fn", "float8_e5m2", "complex64", "complex128")
    reports = run_world(4, results, dict(seed=11, dtypes=dtypes, sizes=[999]), timeout=200, **layout).check_ok()
    for rank, res in enumerate(reports):
        assert not res["wrong"], (name, rank, res["wrong"])
        assert set(res["ran"]) <= {"rank_order", "oneshot"}, (name, res["ran"])
        for key, digests in res["digests"].items():
            assert len(digests) == 1, (name, rank, key, "algorithms disagree")
    differs = {d.split("/")[1] for res in reports for d in res["differs"]}
    assert {"float8_e4m3fn", "float8_e5m2", "complex64"} <= differs, differs  # the check can fail


def mismatched():
    comm = rt.init()
    out = outcome(comm.all_reduce(np.ones(100, np.float32), async_op=True), time.monotonic())
    comm.close()
    return out


@pytest.mark.timeout(60)
def test_a_rank_alone_in_deterministic_mode_is_a_mismatch():
    world = run_world(
        3, mismatched, timeout=50, per_rank_env=lambda r: {"RINGTREE_DETERMINISTIC": "1" if r == 1 else "0"}
    )
    for rank, res in enumerate(world.check_ok()):
        assert res["raised"] == "CollectiveMismatch", (rank, res)
    assert any("deterministic" in res["message"] for res in world.check_ok())
