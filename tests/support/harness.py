"""Spawn real rank processes for a test and collect what each rank reports.

A test passes its rank body, a module-level function, itself: run_world(3, sweep, dict(...)).
Each rank runs rank_worker.py, which loads the function's module from its file, calls the
function by its qualified name with the arguments as keywords, and writes the JSON result to a
file. Every world has a hard timeout: on expiry all ranks are killed and the test fails with
their output, so a hang fails fast instead of stalling CI.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import ringtree as rt
from ringtree.launch import rank_environment

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "rank_worker.py")
# What a test imports by name, as pyproject.toml's pytest pythonpath lists it: rank processes get
# the same roots, so a rank body imports what its test does.
ROOT = os.path.dirname(os.path.dirname(HERE))
IMPORT_ROOTS = [os.path.join(ROOT, "tests", "support"), os.path.join(ROOT, "bench"), os.path.join(ROOT, "examples")]


def rank_target(func):
    """(module file, qualified name) by which a rank process finds `func`. Only a function a
    module defines at its top level (or a class in it defines) can be found that way, so anything
    else is refused here, in the test, rather than in every rank."""
    if not callable(func):  # a name in a string, say: pass the function itself
        raise TypeError(f"a rank body must be a function, got {func!r}")
    module = sys.modules.get(getattr(func, "__module__", None))
    path, qualname = getattr(module, "__file__", None), getattr(func, "__qualname__", "")
    if path is None or "<locals>" in qualname:
        raise TypeError(f"rank body {qualname or func!r} must be defined at the top level of a module file")
    found = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not func:
        raise TypeError(f"{module.__name__}.{qualname} is not the rank body passed ({func!r})")
    return os.path.abspath(path), qualname


def rank_command(func, args=None, outdir=None):
    """The command line of one rank running func(**args); with outdir its result is written there."""
    path, qualname = rank_target(func)
    return [sys.executable, WORKER, path, qualname, json.dumps(args or {})] + ([outdir] if outdir else [])


def rank_pythonpath(func, base=None) -> str:
    """PYTHONPATH of a rank running func: its module's folder (as pytest puts a test's folder
    first), then the suite's import roots, then `base`."""
    folder = os.path.dirname(rank_target(func)[0])
    return os.pathsep.join([folder] + IMPORT_ROOTS + [p for p in [base] if p])


@dataclass
class World:
    returncodes: list
    outputs: list
    results: list = field(default_factory=list)

    def failure_report(self) -> str:
        return "\n".join(
            f"--- rank {r} (exit {c}) ---\n{o[-4000:]}" for r, (c, o) in enumerate(zip(self.returncodes, self.outputs))
        )

    def check_ok(self):
        import pytest

        if any(c != 0 for c in self.returncodes) or any(r is None for r in self.results):
            pytest.fail("a rank failed:\n" + self.failure_report())
        return self.results


class RunningWorld:
    """Rank processes started by spawn_world: wait for some or all of them, then collect()."""

    def __init__(self, procs, logs, outdir):
        self.procs, self.logs, self.outdir = procs, logs, outdir

    def wait(self, ranks=None, deadline=None) -> list:
        """Waits until `ranks` (default all) have exited or time.monotonic() passes deadline;
        returns those still running."""
        ranks = range(len(self.procs)) if ranks is None else ranks
        while any(self.procs[r].poll() is None for r in ranks) and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.02)
        return [r for r in ranks if self.procs[r].poll() is None]

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)  # a stopped process would not die before it runs again
                p.kill()
                p.wait()

    def collect(self) -> World:
        """Kills what still runs, then reads every rank's output and result."""
        self.kill()
        outputs = []
        for log in self.logs:
            log.seek(0)
            outputs.append(log.read())
            log.close()
        world = World([p.returncode for p in self.procs], outputs)
        for r in range(len(self.procs)):
            path = os.path.join(self.outdir, f"{r}.json")
            world.results.append(json.load(open(path)) if os.path.exists(path) else None)
        shutil.rmtree(self.outdir, ignore_errors=True)  # the World holds every output and result now
        return world


def spawn_world(
    nranks, func, args=None, *, hosts=1, env=None, per_rank_env=None, per_rank_prefix=None, unique_id=None
) -> RunningWorld:
    """Starts func(**args) in nranks fresh rank processes and returns them running.
    unique_id: a token every rank gets (else a fresh id, whose reserved port rank 0 inherits)."""
    rank_target(func)  # refused here, before any process starts
    outdir = tempfile.mkdtemp(prefix="ringtree-test-")
    command = rank_command(func, args, outdir)
    uid = rt.UniqueId.create() if unique_id is None else unique_id
    listen_fd = uid.take_listener() if unique_id is None else -1
    procs, logs = [], []
    try:
        for r in range(nranks):
            e = rank_environment(r, nranks, str(uid), hosts)
            e["PYTHONPATH"] = rank_pythonpath(func, e.get("PYTHONPATH"))
            e.setdefault("RINGTREE_TIMEOUT", "60")
            e.update(env or {})
            if per_rank_env:
                e.update(per_rank_env(r))
            e["PYTHONUNBUFFERED"] = "1"
            e["RINGTREE_TEST_SLOT"] = str(r)  # result file name, independent of the rank it claims
            pass_fds = ()
            if r == 0 and listen_fd >= 0:
                e["RINGTREE_LISTEN_FD"] = str(listen_fd)
                pass_fds = (listen_fd,)
            log = open(os.path.join(outdir, f"{r}.log"), "w+")
            logs.append(log)
            prefix = list(per_rank_prefix(r)) if per_rank_prefix else []
            procs.append(
                subprocess.Popen(prefix + command, env=e, stdout=log, stderr=subprocess.STDOUT, pass_fds=pass_fds)
            )
    except BaseException:
        RunningWorld(procs, logs, outdir).collect()
        raise
    finally:
        if listen_fd >= 0:
            os.close(listen_fd)
    return RunningWorld(procs, logs, outdir)


def run_world(
    nranks, func, args=None, *, hosts=1, env=None, timeout=180, per_rank_env=None, per_rank_prefix=None, unique_id=None
):
    """Runs func(**args) in nranks fresh rank processes (ranks split over `hosts` emulated hosts)
    and returns their World; fails the test if they are not all done within `timeout` seconds.
    per_rank_prefix(r): words to run rank r's command under (e.g. `ip netns exec NAME`);
    unique_id: as for spawn_world (one whose rank 0 listens inside its namespace, say)."""
    running = spawn_world(
        nranks,
        func,
        args,
        hosts=hosts,
        env=env,
        per_rank_env=per_rank_env,
        per_rank_prefix=per_rank_prefix,
        unique_id=unique_id,
    )
    try:
        hung = running.wait(deadline=time.monotonic() + timeout)
    finally:
        world = running.collect()
    if hung:
        import pytest  # here, not at the top: rank processes and bench scripts import this module too

        pytest.fail(f"ranks {hung} still running after the {timeout} s hard timeout:\n" + world.failure_report())
    return world
