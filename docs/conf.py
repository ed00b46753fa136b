"""Sphinx configuration of ringtree's manual.

Built in the tests (tests/docs/test_docs_build.py) with warnings as errors and nitpicky
cross-references: python -m sphinx -W --keep-going -n -b html docs docs/_build/html
"""

from __future__ import annotations

import inspect
import re

import ringtree

project = "ringtree"
author = "the ringtree authors"
copyright = "2026, the ringtree authors"
release = ringtree.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",  # numpydoc sections (Parameters, Returns, Raises) in docstrings
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# Headings get anchors down to level 3, so pages link to sections as [text](page.md#anchor).
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# Every cross-reference must resolve. Types from libraries outside the project are named in
# signatures but have no page here (the build runs offline, without intersphinx).
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(numpy|np|torch|os|io|collections\.abc|typing|concurrent\.futures|datetime)\..*"),
    (r"py:.*", r"c10d::.*"),
    # Types named in numpydoc sections: builtins, and "buffer" (any array the call accepts).
    (r"py:class", r"(bool|int|float|str|bytes|dict|list|tuple|object|None|buffer|callable|sequence|iterable)"),
]

# The PyTorch parts are documented without torch installed (the docs extra does not pull a
# multi-GB wheel): autodoc imports them against a stand-in torch. Always, so that a machine with
# torch renders the same page.
autodoc_mock_imports = ["torch"]

# Docstrings use numpydoc sections (Parameters, Returns, Raises) only.
napoleon_google_docstring = False
napoleon_numpy_docstring = True

# The API page's summary table links to the entries the page itself makes: no stub pages.
autosummary_generate = False

autodoc_default_options = {"members": True, "member-order": "bysource", "undoc-members": False}
autodoc_typehints = "signature"
# The torch backend's classes subclass torch's; their docs are torch's, not ours.
autodoc_inherit_docstrings = False
# Docstrings write `name` for code, as the Markdown pages do.
default_role = "code"
# A class's entry shows its constructor's signature, and the class's docstring describes the
# constructor's parameters (numpydoc): no separate __init__ entry.
autodoc_class_signature = "mixed"
add_module_names = False


# The stand-in torch spells a subscripted annotation (Future[Tensor]) as an attribute path;
# write it back as the subscript it is.
_MOCK_SUBSCRIPT = re.compile(r"(torch(?:\.\w+)*\.Future)\.(torch(?:\.\w+)+)")


# The compiled module's classes are public under `ringtree` (ringtree.UniqueId, not
# ringtree._core.UniqueId).
_CORE = re.compile(r"\bringtree\._core\.")


# Placeholders for a constructor: pybind11's for a class built by its factories, and the stand-in
# torch's __new__ for a class that subclasses one of torch's.
_PLACEHOLDERS = ("(*args, **kwargs)", "(*args: Any, **kwargs: Any)")


# Classes that calls hand back and that nobody builds by hand: their entries show no constructor.
_MADE_BY_CALLS = {
    "ringtree.Work",
    "ringtree.MessageWork",
    "ringtree.Group",
    "ringtree.Request",
    "ringtree.Status",
    "ringtree.ChoiceRequest",
    "ringtree.CollectiveInfo",
    "ringtree.ps.ServeReport",
    "ringtree.ps.Server",
    "ringtree.ps.Worker",
    "ringtree.moe.MoEStats",
    "ringtree.torch.RingtreeWork",
}


def _clean_signatures(app, what, name, obj, options, signature, return_annotation):
    fix = lambda text: _CORE.sub("ringtree.", _MOCK_SUBSCRIPT.sub(r"\1[\2]", text)) if text else text
    if what == "class" and name in _MADE_BY_CALLS:
        return "", None
    if signature in _PLACEHOLDERS and (what in ("class", "exception") or name.endswith(".__init__")):
        init = vars(obj).get("__init__") if isinstance(obj, type) else None
        if not inspect.isfunction(init):
            return "", None  # no constructor to show
        # The class's own __init__, as autodoc shows a class's signature (self left out).
        from sphinx.util.inspect import signature as signature_of
        from sphinx.util.inspect import stringify_signature

        signature = stringify_signature(signature_of(init, bound_method=True), show_return_annotation=False)
    return fix(signature), fix(return_annotation)


def _unlinkable(env) -> set:
    """(module, name) of the code viewcode would link back to nowhere: a module without Python
    source (the compiled `_core`), and names documented under another module than the first one
    viewcode met in the same file (it keeps one per file: `Bucketer` as `ringtree.Bucketer` makes
    `ringtree.bucketing.assign_buckets` link to `ringtree.assign_buckets`)."""
    documented = env.domains["py"].objects
    gone = set()
    for module, entry in getattr(env, "_viewcode_modules", {}).items():
        if not entry:
            gone.add((module, None))
            continue
        code, tags, used, refname = entry
        gone |= {(module, n) for n in used if f"{refname}.{n}" not in documented}
    return gone


def _viewcode_links_that_exist(app):
    """Before viewcode writes its pages: no index entry and no back-link that leads nowhere."""
    modules = getattr(app.env, "_viewcode_modules", {})
    for module, name in _unlinkable(app.env):
        if name is None:
            del modules[module]
        else:
            del modules[module][2][name]
    return []


def _source_links_that_exist(app, doctree, docname):
    """The [source] links to code whose page or anchor viewcode will not write."""
    from docutils import nodes

    gone = {f"{m.replace('.', '/')}.html#{n}" for m, n in _unlinkable(app.env) if n}
    for ref in list(doctree.findall(nodes.reference)):
        uri = ref.get("refuri", "")
        if "_modules/" in uri and uri.split("_modules/", 1)[1] in gone:
            ref.parent.remove(ref)


def _public_names() -> list:
    """ringtree.__all__ and ringtree.torch.__all__ as they stand, read from the sources (so
    without importing torch)."""
    import ast
    import os

    names = [f"ringtree.{n}" for n in ringtree.__all__]
    with open(os.path.join(os.path.dirname(ringtree.__file__), "torch", "__init__.py")) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            names += [f"ringtree.torch.{n}" for n in ast.literal_eval(node.value)]
    return names


_SUMMARY_MARK = "<!-- public names: docs/conf.py puts the summary table of __all__ here -->"


def _summary_table(app, docname, source):
    """The API page's summary table, made from __all__ at build time so it never lags a new
    public name."""
    if docname == "api" and _SUMMARY_MARK in source[0]:
        rows = "".join(f"   {name}\n" for name in _public_names())
        source[0] = source[0].replace(_SUMMARY_MARK, f"```{{eval-rst}}\n.. autosummary::\n\n{rows}```")


def _constant_docs(app, what, name, obj, options, lines):
    """A constant's text is the `#:` comment where it is assigned, not its type's docstring
    (autodoc reads comments only in the module named, and the package re-exports them)."""
    import sys

    from sphinx.pycode import ModuleAnalyzer

    if what != "data" or getattr(obj, "__doc__", None) != type(obj).__doc__:
        return
    attr = name.rpartition(".")[2]
    lines[:] = []
    for module in sorted(m for m in sys.modules if m == "ringtree" or m.startswith("ringtree.")):
        if getattr(sys.modules[module], attr, None) is not obj:
            continue
        try:
            found = ModuleAnalyzer.for_module(module).find_attr_docs().get(("", attr))
        except Exception:  # a compiled module has no source to read
            continue
        if found:
            lines[:] = list(found)
            return


def setup(app):
    app.connect("autodoc-process-docstring", _constant_docs)
    app.connect("source-read", _summary_table)
    app.connect("autodoc-process-signature", _clean_signatures)
    app.connect("html-collect-pages", _viewcode_links_that_exist, priority=400)
    app.connect("doctree-resolved", _source_links_that_exist)


# Docstrings and pages quote code as typed (algo="auto"); curly quotes would change it.
smartquotes = False

html_theme = "furo"
html_title = f"ringtree {release}"
html_static_path = ["_static"]
