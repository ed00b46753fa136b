"""A pytest plugin of the one-GPU check (bench/gpu_check.sh loads it with -p gpu_check_pytest).

Two things the check needs that pytest alone does not give:

- A per-test limit that holds: pytest-timeout lets a test's @pytest.mark.timeout(N) override
  --timeout, so a test marked for the suite's slow machines (300 s) would outlive its stage.
  Every test's limit here is the smaller of its marker and GPU_CHECK_PER_TEST seconds.
- A verdict for every test that started, even when the stage is killed at its limit: pytest's
  own summary is printed at the end of the session, which a killed stage never reaches. Each
  test's start and its verdict are appended to GPU_CHECK_VERDICTS as they happen (one line each,
  flushed), so the check lists a test that started and never finished as TIMEOUT.
"""

from __future__ import annotations

import os

import pytest

_RANK = {"passed": 0, "skipped": 1, "failed": 2}


def _write(*fields: str) -> None:
    """One line of tab-separated fields: START or a verdict, the test's id, the reason."""
    path = os.environ.get("GPU_CHECK_VERDICTS")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write("\t".join(x.replace("\t", " ").replace("\n", " ") for x in fields) + "\n")
        f.flush()
        os.fsync(f.fileno())


def pytest_collection_modifyitems(config, items):
    limit = float(os.environ.get("GPU_CHECK_PER_TEST", "0") or 0)
    if limit <= 0:
        return
    for item in items:
        marker = item.get_closest_marker("timeout")
        marked = None
        if marker is not None:
            marked = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        if marked is None or float(marked) > limit:
            # Prepended: the closest marker, the one pytest-timeout reads.
            item.add_marker(pytest.mark.timeout(limit), append=False)


_outcomes: dict[str, tuple[str, str]] = {}


def pytest_runtest_logstart(nodeid, location):
    _write("START", nodeid)


def pytest_runtest_logreport(report):
    if report.when == "call":
        outcome = report.outcome
    elif report.failed:
        outcome = "error"  # set-up or tear-down failed
    elif report.skipped:
        outcome = "skipped"
    else:
        return
    reason = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
    elif report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        reason = getattr(crash, "message", None) or ((report.longreprtext or "").strip().splitlines() or [""])[-1]
        reason = reason.splitlines()[0] if reason else ""
    previous = _outcomes.get(report.nodeid)
    if previous is None or _RANK.get(outcome, 3) > _RANK.get(previous[0], 3):
        _outcomes[report.nodeid] = (outcome, reason)


def pytest_runtest_logfinish(nodeid, location):
    outcome, reason = _outcomes.pop(nodeid, ("error", "no report"))
    verdict = {"passed": "PASSED", "failed": "FAILED", "skipped": "SKIPPED"}.get(outcome, "ERROR")
    _write(verdict, nodeid, reason)
