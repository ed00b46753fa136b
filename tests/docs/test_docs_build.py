"""The manual builds with Sphinx with warnings as errors and every cross-reference resolved
(nitpicky), as CI builds it, on a machine without torch (the docs extra does not install it);
its generated pages match what their generators make now."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys

import pytest
from markdown_examples import REPO

# Warnings are errors, and every cross-reference must resolve.
STRICT = ("-W", "--keep-going", "-n")
# What the README and the development page tell a user to run, which is what this test runs.
COMMAND = f"python -m sphinx {' '.join(STRICT)} -b html docs docs/_build/html"


def test_the_pages_give_the_command_ci_runs():
    for page in ("README.md", "docs/development.md", "docs/conf.py", "pyproject.toml"):
        with open(os.path.join(REPO, page)) as f:
            assert COMMAND in f.read(), f"{page} does not give the strict docs command: {COMMAND}"


# Runs Sphinx as `python -m sphinx` does, in a process where `import torch` fails as it does where
# torch is not installed: the PyTorch pages must come from the docstrings alone.
_WITHOUT_TORCH = """
import importlib.abc, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTorch())
from sphinx.cmd.build import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_manual_builds_without_a_warning_and_without_torch(tmp_path):
    out = tmp_path / "html"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _WITHOUT_TORCH,
            *STRICT,
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
    for page in ("index", "api", "settings", "performance", "capabilities", "semantics", "migrating"):
        assert (out / f"{page}.html").is_file(), page
    # Complete: every public name of the package and of its PyTorch part has its entry.
    import ringtree

    torch_part = pytest.importorskip("ringtree.torch")
    entries = set(re.findall(r'<dt class="sig sig-object py" id="([^"]+)"', (out / "api.html").read_text()))
    public = [f"ringtree.{n}" for n in ringtree.__all__] + [f"ringtree.torch.{n}" for n in torch_part.__all__]
    summary = (out / "api.html").read_text().split('class="autosummary', 1)[-1].split("</table>", 1)[0]
    assert all(f'href="#{name}"' in summary for name in public), "the summary table misses names"
    missing = [name for name in public if name not in entries]
    assert not missing, f"public names without an entry on the API page: {missing}"
    # Signatures as a user types them: public names, no pybind11 placeholders, straight quotes.
    text = html.unescape(re.sub(r"<[^>]+>", "", (out / "api.html").read_text()))
    # A builtin type's docstring standing in for a constant's (int([x]) -> integer ...) too.
    builtins_doc = [t.__doc__.splitlines()[0] for t in (int, float, str, tuple, list, dict)]
    for leak in ("ringtree._core.", "*args, **kwargs", "\u201c", "\u201d", "\u2018", "\u2019", *builtins_doc):
        assert leak not in text, f"the API page shows {leak!r}"
    # Every entry says what it is, and every callable has the numpydoc sections its signature
    # calls for (Parameters, Returns).
    silent = entries_without_text((out / "api.html").read_text())
    assert not silent, f"{len(silent)} API entries without text: {silent}"
    sectionless = entries_without_sections((out / "api.html").read_text())
    assert not sectionless, f"{len(sectionless)} API entries without their sections: {sectionless}"
    broken = broken_links(out)
    assert not broken, f"links to pages or anchors that do not exist: {broken[:20]}"


def entries_without_text(page: str) -> list:
    """The ids of the API page's entries whose description is empty."""
    found = re.finditer(r'<dt class="sig sig-object py" id="([^"]+)">.*?</dt>\s*<dd>(.*?)(?:<dl|</dd>)', page, re.S)
    return [m.group(1) for m in found if not re.sub(r"<[^>]+>", "", m.group(2)).strip()]


def test_an_entry_without_text_is_counted():
    page = (
        '<dt class="sig sig-object py" id="a.f">f()</dt><dd><p>Does f.</p></dd>'
        '<dt class="sig sig-object py" id="a.g">g()</dt><dd></dd>'
        '<dt class="sig sig-object py" id="a.C">C</dt><dd><dl><dt class="sig sig-object py" id="a.C.h">h</dt>'
    )
    assert entries_without_text(page) == ["a.g", "a.C"]


class _Element:
    def __init__(self, tag, attrs):
        self.tag, self.attrs, self.children, self.text = tag, dict(attrs), [], ""

    def classes(self) -> list:
        return (self.attrs.get("class") or "").split()

    def all_text(self) -> str:
        return self.text + "".join(c.all_text() for c in self.children)

    def find_all(self, tag, cls):
        for child in self.children:
            if child.tag == tag and cls in child.classes():
                yield child
            yield from child.find_all(tag, cls)


def _html_tree(page: str) -> _Element:
    """The page as a tree of elements (enough of HTML for Sphinx's output: void elements close
    themselves, and an end tag closes what is open down to its element)."""
    from html.parser import HTMLParser

    void = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
    root = _Element("root", {})
    stack = [root]

    class Parser(HTMLParser):
        def handle_starttag(self, tag, attrs):
            element = _Element(tag, attrs)
            stack[-1].children.append(element)
            if tag not in void:
                stack.append(element)

        def handle_endtag(self, tag):
            if any(e.tag == tag for e in stack[1:]):
                while stack.pop().tag != tag:
                    pass

        def handle_data(self, data):
            text = _Element("#text", {})
            text.text = data
            stack[-1].children.append(text)

    Parser(convert_charrefs=True).feed(page)
    return root


def entries_without_sections(page: str) -> list:
    """(id, section) for each API entry whose description lacks a numpydoc section its signature
    calls for: "Parameters" when it takes a parameter (self aside), "Returns" when it is annotated
    to return something other than None. Napoleon renders the sections as a field list directly
    in the entry's description; a nested entry's field lists are its own."""
    missing = []
    for entry in _html_tree(page).find_all("dl", "py"):
        parts = [c for c in entry.children if c.tag in ("dt", "dd")]
        if len(parts) < 2 or "sig-object" not in parts[0].classes():
            continue
        signature, description = parts[0], parts[1]
        fields = {
            field.all_text().strip().rstrip(":").strip()
            for fields in description.children
            if fields.tag == "dl" and "field-list" in fields.classes()
            for field in fields.children
            if field.tag == "dt"
        }
        names = [p.all_text().split(":")[0].split("=")[0].strip() for p in signature.find_all("em", "sig-param")]
        if [n for n in names if n.lstrip("*") and n != "self" and n != "/"] and "Parameters" not in fields:
            missing.append((signature.attrs["id"], "Parameters"))
        returned = [r.all_text().strip() for r in signature.find_all("span", "sig-return-typehint")]
        if returned and returned[0] != "None" and "Returns" not in fields:
            missing.append((signature.attrs["id"], "Returns"))
    return missing


def test_an_entry_without_its_sections_is_counted():
    def entry(id_, params, returns, fields, nested=""):
        sig = ", ".join(f'<em class="sig-param"><span class="n">{p}</span></em>' for p in params)
        if returns:
            sig += f'<span class="sig-return"><span class="sig-return-typehint">{returns}</span></span>'
        listed = "".join(f'<dt class="field-odd">{f}<span class="colon">:</span></dt><dd><p>x</p></dd>' for f in fields)
        return (
            f'<dl class="py method"><dt class="sig sig-object py" id="{id_}">f({sig})</dt>'
            f'<dd><p>Does f.</p><dl class="field-list simple">{listed}</dl>{nested}</dd></dl>'
        )

    page = (
        entry("a.f", ["x", "y=1"], "int", ["Parameters", "Returns"])
        + entry("a.g", ["self: a.C", "x: int"], "None", [])
        + entry("a.h", ["self", "*", "/"], "list", ["Return type"])
        + entry("a.k", [], "", [])
        # A class whose member has Parameters: the class's own are still missing.
        + entry("a.C", ["n"], "", [], nested=entry("a.C.m", ["x"], "", ["Parameters"]))
    )
    assert entries_without_sections(page) == [
        ("a.g", "Parameters"),
        ("a.h", "Returns"),
        ("a.C", "Parameters"),
    ]


def broken_links(site) -> list:
    """(page, href) of every link within the built site whose page or anchor is missing."""
    ids, links = {}, []
    for path in site.rglob("*.html"):
        text = path.read_text(errors="replace")
        ids[path.resolve()] = set(re.findall(r'\bid="([^"]+)"', text))
        links += [(path, href) for href in re.findall(r'href="([^"]+)"', text)]
    broken = []
    for page, href in links:
        if re.match(r"[a-z]+:", href) or not (href.split("#")[0].endswith(".html") or href.startswith("#")):
            continue  # another site, or a file that is not a page (sources, images)
        target, _, anchor = href.partition("#")
        dest = (page.parent / target).resolve() if target else page.resolve()
        if dest not in ids or (anchor and anchor not in ids[dest]):
            broken.append((str(page.relative_to(site)), href))
    return broken


def test_the_api_summary_lists_every_public_name_once():
    import ringtree

    torch_part = pytest.importorskip("ringtree.torch")
    sys.path.insert(0, os.path.join(REPO, "docs"))
    try:
        import conf
    finally:
        sys.path.pop(0)
    public = [f"ringtree.{n}" for n in ringtree.__all__] + [f"ringtree.torch.{n}" for n in torch_part.__all__]
    assert conf._public_names() == public
    with open(os.path.join(REPO, "docs", "api.md")) as f:
        assert conf._SUMMARY_MARK in f.read()
