"""The one-GPU check's plumbing (bench/gpu_check.sh), without a GPU: its stages fit the budget on
paper, and its stand-in mode runs stages over the CUDA stand-in through the same runner (time
limits, per-test verdicts, the summary), skipping what needs a GPU and saying so."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "gpu_check.sh")
ORDER = [
    "env",
    "build",
    "ipc_p2",
    "ipc_p4",
    "semantics",
    "staged",
    "torch",
    "nccl",
    "sanitize",
    "bench_ipc",
    "thread_ranks",
    "cross_gpu",
]


def check(*args, env=None, timeout=120):
    return subprocess.run(
        ["bash", SCRIPT, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
    )


def test_the_plan_fits_in_eight_minutes():
    out = check("--plan")
    assert out.returncode == 0, out.stdout + out.stderr
    rows = re.findall(r"^(\w+)\s+(\d+) s", out.stdout, re.M)
    limits = {name: int(limit) for name, limit in rows if name != "total"}
    assert list(limits) == ORDER, limits  # in order of value
    assert sum(limits.values()) == int(dict(rows)["total"]) <= 450 < 480, out.stdout


def test_a_plan_over_budget_is_refused():
    assert check("--plan", env={"CHECK_BUDGET": "300"}).returncode != 0


@pytest.mark.timeout(150)
def test_the_stand_in_mode_runs_stages_and_reports_every_verdict(tmp_path):
    out = check("--standin", "--only", "env,torch,cross_gpu", env={"OUT": str(tmp_path)}, timeout=140)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    summary = (tmp_path / "summary.txt").read_text()
    assert re.search(r"^  env\s+ok", summary, re.M), summary
    assert re.search(r"^  torch\s+skipped: needs torch with CUDA", summary, re.M), summary
    assert re.search(r"^  cross_gpu\s+ok", summary, re.M), summary
    verdicts = re.findall(r"^  \[cross_gpu\] PASSED .*test_standin_devices\.py::(\w+)", summary, re.M)
    assert len(verdicts) == 2, summary
    assert "ipc_p2" not in summary  # --only: the other stages are not run, nor listed
    assert (tmp_path / "env.log").exists() and (tmp_path / "dumps").is_dir()


def test_stages_past_the_budget_are_skipped_and_fail_the_check(tmp_path):
    out = check("--standin", "--only", "env,cross_gpu", env={"OUT": str(tmp_path), "CHECK_BUDGET": "3"})
    assert out.returncode == 1, out.stdout
    summary = (tmp_path / "summary.txt").read_text()
    assert re.search(r"^  env\s+SKIPPED \(the 3 s budget is used up\)", summary, re.M), summary
