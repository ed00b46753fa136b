"""bench/group_cost.py end to end at P=2: every figure printed, every result right."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(150)
def test_group_cost_prints_each_figure_against_the_plain_call():
    script = os.path.join(ROOT, "bench", "group_cost.py")
    cmd = [sys.executable, "-m", "ringtree.launch", "-n", "2", "--no-label", "--timeout", "120", script]
    proc = subprocess.run(
        cmd + ["--calls", "8", "--rounds", "3", "--reps", "2"], cwd=ROOT, capture_output=True, text=True, timeout=140
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.split(":")[0].strip(): line for line in proc.stdout.splitlines() if line.endswith("x")}
    assert {"plain call", "group of 8", "coalesced list of 8", "persistent group of 8"} <= set(rows), proc.stdout
    assert rows["plain call"].endswith("1.00x")
    assert "# wrong elements: 0" in proc.stdout
