"""The manual builds with Sphinx with warnings as errors and every cross-reference resolved
(nitpicky), as CI builds it; its generated pages match what their generators make now."""

from __future__ import annotations

import os
import subprocess
import sys

from markdown_examples import REPO


def test_the_manual_builds_without_a_warning(tmp_path):
    out = tmp_path / "html"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-n",
            "-q",
            "-b",
            "html",
            "-d",
            str(tmp_path / "doctrees"),
            os.path.join(REPO, "docs"),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"sphinx-build failed:\n{done.stdout}\n{done.stderr}"
    for page in ("index", "api", "settings", "performance"):
        assert (out / f"{page}.html").is_file(), page
