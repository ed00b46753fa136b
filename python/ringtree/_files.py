"""Files the package writes: flight-record dumps, traces and checkpoints, each made atomically
and privately."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat

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


def _refusal(path: str, st, whose: str) -> str | None:
    """Why a directory is not safe to write in, or None: another user (not root) owns it, or
    others may write in it without the sticky bit (then they could swap what is in it)."""
    me = os.geteuid()
    if st.st_uid not in (me, 0) or (whose == "folder" and st.st_uid != me):
        return f"it belongs to uid {st.st_uid}, not to this user (uid {me})"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"its mode is {stat.S_IMODE(st.st_mode):04o}: other users may write in it and it is not sticky"
    return None


def safe_folder(path, what: str) -> str:
    """`path` as a directory of this user's that nobody else can swap files in, made (0700
    where new) if missing: refused (InvalidArgument) when it or its parent belongs to another
    user, or may be written by others without the sticky bit, or `path` is a symbolic link."""
    path = os.path.abspath(os.fspath(path))
    os.makedirs(path, mode=0o700, exist_ok=True)
    parent = os.path.dirname(path)
    for where, whose in ((path, "folder"), (parent, "parent")):
        st = os.lstat(where)
        if stat.S_ISLNK(st.st_mode) and whose == "folder":
            why = "it is a symbolic link"
        elif not stat.S_ISDIR(os.stat(where).st_mode):
            why = "it is not a directory"
        else:
            why = _refusal(where, os.stat(where), whose)
        if why:
            raise _core.InvalidArgument(
                f"{what}: refusing to write in {path}: {'its parent ' + where if whose == 'parent' else where} is "
                f"not safe ({why}); use a directory of your own that only you can write"
            )
    return path


def write_exclusive(path, write) -> None:
    """write(file) into a fresh file next to `path` (random name, created exclusively, mode
    0600, never through a symbolic link), then renamed over `path`: readers see the old file
    or the whole new one, and a link planted at either name is never followed."""
    folder, name = os.path.split(os.fspath(path))
    temporary = os.path.join(folder, f".{name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
