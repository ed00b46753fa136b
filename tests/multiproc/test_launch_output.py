"""ringtree.launch's output: with several ranks each line a rank writes reaches the launcher's
stdout or stderr whole, once, prefixed with that rank (as `mpiexec -l`), however the ranks cut
their writes; with one rank, or --no-label, the output passes through untouched."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

LINES = 40

# Every line is written in three pieces with a pause between them, on both streams, so ranks that
# run at once would cut each other's lines if the launcher passed bytes on as they came.
_RANK = f"""
import os, sys, time
rank = os.environ["RINGTREE_RANK"]
for i in range({LINES}):
    for stream in (sys.stdout, sys.stderr):
        stream.write(f"rank {{rank}} line {{i}}")
        stream.flush()
        time.sleep(0.001)
        stream.write(" continued")
        stream.flush()
        stream.write(" end\\n")
        stream.flush()
sys.stdout.write(f"rank {{rank}} last line without a newline")
"""


def _launch(tmp_path, ranks, *options):
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    return subprocess.run(
        [sys.executable, "-m", "ringtree.launch", "-n", str(ranks), *options, "--timeout", "100", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _expected(ranks, stream):
    lines = [f"rank {r} line {i} continued end" for r in range(ranks) for i in range(LINES)]
    if stream == "stdout":
        lines += [f"rank {r} last line without a newline" for r in range(ranks)]
    return sorted(lines)


@pytest.mark.timeout(150)
def test_each_line_arrives_whole_once_and_labelled_with_its_rank(tmp_path):
    done = _launch(tmp_path, 3)
    assert done.returncode == 0, done.stdout + done.stderr
    for stream, text in (("stdout", done.stdout), ("stderr", done.stderr)):
        got = []
        for line in text.splitlines():
            m = re.fullmatch(r"\[(\d+)\] (rank (\d+) .*)", line)
            assert m, f"{stream}: a line without its rank's label, or cut: {line!r}"
            assert m.group(1) == m.group(3), f"{stream}: {line!r} carries another rank's label"
            got.append(m.group(2))
        assert sorted(got) == _expected(3, stream), stream
        # Each rank's lines keep their order.
        for r in range(3):
            mine = [int(x) for x in re.findall(rf"^\[{r}\] rank {r} line (\d+)", text, re.M)]
            assert mine == list(range(LINES)), (stream, r)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("ranks, options", [(1, ()), (2, ("--no-label",))])
def test_one_rank_or_no_label_passes_output_through(tmp_path, ranks, options):
    done = _launch(tmp_path, ranks, *options)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not re.search(r"^\[\d+\] ", done.stdout + done.stderr, re.M)
    if ranks == 1:
        assert done.stdout.splitlines() == [f"rank 0 line {i} continued end" for i in range(LINES)] + [
            "rank 0 last line without a newline"
        ]


@pytest.mark.timeout(150)
def test_label_on_for_one_rank_and_the_launchers_own_lines_stay_whole(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import sys\nprint('about to fail')\nsys.exit(3)\n")
    done = subprocess.run(
        [sys.executable, "-m", "ringtree.launch", "-n", "1", "--label", "--timeout", "100", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3
    assert done.stdout == "[0] about to fail\n"
