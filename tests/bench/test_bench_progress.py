"""rt_bench's progress on stderr never shares a line with the tables on stdout: on a terminal the
bar is taken off its line while a table prints; elsewhere (a log, a launcher relaying lines) the
progress is whole lines, with no carriage returns."""

from __future__ import annotations

import io

import pytest

from rtbench import driver


class Terminal(io.StringIO):
    """stdout and stderr of one terminal: one stream of characters."""

    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def _sweep(monkeypatch, tty):
    screen = Terminal(tty)
    monkeypatch.setattr(driver.sys, "stdout", screen)
    monkeypatch.setattr(driver.sys, "stderr", screen)
    progress = driver.Progress(4, enabled=True)
    progress.step("all_reduce float32 sum 8B")
    progress.step("all_reduce float32 sum 64B")
    with progress.pause():
        print("# all_reduce table header", flush=True)
    progress.step("all_gather float32 8B")
    progress.step("all_gather float32 64B")
    progress.close()
    return screen.getvalue()


def test_the_bar_leaves_its_line_before_a_table_prints(monkeypatch):
    pytest.importorskip("tqdm")
    out = _sweep(monkeypatch, tty=True)
    assert "all_reduce float32" in out  # the bar was drawn
    before = out[: out.index("# all_reduce table header")]
    # What the terminal shows on the header's line before it: nothing but blanks the bar left.
    line = before.replace("\r", "\n").split("\n")[-1]
    assert line == "", repr(before[-80:])


def test_progress_off_a_terminal_is_whole_lines(monkeypatch):
    out = _sweep(monkeypatch, tty=False)
    assert "\r" not in out
    lines = out.splitlines()
    assert "# all_reduce table header" in lines
    assert all(x.startswith(("[rt_bench] ", "# all_reduce")) for x in lines), lines
    assert "[rt_bench] 4/4 all_gather float32 64B" in lines
