"""Train an MLP with sharded data parallelism on ringtree, checkpoint it in shards and resume at
another world size.

    python -m ringtree.launch -n 4 examples/train_sharded.py --steps 40 --ckpt /tmp/run --every 10
    python -m ringtree.launch -n 2 examples/train_sharded.py --steps 80 --ckpt /tmp/run --resume
    torchrun --nproc-per-node 2 examples/train_sharded.py
    mpiexec -n 2 python examples/train_sharded.py          # needs mpi4py

    options: --stage 1|2|3 | --fsdp2   --dtype fp32|fp16|bf16   --accum K   --clip NORM
             --batch GLOBAL --lr LR --hidden H --scaler --ckpt DIR --every K --resume
             --keep-per-rank-batch

ZeRO (--stage) runs ringtree.torch.ShardedDataParallel over a ringtree communicator and saves
ShardedCheckpoint directories; --fsdp2 runs torch's fully_shard on the "ringtree"
torch.distributed backend and saves with torch.distributed.checkpoint (DCP). Both reshard on
--resume, which continues from the newest complete checkpoint under --ckpt.

Data: a fixed generated data set read in a fresh random order each epoch, so the data
position is just the number of samples consumed. Each step reads the next global batch and
rank r trains on its r-th slice, split into --accum micro-batches. Batch policy on resume:
by default the global batch stays what it was (per-rank batch = global / P), so training
continues exactly as if it had never stopped; --keep-per-rank-batch keeps the per-rank batch
instead, so the global batch follows P, and scales the learning rate linearly with it. Both
are recorded in the checkpoint's history (metadata.json).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import ringtree as rt
import ringtree.torch as rtt

INPUTS, CLASSES, DATASET = 32, 8, 4096
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class Stream:
    """A generated data set (labels from a fixed random teacher) read in a new order each epoch;
    the reading position, `samples` consumed, is all a checkpoint needs to resume it."""

    def __init__(self, size: int = DATASET, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, INPUTS, generator=generator) * 2 + 1
        teacher = torch.randn(INPUTS, CLASSES, generator=generator)
        self.y = (torch.tanh(self.x - 1) @ teacher).argmax(dim=1)
        self.size, self.seed = size, seed
        self._orders = {}

    def order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:  # keeps one epoch's order: a batch spans at most two
            self._orders = {
                epoch: torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + epoch))
            }
        return self._orders[epoch]

    def batch(self, samples: int, count: int):
        """The `count` samples after the first `samples` of the stream."""
        positions = torch.arange(samples, samples + count)
        indices = torch.empty(count, dtype=torch.long)
        for epoch in torch.unique(positions // self.size).tolist():
            chosen = positions // self.size == epoch
            indices[chosen] = self.order(epoch)[positions[chosen] % self.size]
        return self.x[indices], self.y[indices]


class Standardize(torch.nn.Module):
    """Fixed input statistics, kept as buffers (so checkpoints carry replicated state too)."""

    def __init__(self, mean: float, std: float):
        super().__init__()
        self.register_buffer("mean", torch.full((INPUTS,), mean))
        self.register_buffer("std", torch.full((INPUTS,), std))

    def forward(self, x):
        return (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)


def make_model(hidden: int = 64, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        Standardize(1.0, 2.0),
        torch.nn.Linear(INPUTS, hidden),
        torch.nn.GELU(),
        torch.nn.LayerNorm(hidden),
        torch.nn.Linear(hidden, hidden),
        torch.nn.GELU(),
        torch.nn.Linear(hidden, CLASSES),
    )


def schedule(warmup: int = 4, halve_every: int = 20):
    """Linear warm-up, then halve every `halve_every` steps (LambdaLR: the state is the step)."""
    return lambda step: min(1.0, (step + 1) / warmup) * 0.5 ** (step // halve_every)


def rank_slice(tensor, rank: int, world: int):
    per_rank = tensor.shape[0] // world
    return tensor[rank * per_rank : (rank + 1) * per_rank]


class Trainer:
    """One rank's trainer: ZeRO stage 1/2/3 on a ringtree communicator (`comm`), or FSDP2 on
    the default torch.distributed group (fsdp2=True). `step()` trains on the next global batch;
    `save(dir)` and `resume(dir)` write and read sharded checkpoints."""

    def __init__(
        self,
        comm=None,
        *,
        stage: int = 2,
        fsdp2: bool = False,
        dtype: str = "fp32",
        hidden: int = 64,
        lr: float = 3e-3,
        global_batch: int = 48,
        accum: int = 1,
        clip: float | None = None,
        scaler: bool | None = None,
        growth_interval: int = 2000,
        bucket_cap_mb: float = 25.0,
        keep_per_rank_batch: bool = False,
        data: Stream | None = None,
    ):
        self.fsdp2, self.dtype, self.accum, self.clip = fsdp2, DTYPES[dtype], accum, clip
        self.keep_per_rank_batch = keep_per_rank_batch
        self.data = data or Stream()
        self.samples, self.steps = 0, 0
        model = make_model(hidden)
        if scaler is None:
            scaler = dtype == "fp16"
        if fsdp2:
            import torch.distributed as dist
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            if dtype == "fp16":
                raise ValueError(
                    "--fsdp2 takes --dtype fp32 or bf16 here: a GradScaler would decide on "
                    "overflow per rank (torch has no sharded scaler for fully_shard)"
                )
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            policy = MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32)
            for layer in model:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mp_policy=policy)
            fully_shard(model, mp_policy=policy)
            self.model, self.optimizer, self.zero = model, torch.optim.AdamW(model.parameters(), lr=lr), None
            self.scaler = None
        else:
            comm = rt.init() if comm is None else comm
            self.rank, self.world = comm.rank, comm.size
            self.zero = rtt.ShardedDataParallel(
                model,
                torch.optim.AdamW,
                comm,
                stage=stage,
                bucket_cap_mb=bucket_cap_mb,
                accumulation_steps=accum,
                param_dtype=None if dtype == "fp32" else self.dtype,
                lr=lr,
            )
            self.model, self.optimizer = model, self.zero.optimizer
            self.scaler = torch.amp.GradScaler("cpu", growth_interval=growth_interval) if scaler else None
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule())
        self.checkpoint = None if fsdp2 else rtt.ShardedCheckpoint(self.zero, self.scheduler, self.scaler)
        self.history = []  # FSDP2's; ZeRO's lives in self.checkpoint.history
        self.set_global_batch(global_batch)

    def set_global_batch(self, global_batch: int):
        if global_batch % (self.world * self.accum):
            raise ValueError(
                f"the global batch {global_batch} must be divisible by ranks x accumulation "
                f"({self.world} x {self.accum})"
            )
        self.global_batch = global_batch

    def step(self) -> float:
        """One optimizer step on the next global batch; returns this rank's loss."""
        x, y = self.data.batch(self.samples, self.global_batch)
        x, y = rank_slice(x, self.rank, self.world), rank_slice(y, self.rank, self.world)
        if self.zero is not None and self.dtype != torch.float32:
            x = x.to(self.dtype)
        total = 0.0
        for micro, (xm, ym) in enumerate(zip(x.chunk(self.accum), y.chunk(self.accum))):
            if self.fsdp2:  # gradients reduce-scatter on the last micro-step only
                self.model.set_requires_gradient_sync(micro == self.accum - 1)
            loss = torch.nn.functional.cross_entropy(self.model(xm).float(), ym) / self.accum
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            total += loss.item()
        if self.fsdp2:
            if self.clip is not None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
            self.optimizer.step()
            self.optimizer.zero_grad()
        else:
            if self.clip is not None:
                if self.scaler is not None:
                    self.zero.unscale_(self.scaler)
                self.zero.clip_grad_norm_(self.clip)
            self.zero.step(self.scaler)
            if self.scaler is not None:
                self.scaler.update()
            self.zero.zero_grad()
        self.scheduler.step()
        self.samples += self.global_batch
        self.steps += 1
        return total

    # --- checkpoints ------------------------------------------------------------------------

    def position(self) -> dict:
        return {
            "samples": self.samples,
            "steps": self.steps,
            "global_batch": self.global_batch,
            "per_rank_batch": self.global_batch // self.world,
            "accumulation": self.accum,
        }

    def save(self, path: str):
        batch = {k: v for k, v in self.position().items() if k not in ("samples", "steps")}
        batch["policy"] = "keep per-rank batch, lr linear in P" if self.keep_per_rank_batch else "keep global batch"
        if not self.fsdp2:
            self.checkpoint.save(path, data=self.position(), batch=batch)
            return
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=path)
        self.history.append(
            dict(
                batch,
                event="save",
                world_size=self.world,
                samples=self.samples,
                lr=self.optimizer.param_groups[0]["lr"],
            )
        )
        if self.rank == 0:  # what DCP does not hold, the same on every rank
            torch.save(
                {"scheduler": self.scheduler.state_dict(), "data": self.position(), "history": self.history},
                os.path.join(path, "trainer.pt"),
            )
        dist.barrier()

    def resume(self, path: str) -> dict:
        """Load the checkpoint in `path` (saved at any world size); returns its data position."""
        if self.fsdp2:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

            model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
            state = {"model": model_state, "optimizer": optimizer_state}
            dcp.load(state, checkpoint_id=path)
            set_state_dict(
                self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
            )
            extra = torch.load(os.path.join(path, "trainer.pt"), weights_only=True)
            self.scheduler.load_state_dict(extra["scheduler"])
            data, self.history = extra["data"], extra["history"]
            saved_world = self.history[-1]["world_size"]
        else:
            meta = self.checkpoint.load(path)
            data, saved_world = meta["data"], meta["world_size"]
        self.samples, self.steps = data["samples"], data["steps"]
        if self.keep_per_rank_batch:
            global_batch = data["per_rank_batch"] * self.world
            self._scale_lr(global_batch / data["global_batch"])
        else:
            global_batch = data["global_batch"]
        self.set_global_batch(global_batch)
        record = {
            "event": "resume",
            "world_size": self.world,
            "saved_world_size": saved_world,
            "samples": self.samples,
            "global_batch": global_batch,
            "per_rank_batch": global_batch // self.world,
            "lr": self.optimizer.param_groups[0]["lr"],
        }
        history = self.history if self.fsdp2 else self.checkpoint.history
        if self.fsdp2:
            history.append(record)
        else:
            history[-1] = record  # the checkpoint's own resume record, with the batch policy applied
        return data

    def _scale_lr(self, factor: float):
        """The linear scaling rule: the lr follows the global batch."""
        for group in self.optimizer.param_groups:
            group["lr"] *= factor
            group["initial_lr"] *= factor
        self.scheduler.base_lrs = [lr * factor for lr in self.scheduler.base_lrs]
        self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def full_parameters(self) -> list:
        """Every parameter in full, on every rank (collective under FSDP2)."""
        if self.fsdp2:
            return [p.full_tensor().detach().float() for p in self.model.parameters()]
        with self.zero.gathered_parameters():  # stage 3 keeps only shards between steps
            return [p.detach().float().clone() for p in self.model.parameters()]


def latest_checkpoint(root: str) -> str | None:
    """The newest complete checkpoint directory (step-NNNNNNNN) under root."""
    if not os.path.isdir(root):
        return None
    done = [
        name
        for name in os.listdir(root)
        if name.startswith("step-")
        and (
            os.path.exists(os.path.join(root, name, "metadata.pt"))
            or os.path.exists(os.path.join(root, name, "trainer.pt"))
        )
    ]
    return os.path.join(root, max(done)) if done else None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40, help="train until this many steps in all (resumed ones count)")
    p.add_argument("--stage", type=int, choices=(1, 2, 3), default=2)
    p.add_argument("--fsdp2", action="store_true", help="torch's fully_shard on the ringtree backend instead")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per step")
    p.add_argument("--clip", type=float, default=None, help="clip the global gradient norm to this")
    p.add_argument("--batch", type=int, default=48, help="global batch (on --resume: the checkpoint's)")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--scaler", action="store_true", help="a GradScaler also in fp32/bf16 (always in fp16)")
    p.add_argument("--ckpt", default=None, help="directory of the checkpoints (step-NNNNNNNN/ below it)")
    p.add_argument("--every", type=int, default=0, help="checkpoint every this many steps (and at the end)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint under --ckpt")
    p.add_argument(
        "--keep-per-rank-batch",
        action="store_true",
        help="on resume keep the per-rank batch (global batch follows P, lr scaled linearly)",
    )
    args = p.parse_args(argv)

    comm = None
    if args.fsdp2:
        import torch.distributed as dist

        rtt.init_process_group()
        world = dist.get_world_size()
    else:
        comm = rt.init()
        world = comm.size
    if "OMP_NUM_THREADS" not in os.environ:
        # torch's default (a thread per core in every rank) oversubscribes the cores when the
        # ranks share a host, and its spinning threads then slow each step 10-30x (torchrun sets 1).
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    trainer = Trainer(
        comm,
        stage=args.stage,
        fsdp2=args.fsdp2,
        dtype=args.dtype,
        hidden=args.hidden,
        lr=args.lr,
        global_batch=args.batch,
        accum=args.accum,
        clip=args.clip,
        scaler=args.scaler or None,
        keep_per_rank_batch=args.keep_per_rank_batch,
    )
    say = print if trainer.rank == 0 else (lambda *a, **k: None)
    how = "FSDP2" if args.fsdp2 else f"ZeRO stage {args.stage}"
    say(f"{how} on {trainer.world} ranks, {args.dtype}, accumulation {args.accum}, clip {args.clip}")
    if args.resume:
        path = latest_checkpoint(args.ckpt or "")
        if path is None:
            raise SystemExit(f"--resume: no complete checkpoint under {args.ckpt!r}")
        trainer.resume(path)
        say(
            f"resumed {path} (saved on {trainer_history(trainer)[-1]['saved_world_size']} ranks) at step "
            f"{trainer.steps}, {trainer.samples} samples: global batch {trainer.global_batch}, per rank "
            f"{trainer.global_batch // trainer.world}, lr {trainer.optimizer.param_groups[0]['lr']:.3g}"
        )
    started, first = time.perf_counter(), None
    while trainer.steps < args.steps:
        loss = torch.tensor([trainer.step()])
        mean = loss.clone()
        if comm is not None:
            comm.all_reduce(mean, op="avg")
        else:
            dist.all_reduce(mean)
            mean /= trainer.world
        first = mean.item() if first is None else first
        say(
            f"step {trainer.steps:4d}  samples {trainer.samples:6d}  loss {mean.item():.4f}  "
            f"lr {trainer.scheduler.get_last_lr()[0]:.3g}"
        )
        if args.ckpt and args.every and (trainer.steps % args.every == 0 or trainer.steps == args.steps):
            path = os.path.join(args.ckpt, f"step-{trainer.steps:08d}")
            trainer.save(path)
            say(f"saved {path}")
    if first is not None:
        say(f"final loss {mean.item():.4f} (first {first:.4f}) in {time.perf_counter() - started:.2f} s")
    if comm is not None:
        comm.close()
    else:
        dist.destroy_process_group()


def trainer_history(trainer: Trainer) -> list:
    return trainer.history if trainer.fsdp2 else trainer.checkpoint.history


if __name__ == "__main__":
    main()
