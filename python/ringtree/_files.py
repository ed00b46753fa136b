"""Files the package writes: flight-record dumps and traces, each made atomically."""
from __future__ import annotations

import os


def dump_path(path, name: str) -> str:
    """A dump's file: `path` itself when it names a .json file, else `name` in the directory
    `path` (default RINGTREE_DUMP_DIR, else ./ringtree-dumps)."""
    if path is None:
        path = os.environ.get("RINGTREE_DUMP_DIR") or "ringtree-dumps"
    path = os.fspath(path)
    return path if path.endswith(".json") else os.path.join(path, name)


def write_json(path: str, text: str) -> str:
    """Write text to path atomically (a temporary file renamed), making its directory."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path
