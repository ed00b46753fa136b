"""The tree keeps its style: ruff's lint and formatter, and clang-format for the C++ and CUDA
sources, as configured in pyproject.toml and .clang-format (the test extra installs both)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tool(name: str) -> str:
    here = os.path.join(os.path.dirname(sys.executable), name)
    found = here if os.path.exists(here) else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]' installs it")
    return found


def run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def cpp_sources() -> list[str]:
    if os.path.isdir(os.path.join(ROOT, ".git")):
        out = run("git", "ls-files", "csrc/*.cc", "csrc/*.h", "csrc/*.cu", "csrc/*.cuh")
        if out.returncode == 0:
            return out.stdout.split()
    return [
        os.path.relpath(os.path.join(d, f), ROOT)
        for d, _, files in os.walk(os.path.join(ROOT, "csrc"))
        for f in files
        if f.endswith((".cc", ".h", ".cu", ".cuh"))
    ]


def test_ruff_lint_passes():
    out = run(tool("ruff"), "check", ".")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_ruff_format_leaves_the_tree_as_it_is():
    out = run(tool("ruff"), "format", "--check", ".")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_clang_format_leaves_the_sources_as_they_are():
    sources = cpp_sources()
    assert len(sources) > 50, sources
    out = run(tool("clang-format"), "--dry-run", "--Werror", *sources)
    assert out.returncode == 0, out.stderr[-4000:]
