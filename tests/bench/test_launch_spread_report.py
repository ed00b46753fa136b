"""launch_spread_report.py: the side-by-side tables and the plot made from --sweep results."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORT = os.path.join(ROOT, "bench", "launch_spread_report.py")


def sweep_json(path, ratios_by_cell):
    """A file shaped like launch_spread.py -J: {"ratios": {"P2": {coll: [row, ...]}}}."""
    ratios = {}
    for (nranks, collective, size), (ringtree_s, peer_s) in ratios_by_cell.items():
        ratios.setdefault(f"P{nranks}", {}).setdefault(collective, []).append({
            "size": size, "median_s": {"ringtree": ringtree_s, "mpich": peer_s},
            "best_peer": "mpich", "ratio": peer_s / ringtree_s})
    path.write_text(json.dumps({"ratios": ratios}))
    return str(path)


def run(*args):
    return subprocess.run([sys.executable, REPORT, *args], capture_output=True, text=True, timeout=120)


def test_tables_put_each_run_in_its_own_column(tmp_path):
    a = sweep_json(tmp_path / "a.json", {(2, "all_reduce", 8): (2e-6, 1e-6), (2, "all_reduce", 1024): (1e-6, 3e-6)})
    b = sweep_json(tmp_path / "b.json", {(2, "all_reduce", 8): (1e-6, 1.5e-6), (4, "broadcast", 8): (4e-6, 1e-6)})
    out = run(f"quiet={a}", f"load2={b}", "--markdown")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = lines.index("| size | quiet | load2 |")
    assert lines[header + 2] == "| 8 B | **0.50** (2.0) | 1.50 (1.0) |"
    assert lines[header + 3] == "| 1 KiB | 3.00 (1.0) | n/a |"
    assert "| 8 B | n/a | **0.25** (4.0) |" in lines
    plain = run(f"quiet={a}").stdout
    assert "<0.50" in plain and "3.00" in plain


def test_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    a = sweep_json(tmp_path / "a.json", {(2, c, s): (1e-6, 1e-6 * (1 + i)) for i, (c, s) in enumerate(
        [("all_reduce", 8), ("all_reduce", 64), ("all_to_all", 8), ("broadcast", 1 << 20)])})
    png = tmp_path / "ratios.png"
    out = run(f"madvise={a}", "--plot", str(png))
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_without_a_label_is_refused(tmp_path):
    a = sweep_json(tmp_path / "a.json", {(2, "all_reduce", 8): (1e-6, 1e-6)})
    out = run(a)
    assert out.returncode != 0 and "expected LABEL=FILE" in out.stderr
