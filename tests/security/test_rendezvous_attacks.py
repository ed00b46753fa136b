"""A stranger against a job's rendezvous, on loopback: squatting rank 0's port, recording and
replaying the traffic between two ranks, computing the secret from a launcher's public facts,
stalling every listener, taking a reserved port. Where the tests run as root the stranger is a
second OS user (support/stranger.py); the attacks that do not need one run as this user elsewhere.
Every loop is bounded, every world has a hard timeout."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import stranger
import wire
from harness import run_world, spawn_world

import ringtree as rt


def holds_secret(data: bytes, secret: bytes, window: int = 6) -> bool:
    """Whether any `window` consecutive bytes of the secret, or of its hex, appear in data."""
    pieces = [secret[i : i + window] for i in range(len(secret) - window + 1)]
    text = secret.hex().encode()
    pieces += [text[i : i + 2 * window] for i in range(0, len(text) - 2 * window + 1)]
    return any(p in data for p in pieces)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(flag, seconds=60.0):
    deadline = time.monotonic() + seconds
    while flag and not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.02)


def form_and_sum(timeout=20.0, flag=None, late_ranks=(), env=None):
    """Forms the world from the environment (the ranks in late_ranks once `flag` exists), then
    one all_reduce of rank + 1; reports the sum or the error."""
    os.environ.update(env or {})
    me = int(os.environ.get("RINGTREE_TEST_SLOT", "0"))
    if me in late_ranks:
        wait_for(flag)
    start = time.monotonic()
    try:
        comm = rt.init(timeout=timeout)
        x = np.full(4, comm.rank + 1, np.int64)
        comm.all_reduce(x)
        comm.close()
        return {"raised": None, "sum": int(x[0]), "seconds": time.monotonic() - start}
    except rt.Error as exc:
        return {"raised": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}


# --- squatting rank 0's port -----------------------------------------------------------------


def squat(ready, port, seconds):
    """Listen on rank 0's port first, answer every hello as rank 0 would but without the secret,
    and keep every byte the ranks send."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(16)
    srv.settimeout(0.2)
    ready()
    captured = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(captured) < 200:
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            continue
        conn.settimeout(1.0)
        data = wire.recv_exact(conn, wire.HELLO.size)
        try:
            conn.sendall(wire.CHALLENGE.pack(wire.CHALLENGE_MAGIC, wire.VERSION, os.urandom(16), os.urandom(32)))
            while True:  # whatever else comes, until the rank gives up on this connection
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        captured.append(data.hex())
        conn.close()
    return captured


@pytest.mark.timeout(120)
def test_squatting_rank_0s_port_captures_nothing_usable(attacker_user):
    port = free_port()
    seed = os.urandom(16).hex()  # a strong shared secret: the port is fixed, as with RINGTREE_SECRET
    uid = rt.UniqueId.from_seed("127.0.0.1", port, seed)
    squatter = stranger.Attacker(attacker_user, squat, port, 7.0)
    squatter.wait_ready()
    world = run_world(2, form_and_sum, dict(timeout=5.0), timeout=60, unique_id=uid)
    captured = [bytes.fromhex(c) for c in squatter.result(30)]
    results = world.check_ok()
    assert results[0]["raised"] == "BootstrapError" and f"cannot listen on 127.0.0.1:{port}" in results[0]["message"], (
        results[0]
    )
    # The real rank 1 refuses the impostor, says so, and gives up only at its deadline.
    assert results[1]["raised"] == "BootstrapError", results[1]
    assert f"rank 0 at 127.0.0.1:{port} did not prove the job's secret" in results[1]["message"], results[1]
    assert captured, "rank 1 never reached the squatter"
    secret = wire.secret_of(uid)
    for data in captured:
        assert not holds_secret(data, secret), data.hex()
        # A hello and nothing more: no proof goes to a server that has not proved the secret.
        assert len(data) == wire.HELLO.size, data.hex()
        assert wire.HELLO.unpack(data)[:6] == (wire.HELLO_MAGIC, wire.VERSION, wire.STAR, 1, 2, 0)


# --- recording and replaying -------------------------------------------------------------------


class RecordingProxy:
    """Forwards one connection to `upstream`, keeping every byte both ways; once the client has
    gone quiet for a moment after its first bytes, replays all it sent on a connection of its
    own to `upstream`, and keeps what comes back."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(4)
        self.port = self.srv.getsockname()[1]
        self.to_server, self.to_client, self.replayed, self.replay_answer = bytearray(), bytearray(), b"", None
        self.last_client_byte = None
        self.threads = [threading.Thread(target=self.run, daemon=True)]

    def pump(self, src, dst, log, client_side):
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                log += chunk
                if client_side:
                    self.last_client_byte = time.monotonic()
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def run(self):
        self.srv.settimeout(30)
        client, _ = self.srv.accept()
        deadline = time.monotonic() + 30
        while True:  # rank 0 may not listen yet
            try:
                server = socket.create_connection(self.upstream)
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        pumps = [
            threading.Thread(target=self.pump, args=(client, server, self.to_server, True), daemon=True),
            threading.Thread(target=self.pump, args=(server, client, self.to_client, False), daemon=True),
        ]
        for t in pumps:
            t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (
            self.last_client_byte is None or time.monotonic() - self.last_client_byte < 0.5
        ):
            time.sleep(0.02)
        self.replayed = bytes(self.to_server)
        replay = socket.create_connection(self.upstream, timeout=5)
        replay.sendall(self.replayed)
        answer = b""
        try:
            while len(answer) < 1 << 20:
                chunk = replay.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except OSError:
            pass
        self.replay_answer = answer
        replay.close()


class LoopbackCapture:
    """Every frame on the loopback interface while it runs (root only: an AF_PACKET socket)."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        self.sock.bind(("lo", 0))
        self.sock.settimeout(0.1)
        self.data, self.stop = bytearray(), threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set() and len(self.data) < 256 << 20:
            try:
                self.data += self.sock.recv(1 << 16)
            except TimeoutError:
                continue

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close()
        return bytes(self.data)


@pytest.mark.timeout(120)
def test_a_recording_proxy_sees_no_secret_and_its_replay_is_refused(tmp_path):
    uid = rt.UniqueId.create()
    os.close(uid.take_listener())  # rank 0, a subprocess, binds the port itself
    secret = wire.secret_of(uid)
    proxy = RecordingProxy((uid.ip, uid.port))
    capture = LoopbackCapture() if os.geteuid() == 0 else None
    flag = str(tmp_path / "go")
    via_proxy = f"rt1:127.0.0.1:{proxy.port}:{secret.hex()}"
    # Rank 1 reaches rank 0 through the proxy; rank 2 comes once the replay is done, so rank 0
    # is still listening when it arrives. Everything goes over TCP, so the capture sees it all.
    running = spawn_world(
        3,
        form_and_sum,
        dict(timeout=40.0, flag=flag, late_ranks=[2]),
        unique_id=uid,
        env={"RINGTREE_TRANSPORT": "tcp"},
        per_rank_env=lambda r: {"RINGTREE_UNIQUE_ID": via_proxy} if r == 1 else {},
    )
    try:
        proxy.threads[0].start()
        proxy.threads[0].join(timeout=60)
        open(flag, "w").close()
        hung = running.wait(deadline=time.monotonic() + 90)
    finally:
        world = running.collect()
        captured = capture.close() if capture else b""
    assert not hung, world.failure_report()
    for res in world.check_ok():
        assert res["raised"] is None and res["sum"] == 6, res
    # Rank 1's hello, then its proof and peer record; then the sealed set-up messages, and no
    # byte of the secret anywhere.
    assert len(proxy.replayed) == wire.HELLO.size + 32 + wire.PEER.size, proxy.replayed.hex()
    assert not holds_secret(bytes(proxy.to_server) + bytes(proxy.to_client), secret)
    # The replay gets a fresh challenge, and its recorded proof (for another nonce) is refused.
    answer = proxy.replay_answer
    assert answer is not None and len(answer) == wire.CHALLENGE.size, answer
    assert wire.CHALLENGE.unpack(answer)[:2] == (wire.CHALLENGE_MAGIC, wire.VERSION)
    if capture is not None:
        assert len(captured) > 10_000, len(captured)  # it saw the run
        assert not holds_secret(captured, secret)


# --- secrets computed from a launcher's public facts ----------------------------------------


def join_with(ready, tokens, timeout):
    """The stranger: tries each token as rank 1 of a world of 2 and reports what it got."""
    os.environ.update(RINGTREE_TRANSPORT="tcp", RINGTREE_CACHE_DIR="off", RINGTREE_TIMEOUT=str(timeout))
    ready()
    out = []
    for token in tokens:
        try:
            comm = rt.init(1, 2, token, timeout=timeout)
            x = np.zeros(4, np.int64)
            comm.all_reduce(x)
            out.append({"joined": True, "received": x.tolist()})
            comm.close()
        except rt.Error as exc:
            out.append({"joined": False, "error": f"{type(exc).__name__}: {exc}"})
    return out


def clear_launcher_env(**extra):
    # run_world's own ringtree variables are blanked: only the launcher's remain to go by.
    return {"RINGTREE_RANK": "", "RINGTREE_WORLD_SIZE": "", "RINGTREE_UNIQUE_ID": "", **extra}


def slurm_env(r, step, **extra):
    return clear_launcher_env(
        SLURM_PROCID=str(r),
        SLURM_NTASKS="2",
        SLURM_LOCALID=str(r),
        SLURM_JOB_ID="4242",
        SLURM_STEP_ID=str(step),
        SLURM_STEP_NODELIST="127.0.0.1",
        **extra,
    )


def free_slurm_step() -> int:
    """A step id whose port under the old rule (29400 + step) is free here."""
    for step in range(1000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", 29400 + step))
                return step
            except OSError:
                continue
    pytest.skip("no free port in 29400..30399")


def stranger_tries(attacker_user, token, running, skip_ports=()):
    """The stranger tries the computed token where the launcher's facts point, and with the same
    secret at every port rank 0 listens on (anyone can list them in /proc/net/tcp)."""
    rank0 = running.procs[0]
    deadline = time.monotonic() + 20
    ports = set()
    while time.monotonic() < deadline and not ports and rank0.poll() is None:
        ports = stranger.listening_ports([rank0.pid]) - set(skip_ports)
        time.sleep(0.05)
    secret_hex = str(token).rsplit(":", 1)[1]
    tries = [str(token)] + [f"rt1:127.0.0.1:{p}:{secret_hex}" for p in sorted(ports)]
    attacker = stranger.Attacker(attacker_user, join_with, tries, 2.0)
    attacker.wait_ready()
    return attacker.result(60), ports


def attacked_world(attacker_user, tmp_path, computed, per_rank_env, skip_ports=()):
    """A world of 2 whose rank 1 comes late: meanwhile the stranger tries to take its seat."""
    flag = str(tmp_path / f"go-{time.monotonic_ns()}")
    running = spawn_world(2, form_and_sum, dict(timeout=40.0, flag=flag, late_ranks=[1]), per_rank_env=per_rank_env)
    try:
        attempts, ports = stranger_tries(attacker_user, computed, running, skip_ports)
        open(flag, "w").close()
        hung = running.wait(deadline=time.monotonic() + 90)
    finally:
        world = running.collect()
    assert not hung, world.failure_report()
    assert attempts and not any(a["joined"] for a in attempts), attempts
    return world.check_ok(), ports


@pytest.mark.timeout(150)
def test_a_token_computed_from_slurm_facts_cannot_join(attacker_user, tmp_path):
    step = free_slurm_step()
    # The job's facts, as the old rule turned them into rank 0's address and secret.
    computed = rt.UniqueId.from_seed("127.0.0.1", 29400 + step, f"slurm|4242|{step}|2")
    # Without a token file, a secret or MPI, the ranks refuse to start at all: nothing to join.
    results, _ = attacked_world(attacker_user, tmp_path, computed, lambda r: slurm_env(r, step))
    for res in results:
        assert res["raised"] == "InvalidArgument", res
        for option in ("RINGTREE_UNIQUE_ID_FILE", "RINGTREE_SECRET", "mpiexec", "RINGTREE_SINGLE_USER_CLUSTER"):
            assert option in res["message"], res
    # With a token file the job forms, though the stranger tried the computed secret everywhere.
    path = str(tmp_path / "job.id")
    results, ports = attacked_world(
        attacker_user, tmp_path, computed, lambda r: slurm_env(r, step, RINGTREE_UNIQUE_ID_FILE=path)
    )
    assert ports, "rank 0 was not seen listening"
    for res in results:
        assert res["raised"] is None and res["sum"] == 3, res


@pytest.mark.timeout(150)
def test_a_token_computed_from_torchrun_facts_cannot_join(attacker_user, tmp_path):
    pytest.importorskip("torch")
    master_port = free_port()
    # torchrun's agent runs the c10d store; the workers are its clients.
    agent = subprocess.Popen([sys.executable, "-c", AGENT_STORE, str(master_port)], stdout=subprocess.PIPE, text=True)
    try:
        assert agent.stdout.readline().strip() == "ready"
        # The run's facts, as the old rule turned them into rank 0's address and secret.
        computed = rt.UniqueId.from_seed("127.0.0.1", master_port + 1, f"run42|127.0.0.1|{master_port}|2")

        def torchrun_env(r):
            return clear_launcher_env(
                RANK=str(r),
                LOCAL_RANK=str(r),
                WORLD_SIZE="2",
                LOCAL_WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(master_port),
                TORCHELASTIC_RUN_ID="run42",
                TORCHELASTIC_USE_AGENT_STORE="True",
            )

        results, ports = attacked_world(attacker_user, tmp_path, computed, torchrun_env)
    finally:
        agent.kill()
        agent.wait()
    assert ports, "rank 0 was not seen listening"
    for res in results:
        assert res["raised"] is None and res["sum"] == 3, res


AGENT_STORE = """
import sys, time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 3, is_master=True, wait_for_workers=False)
print("ready", flush=True)
time.sleep(120)
"""


# --- stalling every listener -----------------------------------------------------------------


class Staller:
    """Opens `per_port` silent connections to every port the given processes listen on, as soon
    as it appears, and holds them until stopped (bounded in time and number)."""

    def __init__(self, pids, per_port=12, seconds=60):
        self.pids, self.per_port, self.seconds = pids, per_port, seconds
        self.held, self.ports = [], set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        deadline = time.monotonic() + self.seconds
        while not self.stop.is_set() and time.monotonic() < deadline and len(self.held) < 2000:
            for port in stranger.listening_ports(self.pids) - self.ports:
                self.ports.add(port)
                for _ in range(self.per_port):
                    try:
                        self.held.append(socket.create_connection(("127.0.0.1", port), timeout=0.5))
                    except OSError:
                        break
            time.sleep(0.02)

    def close(self):
        self.stop.set()
        self.thread.join()
        for s in self.held:
            s.close()


@pytest.mark.timeout(150)
def test_stalled_connections_on_every_listener_leave_setup_forming_in_seconds(tmp_path):
    flag = str(tmp_path / "go")
    running = spawn_world(3, form_and_sum, dict(timeout=60.0, flag=flag, late_ranks=[2]))
    staller = Staller([p.pid for p in running.procs])
    staller.thread.start()
    try:
        # Ranks 0 and 1 listen (rank 0's port, both mesh listeners): stall them all before the
        # last rank comes.
        deadline = time.monotonic() + 30
        while len(staller.ports) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        stalled_ports = len(staller.ports)
        open(flag, "w").close()
        hung = running.wait(deadline=time.monotonic() + 90)
    finally:
        staller.close()
        world = running.collect()
    assert not hung, world.failure_report()
    assert stalled_ports >= 3, stalled_ports
    results = world.check_ok()
    for res in results:
        assert res["raised"] is None and res["sum"] == 6, res
    # Formed in seconds, not the 2 s per stalled connection a listener that reads hellos one at
    # a time would take (24 s for the twelve on rank 0's mesh listener).
    assert results[2]["seconds"] < 10, results


# --- ports --------------------------------------------------------------------------------------


def take_port(ready, port):
    """Another user tries to bind and listen on a port a unique id reserved."""
    ready()
    out = {}
    for name, opts in (
        ("SO_REUSEADDR", [socket.SO_REUSEADDR]),
        ("SO_REUSEPORT", [socket.SO_REUSEPORT]),
        ("both", [socket.SO_REUSEADDR, socket.SO_REUSEPORT]),
    ):
        s = socket.socket()
        try:
            for opt in opts:
                s.setsockopt(socket.SOL_SOCKET, opt, 1)
            s.bind(("127.0.0.1", port))
            s.listen(1)
            out[name] = "listening"
        except OSError as exc:
            out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
        finally:
            s.close()
    return out


@pytest.mark.timeout(60)
def test_a_reserved_port_cannot_be_taken_by_another_user(other_user):
    uid = rt.UniqueId.create()  # bound, not listening yet: the launcher's reservation
    try:
        attacker = stranger.Attacker(other_user, take_port, uid.port)
        attacker.wait_ready()
        tried = attacker.result(30)
        assert tried == {"SO_REUSEADDR": "EADDRINUSE", "SO_REUSEPORT": "EADDRINUSE", "both": "EADDRINUSE"}, tried
        # The same user's rank 0 still can (it shares the port with its launcher).
        comm = rt.init(0, 1, uid)
        comm.close()
    finally:
        fd = uid.take_listener()
        if fd >= 0:
            os.close(fd)


def test_a_port_setting_out_of_range_is_an_error(monkeypatch):
    monkeypatch.setenv("RINGTREE_PORT", "70000")
    with pytest.raises(rt.InvalidArgument, match="RINGTREE_PORT=70000 is out of range"):
        rt.UniqueId.create()
    monkeypatch.setenv("RINGTREE_PORT", "-1")
    with pytest.raises(rt.InvalidArgument, match="out of range"):
        rt.UniqueId.create()
