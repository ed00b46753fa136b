"""The environment settings, as the core declares them (csrc/common/settings.def): the Python
layer reads its settings through get() and the helpers below, so a default in force is the
default documented, and writes them into a child's environment through put()."""

from __future__ import annotations

import os

from . import _core

TABLE = {row["name"]: row for row in _core.SETTINGS}


def _row(name: str):
    row = TABLE.get(name)
    if row is None:
        raise KeyError(f"{name} is not a ringtree setting (csrc/common/settings.def declares them)")
    return row


def get(name: str):
    """The value of setting `name` in force: the environment's (an empty variable counts as unset),
    else the table's default; None where neither is set."""
    value = os.environ.get(name) or _row(name)["default"]
    return value or None


def given(name: str):
    """The environment's value of setting `name`, None where it is unset or empty: for settings
    whose absence means something (the launcher did not set it, pick an address)."""
    _row(name)
    return os.environ.get(name) or None


def get_int(name: str):
    """Setting `name` as an integer, None where it is unset with no default."""
    value = get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise _core.InvalidArgument(f"{name}={value!r} is not an integer") from None


def get_flag(name: str) -> bool:
    """Setting `name` as a yes/no flag: 1, true, yes or on (any case) is yes."""
    return (get(name) or "").strip().lower() in ("1", "true", "yes", "on")


def put(env, name: str, value: str) -> None:
    """Sets setting `name` to `value` in `env` (a child's environment, or os.environ)."""
    _row(name)
    env[name] = value
