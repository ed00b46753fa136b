"""bench/perf_page.py: the summary keeps what the performance page needs of a sweep, the page's
ratios are the best peer's median over ringtree's, and the committed page is what the committed
summary renders to (so nobody edits it by hand)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import perf_page  # noqa: E402

SUMMARY = os.path.join(ROOT, "bench", "results", "summary.json")


def stats(median_us, lo=None, hi=None):
    m = median_us * 1e-6
    return {"launches": 3, "min": (lo or median_us) * 1e-6, "median": m, "max": (hi or median_us) * 1e-6}


def sweep(thp="madvise"):
    """A two-size, two-collective sweep at P=2 and P=4 with made-up times (microseconds)."""
    times = {  # (P, collective, size): {lib: median}
        (2, "all_reduce", 8): {"ringtree": 1.0, "mpich": 4.0, "openmpi": 2.0, "gloo": 30.0},
        (2, "all_reduce", 1 << 20): {"ringtree": 200.0, "mpich": 300.0, "openmpi": 500.0, "impi": 250.0, "gloo": 900.0},
        (2, "broadcast", 8): {"ringtree": 2.0, "mpich": 5.0, "openmpi": 1.0},  # gloo absent at this cell
        (2, "broadcast", 1 << 20): {"ringtree": 100.0, "mpich": 80.0, "openmpi": 120.0, "gloo": 400.0},
        (4, "all_reduce", 8): {"ringtree": 3.0, "mpich": 6.0, "openmpi": 9.0, "gloo": 40.0},
        (4, "all_reduce", 1 << 20): {
            "ringtree": 400.0,
            "mpich": 1200.0,
            "openmpi": 800.0,
            "impi": 900.0,
            "gloo": 2000.0,
        },
    }
    summary = {}
    for (p, coll, size), libs in times.items():
        summary.setdefault(f"P{p}", {}).setdefault(coll, {})[str(size)] = {lib: stats(t) for lib, t in libs.items()}
    launches = [
        {"lib": lib, "ok": True, "description": f"{lib} 1.0"}
        for lib in ("ringtree", "mpich", "openmpi", "impi", "gloo")
    ]
    return {
        "options": {"sweep": True, "launches": 3, "collectives": ["all_reduce", "broadcast"]},
        "context": {
            "thp": {"enabled": thp},
            "background_load": "none",
            "commit": "abc1234",
            "machine": {"cpu": "Test CPU", "cpus": 2, "memory_gib": 24, "numa_nodes": 1, "kernel": "6.1"},
            "date": "2026-12-01",
            "command": "python bench/launch_spread.py --sweep",
        },
        "interrupted": None,
        "absent": {},
        "summary": summary,
        "launches": launches,
    }


def test_ratios_tables_and_overview_follow_the_best_peer(tmp_path):
    paths = []
    for thp in ("madvise", "never"):
        path = tmp_path / f"{thp}.json"
        path.write_text(json.dumps(sweep(thp)))
        paths.append(f"THP {thp}={path}")
    doc = perf_page.summarize(paths)
    run = doc["runs"][0]
    assert run["collectives"] == ["all_reduce", "broadcast"] and run["commit"] == "abc1234"
    assert run["cells"]["P2"]["all_reduce"][0] == [
        8,
        {"ringtree": [1.0, 1.0, 1.0], "mpich": [4.0, 4.0, 4.0], "openmpi": [2.0, 2.0, 2.0], "gloo": [30.0, 30.0, 30.0]},
    ]
    page = perf_page.render_page(doc, ["ratio-P2.png", "ratio-P4.png"])
    lines = page.splitlines()
    # P=2 all_reduce 8 B: best peer Open MPI at 2.0 us over ringtree's 1.0 -> 2.00, bold; 1 MiB: Intel MPI
    # 250 / 200 (a peer only some cells have still counts where it runs).
    row_8 = next(line for line in lines[lines.index("## all_reduce") :] if line.startswith("| 8 B |"))
    # busbw (GB/s) = size / time x factor, all_reduce's 2(P-1)/P: 8 B / 1 us x 1 = 0.008;
    # 8 B / 3 us x 1.5 = 0.004; 1 MiB / 200 us x 1 = 5.24; 1 MiB / 400 us x 1.5 = 3.93.
    assert row_8 == "| 8 B | 1.00 | 0.008 | 2.00 (Open MPI) | **2.00** | 3.00 | 0.004 | 6.00 (MPICH) | **2.00** |"
    row_1m = next(line for line in lines[lines.index("## all_reduce") :] if line.startswith("| 1 MiB |"))
    assert row_1m == "| 1 MiB | 200 | 5.24 | 250 (Intel MPI) | **1.25** | 400 | 3.93 | 800 (Open MPI) | **2.00** |"
    # broadcast has no P=4 cells; at 1 MiB MPICH is faster: 80 / 100 = 0.80, not bold.
    row_b = next(line for line in lines[lines.index("## broadcast") :] if line.startswith("| 1 MiB |"))
    assert row_b == "| 1 MiB | 100 | 10.5 | 80.0 (MPICH) | 0.80 |"  # broadcast's factor is 1
    # Overview: broadcast at P=2, small sizes 1.0/2.0 = 0.50 (0 of 1 at or above 1), large 0.80.
    assert "| 2 | broadcast | 0.50-0.50 (0/1) | 0.80-0.80 (0/1) | 0.50-0.50 (0/1) | 0.80-0.80 (0/1) |" in lines
    assert "- Machine: Test CPU, 2 logical CPUs, 24 GiB, 1 NUMA node(s), Linux 6.1." in lines
    peers = next(line for line in lines if line.startswith("- Peers: "))
    assert all(f"{name}: " in peers for name in ("MPICH", "Open MPI", "Intel MPI", "Gloo")), peers
    assert any(line.startswith("- Ranks: 2 and 4 on this one machine's 2 logical CPUs; at P=4 ") for line in lines)
    assert "![ringtree over the best peer, P4](_static/performance/ratio-P4.png)" in lines


def test_the_page_counts_each_librarys_cells_with_a_wide_launch_spread(tmp_path):
    run = sweep()
    cells = run["summary"]["P2"]["all_reduce"]
    cells["8"]["ringtree"] = stats(1.0, lo=0.5, hi=0.75)  # 1.5x: counted
    cells["8"]["mpich"] = stats(4.0, lo=3.0, hi=4.4)  # 1.47x: not
    cells[str(1 << 20)]["ringtree"] = stats(200.0, lo=100.0, hi=400.0)
    path = tmp_path / "madvise.json"
    path.write_text(json.dumps(run))
    summary = perf_page.summarize([f"THP madvise={path}"])["runs"][0]
    counts = perf_page.spread_counts(summary)
    # ringtree has a cell at each of the six (P, collective, size) steps; MPICH and Open MPI too.
    assert counts["ringtree"] == [2, 6] and counts["mpich"] == [0, 6] and counts["openmpi"] == [0, 6]
    text = " ".join(perf_page.spread_lines([summary]))
    assert "THP madvise: ringtree 2 of 6, MPICH 0 of 6, Open MPI 0 of 6, Intel MPI 0 of 2, Gloo 0 of 5" in text


def test_a_run_kept_from_an_earlier_summary_keeps_its_commit_on_the_page(tmp_path):
    old, new = sweep("never"), sweep("madvise")
    new["context"]["commit"], new["context"]["date"] = "def5678", "2026-12-06"
    new["options"].update(iters=10, batches=5, warmup=5, batch_bytes=16 << 20, max_iters=400, batch_seconds=0.02)
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    earlier = perf_page.summarize([f"THP never={tmp_path / 'old.json'}"])
    doc = perf_page.summarize([f"THP madvise={tmp_path / 'new.json'}"], ["THP never"], earlier)
    assert [r["label"] for r in doc["runs"]] == ["THP madvise", "THP never"]
    assert doc["runs"][1] == earlier["runs"][0]  # unchanged, its cells and commit included
    lines = perf_page.render_page(doc, []).splitlines()
    assert "- ringtree at commit `def5678`, measured 2026-12-06." in lines
    runs = next(line for line in lines if line.startswith("- Runs: "))
    assert "THP never (3 launches per library, transparent huge pages `never`, background load: none; " in runs
    assert "ringtree at commit `abc1234`, measured 2026-12-01)" in runs
    # the new run says how it timed a launch; the old one, summarized before it was recorded, does not
    assert (
        "THP madvise (3 launches per library, each timing 5 batches of max(10, min(400, 16 MiB / size, "
        "20 ms / warm-up call)) calls after 5 warm-up calls, transparent huge pages `madvise`, background load: "
        "none);" in runs
    )
    with pytest.raises(ValueError, match="no run labelled 'THP always'"):
        perf_page.summarize([f"THP madvise={tmp_path / 'new.json'}"], ["THP always"], earlier)
    with pytest.raises(ValueError, match="needs an earlier summary"):
        perf_page.summarize([f"THP madvise={tmp_path / 'new.json'}"], ["THP never"], None)


def test_plots_are_drawn_per_rank_count(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(sweep()))
    summary = tmp_path / "summary.json"
    assert perf_page.main(["summarize", f"THP madvise={path}", "-o", str(summary)]) == 0
    page, plots = tmp_path / "performance.md", tmp_path / "plots"
    assert perf_page.main(["render", str(summary), "--page", str(page), "--plots", str(plots)]) == 0
    for name in ("ratio-P2.png", "ratio-P4.png"):
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"(_static/performance/{name})" in page.read_text()


def test_an_interrupted_or_non_sweep_result_is_refused(tmp_path):
    bad = sweep()
    bad["interrupted"] = "interrupted (KeyboardInterrupt)"
    (tmp_path / "a.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="interrupted"):
        perf_page.summarize([f"x={tmp_path / 'a.json'}"])
    bad = sweep()
    bad["options"]["sweep"] = False
    (tmp_path / "b.json").write_text(json.dumps(bad))
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "perf_page.py"),
            "summarize",
            f"x={tmp_path / 'b.json'}",
            "-o",
            str(tmp_path / "out.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "not a launch_spread.py --sweep result" in done.stderr


def test_the_committed_page_is_what_the_committed_summary_renders_to():
    with open(SUMMARY) as f:
        summary = json.load(f)
    names = [f"ratio-{p}.png" for p in perf_page.ranks_of(summary["runs"][0])]
    with open(perf_page.PAGE) as f:
        committed = f.read()
    assert committed == perf_page.render_page(summary, names), (
        "docs/performance.md differs from what bench/results/summary.json renders to: "
        "run python bench/perf_page.py render bench/results/summary.json"
    )
    for name in names:
        assert os.path.isfile(os.path.join(perf_page.PLOTS, name)), name


def test_the_page_shows_a_command_a_reader_can_retype():
    here = (
        "python bench/launch_spread.py --sweep --openmpi-venv /srv/me/ompi-5 --impi-venv /srv/me/impi "
        "--thp never -J /srv/me/out/s.json"
    )
    assert perf_page.portable_command(here) == (
        "python bench/launch_spread.py --sweep --openmpi-venv /tmp/ompi --impi-venv /tmp/impi --thp never -J sweep.json"
    )
    assert perf_page.portable_command(None) is None
