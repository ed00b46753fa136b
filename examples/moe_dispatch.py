"""A tiny Mixture-of-Experts layer trained over ringtree.moe.

    python -m ringtree.launch -n 4 examples/moe_dispatch.py [--steps 40]

Each rank draws its own batch from a generated task whose target depends on which of a few
regions a token lies in, so experts pay off. The router (a Linear layer, replicated) picks
the top-k of num_experts experts per token; the experts (small MLPs) are spread over the ranks,
two per rank, and only their own rank holds their parameters. dispatch sends each token to its
experts' ranks, combine brings the weighted outputs back, and backward runs the same exchanges
in reverse, so each expert's gradient is complete on its rank and only the router's gradient
needs an all_reduce. Rank 0 prints the mean loss and the tokens each expert dropped for lack of
capacity.
"""

from __future__ import annotations

import argparse

import torch

import ringtree as rt
import ringtree.moe as moe

H, REGIONS = 16, 4


def batch(generator, tokens):
    """Tokens and targets: a token's target is a fixed map of it chosen by its region."""
    task = torch.Generator().manual_seed(1234)  # the same task on every rank
    centers = torch.randn(REGIONS, H, generator=task)
    maps = torch.randn(REGIONS, H, H, generator=task) / H**0.5
    x = torch.randn(tokens, H, generator=generator)
    region = (x @ centers.t()).argmax(1)
    return x, torch.tanh(torch.einsum("th,thd->td", x, maps[region]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--tokens", type=int, default=128, help="tokens per rank per step")
    p.add_argument("--experts-per-rank", type=int, default=2)
    p.add_argument("-k", type=int, default=2)
    p.add_argument("--capacity-factor", type=float, default=1.25)
    args = p.parse_args()
    torch.set_num_threads(1)
    comm = rt.init()
    E = args.experts_per_rank * comm.size

    torch.manual_seed(0)  # the router starts the same on every rank
    router = torch.nn.Linear(H, E)
    experts = {}
    for e in range(comm.rank * args.experts_per_rank, (comm.rank + 1) * args.experts_per_rank):
        torch.manual_seed(100 + e)
        experts[e] = torch.nn.Sequential(torch.nn.Linear(H, 4 * H), torch.nn.GELU(), torch.nn.Linear(4 * H, H))
    params = list(router.parameters()) + [q for m in experts.values() for q in m.parameters()]
    optimizer = torch.optim.Adam(params, lr=3e-3)
    data = torch.Generator().manual_seed(comm.rank)
    loss_sum = torch.zeros(1)

    for step in range(args.steps):
        x, target = batch(data, args.tokens)
        logits = router(x)
        top, ids = logits.topk(args.k, dim=1)
        weights = torch.softmax(top, dim=1)
        expert_inputs, handle = moe.dispatch(x, ids, weights, E, args.capacity_factor, comm=comm, global_stats=True)
        chunks = expert_inputs.split(handle.expert_counts)
        y = moe.combine(torch.cat([experts[e](c) for e, c in zip(handle.local_experts, chunks)]), handle)
        loss = torch.nn.functional.mse_loss(y, target)
        optimizer.zero_grad()
        loss.backward()
        comm.all_reduce(router.weight.grad, op="avg")  # the replicated router: average its gradient
        comm.all_reduce(router.bias.grad, op="avg")
        optimizer.step()
        loss_sum[0] = loss.item()
        comm.all_reduce(loss_sum, op="avg")
        if comm.rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            s = handle.stats
            print(
                f"step {step:3d}  loss {loss_sum.item():.4f}  dropped per expert {s.global_dropped.tolist()} "
                f"(kept {int(s.global_kept.sum())} of {int(s.global_kept.sum() + s.global_dropped.sum())})",
                flush=True,
            )
    comm.close()


if __name__ == "__main__":
    main()
