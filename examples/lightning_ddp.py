"""Train with PyTorch Lightning on the ringtree backend of torch.distributed: DDP over 2 CPU processes.

    python examples/lightning_ddp.py                         # Lightning starts the second process
    torchrun --nproc-per-node 2 examples/lightning_ddp.py    # or torchrun starts both

    options: --epochs 3   --save PREFIX (each rank writes its final weights to PREFIX-rank<r>.pt)

Lightning gives each rank half of every epoch's shuffled order (a DistributedSampler it adds) in
batches of 8, and DDP averages the gradients over ringtree, so the 2 ranks follow exactly the
trajectory of one process that trains on the same order in batches of 16.
"""

from __future__ import annotations

import argparse

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.strategies import DDPStrategy

import ringtree.torch  # noqa: F401  (registers the "ringtree" backend)

PROCESSES, BATCH, SAMPLES, LR = 2, 8, 64, 0.1


def dataset() -> torch.utils.data.TensorDataset:
    """A noisy linear regression task, the same on every rank."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 8, generator=g)
    y = x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.1 * torch.randn(SAMPLES, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def make_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = make_net()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--save", metavar="PREFIX", help="each rank writes its final weights to PREFIX-rank<r>.pt")
    args = p.parse_args()

    model = Regression()
    loader = torch.utils.data.DataLoader(dataset(), batch_size=BATCH)  # Lightning shards and shuffles it
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=PROCESSES,
        strategy=DDPStrategy(process_group_backend="ringtree"),
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)

    x, y = dataset().tensors
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(model.net(x), y).item()
    print(
        f"rank {trainer.global_rank} of {trainer.world_size}: backend {dist.get_backend()}, "
        f"loss on the whole data set {loss:.4f}"
    )
    if args.save:
        torch.save(model.net.state_dict(), f"{args.save}-rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main()
