"""Where a training step's time goes on the ringtree backend: cProfile of one rank per variant.

    python bench/train_profile.py                            # P = 2, ~10M-parameter deep MLP
    python bench/train_profile.py --ranks 2 --width 1120 --depth 8 --steps 10 --top 25

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
sys.path.insert(0, HERE)


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
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    command = [sys.executable, "-m", "ringtree.launch", "-n", str(args.ranks), "--timeout", "900",
               os.path.abspath(__file__), "--worker"] + [a for a in (argv or sys.argv[1:]) if a != "--worker"]
    return subprocess.run(command, env=dict(os.environ, OMP_NUM_THREADS="1")).returncode


if __name__ == "__main__":
    sys.exit(main())
