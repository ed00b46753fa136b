"""Where a training step's time goes on the ringtree backend: cProfile of one rank per variant.

    python bench/train_profile.py                            # P = 2, ~10M-parameter deep MLP
    python bench/train_profile.py --ranks 2 --width 1120 --depth 8 --steps 10 --top 25
    python -m ringtree.launch -n 2 bench/train_profile.py --percall     # per-call cost vs Gloo

Each variant (see train_step.VARIANTS: DDP on ringtree / Gloo, DataParallelHook, ZeRO stages
1-3, FSDP2 on ringtree / Gloo, and the no-communication "local" step) is built in the same
processes, warmed up, then --steps steps run under cProfile on rank 0 (the other ranks run the
same steps unprofiled). Printed per variant: the step time, and the functions with the most
own time (tottime) and the torch.distributed / ringtree entry points with their cumulative
time. cProfile sees the calling thread only: ringtree's completion threads, which wait for
the collectives and complete torch futures, are not in it (their effect shows as waits).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(args):
    import torch
    import torch.distributed as dist

    import train_step

    torch.set_num_threads(1)
    setup = train_step.Setup(args.width, args.depth, args.batch)
    variants = args.variants.split(",") if args.variants else list(train_step.VARIANTS)
    for variant in variants:
        step, cleanup = setup.build(variant)
        for _ in range(args.warmup):
            step()
        dist.barrier(group=setup.gloo)
        profile = cProfile.Profile() if setup.rank == 0 else None
        started = time.perf_counter()
        if profile is not None:
            profile.enable()
        for _ in range(args.steps):
            step()
        if profile is not None:
            profile.disable()
        elapsed = (time.perf_counter() - started) / args.steps
        dist.barrier(group=setup.gloo)
        cleanup()
        if profile is not None:
            out = io.StringIO()
            stats = pstats.Stats(profile, stream=out)
            stats.sort_stats("tottime").print_stats(args.top)
            text = out.getvalue()
            body = text[text.find("ncalls"):] if "ncalls" in text else text
            print(f"===== {variant}: {elapsed * 1e3:.2f} ms/step (profiled, rank 0), {args.steps} steps\n{body}",
                  flush=True)
    setup.close()


def percall():
    """Per-call cost of small and mid-size collectives through torch.distributed, on the ringtree
    group and on a Gloo group over the same ranks: async + wait, and blocking; best of 5 x 200
    calls, slowest rank (run under ringtree.launch with --percall)."""
    import torch
    import torch.distributed as dist

    import ringtree.torch as rtt

    torch.set_num_threads(1)
    rtt.init_process_group()
    gloo = dist.new_group(backend="gloo")
    out = {}
    for name, group in (("ringtree", dist.group.WORLD), ("gloo", gloo)):
        for n in (256, 262144):
            t = torch.ones(n)
            big = torch.empty(n * dist.get_world_size())
            cases = {
                "all_reduce async+wait": lambda: dist.all_reduce(t, group=group, async_op=True).wait(),
                "all_reduce blocking": lambda: dist.all_reduce(t, group=group),
                "all_gather_into_tensor blocking": lambda: dist.all_gather_into_tensor(big, t, group=group),
            }
            for case, fn in cases.items():
                for _ in range(50):
                    fn()
                best = []
                for _ in range(5):
                    dist.barrier(group=gloo)
                    started = time.perf_counter()
                    for _ in range(200):
                        fn()
                    best.append((time.perf_counter() - started) / 200)
                worst = torch.tensor([min(best)], dtype=torch.float64)
                dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=gloo)
                out[f"{name} {case} {n * 4}B"] = worst.item() * 1e6
    if dist.get_rank() == 0:
        for key, us in out.items():
            print(f"{key:55s} {us:9.1f} us")
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--width", type=int, default=1120)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--batch", type=int, default=64, help="global batch")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--variants", default="", help="comma-separated (default: all of train_step.VARIANTS)")
    p.add_argument("--percall", action="store_true",
                   help="instead: per-call cost of small collectives, ringtree vs Gloo (under ringtree.launch)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.percall:
        return percall()
    if args.worker:
        return worker(args)
    command = [sys.executable, "-m", "ringtree.launch", "-n", str(args.ranks), "--timeout", "900",
               os.path.abspath(__file__), "--worker"] + [a for a in (argv or sys.argv[1:]) if a != "--worker"]
    return subprocess.run(command, env=dict(os.environ, OMP_NUM_THREADS="1")).returncode


if __name__ == "__main__":
    sys.exit(main())
