"""The job's secret: RINGTREE_SECRET must carry 128 random bits, is stretched with a salt of the
job's own, and never shows in an error, a log line or a dump."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

import ringtree as rt
from ringtree import _launchers
from ringtree.secret import check_secret, new_secret

SECRET = "9d41c7a2e06b3f58c1d2e7a4b9f03c6e"
WEAK = ["hunter2", "correct horse battery staple", "0" * 32, "deadbeef" * 4, "0123456789abcdef" * 2, "a1b2c3d4" * 3]


def test_fresh_secrets_pass_the_check_and_the_command_prints_one():
    for _ in range(2000):  # a false refusal of a random secret would show here
        value = new_secret()
        assert len(value) == 32 and check_secret(value) == value
    out = subprocess.run([sys.executable, "-m", "ringtree.secret"], capture_output=True, text=True, timeout=60)
    printed = out.stdout.strip()
    assert out.returncode == 0 and len(printed) == 32 and int(printed, 16) >= 0 and check_secret(printed) == printed
    assert check_secret(SECRET.upper() + "\n") == SECRET.upper()  # case and a trailing newline do not matter


@pytest.mark.parametrize("weak", WEAK)
def test_a_guessable_secret_is_refused_without_showing_it(weak):
    with pytest.raises(rt.InvalidArgument, match="128 random bits") as raised:
        check_secret(weak)
    assert weak not in str(raised.value) and "python -m ringtree.secret" in str(raised.value)


def slurm_env(monkeypatch, secret):
    for name in ("RINGTREE_RANK", "RINGTREE_WORLD_SIZE", "RINGTREE_UNIQUE_ID", "RINGTREE_UNIQUE_ID_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RINGTREE_SECRET", secret)
    for name, value in dict(
        SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_JOB_ID="77", SLURM_STEP_ID="3", SLURM_STEP_NODELIST="127.0.0.1"
    ).items():
        monkeypatch.setenv(name, value)


def test_launchers_refuse_a_weak_secret_before_any_traffic(monkeypatch):
    slurm_env(monkeypatch, "hunter2")
    with pytest.raises(rt.InvalidArgument, match="RINGTREE_SECRET is refused"):
        _launchers.from_slurm()
    # And the c10d store path (torchrun, the torch backend) the same way.
    with pytest.raises(rt.InvalidArgument, match="RINGTREE_SECRET is refused"):
        _launchers.unique_id_through_store(None, "k", 1, 1.0)


def test_the_seeded_secret_is_salted_per_job(monkeypatch):
    slurm_env(monkeypatch, SECRET)
    _, _, token, _ = _launchers.from_slurm()
    salt = b"ringtree seeded unique id v2|29403|slurm|77|3|0"
    expected = hashlib.pbkdf2_hmac("sha256", SECRET.encode(), salt, 200_000, 32)[:16]
    assert token.rsplit(":", 1)[1] == expected.hex()
    # Another job (id, step or restart) at the same port: another salt, another secret.
    monkeypatch.setenv("SLURM_JOB_ID", "78")
    assert _launchers.from_slurm()[2] != token
    a = rt.UniqueId.from_seed("127.0.0.1", 29400, SECRET, "one job")
    b = rt.UniqueId.from_seed("127.0.0.1", 29400, SECRET, "another")
    assert str(a) != str(b)


def secret_of(token) -> str:
    return str(token).rsplit(":", 1)[1]


def test_no_error_echoes_a_token_or_a_grow_token():
    uid = rt.UniqueId.create()
    os.close(uid.take_listener())
    secret = secret_of(uid)
    for bad in (
        f"rt1:127.0.0.1:99999:{secret}",
        f"rt1:127.0.0.1:{uid.port}:{secret}0",
        f"rt2:127.0.0.1:{uid.port}:{secret}",
        f"rt1:127.0.0.1:{uid.port}:{secret[:-1]}X",
        secret,
    ):
        with pytest.raises(rt.InvalidArgument) as raised:
            rt.UniqueId.parse(bad)
        assert secret[:-1] not in str(raised.value) and secret[1:] not in str(raised.value), str(raised.value)
        with pytest.raises(rt.InvalidArgument) as raised:
            rt.init(0, 2, bad, timeout=1.0)
        assert secret[1:-1] not in str(raised.value)
    for bad_grow in (f"rtgrow1:2:x:{uid}", f"rtgrow:2:3:{uid}", f"rtgrow1:2:3:rt1:127.0.0.1:0:{secret}"):
        with pytest.raises(rt.InvalidArgument) as raised:
            rt.join(bad_grow, 0, timeout=1.0)
        assert secret[1:-1] not in str(raised.value), str(raised.value)


def test_a_failing_launch_shows_the_secret_nowhere(tmp_path):
    """A rank started with a malformed token: its exception, its log and its output."""
    secret = new_secret()
    env = dict(
        os.environ,
        RINGTREE_RANK="1",
        RINGTREE_WORLD_SIZE="2",
        RINGTREE_UNIQUE_ID=f"rt1:127.0.0.1:0:{secret}",
        RINGTREE_DUMP_DIR=str(tmp_path / "dumps"),
        RINGTREE_TIMEOUT="5",
    )
    code = "import logging, ringtree as rt\nlogging.basicConfig(level=logging.DEBUG)\nrt.init()"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "InvalidArgument" in out.stderr, out.stderr
    assert secret not in out.stdout + out.stderr and secret[4:20] not in out.stderr
    dumps = tmp_path / "dumps"
    for path in dumps.rglob("*") if dumps.exists() else []:
        assert secret not in path.read_text(errors="replace")
