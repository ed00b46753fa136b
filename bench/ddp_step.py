"""DDP step time: the example model (examples/train_ddp.py) under DistributedDataParallel on
the ringtree backend and on Gloo, at P = 2 and 4 local ranks.

    python bench/ddp_step.py                          # the table: P in {2, 4}, both backends
    python bench/ddp_step.py --ranks 2,4 --hidden 256,1024 --steps 60 --warmup 10

A step is forward + backward (DDP's bucketed gradient all_reduce) + SGD step on a global
batch split evenly over the ranks. Each rank runs one torch thread (ranks share the cores).
The time reported is the median step of the slowest rank; "local" is the same step without
DDP or any communication, on one rank's share of the batch, measured in the same job, so
"ddp - local" is what the backend adds. Each configuration runs --repeats times with the
backends interleaved, and the best repeat counts: on a shared machine the others' load only
ever adds time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _step_times(step, steps, warmup):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return times


def worker(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import ringtree.torch as rtt
    from rtbench.examples import load

    train_ddp = load("train_ddp")

    torch.set_num_threads(1)
    rtt.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = train_ddp.global_batch(0, args.batch)
    x, y = train_ddp.local_slice(x, rank, world), train_ddp.local_slice(y, rank, world)

    def make_step(module, sync=None):
        optimizer = torch.optim.SGD(module.parameters(), lr=0.01)

        def step():
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(module(x), y).backward()
            if sync is not None:
                sync()
            optimizer.step()

        return step

    local = _step_times(make_step(train_ddp.make_model(args.hidden)), args.steps, args.warmup)
    dist.barrier()
    if args.coalesced:  # no DDP: every parameter's gradient in one all_reduce_coalesced per step
        ddp_model = train_ddp.make_model(args.hidden)
        grads = lambda: dist.all_reduce_coalesced([p.grad for p in ddp_model.parameters()])  # noqa: E731
        ddp = _step_times(make_step(ddp_model, grads), args.steps, args.warmup)
    else:
        ddp_model = DistributedDataParallel(train_ddp.make_model(args.hidden))
        ddp = _step_times(make_step(ddp_model), args.steps, args.warmup)
    # The slowest rank sets the pace.
    medians = torch.tensor([statistics.median(ddp), statistics.median(local)], dtype=torch.float64)
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)
    if rank == 0:
        params = sum(p.numel() for p in ddp_model.parameters())
        print(
            "RESULT "
            + json.dumps(
                {
                    "backend": args.backend,
                    "ranks": world,
                    "hidden": args.hidden,
                    "params": params,
                    "ddp_ms": medians[0].item() * 1e3,
                    "local_ms": medians[1].item() * 1e3,
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()


def launched_result(script, ranks, job_timeout, worker_args, what):
    """Runs `script --worker ...` on `ranks` fresh local ranks (one thread of math each) and
    returns the JSON its rank 0 printed after "RESULT " (the bench workers' convention)."""
    command = [
        sys.executable,
        "-m",
        "ringtree.launch",
        "-n",
        str(ranks),
        "--no-label",
        "--timeout",
        str(job_timeout),
        os.path.abspath(script),
        "--worker",
    ] + [str(a) for a in worker_args]
    proc = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(
        f"{what} at P={ranks} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    )


def run_one(backend, ranks, hidden, args):
    return launched_result(
        __file__,
        ranks,
        args.job_timeout,
        [
            "--backend",
            backend,
            "--hidden",
            hidden,
            "--steps",
            args.steps,
            "--warmup",
            args.warmup,
            "--batch",
            args.batch,
        ]
        + (["--coalesced"] if args.coalesced else []),
        backend,
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2,4", help="comma-separated world sizes")
    p.add_argument("--hidden", default="256,1024", help="comma-separated hidden widths of the example MLP")
    p.add_argument("--backends", default="ringtree,gloo")
    p.add_argument("--batch", type=int, default=64, help="global batch")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3, help="jobs per configuration and backend; the best counts")
    p.add_argument("--job-timeout", type=float, default=300)
    p.add_argument(
        "--coalesced",
        action="store_true",
        help="instead of DDP, all-reduce the gradients with one dist.all_reduce_coalesced per step",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", default="ringtree", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        args.hidden = int(args.hidden)
        return worker(args)

    backends = args.backends.split(",")
    rows = []
    print(
        f"DDP step time, examples/train_ddp.py MLP, global batch {args.batch}, median of {args.steps} steps "
        f"(slowest rank), best of {args.repeats} jobs, {os.cpu_count()} cores"
    )
    header = (
        f"{'P':>3} {'hidden':>6} {'params':>9} {'MB':>6} {'local ms':>9} "
        + " ".join(f"{b + ' ms':>12}" for b in backends)
        + (f" {'ringtree/gloo':>14}" if set(backends) >= {"ringtree", "gloo"} else "")
    )
    print(header)
    for ranks in (int(r) for r in args.ranks.split(",")):
        for hidden in (int(h) for h in args.hidden.split(",")):
            results, local_ms = {}, float("inf")
            for _ in range(args.repeats):
                for b in backends:  # interleaved, so a burst of outside load hits both
                    result = run_one(b, ranks, hidden, args)
                    local_ms = min(local_ms, result["local_ms"])
                    if b not in results or result["ddp_ms"] < results[b]["ddp_ms"]:
                        results[b] = result
            first = results[backends[0]]
            line = (
                f"{ranks:>3} {hidden:>6} {first['params']:>9} {first['params'] * 4 / 1e6:>6.2f} "
                f"{local_ms:>9.2f} " + " ".join(f"{results[b]['ddp_ms']:>12.2f}" for b in backends)
            )
            if "ringtree" in results and "gloo" in results:
                line += f" {results['ringtree']['ddp_ms'] / results['gloo']['ddp_ms']:>14.2f}"
            print(line, flush=True)
            rows.append(results)
    return rows


if __name__ == "__main__":
    main()
