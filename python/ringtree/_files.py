"""Files the package writes: flight-record dumps and traces, each made atomically and privately."""

from __future__ import annotations

import os

from . import _core, _settings


def dump_path(path, name: str) -> str:
    """A dump's file: `path` itself when it names a .json file, else `name` in the directory
    `path` (default RINGTREE_DUMP_DIR, else ./ringtree-dumps)."""
    if path is None:
        path = _settings.get("RINGTREE_DUMP_DIR") or "ringtree-dumps"
    path = os.fspath(path)
    return path if path.endswith(".json") else os.path.join(path, name)


def write_json(path: str, text: str) -> str:
    """Write text to path as automatic dumps are written: atomically, 0600, in a directory of
    this user's that nobody else may write (made 0700), never through a symlink."""
    folder, name = os.path.split(path)
    return _core.write_private_file(folder or ".", name, text)
