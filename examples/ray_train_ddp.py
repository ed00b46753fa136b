"""Train with Ray Train on the ringtree backend of torch.distributed: DDP over 2 CPU workers.

    python examples/ray_train_ddp.py

    options: --steps 8   --backend ringtree (or gloo; several train one after the other, to compare)
             --save PREFIX (each worker writes its weights and losses to PREFIX-<backend>-rank<r>.pt)
             --tmp DIR (Ray's session files; a fresh folder under /tmp by default)

Ray starts the workers and the process group itself, before the training function runs, so the
workers must register the backend earlier: the job's runtime environment names a setup hook that
every Ray worker process runs when it starts, and the hook imports ringtree.torch.
`TorchConfig(backend="ringtree")` then makes Ray start the group on ringtree. Each step worker r
trains on its own 8 samples of the step's 16, and DDP averages the gradients over ringtree.
"""

from __future__ import annotations

import argparse
import tempfile

import ray
import torch
import torch.distributed as dist
from ray import train
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

WORKERS, BATCH, SAMPLES, LR = 2, 8, 128, 0.1


def register_ringtree():
    """Runs in every Ray worker process as it starts, before Ray makes the process group."""
    import ringtree.torch  # noqa: F401  (registers the "ringtree" backend)


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    """A noisy linear regression task, the same on every worker."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 8, generator=g)
    y = x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.1 * torch.randn(SAMPLES, 1, generator=g)
    return x, y


def make_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def train_loop(cfg: dict):
    rank, world = train.get_context().get_world_rank(), train.get_context().get_world_size()
    net = make_net()
    model = train.torch.prepare_model(net)  # DDP on the group Ray started
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = dataset()
    losses = []
    for step in range(cfg["steps"]):
        start = (step * world + rank) * BATCH % SAMPLES  # this worker's 8 of the step's 16 samples
        loss = torch.nn.functional.mse_loss(model(x[start : start + BATCH]), y[start : start + BATCH])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    with torch.no_grad():
        whole = torch.nn.functional.mse_loss(net(x), y).item()
    print(
        f"rank {rank} of {world}: backend {dist.get_backend()}, "
        f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, on the whole data set {whole:.4f}",
        flush=True,
    )
    if cfg["save"]:
        path = f"{cfg['save']}-{dist.get_backend()}-rank{rank}.pt"
        torch.save({"weights": net.state_dict(), "losses": losses}, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--backend", nargs="+", default=["ringtree"], help="one training per backend")
    p.add_argument("--save", metavar="PREFIX", help="each worker writes PREFIX-<backend>-rank<r>.pt")
    p.add_argument("--tmp", metavar="DIR", help="Ray's session files and results")
    args = p.parse_args()

    tmp = args.tmp or tempfile.mkdtemp(prefix="ray-")
    ray.init(
        num_cpus=WORKERS,
        include_dashboard=False,
        _temp_dir=tmp,
        runtime_env={"worker_process_setup_hook": register_ringtree},
    )
    try:
        for backend in args.backend:
            trainer = TorchTrainer(
                train_loop,
                train_loop_config={"steps": args.steps, "save": args.save},
                torch_config=TorchConfig(backend=backend),
                scaling_config=ScalingConfig(num_workers=WORKERS, use_gpu=False),
                run_config=RunConfig(storage_path=f"{tmp}/results", name=f"ray_train_ddp_{backend}"),
            )
            trainer.fit()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
