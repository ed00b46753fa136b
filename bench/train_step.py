"""Training step time on the ringtree backend against Gloo: torch's DDP and FSDP2 on each backend,
ringtree's DataParallelHook and ShardedDataParallel (ZeRO stages 1-3), and the same step without
any communication, for deep MLPs of about 1M, 10M and 50M parameters, with Adam.

    python bench/train_step.py                                  # P = 2 and 4, the three models
    python bench/train_step.py --ranks 2 --width 1120 --launches 3 --steps 5

Model: --depth Linear(width, width) layers with Tanh between (width 352, 1120, 2500 at depth 8:
994,048, 10,044,160 and 50,020,000 parameters), MSE loss, global batch --batch split evenly over
the ranks, one torch thread per rank. A step is zero_grad + forward + backward + optimizer step
(torch.optim.Adam; ZeRO steps its shards, FSDP2 its DTensor shards). Every variant keeps its
defaults: DDP and the ZeRO hook 25 MiB buckets, FSDP2 one fully_shard per Linear and one at the
root (reshard_after_forward=True); on ringtree FSDP2 takes its staging buffers from the group's
allocate_tensor (set_allocate_memory_from_process_group_for_comm).

In each launch (python -m ringtree.launch) every variant runs in the same processes, built
afresh and interleaved over --rounds rounds; a variant's time in a round is the slowest rank's
median step after --warmup steps, its best round counting (outside load only ever adds time).
The table gives, per variant, the median over --launches launches, and its ratio to the same
torch wrapper on Gloo in the same launch (median of ratios; ringtree's own hooks are compared with
DDP on Gloo). "comm" columns: step time minus the local step's, the time communication and the
wrapper add.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from ddp_step import _step_times, launched_result
from zero_bench import deep_mlp

VARIANTS = (
    "local",
    "ddp gloo",
    "ddp ringtree",
    "hook ringtree",
    "zero1 ringtree",
    "zero2 ringtree",
    "zero3 ringtree",
    "fsdp2 gloo",
    "fsdp2 ringtree",
)
# What each ringtree variant is compared with.
BASELINE = {
    "ddp ringtree": "ddp gloo",
    "hook ringtree": "ddp gloo",
    "zero1 ringtree": "ddp gloo",
    "zero2 ringtree": "ddp gloo",
    "zero3 ringtree": "ddp gloo",
    "fsdp2 ringtree": "fsdp2 gloo",
    "fsdp2 ringtree-noalloc": "fsdp2 gloo",
}
# Not in the default set: FSDP2 on ringtree without the allocation hook, to measure what it gives.
EXTRA_VARIANTS = ("fsdp2 ringtree-noalloc",)


class Setup:
    """The process groups (ringtree as torch's default group, and a Gloo group over the same ranks)
    and this rank's batch; build(variant) makes a step function. Needs ringtree.launch or torchrun."""

    def __init__(self, width: int, depth: int, batch: int):
        import torch
        import torch.distributed as dist

        import ringtree.torch as rtt

        rtt.init_process_group()
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.gloo = dist.new_group(backend="gloo")
        self.width, self.depth = width, depth
        generator = torch.Generator().manual_seed(7)
        per_rank = batch // self.world
        x = torch.randn(batch, width, generator=generator)
        y = torch.randn(batch, width, generator=generator)
        self.x = x[self.rank * per_rank : (self.rank + 1) * per_rank].contiguous()
        self.y = y[self.rank * per_rank : (self.rank + 1) * per_rank].contiguous()

    def build(self, variant: str):
        """(step, cleanup) for `variant` (one of VARIANTS)."""
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        import ringtree.torch as rtt

        model = deep_mlp(self.width, self.depth)
        x, y = self.x, self.y
        loss_fn = torch.nn.functional.mse_loss
        name, _, backend = variant.partition(" ")
        group = self.gloo if backend == "gloo" else dist.group.WORLD  # ringtree, ringtree-noalloc
        cleanup = []

        def plain(module, optimizer):
            def step():
                optimizer.zero_grad()
                loss_fn(module(x), y).backward()
                optimizer.step()

            return step

        if name == "local":
            step = plain(model, torch.optim.Adam(model.parameters(), lr=1e-4))
        elif name == "ddp":
            ddp = DistributedDataParallel(model, process_group=group)
            step = plain(ddp, torch.optim.Adam(ddp.parameters(), lr=1e-4))
        elif name == "hook":
            hook = rtt.DataParallelHook(model, group.comm)
            cleanup.append(hook.remove)
            step = plain(model, torch.optim.Adam(model.parameters(), lr=1e-4))
        elif name.startswith("zero"):
            zero = rtt.ShardedDataParallel(model, torch.optim.Adam, group.comm, stage=int(name[4]), lr=1e-4)
            cleanup.append(zero.remove)

            def step():
                zero.zero_grad()
                loss_fn(model(x), y).backward()
                zero.step()
        elif name == "fsdp2":
            from torch.distributed.device_mesh import DeviceMesh
            from torch.distributed.fsdp import fully_shard

            mesh = DeviceMesh.from_group(group, "cpu")
            for layer in model:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
                    # Staging buffers from the group's allocate_tensor (ringtree: a pool; Gloo: none).
                    layer.set_allocate_memory_from_process_group_for_comm(backend == "ringtree")
            fully_shard(model, mesh=mesh)
            step = plain(model, torch.optim.Adam(model.parameters(), lr=1e-4))
        else:
            raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS + EXTRA_VARIANTS)}")

        def close():
            for fn in cleanup:
                fn()

        return step, close

    def close(self):
        import torch.distributed as dist

        dist.barrier(group=self.gloo)
        dist.destroy_process_group()


def worker(args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    setup = Setup(args.width, args.depth, args.batch)
    variants = args.variants.split(",")
    best = {variant: float("inf") for variant in variants}
    for _ in range(args.rounds):
        for variant in variants:
            step, cleanup = setup.build(variant)
            dist.barrier(group=setup.gloo)
            median = torch.tensor([statistics.median(_step_times(step, args.steps, args.warmup))], dtype=torch.float64)
            cleanup()
            dist.all_reduce(median, op=dist.ReduceOp.MAX, group=setup.gloo)  # the slowest rank sets the pace
            best[variant] = min(best[variant], median.item())
    if setup.rank == 0:
        params = sum(p.numel() for p in deep_mlp(args.width, args.depth).parameters())
        print("RESULT " + json.dumps({"params": params, "ms": {v: t * 1e3 for v, t in best.items()}}), flush=True)
    setup.close()


def run_launch(ranks: int, width: int, args) -> dict:
    return launched_result(
        __file__,
        ranks,
        args.job_timeout,
        [
            "--width",
            width,
            "--depth",
            args.depth,
            "--batch",
            args.batch,
            "--steps",
            args.steps,
            "--warmup",
            args.warmup,
            "--rounds",
            args.rounds,
            "--variants",
            args.variants,
        ],
        f"width {width}",
    )


def table(args):
    variants = args.variants.split(",")
    raw = []
    print(
        f"Step time (ms), deep MLP of {args.depth} Linear layers + Adam, global batch {args.batch}; per launch "
        f"the best of {args.rounds} interleaved rounds of the slowest rank's median of {args.steps} steps; median "
        f"of {args.launches} launches; (x) = time / the same wrapper on Gloo (DDP on Gloo for ringtree's own "
        f"hooks), lower is better; comm = time - local; {os.cpu_count()} cores; load at start: "
        f"{os.getloadavg()[0]:.2f}"
    )
    print("| P | params | " + " | ".join(variants) + " |")
    print("|" + "---|" * (len(variants) + 2))
    for ranks in (int(r) for r in args.ranks.split(",")):
        for width in (int(w) for w in args.width.split(",")):
            launches = [run_launch(ranks, width, args) for _ in range(args.launches)]
            raw.append({"ranks": ranks, "width": width, "launches": launches})
            local = statistics.median(launch["ms"]["local"] for launch in launches) if "local" in variants else None
            cells = []
            for variant in variants:
                ms = statistics.median(launch["ms"][variant] for launch in launches)
                cell = f"{ms:.1f}"
                base = BASELINE.get(variant)
                if base in variants:
                    ratio = statistics.median(launch["ms"][variant] / launch["ms"][base] for launch in launches)
                    cell += f" ({ratio:.2f}x)"
                if local is not None and variant != "local":
                    cell += f" comm {ms - local:.1f}"
                cells.append(cell)
            print(f"| {ranks} | {launches[0]['params']} | " + " | ".join(cells) + " |", flush=True)
    print(f"load at end: {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": raw}, f, indent=1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2,4", help="comma-separated world sizes")
    p.add_argument("--width", default="352,1120,2500", help="comma-separated widths of the deep MLP")
    p.add_argument("--depth", type=int, default=8, help="Linear layers of the deep MLP")
    p.add_argument("--batch", type=int, default=64, help="global batch")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds per launch; the best counts")
    p.add_argument("--launches", type=int, default=3)
    p.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS + EXTRA_VARIANTS)}"
    )
    p.add_argument("--json", default="", help="also write every launch's figures to this file")
    p.add_argument("--job-timeout", type=float, default=900)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        args.width = int(args.width)
        return worker(args)
    return table(args)


if __name__ == "__main__":
    main()
