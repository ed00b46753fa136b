"""The examples of docs/choosing.md run as written, on every rank of a 2-rank world."""

import os
import re

import pytest
from harness import run_world

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "choosing.md")


def examples():
    with open(PAGE) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def run_example(index):
    """Runs the page's example `index` as a program (its own namespace, as `python file.py`)."""
    exec(compile(examples()[index], f"{PAGE}:example{index}", "exec"), {"__name__": "__main__"})
    return {"ran": index}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("index", range(len(examples())))
def test_the_page_example_runs_on_two_ranks(index):
    assert len(examples()) == 2
    assert [res["ran"] for res in run_world(2, run_example, dict(index=index), timeout=50).check_ok()] == [index] * 2
