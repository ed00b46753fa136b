"""The environment settings, as the core declares them (csrc/common/settings.def): the Python
layer reads its settings through get(), so a default in force is the default documented."""

from __future__ import annotations

import os

from . import _core

TABLE = {row["name"]: row for row in _core.SETTINGS}


def get(name: str):
    """The value of setting `name` in force: the environment's (an empty variable counts as unset),
    else the table's default; None where neither is set."""
    row = TABLE.get(name)
    if row is None:
        raise KeyError(f"{name} is not a ringtree setting (csrc/common/settings.def declares them)")
    value = os.environ.get(name) or row["default"]
    return value or None
