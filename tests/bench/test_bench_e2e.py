"""Bench driver end to end: real ranks started by ringtree's launcher (and mpiexec).

Each run is tiny (a few sizes up to 4 KiB, 2 timed iterations) and has a hard
timeout, so a hang fails the test instead of stalling CI.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from ringtree import _core
from rtbench import report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = os.path.join(ROOT, "bench", "rt_bench.py")


TINY = ["-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1", "--no-progress"]


def have(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


needs_ringtree = pytest.mark.skipif(
    not have("ringtree") or not have("ringtree.launch"),
    reason="ringtree is not installed (pip install -e . --no-build-isolation)",
)


def launch(nranks, args, timeout=120):
    cmd = [sys.executable, "-m", "ringtree.launch", "-n", str(nranks), "--no-label", "--timeout", "90", DRIVER] + args
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def all_rows(tables):
    return [row for t in tables for row in t["rows"]]


@needs_ringtree
@pytest.mark.timeout(150)
def test_every_collective_two_ranks(tmp_path):
    json_path = tmp_path / "out.json"
    args = TINY + [
        "--collective",
        "all",
        "-d",
        "float32,int8",
        "-o",
        "sum,max",
        "-r",
        "1",
        "--algo",
        "all",
        "-J",
        str(json_path),
        "--vs",
        "memcpy",
    ]
    if have("matplotlib"):
        args += ["--plot", str(tmp_path / "out.png")]
    proc = launch(2, args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[rt_bench]" not in proc.stdout  # progress never goes to stdout
    tables = report.parse_tables(proc.stdout)
    names = {t["meta"]["collective"] for t in tables}
    assert names == {
        "all_reduce",
        "reduce_scatter",
        "all_gather",
        "all_to_all",
        "broadcast",
        "reduce",
        "gather",
        "scatter",
        "sendrecv",
    }
    for table in tables:
        assert table["meta"]["oob"] == ["0", "OK"], table["meta"]
        for row in table["rows"]:
            for key in ("oop_wrong", "ip_wrong"):
                assert row[key] in (0, "n/a"), (table["meta"], row)
    # all_reduce, float32 and int8, sum and max, 4 sizes, every algorithm measured.
    ar = [t for t in tables if t["meta"]["collective"] == "all_reduce"]
    assert {"ringtree:ring", "ringtree:tree", "ringtree:auto"} <= {t["meta"]["impl"] for t in ar}
    for table in ar:
        assert len(table["rows"]) == 2 * 2 * 4
        assert all(isinstance(r["oop_time"], (int, float)) and r["oop_time"] > 0 for r in table["rows"])
    assert "# Out of bounds values : 0 OK" in proc.stdout.splitlines()[-3]
    doc = json.loads(json_path.read_text())
    assert doc["header"]["nranks"] == 2 and len(doc["results"]) > 0
    if have("matplotlib"):
        assert (tmp_path / "out.png").stat().st_size > 1000


@needs_ringtree
@pytest.mark.timeout(150)
def test_coalesced_lists_time_and_check_each_collective_that_has_one():
    collectives = "all_reduce,all_gather,reduce_scatter,broadcast"
    proc = launch(2, TINY + ["--group", "3", "--coalesced", "--collective", collectives])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tables = report.parse_tables(proc.stdout)
    assert {t["meta"]["collective"] for t in tables} == {"all_reduce", "all_gather", "reduce_scatter"}
    for table in tables:
        assert table["meta"]["oob"] == ["0", "OK"], table["meta"]
        assert all(row["oop_wrong"] == 0 for row in table["rows"]), table
    assert "broadcast has no coalesced form" in proc.stdout
    # Repeated in place, a reduce_scatter's output is the next call's input: not timed, said why.
    assert "in-place reduce_scatters on one buffer read each other's results" in proc.stdout


@needs_ringtree
@pytest.mark.timeout(150)
def test_corrupted_result_fails_the_run():
    proc = launch(2, TINY + ["--collective", "all_reduce,all_gather", "--inject-error"])
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED" in proc.stdout
    rows = all_rows(report.parse_tables(proc.stdout))
    assert rows and all(r["oop_wrong"] >= 1 for r in rows if r["count"] > 0)


@needs_ringtree
@pytest.mark.timeout(150)
def test_every_dtype_and_op_one_size():
    proc = launch(
        2,
        [
            "-b",
            "4K",
            "-e",
            "4K",
            "-n",
            "1",
            "-w",
            "0",
            "--no-progress",
            "-d",
            "all",
            "-o",
            "all",
            "--collective",
            "all_reduce,reduce_scatter",
        ],
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = all_rows(report.parse_tables(proc.stdout))
    assert len(rows) == 2 * 16 * 5
    # complex numbers have no order: min and max are refused (n/a), everything else is exact
    unordered = [r for r in rows if r["type"] in ("cfloat", "cdouble") and r["redop"] in ("min", "max")]
    assert len(unordered) == 2 * 2 * 2 and all(r["oop_wrong"] == "n/a" for r in unordered)
    assert all(r["oop_wrong"] == 0 for r in rows if r not in unordered)


NEW_DTYPES = "int16,uint16,uint32,uint64,float8_e4m3fn,float8_e5m2,complex64,complex128"


@needs_ringtree
@pytest.mark.timeout(150)
def test_the_newer_dtypes_check_results_and_catch_a_corrupted_one():
    args = ["-b", "8", "-e", "1K", "-f", "32", "-n", "1", "-w", "0", "--no-progress", "-d", NEW_DTYPES, "-o", "all"]
    proc = launch(2, args + ["--collective", "all"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = all_rows(report.parse_tables(proc.stdout))
    types = {"int16", "uint16", "uint32", "uint64", "f8e4m3", "f8e5m2", "cfloat", "cdouble"}
    assert {r["type"] for r in rows} == types
    measured = [r for r in rows if r["oop_wrong"] != "n/a"]
    assert len(measured) > len(rows) // 2 and all(r["oop_wrong"] == 0 for r in measured)
    proc = launch(2, args + ["--collective", "all_reduce,all_gather", "--inject-error"])
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = all_rows(report.parse_tables(proc.stdout))
    assert {r["type"] for r in rows if r["count"] > 0 and r["oop_wrong"] != "n/a" and r["oop_wrong"] >= 1} == types


@pytest.mark.skipif(
    not (have("ringtree") and have("mpi4py") and shutil.which("mpiexec")),
    reason="needs ringtree, mpi4py and mpiexec (pip install mpi4py mpich)",
)
@pytest.mark.timeout(200)
def test_side_by_side_under_mpiexec():
    peers = "mpi,gloo,nccl,memcpy"
    proc = subprocess.run(
        ["mpiexec", "-n", "2", sys.executable, DRIVER]
        + TINY
        + ["--collective", "all_reduce,all_to_all", "--vs", peers],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "#   nccl    absent: no GPU" in out or "#   nccl    absent:" in out
    tables = report.parse_tables(out)
    for table in tables:
        present = [p for p in table["meta"]["peers"]]
        assert "mpi" in present and "memcpy" in present
        for row in table["rows"]:
            assert isinstance(row["mpi_time"], (int, float))
            if row["count"] > 0:
                assert isinstance(row["mpi_ratio"], float) and row["mpi_ratio"] > 0
    if have("torch"):
        assert all("gloo" in t["meta"]["peers"] for t in tables)
        assert "# peer check: gloo 0 wrong" in out
    else:
        assert "gloo    absent: torch not installed" in out
    assert "# peer check: mpi 0 wrong" in out


@pytest.mark.timeout(60)
@pytest.mark.skipif(_core.cuda_available(), reason="checks the refusal on machines without a usable GPU")
def test_cuda_device_without_a_gpu_is_refused_clearly():
    proc = subprocess.run(
        [sys.executable, DRIVER, "--device", "cuda"], cwd=ROOT, capture_output=True, text=True, timeout=50
    )
    assert proc.returncode == 2
    assert "--device cuda cannot run here: ringtree finds no CUDA device" in proc.stderr
    assert proc.stdout == ""
    # --if-gpu (the README's main command): the same reason, as a note, and success.
    proc = subprocess.run(
        [sys.executable, DRIVER, "--device", "cuda", "--if-gpu"], cwd=ROOT, capture_output=True, text=True, timeout=50
    )
    assert proc.returncode == 0, proc.stderr
    assert "no device sweep on this machine: ringtree finds no CUDA device" in proc.stdout


@pytest.mark.timeout(60)
def test_bad_flags_exit_2():
    proc = subprocess.run(
        [sys.executable, DRIVER, "-b", "1M", "-e", "1K"], cwd=ROOT, capture_output=True, text=True, timeout=50
    )
    assert proc.returncode == 2 and "minbytes" in proc.stderr


@needs_ringtree
@pytest.mark.timeout(150)
def test_raw_socket_peers_time_every_size(tmp_path):
    # Three ranks on one host: the raw ring connects rank r to r+1 over loopback.
    json_path = tmp_path / "raw.json"
    proc = launch(
        3,
        TINY + ["--collective", "all_reduce,all_gather", "--algo", "ring", "--vs", "raw,rawbuf", "-J", str(json_path)],
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(json_path.read_text())
    for row in doc["results"]:
        for peer in ("raw", "rawbuf"):
            cell = row["cells"][peer]["ip"]
            assert cell["seconds"] > 0 and cell["wrong"] is None, (peer, row["size"], cell)
