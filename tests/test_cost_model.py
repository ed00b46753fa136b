"""The cost model behind algo="auto": every rank must choose alike (rank 0's machine figures),
explain() must show what choose_algo() does, and the figures are cached per host."""
import math

import pytest

from harness import run_world


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 4])
def test_every_rank_chooses_alike_and_explain_matches(nranks, tmp_path):
    world = run_world(nranks, "choices_and_estimates", module="cost_workers", timeout=100,
                      env={"RINGTREE_CACHE_DIR": str(tmp_path)})
    results = world.check_ok()
    first = results[0]
    for res in results[1:]:
        assert res["choices"] == first["choices"]
        assert res["costs"] == first["costs"]
    for key, candidates in first["estimates"].items():
        coll, nbytes, dtype = key.split("/")
        algos = [a for a, _ in candidates]
        assert first["choices"][key] in algos, key
        best = min(t for _, t in candidates)
        chosen_t = dict(candidates)[first["choices"][key]]
        assert chosen_t <= best * 1.0101, (key, candidates)  # auto takes the cheapest (ties within 1%)
        assert all(t > 0 and math.isfinite(t) for _, t in candidates), key
    # The board takes small calls on one host, and never calls beyond its capacity.
    assert "oneshot" in [a for a, _ in first["estimates"]["all_reduce/8/float32"]]
    assert "oneshot" not in [a for a, _ in first["estimates"][f"all_reduce/{1 << 24}/float32"]]
    # Larger calls of one algorithm never get cheaper.
    for coll in ("all_reduce", "all_gather", "broadcast"):
        ring = "direct" if coll == "all_to_all" else ("tree" if coll == "broadcast" else "ring")
        times = [dict(first["estimates"][f"{coll}/{n}/float32"])[ring] for n in (8, 4096, 65536, 1 << 20, 1 << 24)]
        assert times == sorted(times), (coll, times)
    text = first["explain"]
    chosen = first["choices"]["all_reduce/4096/float32"]
    assert f"auto chooses {chosen}" in text
    assert f"* {chosen}" in text
    for algo, _ in first["estimates"]["all_reduce/4096/float32"]:
        assert algo in text
    assert first["costs"]["source"] == "measured"
    assert list(tmp_path.glob("machine-v*.txt")), "rank 0 caches its measurement"
    # The next communicator on this host reads the cache instead of measuring again.
    again = run_world(2, "choices_and_estimates", module="cost_workers", timeout=100,
                      env={"RINGTREE_CACHE_DIR": str(tmp_path)}).check_ok()
    assert again[0]["costs"]["source"] == "cached"
    assert again[0]["costs"]["hop_us"] == pytest.approx(first["costs"]["hop_us"], rel=1e-4)


@pytest.mark.timeout(120)
def test_default_figures_without_measuring():
    res = run_world(2, "choices_and_estimates", module="cost_workers", timeout=100,
                    env={"RINGTREE_COST_MODEL": "defaults"}).check_ok()
    assert all(r["costs"]["source"] == "defaults" for r in res)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 3])
def test_one_shot_board_capacity_boundary(nranks):
    limit = 1024
    res = run_world(nranks, "board_boundary", dict(limit_bytes=limit), module="cost_workers", timeout=100,
                    env={"RINGTREE_ONESHOT_BYTES": str(limit)}).check_ok()
    fits = limit // 4
    for r in res:
        assert r[f"ok_{fits}"] and r[f"ok_{fits + 1}"], r
        assert r[f"algo_{fits + 1}"] != "oneshot", r
        assert r["explicit_fits"], r
        assert "RINGTREE_ONESHOT_BYTES" in r["oversize"] and str(limit) in r["oversize"], r["oversize"]
        assert r["after"] == nranks
