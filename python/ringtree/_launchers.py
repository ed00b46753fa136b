"""Where rank, size and the unique id come from, in this order of precedence:

1. explicit arguments to init();
2. RINGTREE_RANK, RINGTREE_WORLD_SIZE, RINGTREE_UNIQUE_ID (ringtree.launch, Slurm, tests);
3. mpiexec (MPICH or Open MPI): rank 0 makes the unique id and mpi4py broadcasts it;
4. torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): rank 0 listens on MASTER_PORT + 1
   (or RINGTREE_PORT); the secret derives from TORCHELASTIC_RUN_ID and the master address,
   or from RINGTREE_SECRET when set (set it on shared hosts);
5. Slurm (SLURM_PROCID, SLURM_NTASKS): the token from RINGTREE_UNIQUE_ID_FILE (rank 0 writes
   it there, the others wait for it), else rank 0 listens on the first host of the step's node
   list at RINGTREE_PORT (default 29400 + SLURM_STEP_ID % 1000) with a secret derived from the
   job and step ids (or RINGTREE_SECRET);
6. no launcher: a world of one.

When the ranks span hosts and RINGTREE_ADDR is not set, rank 0 listens on a routable address:
that of RINGTREE_IFNAME (like NCCL_SOCKET_IFNAME), else of the first interface that is up and
not loopback.
"""
from __future__ import annotations

import fcntl
import os
import re
import socket
import struct
import time

from . import _core

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
    rank, size = _env_int("RINGTREE_RANK"), _env_int("RINGTREE_WORLD_SIZE")
    token = os.environ.get("RINGTREE_UNIQUE_ID")
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
    wanted = os.environ.get("RINGTREE_IFNAME")
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
    if spans_hosts and not os.environ.get("RINGTREE_ADDR"):
        addr = routable_address()
        if addr:
            os.environ["RINGTREE_ADDR"] = addr  # read by UniqueId.create(); also this rank's later ids
    return _core.UniqueId.create()


def from_mpi():
    if not any(os.environ.get(v) for v in _MPI_SIZE_VARS):
        return None
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise _core.InvalidArgument(
            "started by mpiexec but mpi4py is not installed; pip install 'ringtree[mpi]' "
            "or set RINGTREE_RANK/RINGTREE_WORLD_SIZE/RINGTREE_UNIQUE_ID") from exc
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


def from_slurm():
    rank, size = _env_int("SLURM_PROCID"), _env_int("SLURM_NTASKS")
    if rank is None or size is None:
        return None
    path = os.environ.get("RINGTREE_UNIQUE_ID_FILE")
    if path:
        if rank == 0:
            nodes = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or "1"
            token = str(create_unique_id(int(nodes) > 1))
            with open(path + ".tmp", "w") as f:
                f.write(token)
            os.replace(path + ".tmp", path)  # readers never see half a token
        else:
            deadline = time.monotonic() + float(os.environ.get("RINGTREE_TIMEOUT", "300"))
            while not os.path.exists(path):
                if time.monotonic() > deadline:
                    raise _core.BootstrapError(f"RINGTREE_UNIQUE_ID_FILE {path}: rank 0 never wrote the unique id")
                time.sleep(0.05)
            token = open(path).read().strip()
        return rank, size, token, "slurm"
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise _core.InvalidArgument("Slurm job without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST; set "
                                    "RINGTREE_UNIQUE_ID_FILE to a path every rank can read")
    step = _env_int("SLURM_STEP_ID") or 0
    port = _env_int("RINGTREE_PORT") or 29400 + step % 1000
    seed = os.environ.get("RINGTREE_SECRET") or f"slurm|{os.environ.get('SLURM_JOB_ID', '')}|{step}|{size}"
    uid = _core.UniqueId.from_seed(first_host(nodelist), port, seed)
    return rank, size, str(uid), "slurm"


def from_torchrun():
    rank, size = _env_int("RANK"), _env_int("WORLD_SIZE")
    addr, port = os.environ.get("MASTER_ADDR"), _env_int("MASTER_PORT")
    if rank is None or size is None or not addr or port is None:
        return None
    ringtree_port = _env_int("RINGTREE_PORT") or port + 1
    seed = os.environ.get("RINGTREE_SECRET") or "|".join(
        [os.environ.get("TORCHELASTIC_RUN_ID", "none"), addr, str(port), str(size)])
    uid = _core.UniqueId.from_seed(addr, ringtree_port, seed)
    return rank, size, str(uid), "torchrun"


def detect():
    # torchrun before Slurm: a torchrun inside a Slurm allocation also sees SLURM_* variables.
    for source in (from_ringtree_env, from_mpi, from_torchrun, from_slurm):
        found = source()
        if found is not None:
            return found
    return 0, 1, None, "single"
