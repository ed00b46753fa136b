"""Every environment setting is declared once, in csrc/common/settings.def: the code reads each
one through its row (so the default in force is the one documented), no RINGTREE_ name is read
anywhere else, every row is read somewhere, and the manual's settings page is the table's."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from markdown_examples import REPO

import ringtree._settings as settings

NAME = re.compile(r"\bRINGTREE_[A-Z0-9_]*[A-Z0-9]\b")
# Names that are not environment settings read at run time: build options and compile-time macros.
BUILD_NAMES = {
    "RINGTREE_CUDA": "CMake option (pip install reads it from the environment)",
    "RINGTREE_TESTING": "CMake option",
    "RINGTREE_HAVE_CUDA": "compile-time macro",
    "RINGTREE_CUDA_STANDIN": "compile-time macro of the stand-in build",
    "RINGTREE_DEVICE_PATH": "compile-time macro",
    "RINGTREE_MODULE_NAME": "compile-time macro",
    "RINGTREE_SETTING_GROUPS": "the settings table's own macro",
}
TABLE_FILES = {os.path.join("csrc", "common", f) for f in ("settings.def", "settings.h", "settings.cc")}
READERS = (
    re.compile(r"\b(env_int|env_str|env_double|getenv)\s*\(\s*\"RINGTREE_"),
    re.compile(r"environ(\.get)?\s*[\[(]\s*[\"']RINGTREE_"),
)


def sources():
    files = subprocess.run(
        ["git", "-C", REPO, "ls-files", "csrc", "python"], capture_output=True, text=True, check=True
    ).stdout.split()
    for path in files:
        if path.endswith((".cc", ".h", ".cu", ".cuh", ".py", ".def")):
            with open(os.path.join(REPO, path), encoding="utf-8") as f:
                yield path, f.read()


def test_every_name_the_sources_use_is_a_declared_setting():
    unknown = {}
    for path, text in sources():
        for name in NAME.findall(text):
            if name not in settings.TABLE and name not in BUILD_NAMES:
                unknown.setdefault(name, path)
    assert not unknown, f"RINGTREE_ names missing from csrc/common/settings.def: {unknown}"


def test_only_the_table_reads_the_environment():
    direct = [
        f"{path}: {m.group(0)}"
        for path, text in sources()
        if path not in TABLE_FILES and not path.endswith("_settings.py")
        for reader in READERS
        for m in reader.finditer(text)
    ]
    assert not direct, (
        "settings read around the table (use RT_SETTING / setting_*() or ringtree._settings.get):\n" + "\n".join(direct)
    )


def test_every_setting_is_read_somewhere():
    ids = {}
    with open(os.path.join(REPO, "csrc", "common", "settings.def")) as f:
        for m in re.finditer(r"RT_SETTING_ROW\((\w+), \"(RINGTREE_\w+)\"", f.read()):
            ids[m.group(2)] = m.group(1)
    assert set(ids) == set(settings.TABLE)
    unread = []
    for name, ident in ids.items():
        used = re.compile(rf"Setting::{ident}\b|RT_(?:AUTO_)?SETTING\({ident}\)|[\"']{name}[\"']")
        if not any(used.search(text) for path, text in sources() if path not in TABLE_FILES):
            unread.append(name)
    assert not unread, f"declared but never read: {unread}"


def test_a_malformed_value_names_the_setting(tmp_path):
    code = "import ringtree as rt; rt.init().all_reduce(__import__('numpy').ones(3))"
    env = dict(os.environ, RINGTREE_FLIGHT_RECORDER="lots")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "RINGTREE_FLIGHT_RECORDER='lots' is not an integer" in done.stderr, done.stderr


def test_the_settings_page_is_the_table():
    sys.path.insert(0, os.path.join(REPO, "docs"))
    try:
        import settings_page
    finally:
        sys.path.pop(0)
    with open(os.path.join(REPO, "docs", "settings.md")) as f:
        committed = f.read()
    assert committed == settings_page.page(), (
        "docs/settings.md differs from the table: python docs/settings_page.py > docs/settings.md"
    )
    for name in settings.TABLE:
        assert f"`{name}`" in committed


@pytest.mark.parametrize("name", ["RINGTREE_NOT_A_SETTING"])
def test_an_undeclared_name_is_refused_by_get(name):
    with pytest.raises(KeyError, match="not a ringtree setting"):
        settings.get(name)


def test_the_python_readers_follow_the_table(monkeypatch):
    monkeypatch.delenv("RINGTREE_ADDR", raising=False)
    assert settings.get("RINGTREE_ADDR") == settings.TABLE["RINGTREE_ADDR"]["default"] == "127.0.0.1"
    assert settings.given("RINGTREE_ADDR") is None  # unset: the launchers pick an address
    monkeypatch.setenv("RINGTREE_ADDR", "")
    assert settings.given("RINGTREE_ADDR") is None and settings.get("RINGTREE_ADDR") == "127.0.0.1"
    monkeypatch.setenv("RINGTREE_ADDR", "10.1.2.3")
    assert settings.given("RINGTREE_ADDR") == settings.get("RINGTREE_ADDR") == "10.1.2.3"

    monkeypatch.delenv("RINGTREE_RANK", raising=False)
    assert settings.get_int("RINGTREE_RANK") is None
    monkeypatch.setenv("RINGTREE_RANK", "3")
    assert settings.get_int("RINGTREE_RANK") == 3
    monkeypatch.setenv("RINGTREE_RANK", "three")
    with pytest.raises(settings._core.InvalidArgument, match="RINGTREE_RANK='three' is not an integer"):
        settings.get_int("RINGTREE_RANK")

    for value, expected in (("", False), ("0", False), ("no", False), ("1", True), (" Yes ", True), ("ON", True)):
        monkeypatch.setenv("RINGTREE_SINGLE_USER_CLUSTER", value)
        assert settings.get_flag("RINGTREE_SINGLE_USER_CLUSTER") is expected, value


def test_put_writes_declared_names_only():
    env = {}
    settings.put(env, "RINGTREE_HOSTNAME", "emulated-host-1")
    assert env == {"RINGTREE_HOSTNAME": "emulated-host-1"}
    with pytest.raises(KeyError, match="not a ringtree setting"):
        settings.put(env, "RINGTREE_NOT_A_SETTING", "1")
    assert env == {"RINGTREE_HOSTNAME": "emulated-host-1"}


def test_the_oneshot_setting_states_the_slots():
    """The one-shot slots are the core's constants; the setting's text repeats them."""
    from ringtree import _core

    text = settings.TABLE["RINGTREE_ONESHOT_BYTES"]["text"]
    assert f"holds {_core.ONESHOT_SLOTS} one-shot slots of a page" in text, text
    assert f"up to {_core.ONESHOT_INLINE_BYTES} bytes" in text, text
    assert f"{_core.ONESHOT_PAYLOAD_SLOTS} payload slots" in text, text
