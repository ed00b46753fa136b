"""The one-GPU check's plumbing (bench/gpu_check.sh), without a GPU: its stages fit the budget on
paper, and its stand-in mode runs stages over the CUDA stand-in through the same runner (time
limits, per-test verdicts, the summary), skipping what needs a GPU and saying so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

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
    "bench_ipc",
    "torch",
    "nccl",
    "sanitize",
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
    with open(os.path.join(ROOT, "tests", "gpu", "test_standin_devices.py")) as f:
        assert set(verdicts) == set(re.findall(r"^def (test_\w+)", f.read(), re.M)), summary
    assert "ipc_p2" not in summary  # --only: the other stages are not run, nor listed
    assert (tmp_path / "env.log").exists() and (tmp_path / "dumps").is_dir()


def test_stages_past_the_budget_are_skipped_and_fail_the_check(tmp_path):
    out = check("--standin", "--only", "env,cross_gpu", env={"OUT": str(tmp_path), "CHECK_BUDGET": "3"})
    assert out.returncode == 1, out.stdout
    summary = (tmp_path / "summary.txt").read_text()
    assert re.search(r"^  env\s+SKIPPED \(the 3 s budget is used up\)", summary, re.M), summary


# The cases of a stage the script's own tests add (GPU_CHECK_SELFTEST): one passes, one is marked
# for 300 s but must be cut at the check's per-test limit, one skips, and one hangs where the
# per-test limit cannot reach it (SIGALRM blocked, as in a call stuck in C), so only the stage's
# limit ends it; the last never starts.
SELFTEST = """
import signal
import time

import pytest


def test_quick():
    assert 2 + 2 == 4


@pytest.mark.timeout(300)
def test_marked_long():
    time.sleep(30)


def test_skipped():
    pytest.skip("a reason of its own")


def test_hangs_past_the_stage():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(60)


def test_never_started():
    pass
"""


@pytest.mark.timeout(90)
def test_a_stage_killed_by_its_limit_still_reports_every_test(tmp_path):
    cases = tmp_path / "selftest_cases.py"
    cases.write_text(SELFTEST)
    out_dir = tmp_path / "out"
    env = {"OUT": str(out_dir), "GPU_CHECK_SELFTEST": f"{cases}:14", "PER_TEST": "2"}
    start = time.monotonic()
    out = check("--standin", "--only", "build", env=env, timeout=80)
    took = time.monotonic() - start
    summary = (out_dir / "summary.txt").read_text()
    assert out.returncode == 1, out.stdout[-3000:]
    assert re.search(r"^  build\s+ok", summary, re.M), summary
    cut = r"^  selftest\s+TIMED OUT after \d+ s \(limit 14 s; 1 test\(s\) unfinished\)"
    assert re.search(cut, summary, re.M), summary
    verdicts = {name: verdict for verdict, name in re.findall(r"^  \[selftest\] (\w+) \S+::(\w+)", summary, re.M)}
    assert verdicts == {
        "test_quick": "PASSED",
        "test_marked_long": "FAILED",  # at 2 s, not its marker's 300 s nor its own 30 s
        "test_skipped": "SKIPPED",
        "test_hangs_past_the_stage": "TIMEOUT",
    }, summary
    assert "a reason of its own" in summary and "Timeout" in summary, summary
    assert took < 14 + 5 + 30, took  # the stage was ended at its limit (plus the kill's grace)


def test_the_env_stage_fails_saying_what_the_check_lacks(tmp_path):
    # An interpreter without pytest, pytest-timeout or pip (so nothing can be installed either).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=60)
    bare = str(tmp_path / "bare" / "bin" / "python")
    out = check("--standin", "--only", "env", env={"OUT": str(tmp_path / "out"), "PYTHON": bare}, timeout=60)
    assert out.returncode == 1, out.stdout
    summary = (tmp_path / "out" / "summary.txt").read_text()
    line = re.search(r"^  env\s+FAILED rc=1 .*$", summary, re.M)
    assert line and "MISSING: pytest pytest_timeout" in line.group(0), summary
    assert f"run '{bare} -m pip install pytest pytest-timeout'" in line.group(0), summary
