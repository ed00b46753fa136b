"""Where rank, size and the unique id come from, in this order of precedence:

1. explicit arguments to init();
2. RINGTREE_RANK, RINGTREE_WORLD_SIZE, RINGTREE_UNIQUE_ID (ringtree.launch, Slurm, tests);
3. mpiexec (MPICH or Open MPI, also srun with PMI): rank 0 makes the unique id and mpi4py
   broadcasts it;
4. torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): rank 0 makes the unique id and hands
   it to the others through the c10d store torchrun already runs (only its address and a random
   salt when RINGTREE_SECRET is set: the ranks then stretch that secret themselves);
5. Slurm (SLURM_PROCID, SLURM_NTASKS): the token from RINGTREE_UNIQUE_ID_FILE (rank 0 writes
   it there, private to this user; the others wait for it), else rank 0 listens on the first
   host of the step's node list at RINGTREE_PORT (default 29400 + SLURM_STEP_ID % 1000) with
   the secret stretched from RINGTREE_SECRET; with neither, init() refuses, naming the options,
   unless RINGTREE_SINGLE_USER_CLUSTER=1 allows a secret derived from the job's public facts;
6. no launcher: a world of one.

No secret is derived from facts another user can read (job ids, ports, host names) unless
RINGTREE_SINGLE_USER_CLUSTER=1 says that every user who can reach the nodes is trusted.

When the ranks span hosts and RINGTREE_ADDR is not set, rank 0 listens on a routable address:
that of RINGTREE_IFNAME (like NCCL_SOCKET_IFNAME), else of the first interface that is up and
not loopback.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import logging
import os
import re
import secrets
import socket
import stat
import struct
import time

from . import _core, _settings
from .secret import check_secret

_MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")


def _env_int(name):
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise _core.InvalidArgument(f"{name}={value!r} is not an integer") from None


def from_ringtree_env():
    rank, size = _settings.get_int("RINGTREE_RANK"), _settings.get_int("RINGTREE_WORLD_SIZE")
    token = _settings.get("RINGTREE_UNIQUE_ID")
    if rank is None and size is None and not token:
        return None
    missing = [n for n, v in (("RINGTREE_RANK", rank), ("RINGTREE_WORLD_SIZE", size)) if v is None]
    if size is not None and size > 1 and not token:
        missing.append("RINGTREE_UNIQUE_ID")
    if missing:
        raise _core.InvalidArgument(f"incomplete ringtree environment: {', '.join(missing)} not set")
    return rank, size, token or None, "env"


def interface_address(name):
    """The IPv4 address of network interface `name`, or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None


def routable_address():
    """RINGTREE_IFNAME's address, else the first non-loopback interface's (None if none)."""
    wanted = _settings.get("RINGTREE_IFNAME")
    if wanted:
        addr = interface_address(wanted)
        if addr is None:
            raise _core.InvalidArgument(f"RINGTREE_IFNAME={wanted!r}: no such interface with an IPv4 address")
        return addr
    for _, name in socket.if_nameindex():
        addr = interface_address(name)
        if addr and not addr.startswith("127."):
            return addr
    return None


def create_unique_id(spans_hosts):
    """A fresh unique id for rank 0; on a multi-host job it listens on a routable address."""
    if spans_hosts and not _settings.given("RINGTREE_ADDR"):
        addr = routable_address()
        if addr:
            _settings.put(os.environ, "RINGTREE_ADDR", addr)  # read by UniqueId.create(); also this rank's later ids
    return _core.UniqueId.create()


def from_mpi():
    if not any(os.environ.get(v) for v in _MPI_SIZE_VARS):
        return None
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise _core.InvalidArgument(
            "started by mpiexec but mpi4py is not installed; pip install 'ringtree[mpi]' "
            "or set RINGTREE_RANK/RINGTREE_WORLD_SIZE/RINGTREE_UNIQUE_ID"
        ) from exc
    world = MPI.COMM_WORLD
    hosts = world.allgather(socket.gethostname())
    token = str(create_unique_id(len(set(hosts)) > 1)) if world.Get_rank() == 0 else None
    token = world.bcast(token, root=0)
    return world.Get_rank(), world.Get_size(), token, "mpi"


def first_host(nodelist):
    """The first host of a Slurm node list: 'gpu[07-09,12],cpu1' -> 'gpu07'."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise _core.InvalidArgument(f"cannot read the Slurm node list {nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def _port_setting(default):
    """RINGTREE_PORT, else (0 or unset) `default`."""
    value = _settings.get("RINGTREE_PORT") or "0"
    try:
        port = int(value)
    except ValueError:
        raise _core.InvalidArgument(f"RINGTREE_PORT={value!r} is not an integer") from None
    if port == 0:
        return default
    if not 1 <= port <= 65535:
        raise _core.InvalidArgument(f"RINGTREE_PORT={port} is out of range: a TCP port is 1..65535")
    return port


def _timeout_setting():
    value = _settings.get("RINGTREE_TIMEOUT")
    try:
        return float(value)
    except ValueError:
        raise _core.InvalidArgument(f"RINGTREE_TIMEOUT={value!r} is not a number of seconds") from None


# --- token files ------------------------------------------------------------------------------


def write_token_file(path, token, job):
    """Rank 0's side of RINGTREE_UNIQUE_ID_FILE: the token and the job it belongs to, in a file
    only this user can read, written to a fresh exclusive name (never through a symlink) and
    renamed over `path`, so a file or symlink planted there is replaced, never followed, and
    readers never see half a token."""
    path = os.path.abspath(path)
    try:
        owner = os.lstat(path).st_uid
    except FileNotFoundError:
        owner = os.geteuid()
    if owner != os.geteuid():
        raise _core.BootstrapError(
            f"RINGTREE_UNIQUE_ID_FILE {path} exists and belongs to uid {owner}, not to this user "
            f"(uid {os.geteuid()}): refusing to use it; choose a path in a directory only you can write"
        )
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{token}\njob {job}\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _token_file_state(path, job):
    """(token, None) when `path` holds this job's token and passes the checks; (None, why not)
    while it may still come. A file of another user's raises at once: rank 0 of this job is
    this user, and could not replace it in a shared directory anyway."""
    try:
        owner = os.lstat(path).st_uid
    except FileNotFoundError:
        return None, "it does not exist"
    if owner != os.geteuid():
        raise _core.BootstrapError(
            f"RINGTREE_UNIQUE_ID_FILE {path} belongs to uid {owner}, not to this user (uid {os.geteuid()}): "
            f"refusing it (planted by someone else?); choose a path in a directory only you can write"
        )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, "it is a symbolic link (rank 0 writes a regular file)"
        return None, f"it cannot be opened ({exc.strerror})"
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None, "it is not a regular file"
        if st.st_uid != os.geteuid():
            return None, f"it belongs to uid {st.st_uid}"
        if st.st_mode & 0o077:
            return None, f"its mode is {stat.S_IMODE(st.st_mode):04o} (rank 0 writes it 0600)"
        lines = f.read(4096).splitlines()
    if len(lines) < 2 or lines[1] != f"job {job}":
        found = lines[1] if len(lines) >= 2 else "no job line"
        return None, f"it is stale: it names {found!r}, this is job {job}"
    return lines[0].strip(), None


def read_token_file(path, job, timeout):
    """The other ranks' side: waits up to `timeout` seconds for rank 0's token for this job."""
    deadline = time.monotonic() + timeout
    while True:
        token, why = _token_file_state(path, job)
        if token:
            return token
        if time.monotonic() > deadline:
            raise _core.BootstrapError(
                f"RINGTREE_UNIQUE_ID_FILE {path}: rank 0 never wrote this job's unique id "
                f"within {timeout} s (last look: {why})"
            )
        time.sleep(0.05)


# --- Slurm --------------------------------------------------------------------------------------

_SLURM_NEEDS = (
    "ringtree under Slurm without MPI needs a secret that other users cannot compute from the job's "
    "public facts. Give one of: RINGTREE_UNIQUE_ID_FILE=<path every rank can read> (rank 0 writes a "
    "private token there); RINGTREE_SECRET=<32 random hex digits: python -m ringtree.secret> in every rank's "
    "environment; or "
    "launch with mpiexec, or srun --mpi=pmi2/pmix with mpi4py installed (MPI hands out the id). "
    "RINGTREE_SINGLE_USER_CLUSTER=1 derives the secret from the job id as before, for clusters where "
    "every user who can reach the nodes is trusted."
)


def from_slurm():
    rank, size = _env_int("SLURM_PROCID"), _env_int("SLURM_NTASKS")
    if rank is None or size is None:
        return None
    step = _env_int("SLURM_STEP_ID") or 0
    path = _settings.get("RINGTREE_UNIQUE_ID_FILE")
    if path:
        job = f"{os.environ.get('SLURM_JOB_ID', '')}.{step}.{os.environ.get('SLURM_RESTART_COUNT', '0')}"
        if rank == 0:
            nodes = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or "1"
            token = str(create_unique_id(int(nodes) > 1))
            write_token_file(path, token, job)
        else:
            token = read_token_file(path, job, _timeout_setting())
        return rank, size, token, "slurm"
    secret = env_secret()
    if not secret and not _settings.get_flag("RINGTREE_SINGLE_USER_CLUSTER"):
        raise _core.InvalidArgument(_SLURM_NEEDS)
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise _core.InvalidArgument(
            "Slurm job without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST; set "
            "RINGTREE_UNIQUE_ID_FILE to a path every rank can read"
        )
    port = _port_setting(29400 + step % 1000)
    job = os.environ.get("SLURM_JOB_ID", "")
    seed = secret or f"slurm|{job}|{step}|{size}"
    # No channel here carries a random salt to every rank: the salt is the job's own ids, which no
    # two jobs share, so a dictionary stretched for one job serves no other.
    salt = f"slurm|{job}|{step}|{os.environ.get('SLURM_RESTART_COUNT', '0')}"
    uid = _core.UniqueId.from_seed(first_host(nodelist), port, seed, salt)
    return rank, size, str(uid), "slurm"


# --- c10d stores (torchrun, and the torch backend under any launcher) ---------------------------

_inits_through_store = 0  # rt.init() calls under torchrun in this process: each reads its own key
_stores = []  # kept: where rank 0 hosts the c10d store, the others may read the id until they all joined
_PUBLIC_PREFIX = "rtp1"  # what goes through a store when the secret does not: rtp1:<ip>:<port>:<salt>
_SALT_HEX = 32
_job_secret = None  # set by ringtree.torch.init_process_group: a UniqueId derived from its world's
_warned_store_anchor = False
_log = logging.getLogger("ringtree")


def job_secret():
    """What the job's ranks share outside any store, or None: the unique id a launcher of ours
    handed the torch backend (use_job_secret), else RINGTREE_SECRET once it passes check_secret."""
    return _job_secret if _job_secret is not None else env_secret()


def env_secret():
    """RINGTREE_SECRET once it passes check_secret, else None."""
    value = _settings.get("RINGTREE_SECRET")
    return check_secret(value) if value else None


def use_job_secret(uid):
    """Later stores (the torch backend's groups) carry only public parts; each group's secret is
    an HMAC of uid's over its salt (uid's secret is random: no stretching needed). None: back
    to RINGTREE_SECRET."""
    global _job_secret
    _job_secret = uid


def _derived(secret, ip, port, salt):
    """The unique id at ip:port from the job's secret and a salt (32 hex digits)."""
    if isinstance(secret, str):  # RINGTREE_SECRET: stretched, it may have been chosen by a person
        return str(_core.UniqueId.from_seed(ip, port, secret, salt))
    return str(secret.child(ip, port, bytes.fromhex(salt)))


def _warn_store_is_the_anchor():
    global _warned_store_anchor
    if _warned_store_anchor:
        return
    _warned_store_anchor = True
    _log.warning(
        "ringtree: no RINGTREE_SECRET is set, so the job's unique id (its secret included) goes through "
        "torch's c10d store, which has no authentication: whoever can reach the store can read it and join, "
        "or write another and stand in for rank 0. Set RINGTREE_SECRET to the same value on every rank "
        "(make one with `python -m ringtree.secret`); only rank 0's address then goes through the store."
    )


def _bad_store_value(key, why):
    return _core.BootstrapError(
        f"the c10d store's key {key!r} holds no ringtree unique id ({why}; the value is not shown): "
        f"was it written by something other than this job's rank 0?"
    )


def _read_public(key, value):
    """(ip, port, salt) from a store value rtp1:<ip>:<port>:<salt>."""
    parts = value.split(":")
    if len(parts) != 4 or parts[0] != _PUBLIC_PREFIX:
        why = "a full token, though the job has a secret" if value.startswith("rt1:") else "not rtp1:<ip>:<port>:<salt>"
        raise _bad_store_value(key, why)
    _, ip, port, salt = parts
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise _bad_store_value(key, "a bad port")
    if len(salt) != _SALT_HEX or any(c not in "0123456789abcdef" for c in salt):
        raise _bad_store_value(key, "a bad salt")
    return ip, int(port), salt


def spans_hosts_under_torch(size):
    """Whether a torch-launched job runs on more than one host (LOCAL_WORLD_SIZE < WORLD_SIZE)."""
    local = _env_int("LOCAL_WORLD_SIZE")
    return local is not None and local < size


def unique_id_through_store(store, key, rank, timeout, spans_hosts=False):
    """The job's unique id through a c10d store, rank 0 publishing it under `key`: the one path
    of rt.init() under torchrun and of the torch backend under every launcher.

    With a job secret (RINGTREE_SECRET) only rank 0's address, port and a fresh random salt go
    through the store; every rank stretches the secret with that salt itself, so nothing read
    from the store is ever the secret, and a value another user writes there cannot make a rank
    trust an impostor (it would have to prove the secret). Without one, the whole token does:
    the store is then the job's trust anchor (as for NCCL's unique id), which rank 0 says once."""
    secret = job_secret()
    if rank == 0:
        uid = create_unique_id(spans_hosts)
        if secret is None:
            _warn_store_is_the_anchor()
            store.set(key, str(uid))
            return str(uid)
        salt = secrets.token_hex(_SALT_HEX // 2)
        store.set(key, f"{_PUBLIC_PREFIX}:{uid.ip}:{uid.port}:{salt}")
        return _derived(secret, uid.ip, uid.port, salt)
    store.wait([key], datetime.timedelta(seconds=timeout))
    value = store.get(key).decode(errors="replace")
    if secret is None:
        try:
            _core.UniqueId.parse(value)
        except _core.InvalidArgument:
            raise _bad_store_value(key, "not rt1:<ipv4>:<port>:<32 hex digits>") from None
        return value
    ip, port, salt = _read_public(key, value)
    return _derived(secret, ip, port, salt)


def _token_through_torch_store(rank, size):
    """rt.init() under torchrun: the unique id through the c10d store torchrun runs (the agent's,
    or rank 0's own at MASTER_ADDR:MASTER_PORT)."""
    global _inits_through_store
    import torch.distributed as dist  # torchrun comes with torch

    timeout = _timeout_setting()
    store = next(dist.rendezvous("env://", rank, size, timeout=datetime.timedelta(seconds=timeout)))[0]
    _stores[:] = [store]  # a second rank-0 store in this process shares this one's server (multi-tenant)
    _inits_through_store += 1
    key = f"ringtree/init/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{_inits_through_store}"
    return unique_id_through_store(store, key, rank, timeout, spans_hosts_under_torch(size))


def from_torchrun():
    rank, size = _env_int("RANK"), _env_int("WORLD_SIZE")
    addr, port = os.environ.get("MASTER_ADDR"), _env_int("MASTER_PORT")
    if rank is None or size is None or not addr or port is None:
        return None
    if size == 1:
        return rank, size, None, "torchrun"
    return rank, size, _token_through_torch_store(rank, size), "torchrun"


def detect():
    # torchrun before Slurm: a torchrun inside a Slurm allocation also sees SLURM_* variables.
    for source in (from_ringtree_env, from_mpi, from_torchrun, from_slurm):
        found = source()
        if found is not None:
            return found
    return 0, 1, None, "single"
