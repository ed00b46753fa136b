"""Convergence of DDP with topk_hook (top-k sparsification with error feedback) against
uncompressed DDP, on the example MLP (examples/train_ddp.py), on the ringtree backend.

    python -m ringtree.launch -n 2 bench/topk_convergence.py --out bench/results/topk-p2

Every variant trains the same models (one per --seeds initialisation) on the same batches (SGD
with momentum, as the example does), one after another in the same processes, each then scored
on a held-out batch. Rank 0 writes the loss curves (JSON), a table of medians over the seeds
(markdown) and, with matplotlib, a plot of the median curves.
Bytes are per rank per step: the message a rank contributes (top-k: its indices and values;
uncompressed: the float32 gradients) and what it sends with a ring algorithm: (P - 1) messages
for an all_gather, 2 (P - 1) / P of the gradients for an all_reduce. ms / step is wall time on
a shared machine, for orientation only.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time



HELD_OUT_STEP = 10**6  # the seed of the held-out batch: far beyond any step trained on


def parse_variants(text):
    """'none,0.01,0.001' -> [(label, ratio or None)]."""
    return [("none", None) if word == "none" else (f"topk {word}", float(word)) for word in text.split(",")]


def train_once(args, seed, ratio, world):
    """One training run: DDP, with topk_hook at `ratio` unless it is None."""
    import torch

    import ringtree.torch as rtt
    from rtbench.examples import load
    train_ddp = load("train_ddp")
    ddp = train_ddp.wrap(train_ddp.make_model(args.hidden, seed=seed))
    state = None
    if ratio is not None:
        state = rtt.TopKState(ratio=ratio)
        ddp.register_comm_hook(state, rtt.topk_hook)
    elements = sum(p.numel() for p in ddp.parameters())
    started = time.perf_counter()
    losses = train_ddp.train(ddp, args.steps, args.batch, args.lr, log=None)
    seconds = time.perf_counter() - started
    with torch.no_grad():  # held out: a batch no step trained on
        x, y = train_ddp.global_batch(HELD_OUT_STEP, args.eval_batch)
        held_out = torch.nn.functional.cross_entropy(ddp.module(x), y).item()
    if state is not None:
        message = state.sent_bytes / args.steps
        sends = (world - 1) * message
    else:
        message = 4 * elements
        sends = 2 * (world - 1) / world * message
    return dict(seed=seed, losses=losses, held_out=held_out, message_bytes=message, sent_bytes=sends,
                elements=elements, ms_per_step=1e3 * seconds / args.steps)


def _trailing_mean(values, window):
    return [statistics.fmean(values[max(0, i - window + 1):i + 1]) for i in range(len(values))]


def _table(results, args, window):
    """Medians over the seeds (held-out loss also with its range)."""
    baseline = next(iter(results))
    lines = [f"| variant | held-out loss, median (min-max) | training loss, last {window} steps | first step below "
             f"{args.target} (mean of {window}) | message bytes / step | bytes sent / step (ring) | vs {baseline} | "
             "ms / step |", "|---|---|---|---|---|---|---|---|"]
    for label, res in results.items():
        runs = res["runs"]
        held = [run["held_out"] for run in runs]
        tails = [statistics.fmean(run["losses"][-window:]) for run in runs]
        below = [next((i for i, x in enumerate(_trailing_mean(run["losses"], window)) if x < args.target), math.inf)
                 for run in runs]
        ms = statistics.median(run["ms_per_step"] for run in runs)
        lines.append(f"| {label} | {statistics.median(held):.4f} ({min(held):.4f}-{max(held):.4f}) | "
                     f"{statistics.median(tails):.4f} | {statistics.median(below):g} | {res['message_bytes']:,.0f} | "
                     f"{res['sent_bytes']:,.0f} | {res['sent_bytes'] / results[baseline]['sent_bytes']:.4f} | "
                     f"{ms:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=64, help="global batch")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--eval-batch", type=int, default=4096, help="held-out samples for the final loss")
    p.add_argument("--seeds", type=lambda t: [int(x) for x in t.split(",")], default=[0, 1, 2],
                   help="model initialisations, each trained once per variant")
    p.add_argument("--variants", default="none,0.1,0.01,0.001", help="none and top-k ratios")
    p.add_argument("--target", type=float, default=1.0, help="report the first step the smoothed loss is below this")
    p.add_argument("--out", default="bench/out/topk", help="file prefix for .json, .md and .png")
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    import ringtree.torch as rtt

    torch.set_num_threads(1)
    rtt.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for label, ratio in parse_variants(args.variants):
        runs = [train_once(args, seed, ratio, world) for seed in args.seeds]
        results[label] = dict(runs=runs, **{key: runs[0][key] for key in ("message_bytes", "sent_bytes", "elements")})
    dist.destroy_process_group()
    if rank != 0:
        return
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    json.dump(dict(args=vars(args), world=world, results=results), open(args.out + ".json", "w"))
    window = max(1, args.steps // 10)
    for res in results.values():
        smoothed = [_trailing_mean(run["losses"], window) for run in res["runs"]]
        res["smoothed"] = [statistics.median(column) for column in zip(*smoothed)]
    table = _table(results, args, window)
    open(args.out + ".md", "w").write(table + "\n")
    print(table)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, res in results.items():
        ax.plot(res["smoothed"], label=f"{label} ({res['sent_bytes']:,.0f} B/step)")
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss (mean of last {window} steps)")
    ax.set_ylim(bottom=0)
    elements = next(iter(results.values()))["elements"]
    ax.set_title(f"DDP on ringtree, P={world}, MLP {elements:,} parameters, median of {len(args.seeds)} seeds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=110)


if __name__ == "__main__":
    main()
