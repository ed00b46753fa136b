"""The CUDA stand-in for rank processes: ringtree's core with the device path running on the CPU
(the private test module _ringtree_testing, see csrc/bindings/testing). A rank process started
with RINGTREE_TEST_STANDIN=1 (rank_worker.py) installs it before anything imports ringtree, so
that `import ringtree` in the rank body gets it. The hooks (device memory, streams, the walk on
threads) are the module's top level: `import _ringtree_testing as testing`."""

from __future__ import annotations

import importlib.util
import sys

ENV = {"RINGTREE_TEST_STANDIN": "1"}


def available() -> bool:
    return importlib.util.find_spec("_ringtree_testing") is not None


def install():
    """Makes the stand-in core ringtree._core; must run before ringtree is imported."""
    if "ringtree" in sys.modules:
        raise RuntimeError("install the CUDA stand-in before importing ringtree")
    import _ringtree_testing

    sys.modules["ringtree._core"] = _ringtree_testing.core()
