"""Code on the README and the manual's pages fits the page: no line of a fenced block is wider
than 90 columns, so nothing scrolls sideways on the rendered manual (furo's code column)."""

from __future__ import annotations

import os

from markdown_examples import FENCE, REPO, markdown_pages

WIDTH = 90


def wide_code_lines(text: str) -> list:
    """(line number, width) of each fenced-block line wider than WIDTH."""
    lines, wide, i = text.split("\n"), [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        i += 1
        if not m:
            continue
        while i < len(lines) and not lines[i].strip().startswith(m["fence"]):
            if len(lines[i]) > WIDTH:
                wide.append((i + 1, len(lines[i])))
            i += 1
        i += 1
    return wide


def test_no_code_line_is_wider_than_the_page():
    wide = []
    for page in markdown_pages():
        with open(os.path.join(REPO, page), encoding="utf-8") as f:
            wide += [f"{page}:{n} ({w} columns)" for n, w in wide_code_lines(f.read())]
    assert not wide, f"code lines wider than {WIDTH} columns: {wide}"


def test_a_wide_line_is_found_in_any_block_and_only_there():
    text = "\n".join(["x" * 120, "```bash", "y" * 91, "```", "z" * 120, "~~~text", "ok", "~~~"])
    assert wide_code_lines(text) == [(3, 91)]
