"""Rendezvous as users really run it: a unique id made by a launcher that stays alive (or has
exited) and handed to the ranks as a token, and strangers knocking on rank 0's port with every
kind of bad hello while the real ranks arrive. Traffic goes to loopback only, in bounded loops."""
from __future__ import annotations

import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

import ringtree as rt
from harness import run_world
from test_errors import init_only as form_and_sum  # forms the world from the environment and sums the ranks

HELLO_MAGIC = 0x52544231  # "RTB1", bootstrap.cc
HELLO_BYTES = 4 + 4 + 16 + 4 * 3 + 2 + 1 + 1 + 16 + 64 + 8  # bootstrap.cc HelloWire


def late_ranks_form(timeout=30.0, delay=1.5):
    """Rank 0 listens at once; the other ranks arrive `delay` seconds later, behind whatever
    strangers got to rank 0's port first."""
    if int(os.environ["RINGTREE_RANK"]) != 0:
        time.sleep(delay)
    return form_and_sum(timeout)


def check_formed(world, nranks):
    for res in world.check_ok():
        assert res["raised"] is None, res
        assert res["sum"] == nranks * (nranks - 1) // 2, res


@pytest.mark.timeout(90)
def test_token_from_a_launcher_that_stays_alive():
    # This test process is the launcher: it made the id, keeps it (and its reserved port) while
    # the ranks run, and hands them only the token.
    uid = rt.UniqueId.create()
    world = run_world(3, form_and_sum, dict(timeout=30.0), timeout=60, per_rank_env=lambda r: {"RINGTREE_UNIQUE_ID": str(uid)})
    check_formed(world, 3)
    assert str(uid)  # the launcher still holds its id here


@pytest.mark.timeout(90)
def test_token_from_a_launcher_that_has_exited():
    made = subprocess.run([sys.executable, "-c", "import ringtree as rt; print(rt.UniqueId.create())"],
                          capture_output=True, text=True, timeout=60, check=True)
    token = made.stdout.strip()
    world = run_world(3, form_and_sum, dict(timeout=30.0), timeout=60, per_rank_env=lambda r: {"RINGTREE_UNIQUE_ID": token})
    check_formed(world, 3)


def hello(secret: bytes, *, magic=HELLO_MAGIC, version=2, rank=1, size=3) -> bytes:
    body = struct.pack("<II", magic, version) + secret + struct.pack("<iii", rank, size, 4242)
    body += struct.pack("<HBB", 1234, 0, 0) + b"127.0.0.1".ljust(16, b"\0") + b"stranger".ljust(64, b"\0")
    body += struct.pack("<Q", 0)  # shared-memory domain
    assert len(body) == HELLO_BYTES
    return body


class Strangers:
    """Threads that knock on (ip, port) with bad hellos of every kind until stopped; each loop is
    bounded in count and time, and nothing leaves loopback."""

    def __init__(self, ip, port, wrong_secret):
        assert ip.startswith("127."), ip
        self.addr, self.wrong_secret = (ip, port), wrong_secret
        self.stop = threading.Event()
        self.stalled = []  # connections that sent part of a hello and went quiet
        self.counts = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(kind,), daemon=True)
                        for kind in ("slow", "slow", "slow", "garbage", "fields", "flood")]

    def payload(self, kind, rng):
        if kind == "garbage":
            return rng.randbytes(rng.choice([1, 7, HELLO_BYTES, 4096]))
        # Hellos with the wrong secret, and truncated or oversized ones, and wrong versions
        choice = rng.randrange(5)
        if choice == 0:
            return hello(self.wrong_secret)
        if choice == 1:
            return hello(self.wrong_secret, version=99, rank=-5, size=1 << 30)
        if choice == 2:
            return hello(self.wrong_secret)[: rng.randrange(1, HELLO_BYTES)]
        if choice == 3:
            return hello(self.wrong_secret) + b"\xff" * 10000
        return b"\0" * rng.choice([HELLO_BYTES, 65536])

    def run(self, kind):
        rng = random.Random(hash(kind) ^ threading.get_ident())
        deadline = time.monotonic() + 60
        n = 0
        while not self.stop.is_set() and time.monotonic() < deadline and n < 20000:
            n += 1
            try:
                s = socket.create_connection(self.addr, timeout=0.5)
            except OSError:
                time.sleep(0.01)
                continue
            try:
                if kind == "slow":
                    s.sendall(struct.pack("<I", HELLO_MAGIC)[:3])  # three bytes of a header, then silence
                    with self.lock:
                        self.stalled.append(s)
                        if len(self.stalled) > 600:
                            self.stalled.pop(0).close()
                    continue
                if kind != "flood":
                    s.sendall(self.payload(kind, rng))
            except OSError:
                pass
            s.close()
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + n

    def __enter__(self):
        for t in self.threads:
            t.start()
        time.sleep(0.5)  # let the strangers get there first
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()
        with self.lock:
            for s in self.stalled:
                s.close()


@pytest.mark.timeout(120)
def test_strangers_cannot_delay_or_stop_rendezvous():
    uid = rt.UniqueId.create()
    os.close(uid.take_listener())  # rank 0, a subprocess, binds the port itself
    wrong = bytes(16)
    with Strangers(uid.ip, uid.port, wrong) as strangers:
        world = run_world(3, late_ranks_form, dict(timeout=40.0, delay=1.5), timeout=90,
                          per_rank_env=lambda r: {"RINGTREE_UNIQUE_ID": str(uid)})
        # Formed while hundreds of stalled hellos were still held open.
        stalled_during = len(strangers.stalled)
    check_formed(world, 3)
    # The strangers had rank 0's port to themselves for 1.5 s before the real ranks came.
    assert stalled_during >= 50, stalled_during
    assert sum(strangers.counts.values()) >= 300, strangers.counts
    # The stalled hellos held rank 0 up by no more than a few seconds (rank 0's time includes
    # the 1.5 s it waited for the late ranks).
    assert max(res["seconds"] for res in world.results) < 20, world.results
