"""The repository as a user receives it: its product text names nothing outside it (no work-item
numbers, no notes or paths the user does not have), and the licence, changelog and typing marker
are where packaging tools look for them."""

from __future__ import annotations

import os
import re
import subprocess

from markdown_examples import REPO

# What product text must not point at: trackers' work items, files that are not in the tree,
# and paths of the machines the project was written on.
OUTSIDE = re.compile(r"\bissues? #?\d+|\bitem \d+ of\b|DESIGN\.md|RESULTS\.md|\.\./shared/|/(?:work|root)/")


def tracked_text_files() -> list:
    files = subprocess.run(["git", "-C", REPO, "ls-files"], capture_output=True, text=True, check=True).stdout.split()
    keep = []
    for path in files:
        full = os.path.join(REPO, path)
        if not os.path.isfile(full) or path.endswith((".png", ".json")):
            continue
        with open(full, "rb") as f:
            if b"\0" in f.read(8192):
                continue
        keep.append(path)
    return keep


def test_product_text_names_nothing_outside_the_repository():
    found = []
    for path in tracked_text_files():
        with open(os.path.join(REPO, path), encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                if OUTSIDE.search(line):
                    found.append(f"{path}:{n}: {line.strip()[:120]}")
    assert not found, "references outside the repository:\n" + "\n".join(found)


def test_licence_changelog_and_typing_marker_are_present():
    for name in ("LICENSE", "CHANGELOG.md", os.path.join("python", "ringtree", "py.typed")):
        assert os.path.isfile(os.path.join(REPO, name)), name
    with open(os.path.join(REPO, "pyproject.toml")) as f:
        assert 'license = "BSD-3-Clause"' in f.read()
