"""The start and end of a rank in the torch test worlds (test_torch_backend.py,
test_torch_training.py, test_torch_clients.py): a process group on the ringtree backend, one CPU
thread per rank. torch is imported only inside the functions, so importing this module leaves
torch out. The examples (train_ddp, ...) are importable by name, as the suite's settings say."""

import datetime
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")


def init_group(timeout=60.0, backend="ringtree"):
    """init_process_group on the ringtree backend (or `backend`, for a Gloo reference world) from
    the rank's environment; (rank, size)."""
    import torch
    import torch.distributed as dist

    import ringtree.torch as rtt

    torch.set_num_threads(1)  # ranks share two cores
    rtt.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    return dist.get_rank(), dist.get_world_size()


def finish_group():
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
