"""The migration page (docs/migrating.md) names only what exists: every ringtree name in its
tables' ringtree column resolves by import, every call there binds to the signature of what it
calls (argument names and counts), every op and setting it names is the core's, and every
collective has a row. Its examples run in test_examples.py."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import re

import pytest
from markdown_examples import REPO

import ringtree as rt
import ringtree._settings as settings

PAGE = os.path.join(REPO, "docs", "migrating.md")
CODE = re.compile(r"`([^`]+)`")
SETTING = re.compile(r"\bRINGTREE_[A-Z0-9_]+\b")
# What the page's variables stand for.
NAMES = {"rt": rt, "comm": rt.Communicator, "work": rt.Work, "req": rt.Request, "uid": rt.UniqueId}


def ringtree_cells() -> list:
    """(table heading, row's first cell, the ringtree cell) of every table with a ringtree column
    (in the wide tables the second, beside the task, so it is on screen without scrolling)."""
    with open(PAGE) as f:
        lines = f.read().split("\n")
    cells, heading = [], None
    for line in lines:
        if not line.startswith("|"):
            heading = None
            continue
        row = [c.strip() for c in line.strip().strip("|").split("|")]
        if heading is None:
            heading = row
            continue
        if set("".join(row)) <= set("-: "):
            continue
        for column in ("ringtree", "with ringtree"):
            if column in heading:
                cells.append((heading[0], row[0], row[heading.index(column)]))
    return cells


def spans(cell: str) -> list:
    return CODE.findall(cell)


def resolve(dotted: str):
    """The object `rt.X.Y` / `comm.X` stands for; raises AttributeError or KeyError if none."""
    head, *rest = dotted.split(".")
    obj = NAMES[head]
    for part in rest:
        obj = getattr(obj, part)
    return obj


def _dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id] + parts[::-1])
    return None


def check_span(code: str, bound=None) -> list:
    """Problems with one code span of the ringtree column (empty: all good); appends each call
    it checked against a signature to `bound`."""
    problems = []
    for name in SETTING.findall(code):
        if name not in settings.TABLE:
            problems.append(f"{name} is not a ringtree setting")
    if code.startswith("python -m "):
        module = code.split()[2]
        if importlib.util.find_spec(module) is None:
            problems.append(f"no module {module}")
        return problems
    if code.startswith("op="):
        code = code[len("op=") :]
    source = code.replace("; ", "\n").replace("...", "None")
    if source.endswith(":"):  # `with comm.group():`
        source += "\n    pass"
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return problems  # a fragment in code font that is not Python
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "ctx", None), ast.Store):
            dotted = _dotted(node)
            if dotted and dotted.split(".")[0] in NAMES:
                try:
                    resolve(dotted)
                except AttributeError:
                    problems.append(f"{dotted} does not exist")
        if isinstance(node, ast.Call):
            dotted = _dotted(node.func)
            if not dotted or dotted.split(".")[0] not in NAMES or dotted in NAMES:
                continue
            try:
                target = resolve(dotted)
                sig = inspect.signature(target)
            except (AttributeError, ValueError, TypeError):
                continue  # reported above, or a builtin without a signature
            args = [None] * len(node.args)
            if dotted.split(".")[0] != "rt" and inspect.isfunction(target):
                args = [None] + args  # self
            if bound is not None:
                bound.append(dotted)
            try:
                sig.bind(*args, **{k.arg: None for k in node.keywords})
            except TypeError as e:
                problems.append(f"{code}: {e}")
            for k in node.keywords:
                if k.arg == "op" and isinstance(k.value, ast.Constant) and k.value.value not in rt._core.OPS:
                    problems.append(f"{code}: no op {k.value.value!r}")
    if isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant):
        if isinstance(tree.body[0].value.value, str) and tree.body[0].value.value not in rt._core.OPS:
            problems.append(f"{code}: no op {tree.body[0].value.value!r}")
    return problems


def test_every_ringtree_name_on_the_page_exists_and_takes_what_is_shown():
    problems, bound = [], []
    for table, row, cell in ringtree_cells():
        for code in spans(cell):
            problems += [f"{table} / {row}: {p}" for p in check_span(code, bound)]
    assert not problems, "\n".join(problems)
    # Each collective's call, and the set-up, async, group and persistent calls, were bound.
    for call in ("rt.init", "comm.all_reduce", "comm.all_to_all_v", "comm.sendrecv", "comm.split", "comm.group"):
        assert call in bound, (call, sorted(set(bound)))
    assert len(set(bound)) > 30, sorted(set(bound))


def test_the_prose_names_only_what_exists():
    # Outside the tables (whose other columns name other libraries' comm.Allreduce and such),
    # every `rt.` and `comm.` in code font is ringtree's.
    with open(PAGE) as f:
        prose = [line for line in f.read().split("\n") if not line.startswith("|")]
    named = [c for line in prose for c in spans(line) if c.startswith(("rt.", "comm."))]
    assert "rt.CollectiveMismatch" in named, named
    problems = [p for code in named for p in check_span(code)]
    assert not problems, problems


def test_the_ops_named_are_the_cores():
    ops = [c for _, row, cell in ringtree_cells() if row == "reduce ops" for c in spans(cell)]
    named = {c.removeprefix("op=").strip('"') for c in ops if c.startswith(("op=", '"'))}
    assert named | {"premul_sum"} == set(rt._core.OPS), named


def test_every_collective_has_a_row():
    rows = {row for _, row, _ in ringtree_cells()}
    for coll in rt._core.COLLECTIVES:
        assert any(coll in row.replace(", ", " ").split() for row in rows) or coll == "sendrecv", coll
    assert "exchange" in rows  # sendrecv's row


@pytest.mark.parametrize(
    "code,problem",
    [
        ('comm.all_reduce(x, out, op="sum")', None),
        ('comm.all_reduce(x, out, opp="sum")', "unexpected keyword"),
        ('comm.all_reduce(x, out, op="total")', "no op 'total'"),
        ("comm.all_reducee(x)", "comm.all_reducee does not exist"),
        ("rt.UniqueId.create()", None),
        ("rt.UniqueId.creat()", "does not exist"),
        ("RINGTREE_TIMEOUT", None),
        ("RINGTREE_TIMEOUTS", "not a ringtree setting"),
        ("python -m ringtree.analyze DIR", None),
        ("python -m ringtree.analyse DIR", "no module"),
        ("comm.split(color, key, 1, 2)", "too many positional"),
        ('op="bxor"', None),
        ('"mean"', "no op 'mean'"),
        ("with comm.groups():", "does not exist"),
    ],
)
def test_the_checks_catch_what_they_are_for(code, problem):
    found = check_span(code)
    if problem is None:
        assert not found, found
    else:
        assert any(problem in p for p in found), found


def test_a_unique_id_travels_as_its_string():
    # The rendezvous row: a token round-trips through str() and parse().
    uid = rt.UniqueId.create()
    assert str(rt.UniqueId.parse(str(uid))) == str(uid)
