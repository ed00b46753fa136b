"""Where NCCL is: ringtree loads libnccl.so.2 at run time (see csrc/transport/nccl)."""

from __future__ import annotations

import functools
import importlib.util
import os

from . import _core


@functools.lru_cache(maxsize=1)
def wheel_library() -> str:
    """The nvidia-nccl wheel's libnccl.so.2, or "" when that wheel is not installed."""
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return ""
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "lib", "libnccl.so.2")
        if os.path.exists(path):
            return path
    return ""


def nccl_info() -> dict:
    """NCCL as ringtree would use it for algo='nccl'. Looks in RINGTREE_NCCL_LIBRARY, then a
    libnccl already loaded (torch's), the nvidia-nccl wheel, and the system loader; the first
    found is kept for the life of the process.

    Returns
    -------
    dict
        {'version': (major, minor, patch), 'code': NCCL's version code, 'path': the library}.

    Raises
    ------
    Error
        No usable libnccl.so.2 was found; the message says what was tried.
    """
    lib = _core.nccl_library(wheel_library())
    code = int(lib["version"])
    return {"version": (code // 10000, code // 100 % 100, code % 100), "code": code, "path": lib["path"]}
