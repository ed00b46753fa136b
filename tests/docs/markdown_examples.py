"""The Python examples of the README and the manual, as the tests run them.

Every fenced ```python block of README.md and docs/*.md is an example, and every example
runs. An HTML comment on the line before a block (invisible on the rendered page) says how:

    <!-- example: ranks=2 -->          under `python -m ringtree.launch -n 2` (hosts=H adds --hosts H)
    <!-- example: ranks=2 alone -->    that, and also as a one-process program (a world of one)
    <!-- example: continue -->         appended to the page's previous example: one program told in parts
    <!-- example: skip: REASON -->     not run; the reason is printed by the test
    (no comment)                       run once as a one-process program

Options combine with spaces: `ranks=4 hosts=2 timeout=90`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$")
MARKER = re.compile(r"^\s*<!--\s*example:\s*(?P<body>.*?)\s*-->\s*$")


@dataclass
class Example:
    page: str  # path relative to the repository
    line: int  # 1-based line of the first block's opening fence
    code: str
    ranks: int = 1
    hosts: int = 1
    timeout: float = 60.0
    skip: str | None = None
    alone: bool = False  # also run as a one-process program
    parts: list = field(default_factory=list)  # lines of every block joined into it

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def markdown_pages() -> list:
    """README.md and every Markdown page of the manual, relative to the repository."""
    pages = ["README.md"]
    docs = os.path.join(REPO, "docs")
    for folder, dirs, files in os.walk(docs):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        pages += sorted(os.path.relpath(os.path.join(folder, f), REPO) for f in files if f.endswith(".md"))
    return pages


def _options(body: str, where: str) -> dict:
    if body.startswith("skip"):
        reason = body[len("skip") :].lstrip(":").strip()
        if not reason:
            raise ValueError(f"{where}: 'example: skip' needs a reason ('example: skip: why')")
        return {"skip": reason}
    if body == "continue":
        return {"continue": True}
    options = {}
    for word in body.split():
        if word == "alone":
            options["alone"] = True
            continue
        key, sep, value = word.partition("=")
        if not sep or key not in ("ranks", "hosts", "timeout"):
            raise ValueError(f"{where}: unknown example option {word!r} (ranks=N, hosts=H, timeout=S, alone)")
        options[key] = float(value) if key == "timeout" else int(value)
    return options


def examples_in(page: str, text: str | None = None) -> list:
    """The examples of one page, in order."""
    if text is None:
        with open(os.path.join(REPO, page), encoding="utf-8") as f:
            text = f.read()
    lines = text.split("\n")
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m["fence"], m["info"].strip(), i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(m["indent"]) :] if lines[i].startswith(m["indent"]) else lines[i])
            i += 1
        i += 1
        if info.split(" ")[0] not in ("python", "py"):
            continue
        where = f"{page}:{start + 1}"
        prev = start - 1
        while prev >= 0 and not lines[prev].strip():
            prev -= 1
        marker = MARKER.match(lines[prev]) if prev >= 0 else None
        options = _options(marker["body"], where) if marker else {}
        code = "\n".join(body) + "\n"
        if options.pop("continue", False):
            if not found:
                raise ValueError(f"{where}: 'example: continue' with no example before it on the page")
            found[-1].code += "\n" + code
            found[-1].parts.append(start + 1)
            continue
        found.append(Example(page, start + 1, code, parts=[start + 1], **options))
    return found


def all_examples() -> list:
    return [e for page in markdown_pages() for e in examples_in(page)]
