"""Sphinx configuration of ringtree's manual.

Built in the tests (tests/docs/test_docs_build.py) with warnings as errors and nitpicky
cross-references: python -m sphinx -W --keep-going -n -b html docs docs/_build/html
"""

from __future__ import annotations

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
    (r"py:.*", r"(numpy|np|torch|os|collections\.abc|typing|concurrent\.futures|datetime)\..*"),
    (r"py:.*", r"c10d::.*"),
]

# The PyTorch parts are documented without torch installed (the docs extra does not pull a
# multi-GB wheel): autodoc imports them against a stand-in torch. Always, so that a machine with
# torch renders the same page.
autodoc_mock_imports = ["torch"]

autodoc_default_options = {"members": True, "member-order": "bysource", "undoc-members": False}
autodoc_typehints = "signature"
# The torch backend's classes subclass torch's; their docs are torch's, not ours.
autodoc_inherit_docstrings = False
# Docstrings write `name` for code, as the Markdown pages do.
default_role = "code"
autodoc_class_signature = "separated"
add_module_names = False


# The stand-in torch spells a subscripted annotation (Future[Tensor]) as an attribute path;
# write it back as the subscript it is.
_MOCK_SUBSCRIPT = re.compile(r"(torch(?:\.\w+)*\.Future)\.(torch(?:\.\w+)+)")


def _mock_subscripts(app, what, name, obj, options, signature, return_annotation):
    fix = lambda text: _MOCK_SUBSCRIPT.sub(r"\1[\2]", text) if text else text
    return fix(signature), fix(return_annotation)


def setup(app):
    app.connect("autodoc-process-signature", _mock_subscripts)


html_theme = "furo"
html_title = f"ringtree {release}"
html_static_path = ["_static"]
