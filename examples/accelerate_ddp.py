"""Train with Hugging Face Accelerate on the ringtree backend of torch.distributed: DDP over 2 CPU
processes.

    torchrun --nproc-per-node 2 examples/accelerate_ddp.py

    options: --epochs 3   --save PREFIX (each rank writes its final weights to PREFIX-rank<r>.pt)

On the CPU, Accelerate starts Gloo (or MPI) itself and refuses any other backend name, so the
program starts the default process group on ringtree first; Accelerate then uses the group that
is already there. Its prepared data loader gives rank r the batches r, r + 2, ... of 8 samples,
and DDP averages the gradients over ringtree, so the 2 ranks follow exactly the trajectory of one
process that trains on the same samples in order, in batches of 16.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from accelerate import Accelerator

import ringtree.torch  # noqa: F401  (registers the "ringtree" backend)

BATCH, SAMPLES, LR = 8, 64, 0.1


def dataset() -> torch.utils.data.TensorDataset:
    """A noisy linear regression task, the same on every rank."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 8, generator=g)
    y = x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.1 * torch.randn(SAMPLES, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def make_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--save", metavar="PREFIX", help="each rank writes its final weights to PREFIX-rank<r>.pt")
    args = p.parse_args()

    dist.init_process_group("ringtree")  # before the Accelerator, which would start Gloo
    accelerator = Accelerator(cpu=True)
    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(net, optimizer, loader)  # DDP on the ringtree group

    for _ in range(args.epochs):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

    x, y = dataset().tensors
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(net(x), y).item()
    print(
        f"rank {accelerator.process_index} of {accelerator.num_processes}: backend {dist.get_backend()}, "
        f"loss on the whole data set {loss:.4f}"
    )
    if args.save:
        torch.save(net.state_dict(), f"{args.save}-rank{accelerator.process_index}.pt")
    accelerator.end_training()


if __name__ == "__main__":
    main()
