"""Train with DeepSpeed ZeRO (stage 1, 2 or 3) on the ringtree backend of torch.distributed, on the
CPU, over 2 processes.

    torchrun --nproc-per-node 2 examples/deepspeed_zero.py --stage 3

    options: --stage 1|2|3 (several train one after the other, on the same process group)
             --steps 8   --backend ringtree (or gloo, to compare)
             --save PREFIX (each rank writes each stage's final weights and losses to
                            PREFIX-stage<s>-rank<r>.pt)

DeepSpeed picks its accelerator when it is imported: DS_ACCELERATOR=cpu (set below unless you set
it) makes it the CPU. `deepspeed.init_distributed(dist_backend="ringtree")` starts the default
process group on ringtree, and ZeRO's collectives (the gradients' reduce-scatter or all-reduce,
the parameters' all-gather and broadcast) run there. Each step rank r trains on its own 8 samples
of the step's 16; ZeRO averages the gradients over the 2 ranks, and every rank updates the part of
the model state it owns. At the end the ranks gather the whole model (stage 3 keeps only a shard of
each parameter on each rank) and each saves it with the losses it saw.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before DeepSpeed is imported

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import ringtree.torch  # noqa: E402, F401  (registers the "ringtree" backend)

PROCESSES, BATCH, SAMPLES, LR = 2, 8, 128, 0.1


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    """A noisy linear regression task, the same on every rank."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 8, generator=g)
    y = x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.1 * torch.randn(SAMPLES, 1, generator=g)
    return x, y


def make_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,  # torch's SGD, not one of DeepSpeed's own
        "gradient_clipping": 0.0,  # DeepSpeed clips the gradients' norm to 1.0 unless told
        "steps_per_print": 1_000_000,
    }


def train(stage: int, steps: int) -> tuple[dict, list[float], float]:
    """One ZeRO training from the initial model: its final weights, its losses, and its loss on
    the whole data set."""
    rank, world = dist.get_rank(), dist.get_world_size()
    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    engine, _, _, _ = deepspeed.initialize(model=net, optimizer=optimizer, config=config(stage))

    x, y = dataset()
    losses = []
    for step in range(steps):
        start = (step * world + rank) * BATCH % SAMPLES  # this rank's 8 of the step's 16 samples
        loss = torch.nn.functional.mse_loss(engine(x[start : start + BATCH]), y[start : start + BATCH])
        engine.backward(loss)  # ZeRO averages the gradients over the ranks
        engine.step()
        losses.append(loss.item())

    # Stage 3 keeps a shard of each parameter per rank: gather them to read the whole model.
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        weights = {name: t.detach().clone() for name, t in engine.module.state_dict().items()}
        with torch.no_grad():
            whole = torch.nn.functional.mse_loss(engine.module(x), y).item()
    return weights, losses, whole


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stage", type=int, nargs="+", choices=(1, 2, 3), default=[2], help="one training per stage")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--backend", default="ringtree")
    p.add_argument("--save", metavar="PREFIX", help="each rank writes PREFIX-stage<s>-rank<r>.pt")
    args = p.parse_args()

    deepspeed.init_distributed(dist_backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    for stage in args.stage:
        weights, losses, whole = train(stage, args.steps)
        print(
            f"rank {rank} of {world}: backend {dist.get_backend()}, ZeRO stage {stage}, "
            f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, on the whole data set {whole:.4f}"
        )
        if args.save:
            torch.save({"weights": weights, "losses": losses}, f"{args.save}-stage{stage}-rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
