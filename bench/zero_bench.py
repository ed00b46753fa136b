"""Step time of ShardedDataParallel (ZeRO stage 1, 2 and 3) against DataParallelHook and DDP on
ringtree and on Gloo, for the example MLP (examples/train_ddp.py), with Adam; and (--memory)
the storage each rank holds at each stage against DDP.

    python bench/zero_bench.py                       # P = 2, hidden 256 and 1024, 3 launches
    python bench/zero_bench.py --ranks 2 --hidden 1024 --launches 5 --steps 40
    python bench/zero_bench.py --memory --ranks 2,4 --width 352,1120   # ~1M and ~10M parameters

Memory: a deep MLP (--depth Linear layers of --width, Tanh between) trained 3 steps with Adam
on the ringtree process group, each variant in turn in the same processes; per rank, the bytes
of parameter, gradient and optimizer-state storage (ringtree.torch.memory.StorageMeter: the
distinct storages reachable from the DDP module and its optimizer, or from the
ShardedDataParallel, sampled around every module's forward, after every gradient, after
backward and after the step). "rest" is after the step (before zero_grad), "peak" the largest
sample. DDP runs with gradient_as_bucket_view=True so that its reducer's buckets are the
gradients the meter sees. The bucket cap is the model's bytes / --buckets (about a layer each).

A step is zero_grad + forward + backward + optimizer step on one rank's share of a global
batch. In each launch (python -m ringtree.launch) every variant runs in the same processes,
interleaved over --rounds rounds; a variant's time is the slowest rank's median step, its
best round counting (outside load only ever adds time). The table gives, per variant, the
median over launches, and its ratio to DDP on Gloo of the same launch (median of ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from ddp_step import launched_result  # bench/ is the script's directory

VARIANTS = ("local", "ddp gloo", "ddp ringtree", "hook ringtree", "zero1 ringtree", "zero2 ringtree", "zero3 ringtree")
MEMORY_VARIANTS = ("ddp", "zero1", "zero2", "zero3")


def deep_mlp(width: int, depth: int, seed: int = 0):
    import torch

    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def memory_per_rank(variant: str, width: int, depth: int, buckets: int, batch: int, steps: int = 3) -> dict:
    """One rank's storage bytes for `variant` (see the module doc); needs the ringtree process
    group as torch's default group. Returns rest and peak bytes, where the peak was sampled,
    the parameter count and the bucket cap in bytes."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import ringtree.torch as rtt
    from ringtree.torch.memory import StorageMeter, storage_bytes

    rank, world = dist.get_rank(), dist.get_world_size()
    model = deep_mlp(width, depth)
    numel = sum(p.numel() for p in model.parameters())
    cap_bytes = -(-numel * 4 // buckets)
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(batch, width, generator=generator)[rank::world]
    y = torch.randn(batch, width, generator=generator)[rank::world]
    if variant == "ddp":
        ddp = DistributedDataParallel(model, bucket_cap_mb=cap_bytes / 2**20, gradient_as_bucket_view=True)
        optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
        roots, step, zero_grad, module = [ddp, optimizer], optimizer.step, optimizer.zero_grad, ddp

        def grads_and_state():  # what the optimizer keeps, and the gradients (DDP's bucket views)
            # The state's values only: its keys are the parameters themselves.
            return [list(optimizer.state.values()), [p.grad for p in ddp.parameters()]]
    else:
        zero = rtt.ShardedDataParallel(
            model,
            torch.optim.Adam,
            dist.group.WORLD.comm,
            stage=int(variant[-1]),
            bucket_cap_mb=cap_bytes / 2**20,
            lr=1e-3,
        )
        roots, step, zero_grad, module = [zero], zero.step, zero.zero_grad, model

        def grads_and_state():  # the shards' state and gradients, the model's full gradients (stage 1)
            return [
                list(zero.optimizer.state.values()),
                [b.master.grad for b in zero.buckets],
                [b.flat_grads for b in zero.buckets],
                [p.grad for p in zero.params],
            ]

    meter = StorageMeter(roots, model)
    rest = grads_state = 0
    for _ in range(steps):
        torch.nn.functional.mse_loss(module(x), y).backward()
        meter.sample("after backward")
        step()
        rest = meter.sample("after step")
        grads_state = storage_bytes(grads_and_state())
        zero_grad()
    meter.remove()
    largest = max(b.flat_params.numel() * 4 for b in zero.buckets) if variant != "ddp" else None
    return {
        "rest": rest,
        "peak": meter.peak,
        "peak_at": meter.peak_at,
        "params": numel,
        "cap_bytes": cap_bytes,
        "largest_bucket_bytes": largest,
        "grads_state": grads_state,
    }


def memory_worker(args):
    import json

    import torch
    import torch.distributed as dist

    import ringtree.torch as rtt

    torch.set_num_threads(1)
    rtt.init_process_group()
    result = {
        variant: memory_per_rank(variant, args.width, args.depth, args.buckets, args.batch)
        for variant in MEMORY_VARIANTS
    }
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(gathered), flush=True)
    dist.destroy_process_group()


def worker(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import ringtree.torch as rtt
    from rtbench.examples import load

    train_ddp = load("train_ddp")

    torch.set_num_threads(1)
    rtt.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = dist.group.WORLD.comm
    gloo = dist.new_group(backend="gloo")
    x, y = train_ddp.global_batch(0, args.batch)
    x, y = train_ddp.local_slice(x, rank, world), train_ddp.local_slice(y, rank, world)

    def plain(module, optimizer):
        def step():
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(module(x), y).backward()
            optimizer.step()

        return step

    def build(variant):
        model = train_ddp.make_model(args.hidden)
        if variant == "local":
            return plain(model, torch.optim.Adam(model.parameters(), lr=1e-3))
        if variant.startswith("ddp"):
            ddp = DistributedDataParallel(model, process_group=gloo if variant == "ddp gloo" else None)
            return plain(ddp, torch.optim.Adam(ddp.parameters(), lr=1e-3))
        if variant == "hook ringtree":
            rtt.DataParallelHook(model, comm)
            return plain(model, torch.optim.Adam(model.parameters(), lr=1e-3))
        zero = rtt.ShardedDataParallel(model, torch.optim.Adam, comm, stage=int(variant[4]), lr=1e-3)

        def step():
            zero.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            zero.step()

        return step

    steps = {variant: build(variant) for variant in VARIANTS}
    best = {variant: float("inf") for variant in VARIANTS}
    for _ in range(args.rounds):
        for variant, step in steps.items():
            for _ in range(args.warmup):
                step()
            times = []
            for _ in range(args.steps):
                started = time.perf_counter()
                step()
                times.append(time.perf_counter() - started)
            median = torch.tensor([statistics.median(times)], dtype=torch.float64)
            dist.all_reduce(median, op=dist.ReduceOp.MAX, group=gloo)  # the slowest rank sets the pace
            best[variant] = min(best[variant], median.item())
    if rank == 0:
        params = sum(p.numel() for p in train_ddp.make_model(args.hidden).parameters())
        print("RESULT " + json.dumps({"params": params, "ms": {v: t * 1e3 for v, t in best.items()}}), flush=True)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def run_launch(ranks, args, worker_args):
    return launched_result(
        __file__,
        ranks,
        args.job_timeout,
        ["--steps", args.steps, "--warmup", args.warmup, "--batch", args.batch, "--rounds", args.rounds] + worker_args,
        str(worker_args),
    )


def memory_table(args):
    print(
        f"Storage per rank (MiB) of parameters, gradients and Adam state: rest = after the step, peak = "
        f"largest sample; deep MLP of {args.depth} Linear layers, bucket cap = model bytes / {args.buckets}; "
        f"(x) = / DDP's; ideal = DDP/P (stage 3 at rest); the largest rank shown"
    )
    columns = [f"{v} {kind}" for v in MEMORY_VARIANTS for kind in ("rest", "peak")]
    rows = []
    print("| P | width | params | " + " | ".join(columns) + " | ideal 1/P |")
    print("|" + "---|" * (len(columns) + 4))
    for ranks in (int(r) for r in args.ranks.split(",")):
        for width in (int(w) for w in args.width.split(",")):
            ranks_results = run_launch(
                ranks,
                args,
                ["--memory", "--width", str(width), "--depth", str(args.depth), "--buckets", str(args.buckets)],
            )
            worst = {v: {k: max(r[v][k] for r in ranks_results) for k in ("rest", "peak")} for v in MEMORY_VARIANTS}
            ddp = worst["ddp"]
            cells = [
                f"{worst[v][k] / 2**20:.2f} ({worst[v][k] / ddp[k]:.2f}x)"
                for v in MEMORY_VARIANTS
                for k in ("rest", "peak")
            ]
            params = ranks_results[0]["ddp"]["params"]
            print(
                f"| {ranks} | {width} | {params} | " + " | ".join(cells) + f" | {ddp['rest'] / ranks / 2**20:.2f} |",
                flush=True,
            )
            rows.append(
                (ranks, width, params, {v: max(r[v]["grads_state"] for r in ranks_results) for v in MEMORY_VARIANTS})
            )
    print("\nGradients + Adam state per rank after the step (MiB), the largest rank; (x) = / DDP's; ideal = DDP's / P")
    print("| P | width | params | " + " | ".join(MEMORY_VARIANTS) + " | ideal 1/P |")
    print("|" + "---|" * (len(MEMORY_VARIANTS) + 4))
    for ranks, width, params, sizes in rows:
        ddp = sizes["ddp"]
        print(
            f"| {ranks} | {width} | {params} | "
            + " | ".join(f"{sizes[v] / 2**20:.2f} ({sizes[v] / ddp:.3f}x)" for v in MEMORY_VARIANTS)
            + f" | {ddp / ranks / 2**20:.2f} ({1 / ranks:.3f}x) |",
            flush=True,
        )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2", help="comma-separated world sizes")
    p.add_argument("--hidden", default="256,1024", help="comma-separated hidden widths of the example MLP")
    p.add_argument("--batch", type=int, default=64, help="global batch")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per launch; the best counts")
    p.add_argument("--launches", type=int, default=3)
    p.add_argument("--job-timeout", type=float, default=600)
    p.add_argument("--memory", action="store_true", help="the storage table instead of step times")
    p.add_argument("--width", default="352,1120", help="--memory: comma-separated widths of the deep MLP")
    p.add_argument("--depth", type=int, default=8, help="--memory: Linear layers of the deep MLP")
    p.add_argument("--buckets", type=int, default=8, help="--memory: bucket cap = model bytes / this")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        if args.memory:
            args.width = int(args.width)
            return memory_worker(args)
        args.hidden = int(args.hidden)
        return worker(args)
    if args.memory:
        return memory_table(args)

    print(
        f"Step time (ms), examples/train_ddp.py MLP + Adam, global batch {args.batch}; per launch the best of "
        f"{args.rounds} interleaved rounds of the median of {args.steps} steps (slowest rank); median of "
        f"{args.launches} launches; (x) = time / DDP-on-Gloo time of the same launch; {os.cpu_count()} cores"
    )
    print(f"{'P':>2} {'hidden':>6} {'params':>8} " + " ".join(f"{v:>20}" for v in VARIANTS))
    for ranks in (int(r) for r in args.ranks.split(",")):
        for hidden in (int(h) for h in args.hidden.split(",")):
            launches = [run_launch(ranks, args, ["--hidden", str(hidden)]) for _ in range(args.launches)]
            cells = []
            for variant in VARIANTS:
                ms = statistics.median(launch["ms"][variant] for launch in launches)
                ratio = statistics.median(launch["ms"][variant] / launch["ms"]["ddp gloo"] for launch in launches)
                cells.append(f"{ms:>12.3f} ({ratio:>4.2f}x)")
            print(
                f"{ranks:>2} {hidden:>6} {launches[0]['params']:>8} " + " ".join(f"{c:>20}" for c in cells), flush=True
            )


if __name__ == "__main__":
    main()
