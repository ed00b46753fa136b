"""Every Python example of the README and the manual runs as written (markdown_examples.py
says how a page marks an example that needs ranks). An example that breaks fails here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from markdown_examples import all_examples, examples_in

EXAMPLES = all_examples()


def test_the_readme_and_the_manual_have_examples():
    pages = {e.page for e in EXAMPLES}
    assert "README.md" in pages and any(p.startswith("docs/") for p in pages), pages


# Each example at its rank count, and those marked `alone` once more as a one-process program.
RUNS = [(e, e.ranks) for e in EXAMPLES] + [(e, 1) for e in EXAMPLES if e.alone]


@pytest.mark.parametrize(("example", "ranks"), RUNS, ids=[e.id + ("" if n == e.ranks else ":alone") for e, n in RUNS])
def test_example_runs(example, ranks, tmp_path):
    if example.skip:
        pytest.skip(example.skip)
    script = tmp_path / "example.py"
    script.write_text(example.code)
    if ranks > 1 or example.hosts > 1:
        command = [
            sys.executable,
            "-m",
            "ringtree.launch",
            "-n",
            str(ranks),
            "--hosts",
            str(example.hosts),
            "--timeout",
            str(example.timeout),
            str(script),
        ]
    else:
        command = [sys.executable, str(script)]
    env = dict(os.environ, RINGTREE_TIMEOUT="30")
    try:
        done = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=example.timeout + 30
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{example.id} did not finish in {example.timeout + 30:.0f} s:\n{e.stdout}\n{e.stderr}")
    assert done.returncode == 0, f"{example.id} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"


def test_markers_are_read_as_documented():
    page = "\n".join(
        [
            "```python",
            "print(1)",
            "```",
            "<!-- example: ranks=3 hosts=2 timeout=5 alone -->",
            "```python",
            "a = 1",
            "```",
            "<!-- example: continue -->",
            "",
            "```python",
            "print(a)",
            "```",
            "```bash",
            "echo not python",
            "```",
            "<!-- example: skip: needs a GPU -->",
            "```python",
            "import cupy",
            "```",
        ]
    )
    one, two, three = examples_in("page.md", page)
    assert (one.ranks, one.code) == (1, "print(1)\n")
    assert (two.ranks, two.hosts, two.timeout, two.code) == (3, 2, 5.0, "a = 1\n\nprint(a)\n")
    assert two.parts == [5, 10]
    assert two.alone and not one.alone
    assert three.skip == "needs a GPU"
    with pytest.raises(ValueError, match="unknown example option"):
        examples_in("page.md", "<!-- example: rank=2 -->\n```python\npass\n```")
    with pytest.raises(ValueError, match="needs a reason"):
        examples_in("page.md", "<!-- example: skip -->\n```python\npass\n```")
