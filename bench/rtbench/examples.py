"""The repository's examples as modules, for the benches that time the examples' own training
step (ddp_step.py, zero_bench.py): examples/NAME.py is loaded from its file,
once per process, without putting examples/ on the import path."""

from __future__ import annotations

import importlib.util
import os
import sys

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


def load(name: str):
    """The module of examples/<name>.py (e.g. load("train_ddp"))."""
    module = sys.modules.get(f"ringtree_example_{name}")
    if module is None:
        path = os.path.join(EXAMPLES, f"{name}.py")
        spec = importlib.util.spec_from_file_location(f"ringtree_example_{name}", path)
        if spec is None or not os.path.exists(path):
            raise ImportError(f"no example {name!r} at {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module
