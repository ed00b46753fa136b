"""Step time of ShardedDataParallel (ZeRO stage 1 and 2) against DataParallelHook and DDP on
ringtree and on Gloo, for the example MLP (examples/train_ddp.py), with Adam.

    python bench/zero_bench.py                       # P = 2, hidden 256 and 1024, 3 launches
    python bench/zero_bench.py --ranks 2 --hidden 1024 --launches 5 --steps 40

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
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

VARIANTS = ("local", "ddp gloo", "ddp ringtree", "hook ringtree", "zero1 ringtree", "zero2 ringtree")


def worker(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import ringtree.torch as rtt
    import train_ddp

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


def run_launch(ranks, hidden, args):
    command = [sys.executable, "-m", "ringtree.launch", "-n", str(ranks), "--timeout", str(args.job_timeout),
               os.path.abspath(__file__), "--worker", "--hidden", str(hidden), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--batch", str(args.batch), "--rounds", str(args.rounds)]
    proc = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"P={ranks} hidden={hidden} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                       f"{proc.stderr[-2000:]}")


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
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        args.hidden = int(args.hidden)
        return worker(args)

    print(f"Step time (ms), examples/train_ddp.py MLP + Adam, global batch {args.batch}; per launch the best of "
          f"{args.rounds} interleaved rounds of the median of {args.steps} steps (slowest rank); median of "
          f"{args.launches} launches; (x) = time / DDP-on-Gloo time of the same launch; {os.cpu_count()} cores")
    print(f"{'P':>2} {'hidden':>6} {'params':>8} " + " ".join(f"{v:>20}" for v in VARIANTS))
    for ranks in (int(r) for r in args.ranks.split(",")):
        for hidden in (int(h) for h in args.hidden.split(",")):
            launches = [run_launch(ranks, hidden, args) for _ in range(args.launches)]
            cells = []
            for variant in VARIANTS:
                ms = statistics.median(launch["ms"][variant] for launch in launches)
                ratio = statistics.median(launch["ms"][variant] / launch["ms"]["ddp gloo"] for launch in launches)
                cells.append(f"{ms:>12.3f} ({ratio:>4.2f}x)")
            print(f"{ranks:>2} {hidden:>6} {launches[0]['params']:>8} " + " ".join(f"{c:>20}" for c in cells),
                  flush=True)


if __name__ == "__main__":
    main()
