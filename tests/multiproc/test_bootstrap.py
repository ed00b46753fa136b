"""Rendezvous as users really run it: a unique id made by a launcher that stays alive (or has
exited) and handed to the ranks as a token; and the handshake held to its wire byte for byte
(support/wire.py speaks it): a client right in every byte but one is refused by rank 0 and by a
mesh listener, a rank refuses a challenge right in every byte but one, and strangers knocking
on rank 0's port with every kind of bad hello neither delay nor stop the real ranks. Traffic
goes to loopback only, in bounded loops."""

from __future__ import annotations

import hmac
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
import wire
from harness import run_world, spawn_world
from test_errors import init_only as form_and_sum  # forms the world from the environment and sums the ranks

import ringtree as rt


def late_ranks_form(timeout=30.0, delay=1.5, flag=None):
    """Rank 0 listens at once; the other ranks arrive `delay` seconds later (or, given `flag`,
    once that file exists: at most 60 s), behind whatever strangers got to rank 0's port first."""
    if int(os.environ["RINGTREE_RANK"]) != 0:
        if flag is None:
            time.sleep(delay)
        else:
            deadline = time.monotonic() + 60
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.02)
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
    world = run_world(
        3, form_and_sum, dict(timeout=30.0), timeout=60, per_rank_env=lambda r: {"RINGTREE_UNIQUE_ID": str(uid)}
    )
    check_formed(world, 3)
    assert str(uid)  # the launcher still holds its id here


@pytest.mark.timeout(90)
def test_token_from_a_launcher_that_has_exited():
    made = subprocess.run(
        [sys.executable, "-c", "import ringtree as rt; print(rt.UniqueId.create())"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    token = made.stdout.strip()
    world = run_world(
        3, form_and_sum, dict(timeout=30.0), timeout=60, per_rank_env=lambda r: {"RINGTREE_UNIQUE_ID": token}
    )
    check_formed(world, 3)


# --- the handshake, byte for byte -------------------------------------------------------------


def star_bytes_but_one(secret, addr, rank, size):
    """One star handshake per byte a client sends (hello, proof, peer record), each with that
    byte flipped; what rank 0 made of each."""
    payload = wire.peer_record()
    total = wire.HELLO.size + 32 + len(payload)
    return [
        wire.client_handshake(secret, addr, wire.star_transcript(rank, size), payload, flip=i) for i in range(total)
    ]


def assert_all_refused(outcomes):
    for i, out in enumerate(outcomes):
        assert out.accepted is None, (i, out)
        assert out.answer in ("challenge", "refusal", "closed"), (i, out)


def expected_answer(offset):
    """What a server answers a hello whose byte at `offset` is flipped: nothing to a wrong magic
    or to a kind or peer it does not serve, a plain-text refusal to a wrong version, and a
    challenge to anything else (the claims are checked once the sender proved the secret)."""
    field = offset // 4
    if offset >= wire.HELLO.size:
        return "challenge"  # the proof or the payload: answered, then refused
    return {0: "closed", 1: "refusal", 2: "closed", 3: "challenge", 4: "challenge", 5: "closed"}.get(field, "challenge")


@pytest.mark.timeout(120)
def test_rank_0_refuses_a_hello_right_in_every_byte_but_one(tmp_path):
    uid = rt.UniqueId.create()
    os.close(uid.take_listener())  # rank 0, a subprocess, binds the port itself
    flag = str(tmp_path / "go")
    running = spawn_world(3, late_ranks_form, dict(timeout=60.0, flag=flag), unique_id=uid)
    try:
        deadline = time.monotonic() + 30
        while not wire_listening(uid) and time.monotonic() < deadline:
            time.sleep(0.05)
        # As rank 2, which has not come yet: a claim rank 0 may act on only once it is proved.
        outcomes = star_bytes_but_one(wire.secret_of(uid), (uid.ip, uid.port), 2, 3)
        assert_all_refused(outcomes)
        open(flag, "w").close()
        hung = running.wait(deadline=time.monotonic() + 90)
    finally:
        world = running.collect()
    assert not hung, world.failure_report()
    check_formed(world, 3)
    for i, out in enumerate(outcomes):
        assert out.answer == expected_answer(i), (i, out)
        # Rank 0's proof covers the hello as it read it: it checks out for the client exactly
        # when the hello arrived as the client meant it.
        assert out.server_proved == (out.answer == "challenge" and i >= wire.HELLO.size), (i, out)
    assert all("protocol version mismatch" in out.refusal_text for out in outcomes if out.answer == "refusal")


def wire_listening(uid):
    try:
        with socket.create_connection((uid.ip, uid.port), timeout=0.5):
            return True
    except OSError:
        return False


CHANNELS = (wire.CONTROL, wire.DATA, wire.MESSAGE)  # the test's rank asks for TCP: a data connection too


def rank_0_alone(timeout=20.0):
    """Rank 0 of a world whose other ranks the test plays."""
    return form_and_sum(timeout)


@pytest.mark.timeout(120)
def test_a_correct_rank_joins_and_a_mesh_listener_refuses_every_byte_but_one():
    uid = rt.UniqueId.create()
    running = spawn_world(1, rank_0_alone, dict(timeout=20.0), env={"RINGTREE_WORLD_SIZE": "2"}, unique_id=uid)
    secret = wire.secret_of(uid)
    try:
        # The model is right: a rank that gets every byte right is accepted, and the table
        # rank 0 hands it carries seals that check.
        deadline = time.monotonic() + 30
        while not wire_listening(uid) and time.monotonic() < deadline:
            time.sleep(0.05)
        t = wire.star_transcript(1, 2)
        star = wire.client_handshake(secret, (uid.ip, uid.port), t, wire.peer_record(), keep=True)
        assert star.server_proved and star.accepted == 0, star
        peers, setup = wire.read_table(star.sock, t.session_key(secret), 2)
        mesh = (uid.ip, peers[0][1])
        outcomes, joined = {}, {}
        for channel in CHANNELS:

            def mesh_t():
                return wire.Transcript(kind=channel, client_rank=1, server_rank=0, size=2, setup=setup)

            outcomes[channel] = [
                wire.client_handshake(secret, mesh, mesh_t(), flip=i) for i in range(wire.HELLO.size + 32)
            ]
            # The set-up id binds it: the right bytes for another set-up are refused.
            other = mesh_t()
            other.setup = bytes(16)
            assert wire.client_handshake(secret, mesh, other).accepted is None
            joined[channel] = wire.client_handshake(secret, mesh, mesh_t(), keep=True)
        star.sock.close()
        for out in joined.values():
            out.sock.close()
        hung = running.wait(deadline=time.monotonic() + 60)
    finally:
        world = running.collect()
    assert not hung, world.failure_report()
    for channel in CHANNELS:
        assert_all_refused(outcomes[channel])
        assert joined[channel].server_proved and joined[channel].accepted == 0, joined[channel]
    assert world.results[0]["raised"] is not None  # its rank 1 left: rank 0's set-up fails, as it should


def fake_rank_0(server, secret, flips):
    """Rank 0 as played by the test: for every byte of the challenge, one attempt of the real
    rank 1 answered with that byte flipped; then a right challenge, whose proof is checked and
    answered with an authenticated refusal that ends rank 1's set-up."""
    silent_after_flip, hellos = 0, set()
    for flip in list(range(flips)) + [None]:
        conn, _ = server.accept()
        conn.settimeout(10)
        t = wire.serve_challenge(conn, secret, wire.Transcript(0, 0, 0, 0), flip=flip)
        hellos.add((t.kind, t.client_rank, t.size, t.server_rank))
        if flip is not None:
            silent_after_flip += wire.recv_exact(conn, 1) == b""  # it sent no proof: it closed
            conn.close()
            continue
        proof = wire.recv_exact(conn, 32 + wire.PEER.size)
        good = hmac.compare_digest(proof[:32], t.mac(secret, "ringtree client", proof[32:]))
        text = b"the test ends here"
        conn.sendall(wire.ACCEPT.pack(1, len(text), t.accept_mac(secret, 1, text)) + text)
        conn.close()
        return {"silent_after_flip": silent_after_flip, "proof_good": good, "hellos": sorted(hellos)}


@pytest.mark.timeout(120)
def test_a_rank_refuses_a_challenge_right_in_every_byte_but_one():
    secret = os.urandom(16)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(60)
    result = {}
    box = threading.Thread(target=lambda: result.update(fake_rank_0(server, secret, wire.CHALLENGE.size)))
    box.start()
    token = f"rt1:127.0.0.1:{server.getsockname()[1]}:{secret.hex()}"
    try:
        world = run_world(
            1,
            form_and_sum,
            dict(timeout=40.0),
            timeout=90,
            env={"RINGTREE_RANK": "1", "RINGTREE_WORLD_SIZE": "2", "RINGTREE_UNIQUE_ID": token},
        )
    finally:
        box.join(timeout=30)
        server.close()
    res = world.check_ok()[0]
    assert result["silent_after_flip"] == wire.CHALLENGE.size, result  # no proof for any wrong challenge
    assert result["proof_good"] and result["hellos"] == [(wire.STAR, 1, 2, 0)], result
    assert res["raised"] == "BootstrapError" and res["message"] == "the test ends here", res


# --- strangers ----------------------------------------------------------------------------------


class Strangers:
    """Threads that knock on (ip, port) with bad hellos of every kind until stopped; each loop is
    bounded in count and time, and nothing leaves loopback."""

    def __init__(self, ip, port, wrong_secret):
        assert ip.startswith("127."), ip
        self.addr, self.wrong_secret = (ip, port), wrong_secret
        self.stop = threading.Event()
        self.stalled = []  # connections that sent part of a hello and went quiet
        self.counts = {}
        self.accepted = 0  # handshakes rank 0 accepted: must stay 0
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self.run, args=(kind,), daemon=True)
            for kind in ("slow", "slow", "slow", "garbage", "fields", "proofs", "flood")
        ]

    def payload(self, kind, rng):
        if kind == "garbage":
            return rng.randbytes(rng.choice([1, 7, wire.HELLO.size, 4096]))
        hello = wire.HELLO.pack(wire.HELLO_MAGIC, wire.VERSION, wire.STAR, 1, 3, 0, rng.randbytes(16))
        choice = rng.randrange(5)
        if choice == 0:
            return wire.HELLO.pack(wire.HELLO_MAGIC, 99, wire.STAR, -5, 1 << 30, 0, rng.randbytes(16))
        if choice == 1:
            return hello[: rng.randrange(1, wire.HELLO.size)]
        if choice == 2:
            return hello + b"\xff" * 10000  # a hello, then a proof of nothing
        if choice == 3:
            return wire.HELLO.pack(
                wire.HELLO_MAGIC,
                wire.VERSION,
                rng.randrange(-3, 9),
                rng.randrange(-3, 9),
                rng.randrange(-3, 9),
                rng.randrange(-3, 9),
                rng.randbytes(16),
            )
        return b"\0" * rng.choice([wire.HELLO.size, 65536])

    def run(self, kind):
        rng = random.Random(hash(kind) ^ threading.get_ident())
        deadline = time.monotonic() + 60
        n = 0
        while not self.stop.is_set() and time.monotonic() < deadline and n < 20000:
            n += 1
            if kind == "proofs":  # the whole protocol, with a secret that is not the job's
                try:
                    out = wire.client_handshake(
                        self.wrong_secret,
                        self.addr,
                        wire.star_transcript(1 + n % 2, 3),
                        wire.peer_record(),
                        timeout=2.0,
                    )
                    with self.lock:
                        self.accepted += out.accepted is not None
                except OSError:
                    time.sleep(0.01)
                continue
            try:
                s = socket.create_connection(self.addr, timeout=0.5)
            except OSError:
                time.sleep(0.01)
                continue
            try:
                if kind == "slow":
                    s.sendall(struct.pack("<I", wire.HELLO_MAGIC)[:3])  # three bytes of a header, then silence
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
    wrong = bytes(b ^ 0x80 for b in wire.secret_of(uid))  # right but for one bit in every byte
    with Strangers(uid.ip, uid.port, wrong) as strangers:
        world = run_world(
            3,
            late_ranks_form,
            dict(timeout=40.0, delay=1.5),
            timeout=90,
            per_rank_env=lambda r: {"RINGTREE_UNIQUE_ID": str(uid)},
        )
        # Formed while hundreds of stalled hellos were still held open.
        stalled_during = len(strangers.stalled)
    check_formed(world, 3)
    assert strangers.accepted == 0
    # The strangers had rank 0's port to themselves for 1.5 s before the real ranks came.
    assert stalled_during >= 50, stalled_during
    assert sum(strangers.counts.values()) >= 300, strangers.counts
    assert strangers.counts.get("proofs", 0) >= 5, strangers.counts
    # The stalled hellos held rank 0 up by no more than a few seconds (rank 0's time includes
    # the 1.5 s it waited for the late ranks).
    assert max(res["seconds"] for res in world.results) < 20, world.results
