"""MoE dispatch + combine throughput: ringtree.moe over ringtree's all_to_all_v against the same
code over torch's dist.all_to_all_single on Gloo.

    python -m ringtree.launch -n 2 bench/moe_bench.py
    python -m ringtree.launch -n 4 bench/moe_bench.py --tokens 1024,8192 --hidden 256,1024 -n 10

Both sides run ringtree.moe's dispatch and combine with the same routing (the same counts and
drops); only the communicator differs: a ringtree Communicator, or GlooComm below, which gives
moe the two calls it makes (all_to_all for the counts, all_to_all_v for the rows) through
dist.all_to_all_single. The experts are the identity, so the time is routing + exchange +
combine. "fwd" is dispatch + combine; "fwd+bwd" adds the backward of both (two more
exchanges). "local" is the same code on a one-rank communicator (comm.split by rank: every
expert local, the same rows gathered and summed per rank, no reordering, no peer), so
"ringtree - local" is about what the exchange adds. Every iteration allocates its outputs,
and on this VM first-touching large fresh tensors is slow, so local is far from free.
Each rank routes its T tokens top-k over E experts from softmax(random logits)
with capacity factor 1.25. Time per iteration is the slowest rank's; the figure is the median
of the iterations, tokens/s counts every rank's tokens (P * T / time). Libraries alternate
block by block (--repeats blocks each), and each block's median goes into the overall median.
Each rank runs one torch thread (ranks share the cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


class GlooComm:
    """The communicator calls ringtree.moe makes, on the default torch.distributed group."""

    def __init__(self, dist):
        self.dist, self.rank, self.size = dist, dist.get_rank(), dist.get_world_size()

    def all_to_all(self, x, out):
        self.dist.all_to_all_single(out.view(-1), x.view(-1))

    def all_to_all_v(self, x, out, send_counts, recv_counts):
        self.dist.all_to_all_single(out.view(-1), x.view(-1), list(recv_counts), list(send_counts))


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="1024,8192", help="tokens per rank (T), comma list")
    p.add_argument("--hidden", default="256,1024", help="token width (H), comma list")
    p.add_argument("-k", type=int, default=2, help="experts per token")
    p.add_argument("-E", "--experts", type=int, default=8)
    p.add_argument("--capacity-factor", type=float, default=1.25)
    p.add_argument("-n", "--iters", type=int, default=10, help="timed iterations per block")
    p.add_argument("-w", "--warmup", type=int, default=2, help="untimed iterations per block")
    p.add_argument("--repeats", type=int, default=3, help="blocks per library, interleaved")
    p.add_argument("-J", "--json", default=None, help="also write the rows as JSON (rank 0)")
    return p.parse_args(argv)


def _ints(text):
    return [int(v) for v in text.split(",") if v]


def main(argv=None):
    args = _parse(sys.argv[1:] if argv is None else argv)
    import numpy as np
    import torch
    import torch.distributed as dist

    import ringtree as rt
    import ringtree.moe as moe
    from rtbench.impls import open_gloo

    torch.set_num_threads(1)
    comm = rt.init()
    P, rank = comm.size, comm.rank

    def share_port(port):
        value = np.array([port], np.int64)
        comm.broadcast(value, root=0)
        return int(value[0])

    impl, reason = open_gloo(rank, P, share_port, comm.timeout)
    if impl is None:
        raise SystemExit(f"moe_bench: Gloo is not available: {reason}")
    comms = {"ringtree": comm, "gloo": GlooComm(dist), "local": comm.split(rank)}
    slowest = torch.zeros(1, dtype=torch.float64)

    def timed(step):
        """Times of `iters` iterations, each the slowest rank's (one all_reduce outside the timing)."""
        for _ in range(args.warmup):
            step()
        times = []
        for _ in range(args.iters):
            comm.barrier()
            started = time.perf_counter()
            step()
            slowest[0] = time.perf_counter() - started
            comm.all_reduce(slowest, op="max")
            times.append(slowest.item())
        return times

    rows = []
    for T in _ints(args.tokens):
        for H in _ints(args.hidden):
            g = torch.Generator().manual_seed(rank)
            tokens = torch.randn(T, H, generator=g)
            weights, ids = torch.softmax(torch.randn(T, args.experts, generator=g), 1).topk(args.k, dim=1)
            grad = torch.randn(T, H, generator=g)

            def forward(c, x, w):
                expert_inputs, handle = moe.dispatch(x, ids, w, args.experts, args.capacity_factor, comm=c)
                return moe.combine(expert_inputs, handle), handle

            # Same routing, same bits: the transports must agree exactly.
            outs = {name: forward(c, tokens, weights) for name, c in comms.items()}
            wrong = sum(int((outs[name][0] != outs["ringtree"][0]).sum()) for name in comms)
            stats = outs["ringtree"][1].stats
            dropped = int(stats.dropped.sum()) / max(1, T * args.k)

            def fwd(c):
                return lambda: forward(c, tokens, weights)

            def fwd_bwd(c):
                x, w = tokens.clone().requires_grad_(), weights.clone().requires_grad_()
                return lambda: forward(c, x, w)[0].backward(grad)

            for mode, make in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
                blocks = {name: [] for name in comms}
                for repeat in range(args.repeats):
                    order = list(comms) if repeat % 2 == 0 else list(comms)[::-1]
                    for name in order:
                        blocks[name].append(statistics.median(timed(make(comms[name]))))
                seconds = {name: statistics.median(b) for name, b in blocks.items()}
                row = dict(
                    P=P,
                    T=T,
                    H=H,
                    k=args.k,
                    E=args.experts,
                    mode=mode,
                    dropped=dropped,
                    wrong=wrong,
                    **{f"{name}_s": s for name, s in seconds.items()},
                    **{f"{name}_tok_s": P * T / s for name, s in seconds.items()},
                )
                row["ratio"] = seconds["gloo"] / seconds["ringtree"]
                rows.append(row)
                if rank == 0:
                    print(
                        f"P={P} T={T} H={H} {mode}: "
                        + ", ".join(f"{name} {s * 1e3:.2f} ms" for name, s in seconds.items()),
                        file=sys.stderr,
                        flush=True,
                    )
    if rank == 0:
        print(
            "| P | T/rank | H | mode | ringtree ms | Gloo ms | local ms | ringtree tokens/s | Gloo tokens/s | "
            "ringtree / Gloo speed | dropped | #wrong |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['P']} | {r['T']} | {r['H']} | {r['mode']} | {r['ringtree_s'] * 1e3:.2f} | "
                f"{r['gloo_s'] * 1e3:.2f} | {r['local_s'] * 1e3:.2f} | {r['ringtree_tok_s']:.3g} | "
                f"{r['gloo_tok_s']:.3g} | {r['ratio']:.2f}x | {r['dropped']:.1%} | {r['wrong']} |"
            )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    dist.destroy_process_group()
    comms["local"].close()
    comm.close()


if __name__ == "__main__":
    main()
