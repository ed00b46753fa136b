"""The Python package's imports form a DAG (DESIGN: shared helpers in leaf modules, no module
imports another's private names, no module reaches up into its package's __init__ for a name).

Every import of every module of the installed package counts, those inside functions too (a
lazy import still ties the two modules together). The checker is tried on small packages written
here, so a cycle, a private import and a reach up are each shown to fail it."""

import ast
import os
import sys
import textwrap

import pytest

import ringtree


def package_modules(root: str, name: str) -> dict:
    """{dotted module name: path} of every .py file under the package directory `root`
    (a package is its __init__), and the extension modules (path None)."""
    modules = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if os.path.exists(os.path.join(folder, d, "__init__.py"))]
        rel = os.path.relpath(folder, root)
        prefix = name if rel == "." else name + "." + rel.replace(os.sep, ".")
        for f in files:
            if f == "__init__.py":
                modules[prefix] = os.path.join(folder, f)
            elif f.endswith(".py"):
                modules[f"{prefix}.{f[:-3]}"] = os.path.join(folder, f)
            elif f.endswith(".so"):
                modules[f"{prefix}.{f.split('.', 1)[0]}"] = None
    # An editable install keeps the extension modules beside its build, not in the source folder.
    for loaded, module in list(sys.modules.items()):
        if loaded.startswith(name + ".") and str(getattr(module, "__file__", "")).endswith(".so"):
            modules.setdefault(loaded, None)
    return modules


def imports_of(module: str, path: str, modules: dict) -> list:
    """(target module, name or None, line) of each import in the file: `from X import n` gives
    X.n when that is a module, else X with the name n; `import X` gives X."""
    tree = ast.parse(open(path).read(), path)
    is_package = path.endswith("__init__.py")
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] in _roots(modules)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] not in _roots(modules):
                continue
            for a in node.names:
                sub = f"{source}.{a.name}"
                found.append((sub, None, node.lineno) if sub in modules else (source, a.name, node.lineno))
    return found


def _roots(modules):
    return {m.split(".")[0] for m in modules}


def _packages(modules):
    return {m for m, p in modules.items() if p is not None and p.endswith("__init__.py")}


def check_package(root: str, name: str) -> list:
    """Every breach of the three rules, as sentences; [] for a clean package."""
    modules = package_modules(root, name)
    packages = _packages(modules)
    edges = {m: set() for m in modules}
    problems = []
    for module, path in sorted(modules.items()):
        if path is None:
            continue
        for target, imported, line in imports_of(module, path, modules):
            if target not in modules:
                continue
            edges[module].add(target)
            where = f"{os.path.relpath(path, os.path.dirname(root))}:{line}"
            if imported is not None and imported.startswith("_") and not imported.startswith("__"):
                problems.append(f"{where}: {module} imports the private name {imported} of {target}")
            if target in packages and target != module and module.startswith(target + "."):
                what = f"the name {imported}" if imported else "the package itself"
                problems.append(f"{where}: {module} reaches up into {target}'s __init__ for {what}")
    for cycle, component in cycles(edges):
        others = sorted(set(component) - set(cycle))
        problems.append(
            f"import cycle: {' -> '.join(cycle + [cycle[0]])}"
            + (f" (also tied into it: {', '.join(others)})" if others else "")
        )
    return problems


def cycles(edges: dict) -> list:
    """(a cycle, its strongly connected component) for each component that has one (Tarjan)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append((_a_cycle(sorted(component), edges), sorted(component)))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _a_cycle(component, edges):
    """A path from the component's first node back to itself, inside the component."""
    inside, start = set(component), component[0]
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(edges.get(v, ())):
            if w == start:
                return paths[v]
            if w in inside and w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    return component


def test_the_ringtree_package_imports_form_a_dag_without_private_names_or_reaching_up():
    root = os.path.dirname(ringtree.__file__)
    modules = package_modules(root, "ringtree")
    assert "ringtree.comm" in modules and "ringtree.torch.process_group" in modules, sorted(modules)
    problems = check_package(root, "ringtree")
    assert problems == [], "\n".join(problems)


def _write_package(tmp_path, files):
    root = tmp_path / "pkg"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return str(root)


@pytest.mark.parametrize(
    "files, expected",
    [
        (
            {
                "__init__.py": "from .a import f\n",
                "a.py": "from .b import g\ndef f(): return g()\n",
                "b.py": "def g():\n    from .a import f  # lazily: still a cycle\n    return f\n",
            },
            ["import cycle: pkg.a -> pkg.b -> pkg.a"],
        ),
        (
            {
                "__init__.py": "from .a import f\n",
                "a.py": "from .b import _helper\ndef f(): return _helper()\n",
                "b.py": "def _helper(): return 1\n",
            },
            ["pkg/a.py:1: pkg.a imports the private name _helper of pkg.b"],
        ),
        (
            {
                "__init__.py": "def helper(): return 1\nfrom .a import f\n",
                "a.py": "def f():\n    from . import helper\n    return helper()\n",
            },
            [
                "pkg/a.py:2: pkg.a reaches up into pkg's __init__ for the name helper",
                "import cycle: pkg -> pkg.a -> pkg",
            ],
        ),
        (
            {
                "__init__.py": "from .sub.c import h\n",
                "sub/__init__.py": "X = 1\n",
                "sub/c.py": "import pkg.sub as s\ndef h(): return s.X\n",
            },
            ["pkg/sub/c.py:1: pkg.sub.c reaches up into pkg.sub's __init__ for the package itself"],
        ),
        (
            {
                "__init__.py": "from . import a\nfrom .sub import c\n",
                "sub/__init__.py": "",
                "a.py": "from . import b\nfrom .b import value\n",
                "b.py": "value = 1\n",
                "sub/c.py": "from ..a import b\nfrom .. import b as bee\n",
            },
            [],
        ),
    ],
)
def test_the_checker_finds_cycles_private_imports_and_reaching_up(tmp_path, files, expected):
    assert check_package(_write_package(tmp_path, files), "pkg") == expected
