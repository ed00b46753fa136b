"""A second OS user for the attack tests: where the tests run as root, a throwaway system user is
made (useradd -M -r, a unique name) and removed afterwards, failure included; the attacker's code
runs in a child forked from the test process that drops to that user (setgroups, setgid,
setuid). The child uses only what the test process has loaded already: the Python install may
live where the other user cannot read.

Where the tests do not run as root there is no second user: StrangerUnavailable says so, and a
test either skips with that reason or plays the stranger as the same user where the attack does
not depend on a second user (Attacker with user=None).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import select
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass


class StrangerUnavailable(RuntimeError):
    """No second OS user can be made here; the message says why."""


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


@contextlib.contextmanager
def second_user():
    """A fresh system user with no home and no login, removed on exit."""
    if os.geteuid() != 0:
        raise StrangerUnavailable("acting as a second OS user needs root (to create one and to switch to it)")
    if not shutil.which("useradd") or not shutil.which("userdel"):
        raise StrangerUnavailable("useradd/userdel are not installed")
    name = f"rtx{uuid.uuid4().hex[:12]}"
    made = subprocess.run(
        ["useradd", "-M", "-r", "-s", "/usr/sbin/nologin", name], capture_output=True, text=True, timeout=30
    )
    if made.returncode != 0:
        raise StrangerUnavailable(f"useradd failed: {made.stderr.strip()}")
    try:
        pw = pwd.getpwnam(name)
        yield User(name, pw.pw_uid, pw.pw_gid)
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=30)


class Attacker:
    """func(ready, *args) in a forked child, as `user` (None: this user). The child calls
    ready() once it is in place (listening, say); its return value (JSON) comes back through
    result(). Bounded: a child still running at result()'s timeout is killed. before_drop() runs
    in the child before it becomes `user` (PrivateShm.enter, say)."""

    def __init__(self, user: User | None, func, *args, before_drop=None):
        self._ready_r, ready_w = os.pipe()
        self._result_r, result_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns into the test
            code = 0
            try:
                os.close(self._ready_r)
                os.close(self._result_r)
                if before_drop is not None:  # what needs this process's privileges (a namespace)
                    before_drop()
                if user is not None:
                    os.setgroups([])
                    os.setgid(user.gid)
                    os.setuid(user.uid)
                os.chdir("/")

                def ready():
                    os.write(ready_w, b"r")

                out = json.dumps({"ok": func(ready, *args)})
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                out, code = json.dumps({"error": f"{type(exc).__name__}: {exc}"}), 1
            try:
                data = out.encode()
                while data:
                    data = data[os.write(result_w, data) :]
            finally:
                os._exit(code)
        os.close(ready_w)
        os.close(result_w)
        self._done = None

    def wait_ready(self, timeout=20.0):
        readable, _, _ = select.select([self._ready_r], [], [], timeout)
        if not readable or not os.read(self._ready_r, 1):
            raise RuntimeError(f"the attacker was not ready within {timeout} s: {self.result(1.0)}")

    def result(self, timeout=30.0):
        """The child's return value; raises if it failed or overran."""
        if self._done is None:
            deadline = time.monotonic() + timeout
            chunks = []
            while True:
                left = deadline - time.monotonic()
                readable, _, _ = select.select([self._result_r], [], [], max(0.0, left))
                if not readable:
                    os.kill(self.pid, signal.SIGKILL)
                    break
                chunk = os.read(self._result_r, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
            os.waitpid(self.pid, 0)
            os.close(self._result_r)
            os.close(self._ready_r)
            text = b"".join(chunks).decode()
            self._done = json.loads(text) if text else {"error": f"no result within {timeout} s (killed)"}
        if "error" in self._done:
            raise RuntimeError(f"the attacker failed: {self._done['error']}")
        return self._done["ok"]


def socket_inodes(pids) -> set:
    """The inodes of every socket `pids` hold open (as /proc/net/* lists them)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    return inodes


def listening_ports(pids, ip="127.0.0.1") -> set:
    """TCP ports on `ip` where any of `pids` listens (their sockets' inodes in /proc/net/tcp)."""
    inodes = socket_inodes(pids)
    want = "".join(f"{int(part):02X}" for part in reversed(ip.split(".")))
    ports = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            cols = line.split()
            local, state, inode = cols[1], cols[3], cols[9]
            if state == "0A" and inode in inodes and local.split(":")[0] == want:  # 0A: LISTEN
                ports.add(int(local.split(":")[1], 16))
    return ports


class NameWatcher:
    """Every name created in a directory while it runs (inotify, as any local user may use on
    /dev/shm), and every Unix socket name listed in /proc/net/unix while it polls."""

    IN_CREATE, IN_MOVED_TO = 0x100, 0x80

    def __init__(self, directory="/dev/shm"):
        import ctypes
        import threading

        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0 or libc.inotify_add_watch(self.fd, directory.encode(), self.IN_CREATE | self.IN_MOVED_TO) < 0:
            raise OSError(ctypes.get_errno(), f"inotify on {directory}")
        self.created, self.unix = set(), set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            readable, _, _ = select.select([self.fd], [], [], 0.005)
            if readable:
                data = os.read(self.fd, 1 << 16)
                at = 0
                while at + 16 <= len(data):  # struct inotify_event: wd, mask, cookie, len, name
                    length = int.from_bytes(data[at + 12 : at + 16], "little")
                    self.created.add(data[at + 16 : at + 16 + length].rstrip(b"\0").decode(errors="replace"))
                    at += 16 + length
            with open("/proc/net/unix") as f:
                for line in f.read().splitlines()[1:]:
                    cols = line.split()
                    if len(cols) >= 8:
                        self.unix.add(cols[7])

    def close(self):
        self.stop.set()
        self.thread.join()
        os.close(self.fd)


class PrivateShm:
    """A /dev/shm of the test's own (a fresh tmpfs in a mount namespace a holder process keeps),
    so that an attack on names there meets only the ranks the test starts in it (prefix) and
    the attacker (Attacker(..., before_drop=enter)), never other processes of the host."""

    CLONE_NEWNS = 0x00020000

    def __init__(self):
        if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
            raise StrangerUnavailable("a private /dev/shm needs root, unshare and nsenter")
        self.holder = subprocess.Popen(
            ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o mode=1777 none /dev/shm && echo ready && exec sleep 900"],
            stdout=subprocess.PIPE,
            text=True,
        )
        if self.holder.stdout.readline().strip() != "ready":
            self.close()
            raise StrangerUnavailable("cannot mount a private /dev/shm (unshare -m, mount -t tmpfs)")
        self.ns = f"/proc/{self.holder.pid}/ns/mnt"

    def prefix(self, rank=None):
        """The command prefix that runs a rank in the namespace."""
        return ["nsenter", f"--mount={self.ns}", "--"]

    def enter(self):
        """Moves this (single-threaded) process into the namespace."""
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(self.ns, os.O_RDONLY)
        try:
            if libc.setns(fd, self.CLONE_NEWNS) != 0:
                raise OSError(ctypes.get_errno(), "setns")
        finally:
            os.close(fd)

    def close(self):
        self.holder.kill()
        self.holder.wait()
