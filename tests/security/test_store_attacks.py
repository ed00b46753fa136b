"""The c10d store as another user sees it: the torch backend under torchrun's environment (the
agent's store, as torchrun runs it) with RINGTREE_SECRET set, and under ringtree's own launcher.
Another user can list, read and write every key of a TCPStore it reaches; it must find no secret
there, and what it writes must not make a rank trust it."""

from __future__ import annotations

import datetime
import encodings.idna  # noqa: F401 - loaded here: the stranger's sockets need it and cannot read it
import os
import select
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import stranger
from harness import run_world, spawn_world

import ringtree as rt
from ringtree import _launchers

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402 - after the skip

SECRET = "5f0c2a9e4b7d18c3a6e2f9b04d7c1e58"  # the job's RINGTREE_SECRET (a valid one)

AGENT_STORE = """
import sys, time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 3, is_master=True, wait_for_workers=False)
print("ready", flush=True)
time.sleep(float(sys.argv[2]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_env(r, master_port, size=2, **extra):
    # run_world's own ringtree variables are blanked: only torchrun's remain to go by.
    return {
        "RINGTREE_RANK": "",
        "RINGTREE_WORLD_SIZE": "",
        "RINGTREE_UNIQUE_ID": "",
        "RANK": str(r),
        "LOCAL_RANK": str(r),
        "WORLD_SIZE": str(size),
        "LOCAL_WORLD_SIZE": str(size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": "run42",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        **extra,
    }


class AgentStore:
    """torchrun's agent: the c10d store the workers are clients of."""

    def __init__(self, seconds=150):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", AGENT_STORE, str(self.port), str(seconds)], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout.readline().strip() == "ready"

    def close(self):
        self.proc.kill()
        self.proc.wait()


def backend_sum(timeout=20.0, flag=None, late_ranks=(), late_timeout=None):
    """Rank body: the ringtree backend from the environment, one all_reduce of rank + 1. The
    ranks in late_ranks start once the file `flag` exists, with late_timeout if given."""
    import torch
    import torch.distributed as dist

    import ringtree.torch  # noqa: F401 - registers the backend

    me = int(os.environ["RANK"])
    if me in late_ranks:
        deadline = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.02)
        timeout = late_timeout or timeout
    try:
        dist.init_process_group("ringtree", timeout=datetime.timedelta(seconds=timeout))
        x = torch.full((4,), float(me + 1))
        dist.all_reduce(x)
        dist.destroy_process_group()
        return {"raised": None, "sum": float(x[0])}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return {"raised": type(exc).__name__, "message": str(exc)}


def read_every_key(ready, port, seconds):
    """The stranger: lists and reads every key of the store until the ringtree ids appear."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
    ready()
    seen = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for key in store.list_keys():
            if key not in seen:
                seen[key] = store.get(key).decode(errors="replace")
        if any("ringtree/uid/" in k for k in seen):
            break
        time.sleep(0.02)
    return seen


@pytest.mark.timeout(150)
def test_under_torchrun_with_a_secret_another_user_reads_no_secret_from_the_store(other_user):
    agent = AgentStore()
    try:
        attacker = stranger.Attacker(other_user, read_every_key, agent.port, 60.0)
        attacker.wait_ready()
        world = run_world(
            2,
            backend_sum,
            dict(timeout=30.0),
            per_rank_env=lambda r: torchrun_env(r, agent.port, RINGTREE_SECRET=SECRET),
            timeout=120,
        )
        seen = attacker.result(60)
    finally:
        agent.close()
    for res in world.check_ok():
        assert res["raised"] is None and res["sum"] == 3.0, res
    published = [v for k, v in seen.items() if "ringtree/uid/" in k]
    assert published, f"the stranger never saw the backend's key: {sorted(seen)}"
    for value in seen.values():
        assert SECRET not in value and "rt1:" not in value, value
    # What was published is public: address, port and salt; the secret they stand for (the
    # job's, stretched with that salt) is nowhere in the store.
    prefix, ip, port, salt = published[0].split(":")
    assert prefix == "rtp1" and len(salt) == 32, published
    derived = str(rt.UniqueId.from_seed(ip, int(port), SECRET, salt)).rsplit(":", 1)[1]
    assert not any(derived in v for v in seen.values())


def forge_rank_0(ready, store_port, forged_kind, seconds, victim_gone_fd):
    """The stranger: waits for the victim's rank 1 to count its group on the store, writes its
    own unique id under the key rank 1 reads, and waits as rank 0 of that id for rank 1, until
    rank 1 joins or is gone: a byte on victim_gone_fd says the victim's rank 1 has exited, and an
    exited rank can join no one."""
    import torch.distributed as dist

    os.environ.update(RINGTREE_TRANSPORT="tcp", RINGTREE_CACHE_DIR="off")
    store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=datetime.timedelta(seconds=10))
    ready()
    deadline = time.monotonic() + seconds
    key = None
    while key is None and time.monotonic() < deadline:
        key = next((k for k in store.list_keys() if k.endswith("ringtree/creations/rank1")), None)
        time.sleep(0.01)
    if key is None:
        return {"forged": False}
    uid_key = key.replace("ringtree/creations/rank1", "ringtree/uid/1")
    own = rt.UniqueId.create("127.0.0.1")
    if forged_kind == "full":  # what rank 1 trusted before: a whole token
        store.set(uid_key, str(own))
    else:  # the public form, with a salt of the stranger's
        store.set(uid_key, f"rtp1:{own.ip}:{own.port}:{os.urandom(16).hex()}")
    outcome = {}

    def play_rank_0():
        try:
            comm = rt.init(0, 2, str(own), timeout=seconds)
        except rt.Error as exc:
            outcome.update(joined=False, error=f"{type(exc).__name__}: {exc}")
            return
        outcome.update(joined=True)  # whatever follows: rank 1 took the stranger for rank 0
        x = np.zeros(4, np.float32)
        comm.all_reduce(x)
        comm.close()
        outcome.update(received=x.tolist())

    player = threading.Thread(target=play_rank_0, daemon=True)
    player.start()
    while player.is_alive() and not select.select([victim_gone_fd], [], [], 0.05)[0]:
        pass
    player.join(5.0)  # a join under way when rank 1 exited ends with rank 1's side of it
    return {"forged": True, "joined": False, "error": "rank 1 exited without joining", **outcome}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("forged_kind", ["full", "public"])
def test_under_torchrun_with_a_secret_a_forged_store_key_cannot_play_rank_0(other_user, tmp_path, forged_kind):
    agent = AgentStore()
    flag = str(tmp_path / "go")
    victim_gone_r, victim_gone_w = os.pipe()
    try:
        attacker = stranger.Attacker(other_user, forge_rank_0, agent.port, forged_kind, 25.0, victim_gone_r)
        attacker.wait_ready()
        # Rank 0 waits for the flag, so that the stranger's id is the one under the key when rank
        # 1 reads it; rank 0 only ever writes that key, so once rank 1 has read it (and ended,
        # however) rank 0 may go, and gives up on rank 1 within its own shorter timeout.
        running = spawn_world(
            2,
            backend_sum,
            dict(timeout=12.0, flag=flag, late_ranks=[0], late_timeout=4.0),
            per_rank_env=lambda r: torchrun_env(
                r, agent.port, RINGTREE_SECRET=SECRET, RINGTREE_TIMEOUT="4" if r == 0 else "12"
            ),
        )
        try:
            running.wait(ranks=[1], deadline=time.monotonic() + 90)
            os.write(victim_gone_w, b"x")
            open(flag, "w").close()
            attempt = attacker.result(90)
            hung = running.wait(deadline=time.monotonic() + 90)
        finally:
            world = running.collect()
    finally:
        agent.close()
        os.close(victim_gone_r)
        os.close(victim_gone_w)
    assert not hung, world.failure_report()
    assert attempt["forged"], attempt
    assert not attempt["joined"], attempt
    victim = world.results[1]
    assert victim["raised"] is not None, victim
    if forged_kind == "full":  # refused as it is read: it is no public form
        assert "ringtree/uid/1" in victim["message"] and "full token" in victim["message"], victim
    else:  # followed, but the stranger could not prove the secret
        assert "did not prove the job's secret" in victim["message"], victim


def launch_backend_sum():
    """Rank body under ringtree's launcher: ringtree.torch.init_process_group, one all_reduce,
    and what the store holds and where it listens."""
    import torch
    import torch.distributed as dist

    import ringtree.torch

    ringtree.torch.init_process_group()
    store = dist.distributed_c10d._get_default_store()
    x = torch.full((4,), float(dist.get_rank() + 1))
    dist.all_reduce(x)
    out = {"sum": float(x[0]), "pid": os.getpid()}
    if dist.get_rank() == 0:
        out["values"] = [store.get(k).decode(errors="replace") for k in store.list_keys()]
        out["listening"] = listening_addresses(os.getpid())
    dist.barrier()
    dist.destroy_process_group()
    return out


def listening_addresses(pid):
    """(family, local address) of every TCP socket `pid` listens on."""
    inodes = stranger.socket_inodes([pid])
    found = []
    for family in ("tcp", "tcp6"):
        with open(f"/proc/net/{family}") as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    found.append((family, cols[1].split(":")[0]))
    return found


@pytest.mark.timeout(150)
def test_under_ringtree_launch_the_backends_store_listens_on_loopback_and_holds_no_secret():
    world = run_world(2, launch_backend_sum, timeout=120)
    results = world.check_ok()
    assert all(r["sum"] == 3.0 for r in results), results
    root = results[0]
    # Loopback only: 127.0.0.1 in /proc/net/tcp (little-endian hex), nothing on tcp6's [::].
    assert root["listening"] and all(addr == "0100007F" for family, addr in root["listening"]), root["listening"]
    assert root["values"], root
    assert not any("rt1:" in v for v in root["values"]), root["values"]


# --- the shared store path, in one process -------------------------------------------------------


def test_without_a_secret_rank_0_warns_once_that_the_store_is_the_trust_anchor(monkeypatch, caplog):
    monkeypatch.delenv("RINGTREE_SECRET", raising=False)
    monkeypatch.setattr(_launchers, "_warned_store_anchor", False)
    store = dist.HashStore()
    with caplog.at_level("WARNING", logger="ringtree"):
        first = _launchers.unique_id_through_store(store, "k1", 0, 5.0)
        second = _launchers.unique_id_through_store(store, "k2", 0, 5.0)
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "RINGTREE_SECRET" in warnings[0].getMessage() and "python -m ringtree.secret" in warnings[0].getMessage()
    # Without a secret the whole token is what the store carries, and rank 1 takes it as is.
    assert _launchers.unique_id_through_store(store, "k1", 1, 5.0) == first != second
    for token in (first, second):
        os.close(rt.UniqueId.parse(token).take_listener())


def test_with_a_secret_every_rank_derives_the_id_and_salts_differ_per_job(monkeypatch):
    monkeypatch.setenv("RINGTREE_SECRET", SECRET)
    store = dist.HashStore()
    root_a = _launchers.unique_id_through_store(store, "a", 0, 5.0)
    root_b = _launchers.unique_id_through_store(store, "b", 0, 5.0)
    assert _launchers.unique_id_through_store(store, "a", 1, 5.0) == root_a
    a, b = store.get("a").decode(), store.get("b").decode()
    assert a.startswith("rtp1:") and SECRET not in a and root_a.rsplit(":", 1)[1] not in a
    assert a.split(":")[3] != b.split(":")[3]  # a fresh salt per job
    for token in (root_a, root_b):
        os.close(rt.UniqueId.parse(token).take_listener())


@pytest.mark.parametrize(
    "planted, secret",
    [("garbage", None), ("rt1:127.0.0.1:notaport:00", None), ("rt1:127.0.0.1:1:" + "ab" * 16, SECRET), ("1:2", SECRET)],
)
def test_a_malformed_store_value_is_a_bootstrap_error_naming_the_key(monkeypatch, planted, secret):
    if secret:
        monkeypatch.setenv("RINGTREE_SECRET", secret)
    else:
        monkeypatch.delenv("RINGTREE_SECRET", raising=False)
    store = dist.HashStore()
    store.set("ringtree/init/0/1", planted)
    with pytest.raises(rt.BootstrapError, match="ringtree/init/0/1") as raised:
        _launchers.unique_id_through_store(store, "ringtree/init/0/1", 1, 5.0)
    assert planted not in str(raised.value)


def test_rt_init_under_torchrun_reads_a_planted_key_as_a_bootstrap_error():
    """rt.init() under torchrun's environment, with rank 0 absent and the key planted first."""
    store_port = free_port()
    server = dist.TCPStore("127.0.0.1", store_port, 2, is_master=True, wait_for_workers=False)
    server.set("ringtree/init/0/1", "rtp1:127.0.0.1:x:y")
    env = dict(os.environ, **torchrun_env(1, store_port, RINGTREE_SECRET=SECRET, RINGTREE_TIMEOUT="10"))
    code = "import ringtree as rt\ntry:\n    rt.init()\nexcept rt.BootstrapError as e:\n    print('BootstrapError', e)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("BootstrapError") and "ringtree/init/0/1" in out.stdout, out.stdout + out.stderr
    assert SECRET not in out.stdout + out.stderr


def test_a_launcher_given_secret_derives_each_groups_id_by_hmac(monkeypatch):
    """Under ringtree's launcher the backend's groups derive their secrets from the world's:
    the store holds the public parts only, and both sides agree with UniqueId.child."""
    monkeypatch.delenv("RINGTREE_SECRET", raising=False)
    world = rt.UniqueId.create()
    os.close(world.take_listener())
    monkeypatch.setattr(_launchers, "_job_secret", None)
    _launchers.use_job_secret(world)
    store = dist.HashStore()
    root = _launchers.unique_id_through_store(store, "g1", 0, 5.0)
    assert _launchers.unique_id_through_store(store, "g1", 1, 5.0) == root
    _, ip, port, salt = store.get("g1").decode().split(":")
    assert root == str(world.child(ip, int(port), bytes.fromhex(salt)))
    assert str(world).rsplit(":", 1)[1] not in store.get("g1").decode()
    os.close(rt.UniqueId.parse(root).take_listener())
    _launchers.use_job_secret(None)


TORCHRUN_SCRIPT = """
import datetime, os, sys
import torch, torch.distributed as dist
import ringtree.torch  # registers the backend
dist.init_process_group("ringtree", timeout=datetime.timedelta(seconds=60))
x = torch.full((4,), float(dist.get_rank() + 1))
dist.all_reduce(x)
dist.barrier()
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}"), "w") as f:
    f.write(str(float(x[0])))
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.timeout(200)
def test_under_real_torchrun_with_a_secret_the_store_holds_none(other_user, tmp_path):
    """torchrun itself (its agent hosts the store at --master-port), another user listing and
    reading every key while the job runs."""
    script = tmp_path / "job.py"
    script.write_text(TORCHRUN_SCRIPT)
    port = free_port()
    attacker = stranger.Attacker(other_user, read_every_key_of_a_store_to_come, port, 120.0)
    attacker.wait_ready()
    ringtree_world = ("RINGTREE_RANK", "RINGTREE_WORLD", "RINGTREE_UNIQ")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ringtree_world)}
    env.update(RINGTREE_SECRET=SECRET, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2"]
    command += ["--master-addr", "127.0.0.1", "--master-port", str(port), str(script), str(tmp_path)]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=150)
    seen = attacker.result(150)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert [open(tmp_path / f"rank{r}").read() for r in range(2)] == ["3.0", "3.0"]
    published = [v for k, v in seen.items() if "ringtree/uid/" in k]
    assert published and all(v.startswith("rtp1:") for v in published), seen
    for value in seen.values():
        assert SECRET not in value and "rt1:" not in value, value
    assert "no RINGTREE_SECRET is set" not in run.stderr  # the warning is for jobs without one


def read_every_key_of_a_store_to_come(ready, port, seconds):
    """The stranger: connects to the store as soon as it listens, then reads every key."""
    ready()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            time.sleep(0.02)
    return read_every_key(lambda: None, port, max(1.0, deadline - time.monotonic()))
