"""Fixtures of the attack tests: a second OS user where the tests run as root."""

import os
import shutil
import tempfile

import pytest
import stranger


@pytest.fixture
def other_user():
    """A throwaway second OS user (made and removed here); skips, saying why, where none can be made."""
    try:
        with stranger.second_user() as user:
            yield user
    except stranger.StrangerUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def attacker_user():
    """The user an attack runs as: a throwaway second user where the tests run as root, else
    this user (for attacks that do not depend on being someone else)."""
    try:
        with stranger.second_user() as user:
            yield user
    except stranger.StrangerUnavailable:
        yield None


@pytest.fixture
def shared_dir():
    """A directory every user may write in, sticky like /tmp (made under /tmp so that a second
    user can reach it), removed afterwards."""
    path = tempfile.mkdtemp(prefix="ringtree-shared-", dir="/tmp")
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def private_shm():
    """A /dev/shm only the test's ranks and attacker see; skips, saying why, where none can be made."""
    try:
        shm = stranger.PrivateShm()
    except stranger.StrangerUnavailable as exc:
        pytest.skip(str(exc))
    yield shm
    shm.close()
