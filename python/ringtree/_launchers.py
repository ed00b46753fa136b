"""Where rank, size and the unique id come from, in this order of precedence:

1. explicit arguments to init();
2. RINGTREE_RANK, RINGTREE_WORLD_SIZE, RINGTREE_UNIQUE_ID (ringtree.launch, Slurm, tests);
3. mpiexec (MPICH or Open MPI): rank 0 makes the unique id and mpi4py broadcasts it;
4. torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): rank 0 listens on MASTER_PORT + 1
   (or RINGTREE_PORT); the secret derives from TORCHELASTIC_RUN_ID and the master address,
   or from RINGTREE_SECRET when set (set it on shared hosts);
5. no launcher: a world of one.
"""
from __future__ import annotations

import os

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
    token = str(_core.UniqueId.create()) if world.Get_rank() == 0 else None
    token = world.bcast(token, root=0)
    return world.Get_rank(), world.Get_size(), token, "mpi"


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
    for source in (from_ringtree_env, from_mpi, from_torchrun):
        found = source()
        if found is not None:
            return found
    return 0, 1, None, "single"
