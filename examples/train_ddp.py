"""Train a small MLP on synthetic data with DistributedDataParallel on the ringtree backend.

    python -m ringtree.launch -n 2 examples/train_ddp.py
    torchrun --nproc-per-node 2 examples/train_ddp.py
    mpiexec -n 2 python examples/train_ddp.py          # needs mpi4py

    options: --steps 30 --batch 64 --hidden 256 --lr 0.05 --hook none|allreduce|fp16|bf16|int8|topk
             --ratio 0.01 (topk: the fraction of each bucket sent) --backend ringtree|gloo

Every step draws one global batch (the same on every rank, seeded by the step number) and
each rank trains on its own contiguous slice of it, so P ranks follow exactly the
trajectory of one process training on the whole batch. Rank 0 prints the loss per step,
averaged over ranks.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import ringtree.torch as rtt

INPUTS, CLASSES = 64, 10


def make_model(hidden: int = 256, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(INPUTS, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, CLASSES),
    )


def global_batch(step: int, batch: int):
    """The step's whole batch: inputs, and labels from a fixed random linear teacher."""
    teacher = torch.Generator().manual_seed(1234)
    weights = torch.randn(INPUTS, CLASSES, generator=teacher)
    data = torch.Generator().manual_seed(10_000 + step)
    x = torch.randn(batch, INPUTS, generator=data)
    return x, (x @ weights).argmax(dim=1)


def local_slice(tensor, rank: int, world: int):
    per_rank = tensor.shape[0] // world
    return tensor[rank * per_rank : (rank + 1) * per_rank]


HOOKS = {
    "none": None,
    "allreduce": (rtt.AllReduceState, rtt.allreduce_hook),
    "fp16": (rtt.AllReduceState, rtt.fp16_compress_hook),
    "bf16": (rtt.AllReduceState, rtt.bf16_compress_hook),
    "int8": (rtt.Int8QuantizationState, rtt.int8_quantize_hook),
    "topk": (rtt.TopKState, rtt.topk_hook),
}


def wrap(model, hook: str = "none", process_group=None, hook_options=None, **ddp_options):
    """DDP around `model` with the named comm hook; hook_options go to its state (topk: ratio=)."""
    ddp = DistributedDataParallel(model, process_group=process_group, **ddp_options)
    if HOOKS[hook] is not None:
        make_state, function = HOOKS[hook]
        ddp.register_comm_hook(make_state(process_group, **(hook_options or {})), function)
    return ddp


def train(ddp, steps: int, batch: int, lr: float, process_group=None, log=print):
    """Runs `steps` SGD steps; returns the loss of each step averaged over ranks."""
    rank, world = dist.get_rank(process_group), dist.get_world_size(process_group)
    if batch % world:
        raise ValueError(f"--batch {batch} must be divisible by the number of ranks {world}")
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = global_batch(step, batch)
        loss = torch.nn.functional.cross_entropy(ddp(local_slice(x, rank, world)), local_slice(y, rank, world))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, group=process_group)
        losses.append(mean_loss.item() / world)
        if log is not None and rank == 0:
            log(f"step {step:3d}  loss {losses[-1]:.4f}")
    return losses


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=64, help="global batch, split evenly over the ranks")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hook", choices=sorted(HOOKS), default="none")
    p.add_argument("--ratio", type=float, default=0.01, help="topk: the fraction of each bucket sent")
    p.add_argument("--backend", default="ringtree")
    args = p.parse_args(argv)

    rtt.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"training on {world} ranks, backend {dist.get_backend()}, hook {args.hook}")
    started = time.perf_counter()
    hook_options = dict(ratio=args.ratio) if args.hook == "topk" else None
    ddp = wrap(make_model(args.hidden), args.hook, hook_options=hook_options)
    losses = train(ddp, args.steps, args.batch, args.lr)
    if rank == 0:
        print(f"final loss {losses[-1]:.4f} (first {losses[0]:.4f}) in {time.perf_counter() - started:.2f} s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
