"""A stranger against what a job leaves on the host: token files planted or symlinked in a shared
directory, dumps redirected through planted symlinks, names in /dev/shm and /proc/net/unix that
would give away the secret, and a flood on the ranks' doorbells. Where the tests run as root the
stranger is a second OS user (support/stranger.py); elsewhere the attacks that do not need one
run as this user, and the others skip, saying why."""

from __future__ import annotations

import glob
import json
import os
import re
import socket
import stat
import time

import numpy as np
import pytest
import stranger
from harness import run_world, spawn_world

import ringtree as rt
from ringtree import _launchers


def secret_hex_pieces(token, width=8):
    """Every `width` consecutive hex digits of the token's secret: none may show in a name."""
    hexed = str(token).rsplit(":", 1)[1]
    return [hexed[i : i + width] for i in range(len(hexed) - width + 1)]


def wait_for(path, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return os.path.exists(path)


def slurm_env(r, path):
    return {
        "RINGTREE_RANK": "",
        "RINGTREE_WORLD_SIZE": "",
        "RINGTREE_UNIQUE_ID": "",
        "SLURM_PROCID": str(r),
        "SLURM_NTASKS": "2",
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "RINGTREE_UNIQUE_ID_FILE": path,
    }


def init_and_sum(timeout=10.0):
    try:
        comm = rt.init(timeout=timeout)
        x = np.full(4, comm.rank + 1, np.int64)
        comm.all_reduce(x)
        comm.close()
        return {"raised": None, "sum": int(x[0])}
    except rt.Error as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}


# --- token files ------------------------------------------------------------------------------


def plant_token(ready, path, seconds):
    """The stranger plants a token file of its own, for a job that looks like the real one, and
    listens where it points, counting who comes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    with open(path, "w") as f:
        f.write(f"rt1:127.0.0.1:{srv.getsockname()[1]}:{os.urandom(16).hex()}\njob 4242.0.0\n")
    os.chmod(path, 0o644)
    ready()
    came = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            srv.accept()[0].close()
            came += 1
        except TimeoutError:
            pass
    return came


@pytest.mark.timeout(90)
def test_a_token_file_planted_by_another_user_is_refused_by_every_rank(other_user, shared_dir):
    path = os.path.join(shared_dir, "job.id")
    planter = stranger.Attacker(other_user, plant_token, path, 3.0)
    planter.wait_ready()
    world = run_world(2, init_and_sum, dict(timeout=5.0), timeout=60, per_rank_env=lambda r: slurm_env(r, path))
    came = planter.result(30)
    for res in world.check_ok():
        assert res["raised"] == "BootstrapError", res
        assert f"{path} " in res["message"] and f"uid {other_user.uid}" in res["message"], res
    assert came == 0  # nobody joined the planter's world
    assert os.stat(path).st_uid == other_user.uid  # untouched, not followed


@pytest.mark.timeout(90)
def test_a_symlinked_token_file_is_replaced_not_followed(tmp_path):
    path = str(tmp_path / "job.id")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    # Symlinks at the file's name and at the temporary name a writer that picks one might pick.
    for name in (path, path + ".tmp"):
        os.symlink(victim, name)
    world = run_world(2, init_and_sum, dict(timeout=20.0), timeout=60, per_rank_env=lambda r: slurm_env(r, path))
    for res in world.check_ok():
        assert res == {"raised": None, "sum": 3}, res
    assert victim.read_text() == "precious\n"
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    token, job = open(path).read().splitlines()
    assert token.startswith("rt1:127.0.0.1:") and job == "job 4242.0.0"


def test_token_file_readers_wait_out_links_loose_modes_and_other_jobs(tmp_path):
    token = str(rt.UniqueId.create())
    good = tmp_path / "good"
    _launchers.write_token_file(str(good), token, "7.1.0")
    assert _launchers._token_file_state(str(good), "7.1.0") == (token, None)
    assert stat.S_IMODE(os.stat(good).st_mode) == 0o600
    link = tmp_path / "link"
    os.symlink(good, link)
    loose = tmp_path / "loose"
    loose.write_text(f"{token}\njob 7.1.0\n")
    os.chmod(loose, 0o644)
    cases = {
        str(link): "symbolic link",
        str(loose): "mode is 0644",
        str(good): "stale",
        str(tmp_path / "absent"): "does not exist",
    }
    for path, why in cases.items():
        job = "8.1.0" if path == str(good) else "7.1.0"  # the good file is another job's here
        found, reason = _launchers._token_file_state(path, job)
        assert found is None and why in reason, (path, reason)
        with pytest.raises(rt.BootstrapError, match=why):
            _launchers.read_token_file(path, job, timeout=0.2)


# --- dumps --------------------------------------------------------------------------------------


def dump_when_told(shared, private, planted_flag, told_flag):
    """Writes its id and pid for the attacker, waits until the symlinks are planted, then dumps
    into the shared directory (Communicator.dump, and the automatic dump at close) and into a
    private one."""
    comm = rt.init(timeout=20.0)
    with open(told_flag + ".tmp", "w") as f:
        json.dump({"id": comm.id, "pid": os.getpid()}, f)
    os.replace(told_flag + ".tmp", told_flag)
    wait_for(planted_flag)
    out = {}
    try:
        out["shared"] = comm.dump(shared)
    except rt.Error as exc:
        out["shared_error"] = f"{type(exc).__name__}: {exc}"
    out["private"] = comm.dump(private)
    comm.close()  # RINGTREE_DUMP_ON_EXIT: the C++ writer tries the shared directory too
    return out


def plant_links(ready, shared, told, victim):
    """The attacker: symlinks to the victim at every name the dumps might use, then says so."""
    ready()
    if not wait_for(told, 30):
        return 0
    info = json.load(open(told))
    base = f"ringtree-{info['id']}-rank0.json"
    names = [base, f"{base}.tmp", f"{base}.tmp{info['pid']}"] + [f"{base}.tmp{p}" for p in range(1, 64)]
    for name in names:
        try:
            os.symlink(victim, os.path.join(shared, name))
        except FileExistsError:
            pass
    return len(names)


@pytest.mark.timeout(90)
def test_a_dump_through_planted_symlinks_writes_nothing_outside_its_directory(attacker_user, shared_dir, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    told, planted = "/tmp/" + os.path.basename(shared_dir) + ".told", str(tmp_path / "planted")
    private = str(tmp_path / "dumps")
    os.makedirs(private, mode=0o700)
    try:
        # The planter may not read the test's private folder: its id and pid come through /tmp.
        running = spawn_world(
            1,
            dump_when_told,
            dict(shared=shared_dir, private=private, planted_flag=planted, told_flag=told),
            env={"RINGTREE_DUMP_DIR": shared_dir, "RINGTREE_DUMP_ON_EXIT": "1"},
        )
        planter = stranger.Attacker(attacker_user, plant_links, shared_dir, told, str(victim))
        planter.wait_ready()
        planted_count = planter.result(40)
        # A stale link of this user's own at the name in its private folder: replaced, not followed.
        os.symlink(victim, os.path.join(private, f"ringtree-{json.load(open(told))['id']}-rank0.json"))
        open(planted, "w").close()
        hung = running.wait(deadline=time.monotonic() + 60)
        world = running.collect()
    finally:
        if os.path.exists(told):
            os.unlink(told)
    assert not hung, world.failure_report()
    res = world.check_ok()[0]
    assert planted_count > 3
    assert victim.read_text() == "precious\n"
    assert "writable by other users" in res["shared_error"], res
    assert "writable by other users" in world.outputs[0], world.outputs[0]  # the automatic dump refused it too
    # Nothing but the planter's links in the shared directory.
    assert all(os.path.islink(os.path.join(shared_dir, n)) for n in os.listdir(shared_dir)), os.listdir(shared_dir)
    st = os.lstat(res["private"])
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert json.load(open(res["private"]))["format"] == "ringtree-flight-recorder/1"


def test_a_dump_directory_of_another_user_is_refused(other_user, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, other_user.uid, other_user.gid)
    uid = rt.UniqueId.create()
    comm = rt.init(0, 1, uid)
    try:
        with pytest.raises(rt.InvalidArgument, match=f"belongs to uid {other_user.uid}"):
            comm.dump(str(theirs))
        assert os.listdir(theirs) == []
    finally:
        comm.close()


# --- names in shared namespaces ----------------------------------------------------------------


def hold_still(flag_dir, dump_dir):
    """Forms the world (shared memory), dumps, then waits in place while the test looks around."""
    comm = rt.init(timeout=20.0)
    x = np.full(8, comm.rank + 1.0, np.float32)
    comm.all_reduce(x)
    path = comm.dump(dump_dir)
    open(os.path.join(flag_dir, f"ready{comm.rank}"), "w").close()
    wait_for(os.path.join(flag_dir, "done"))
    out = {"id": comm.id, "dump": path, "sum": float(x[0]), "transport": comm.status().transports[1 - comm.rank]}
    comm.close()
    return out


@pytest.mark.timeout(90)
def test_names_in_shared_places_hold_no_bit_of_the_secret(tmp_path):
    uid = rt.UniqueId.create()
    dumps = str(tmp_path / "dumps")
    # Segments and doorbells have names in /dev/shm only during set-up: watch every one made.
    watcher = stranger.NameWatcher("/dev/shm")
    running = spawn_world(2, hold_still, dict(flag_dir=str(tmp_path), dump_dir=dumps), unique_id=uid)
    try:
        assert wait_for(str(tmp_path / "ready0")) and wait_for(str(tmp_path / "ready1"))
        time.sleep(0.1)
        unix_now = open("/proc/net/unix").read()
        dump_names = os.listdir(dumps)
        dump_text = "".join(open(os.path.join(dumps, n)).read() for n in dump_names)
        open(tmp_path / "done", "w").close()
        hung = running.wait(deadline=time.monotonic() + 60)
    finally:
        watcher.close()
        world = running.collect()
        fd = uid.take_listener()
        if fd >= 0:
            os.close(fd)
    assert not hung, world.failure_report()
    results = world.check_ok()
    assert [r["transport"] for r in results] == ["shm", "shm"] and results[0]["sum"] == 3.0, results
    pieces = secret_hex_pieces(uid)
    for where, text in (
        ("/dev/shm", " ".join(watcher.created)),
        ("/proc/net/unix", " ".join(watcher.unix)),
        ("dump names", " ".join(dump_names)),
        ("dumps", dump_text),
    ):
        assert not any(p in text for p in pieces), (where, text[:2000])
    # What was there: the segments under the public id, the doorbells' set-up folders; and once
    # set-up was over, no doorbell a name leads to (the listing keeps the path a socket was bound
    # to, but the path is gone).
    # Each name is its owner's own random draw: nothing of the public id (which names the dumps),
    # no rank, so no name can be derived from another.
    comm_id = results[0]["id"]
    # (Other jobs of the host may make names meanwhile: only this job's form is counted.)
    assert sum(bool(re.fullmatch(r"rt-[0-9a-f]{32}", n)) for n in watcher.created) >= 2, watcher.created
    assert sum(bool(re.fullmatch(r"ringtree-bell-[0-9a-f]{32}", n)) for n in watcher.created) >= 2
    assert not any(comm_id in n for n in watcher.created), watcher.created
    bells = [line.split()[7] for line in unix_now.splitlines()[1:] if "ringtree" in line]
    assert len(bells) >= 2 and not any(os.path.exists(b) or b.startswith("@") for b in bells), bells
    assert sorted(dump_names) == [f"ringtree-{comm_id}-rank0.json", f"ringtree-{comm_id}-rank1.json"]


# --- doorbells ----------------------------------------------------------------------------------


def wait_in_recv(flag_dir, quiet_s):
    """Rank 0 waits in a receive (blocked on its doorbell) while rank 1 stays quiet for quiet_s."""
    comm = rt.init(timeout=30.0)
    x = np.zeros(4, np.float32)
    if comm.rank == 0:
        open(os.path.join(flag_dir, "waiting"), "w").close()
        start = time.process_time()
        comm.recv(x, 1)
        cpu = time.process_time() - start
    else:
        time.sleep(quiet_s)
        x[:] = 7
        comm.send(x, 0)
        cpu = 0.0
    out = {"got": x.tolist(), "cpu_s": cpu, "transport": comm.status().transports[1 - comm.rank]}
    comm.close()
    return out


def flood_doorbells(ready, seconds):
    """Another user sends datagrams to every Unix socket name that could be a rank's doorbell."""
    ready()
    names = set()
    for line in open("/proc/net/unix").read().splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 8 and "ringtree" in cols[7]:
            names.add(cols[7])
    names.update(glob.glob("/dev/shm/ringtree*/*"))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.setblocking(False)
    accepted = tries = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and tries < 200_000:
        for name in names:
            tries += 1
            address = "\0" + name[1:] if name.startswith("@") else name
            try:
                s.sendto(b"x", address)
                accepted += 1
            except OSError:
                pass
        if not names:
            time.sleep(0.01)
    return {"names": sorted(names), "accepted": accepted, "tries": tries}


@pytest.mark.timeout(90)
def test_another_users_doorbell_flood_is_refused(attacker_user, tmp_path):
    running = spawn_world(2, wait_in_recv, dict(flag_dir=str(tmp_path), quiet_s=4.0))
    try:
        assert wait_for(str(tmp_path / "waiting"))
        flood = stranger.Attacker(attacker_user, flood_doorbells, 2.5)
        flood.wait_ready()
        flooded = flood.result(30)
        hung = running.wait(deadline=time.monotonic() + 60)
    finally:
        world = running.collect()
    assert not hung, world.failure_report()
    results = world.check_ok()
    assert results[0]["got"] == [7.0] * 4 and results[0]["transport"] == "shm", results
    # Nothing to ring: no doorbell has a name once set-up is over, and no datagram got through.
    assert flooded["accepted"] == 0, (flooded, results[0]["cpu_s"])


# --- names in /dev/shm squatted ahead of the job ----------------------------------------------------


def squat_names(ready, stop_file, seconds):
    """The stranger: watches /dev/shm and, for every name ringtree makes there, creates first
    every name it could derive from it: the other ranks' names under the same id (the earlier
    scheme, rt-<id>-<r> and ringtree-bell-<id>-<r>), and the name with a rank appended or with
    the other kind's prefix."""
    watcher = stranger.NameWatcher("/dev/shm")
    made = []

    def plant(name):
        path = os.path.join("/dev/shm", name)
        try:
            if name.startswith("ringtree-bell-"):
                os.mkdir(path, 0o777)
            else:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            made.append(path)
        except OSError:
            pass

    ready()
    seen = set()
    deadline = time.monotonic() + seconds
    while not os.path.exists(stop_file) and time.monotonic() < deadline:
        for name in list(watcher.created - seen):
            seen.add(name)
            if os.path.join("/dev/shm", name) in made:
                continue
            m = re.fullmatch(r"(rt|ringtree-bell)-([0-9a-f]+)(?:-(\d+))?", name)
            if not m:
                continue
            ident = m.group(2)
            for r in range(8):
                for prefix in ("rt", "ringtree-bell"):
                    plant(f"{prefix}-{ident}-{r}")
            for prefix in ("rt", "ringtree-bell"):
                plant(f"{prefix}-{ident}")
        time.sleep(0.001)
    watcher.close()
    for path in made:
        try:
            os.rmdir(path) if path.startswith("/dev/shm/ringtree-bell-") else os.unlink(path)
        except OSError:
            pass
    return len(made)


def form_and_sum_shm():
    comm = rt.init(timeout=30.0)
    x = np.full(4, comm.rank + 1, np.int64)
    comm.all_reduce(x)
    out = {"sum": int(x[0]), "transports": [t for q, t in enumerate(comm.status().transports) if q != comm.rank]}
    comm.close()
    return out


@pytest.mark.timeout(300)
def test_jobs_form_with_another_user_squatting_every_name_they_could_guess(other_user, shared_dir, private_shm):
    # In a /dev/shm of the test's own: the squatter must not meet other jobs of this host.
    stop_file = os.path.join(shared_dir, "stop")
    attacker = stranger.Attacker(other_user, squat_names, stop_file, 240.0, before_drop=private_shm.enter)
    attacker.wait_ready()
    try:
        for size in (4, 2, 4, 2):
            world = run_world(size, form_and_sum_shm, timeout=120, per_rank_prefix=private_shm.prefix)
            for res in world.check_ok():
                assert res["sum"] == size * (size + 1) // 2 and set(res["transports"]) == {"shm"}, res
    finally:
        open(stop_file, "w").close()
        planted = attacker.result(60)
    assert planted > 0, "the stranger never saw a name to squat"


# --- checkpoints ----------------------------------------------------------------------------------


def hostile_folder(ready, shared, victims):
    """The stranger makes the checkpoint folder first, open to all, with links at the names a
    save writes (final and the earlier fixed temporary ones) pointing at the victim's files."""
    folder = os.path.join(shared, "ckpt")
    os.mkdir(folder)
    os.chmod(folder, 0o777)
    names = ["shard-00000-of-00002.pt", "shard-00001-of-00002.pt", "metadata.pt", "metadata.json"]
    for name, victim in zip(names, victims * 2):
        os.symlink(victim, os.path.join(folder, name))
        os.symlink(victim, os.path.join(folder, name + ".tmp"))
    ready()
    return folder


def save_checkpoint(path):
    import torch
    import train_sharded

    torch.set_num_threads(1)
    comm = rt.init(timeout=60.0)
    trainer = train_sharded.Trainer(comm, stage=2, hidden=8, global_batch=4)
    trainer.step()
    try:
        trainer.save(path)
        out = {"raised": None}
    except rt.Error as exc:
        out = {"raised": type(exc).__name__, "message": str(exc)}
    comm.close()
    return out


@pytest.mark.timeout(200)
def test_a_checkpoint_in_a_folder_another_user_made_is_refused_and_writes_nothing(other_user, shared_dir, tmp_path):
    pytest.importorskip("torch")
    victims = [str(tmp_path / "precious-a"), str(tmp_path / "precious-b")]
    for v in victims:
        with open(v, "w") as f:
            f.write("the victim's own\n")
    attacker = stranger.Attacker(other_user, hostile_folder, shared_dir, victims)
    attacker.wait_ready()
    folder = attacker.result(30)
    world = run_world(2, save_checkpoint, dict(path=folder), timeout=150)
    for res in world.check_ok():
        assert res["raised"] == "InvalidArgument" and "belongs to uid" in res["message"], res
    for v in victims:
        assert open(v).read() == "the victim's own\n", v
    assert all(os.path.islink(os.path.join(folder, n)) for n in os.listdir(folder))  # nothing replaced


def test_checkpoint_folders_are_refused_when_others_may_swap_their_files(tmp_path, shared_dir):
    from ringtree._files import safe_folder

    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    with pytest.raises(rt.InvalidArgument, match="other users may write in it and it is not sticky"):
        safe_folder(open_folder, "save")
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(rt.InvalidArgument, match="symbolic link"):
        safe_folder(link, "save")
    # Under a sticky folder everyone writes in (like /tmp), a folder of one's own is fine.
    made = safe_folder(os.path.join(shared_dir, "mine", "step-1"), "save")
    assert os.path.isdir(made) and stat.S_IMODE(os.stat(made).st_mode) == 0o700


def test_checkpoint_files_replace_planted_links_and_never_follow_them(tmp_path):
    from ringtree._files import write_exclusive

    target = tmp_path / "elsewhere"
    target.write_text("keep")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "metadata.pt").symlink_to(target)
    (folder / "metadata.pt.tmp").symlink_to(target)
    write_exclusive(str(folder / "metadata.pt"), lambda f: f.write(b"new"))
    final = folder / "metadata.pt"
    assert not final.is_symlink() and final.read_bytes() == b"new" and target.read_text() == "keep"
    assert stat.S_IMODE(final.stat().st_mode) == 0o600
    assert sorted(os.listdir(folder)) == ["metadata.pt", "metadata.pt.tmp"]  # no temporary left


def hold_names(ready, names, stop_file, seconds):
    """The stranger: creates `names` in /dev/shm and holds them until told to stop."""
    made = []
    for name in names:
        path = os.path.join("/dev/shm", name)
        if name.startswith("ringtree-bell-"):
            os.mkdir(path, 0o777)
        else:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        made.append(path)
    ready()
    deadline = time.monotonic() + seconds
    while not os.path.exists(stop_file) and time.monotonic() < deadline:
        time.sleep(0.02)
    for path in made:
        os.rmdir(path) if "ringtree-bell-" in path else os.unlink(path)
    return len(made)


def form_or_fail():
    try:
        return {"raised": None, **form_and_sum_shm()}
    except rt.Error as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}


@pytest.mark.timeout(200)
def test_a_name_that_exists_is_never_used_set_up_draws_another(other_user, shared_dir, private_shm):
    zeros = "0" * 32
    stop_file = os.path.join(shared_dir, "stop")
    held = [f"rt-{zeros}", f"ringtree-bell-{zeros}"]
    attacker = stranger.Attacker(other_user, hold_names, held, stop_file, 150.0, before_drop=private_shm.enter)
    attacker.wait_ready()
    try:
        # Every rank's first two draws of each name are the held ones: it routes around them
        # (and around its peers' names too, drawn the same).
        taken = {"RINGTREE_TEST_SHM_NAMES_TAKEN": "2"}
        world = run_world(3, form_or_fail, env=taken, per_rank_prefix=private_shm.prefix, timeout=120)
        for res in world.check_ok():
            assert res["raised"] is None and res["sum"] == 6 and set(res["transports"]) == {"shm"}, res
        # Every draw taken: a clear error, not a name of someone else's.
        taken = {"RINGTREE_TEST_SHM_NAMES_TAKEN": "99"}
        world = run_world(2, form_or_fail, env=taken, per_rank_prefix=private_shm.prefix, timeout=120)
        for res in world.check_ok():
            assert res["raised"] == "BootstrapError" and "were all taken already" in res["message"], res
    finally:
        open(stop_file, "w").close()
        assert attacker.result(60) == 2
