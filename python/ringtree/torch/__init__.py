"""ringtree for PyTorch: the "ringtree" torch.distributed backend, a data-parallel gradient
hook, ZeRO-style sharded data parallelism with resharding checkpoints, and DDP communication hooks.

    import ringtree.torch                      # registers the backend
    dist.init_process_group("ringtree")        # torchrun / env://, tcp://, or store=...

    model = DistributedDataParallel(model)     # CPU or CUDA tensors
    model.register_comm_hook(AllReduceState(), fp16_compress_hook)

Importing ringtree alone never imports torch; importing ringtree.torch does.
"""

from __future__ import annotations

import os

import torch.distributed as dist

from .checkpoint import ShardedCheckpoint, consolidate_checkpoint, read_checkpoint_metadata
from .comm_hooks import (
    AllReduceState,
    Int8QuantizationState,
    TopKState,
    allreduce_hook,
    bf16_compress_hook,
    fp16_compress_hook,
    int8_quantize_hook,
    topk_hook,
)
from .data_parallel import DataParallelHook
from .process_group import BACKEND_NAME, DEVICES, ProcessGroupRingtree, RingtreeWork, create_process_group
from .zero import ShardedDataParallel

__all__ = [
    "BACKEND_NAME",
    "ProcessGroupRingtree",
    "RingtreeWork",
    "create_process_group",
    "init_process_group",
    "DataParallelHook",
    "ShardedDataParallel",
    "ShardedCheckpoint",
    "consolidate_checkpoint",
    "read_checkpoint_metadata",
    "AllReduceState",
    "Int8QuantizationState",
    "allreduce_hook",
    "fp16_compress_hook",
    "bf16_compress_hook",
    "int8_quantize_hook",
    "TopKState",
    "topk_hook",
]


def _register():
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return  # registered already (module reloaded)
    dist.Backend.register_backend(BACKEND_NAME, create_process_group, devices=list(DEVICES))


_register()


def init_process_group(backend: str = BACKEND_NAME, timeout=None, **kwargs):
    """dist.init_process_group that also works under ringtree's own launchers.

    Under torchrun (MASTER_ADDR/MASTER_PORT set), or with init_method= or store= given, this
    is dist.init_process_group. Under `python -m ringtree.launch` or mpiexec, where torch has
    no rendezvous of its own, ringtree's world (ringtree.init()) carries the address of a
    TCPStore that rank 0 opens on a free port of the job's address (RINGTREE_ADDR, else
    loopback), and torch rendezvouses through that store. The backend's groups then take their
    secrets from the world's, so the store carries none (only addresses, ports and salts).

    Parameters
    ----------
    backend : str
        The backend, "ringtree" by default.
    timeout : datetime.timedelta or None
        The group's timeout, as dist.init_process_group takes it; None: torch's default,
        which the ringtree backend replaces with RINGTREE_TIMEOUT. It also bounds the store's
        rendezvous.
    **kwargs
        The other arguments of dist.init_process_group; rank and world_size default to the
        launcher's.

    Returns
    -------
    None
        What dist.init_process_group returns.
    """
    launched_by_torch = "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ
    if launched_by_torch or "init_method" in kwargs or "store" in kwargs:
        return dist.init_process_group(backend, timeout=timeout, **kwargs)

    import datetime
    import socket

    import numpy as np

    from ringtree import _launchers, _settings
    from ringtree._args import default_timeout
    from ringtree._world import init

    world = init()
    try:
        store_timeout = timeout or datetime.timedelta(seconds=default_timeout())
        store = None
        # Rank 0's store port, a nonce and its address (the world's: the one its peers reach): the
        # backend's groups take their secret from the world's (an HMAC over the nonce), so no
        # store ever carries one.
        public = np.zeros(4, dtype=np.int64)
        if world.rank == 0:
            host = socket.gethostbyname(_settings.given("RINGTREE_ADDR") or world._core.address())
            # Listening on the job's address only (torch's own TCPStore would take every interface).
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                listener.bind((host, 0))
                listener.listen(512)
            except BaseException:
                listener.close()
                raise
            port = listener.getsockname()[1]
            store = dist.TCPStore(
                host,
                port,
                world.size,
                is_master=True,
                timeout=store_timeout,
                wait_for_workers=False,
                master_listen_fd=listener.detach(),
            )
            public[0] = port
            public[1:3] = np.frombuffer(os.urandom(16), dtype=np.int64)
            public[3] = int.from_bytes(socket.inet_aton(host), "big")
        world.broadcast(public, root=0)
        _launchers.use_job_secret(world._core.child_unique_id("127.0.0.1", int(public[0]), public[1:3].tobytes()))
        host = socket.inet_ntoa(int(public[3]).to_bytes(4, "big"))
        if store is None:
            store = dist.TCPStore(host, int(public[0]), world.size, is_master=False, timeout=store_timeout)
        kwargs.setdefault("rank", world.rank)
        kwargs.setdefault("world_size", world.size)
    finally:
        # The bootstrap world has done its job; the backend makes its own communicator.
        world.close()
    return dist.init_process_group(backend, store=store, timeout=timeout, **kwargs)
