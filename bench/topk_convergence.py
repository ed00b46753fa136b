"""Convergence of DDP with topk_hook (top-k sparsification with error feedback) against
uncompressed DDP, on the example MLP (examples/train_ddp.py), on the ringtree backend.

    python -m ringtree.launch -n 2 bench/topk_convergence.py --out bench/results/topk

Every variant trains the same model from the same seed on the same batches (SGD with momentum,
as the example does), one after another in the same processes. Rank 0 writes the loss curves
(JSON), a table (markdown) and, with matplotlib, a plot. Bytes are per rank per step: the
message a rank contributes (top-k: its indices and values; uncompressed: the float32 gradients)
and what it sends with a ring algorithm: (P - 1) messages for an all_gather, 2 (P - 1) / P of
the gradients for an all_reduce.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))


def parse_variants(text):
    """'none,0.01,0.001' -> [(label, ratio or None)]."""
    return [("none", None) if word == "none" else (f"topk {word}", float(word)) for word in text.split(",")]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=64, help="global batch")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--variants", default="none,0.01,0.001", help="none and top-k ratios")
    p.add_argument("--out", default="bench/out/topk", help="file prefix for .json, .md and .png")
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    import ringtree.torch as rtt
    import train_ddp

    torch.set_num_threads(1)
    rtt.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for label, ratio in parse_variants(args.variants):
        ddp = train_ddp.wrap(train_ddp.make_model(args.hidden))
        state = None
        if ratio is not None:
            state = rtt.TopKState(ratio=ratio)
            ddp.register_comm_hook(state, rtt.topk_hook)
        elements = sum(p.numel() for p in ddp.parameters())
        started = time.perf_counter()
        losses = train_ddp.train(ddp, args.steps, args.batch, args.lr, log=None)
        seconds = time.perf_counter() - started
        if state is not None:
            message = state.sent_bytes / args.steps
            sends = (world - 1) * message
        else:
            message = 4 * elements
            sends = 2 * (world - 1) / world * message
        results[label] = dict(losses=losses, message_bytes=message, sent_bytes=sends, elements=elements,
                              ms_per_step=1e3 * seconds / args.steps)
    dist.destroy_process_group()
    if rank != 0:
        return
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    json.dump(dict(args=vars(args), world=world, results=results), open(args.out + ".json", "w"))
    baseline = results[next(iter(results))]
    window = max(1, args.steps // 10)
    lines = [f"| variant | loss, last {window} steps (mean) | final loss | message bytes / step | "
             f"bytes sent / step (ring) | vs {next(iter(results))} | ms / step |", "|---|---|---|---|---|---|---|"]
    for label, res in results.items():
        tail = statistics.fmean(res["losses"][-window:])
        lines.append(f"| {label} | {tail:.4f} | {res['losses'][-1]:.4f} | {res['message_bytes']:,.0f} | "
                     f"{res['sent_bytes']:,.0f} | {res['sent_bytes'] / baseline['sent_bytes']:.4f} | "
                     f"{res['ms_per_step']:.2f} |")
    table = "\n".join(lines)
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
        curve = res["losses"]
        smooth = [statistics.fmean(curve[max(0, i - window + 1):i + 1]) for i in range(len(curve))]
        ax.plot(smooth, label=f"{label} ({res['sent_bytes']:,.0f} B/step)")
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss (mean of last {window} steps)")
    ax.set_title(f"DDP on ringtree, P={world}, MLP {baseline['elements']:,} parameters")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=110)


if __name__ == "__main__":
    main()
