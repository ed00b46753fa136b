"""Sharded checkpoints that load at another world size: train at P = 4, checkpoint, resume at
P = 2, checkpoint, resume at P = 3, and follow one process that trained on the whole global
batch all along, with AdamW, a warm-up/decay LambdaLR, a GradScaler whose scale grows during
the run, clipping by the global norm, and the data position, for ZeRO stages 1, 2 and 3.

The legs run the trainer of examples/train_sharded.py (Trainer) in real rank processes
(harness.py); the reference is a plain torch loop over the unsharded model, here in the test
process. The global batch (12) stays fixed: per-rank batch 3, 6, then 4 in 2 micro-batches.
The middle leg uses a small bucket cap, so its bucket layout (and so every shard boundary)
differs from the saving and the loading legs'."""

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")

import torch_group  # noqa: E402
from harness import run_world  # noqa: E402

# float32: P ranks sum gradients in another order than one process, a few ulps per step that
# Adam's 1/sqrt(v) amplifies a little; relative to the largest parameter, as in test_zero.py.
RELATIVE_TOLERANCE = 1e-6
STEPS = 3  # per leg
GLOBAL_BATCH = 12  # divisible by 4, 2 and 3
HIDDEN = 19  # 1205 parameters: not a multiple of 2, 3 or 4, so shards are padded
CLIP = 0.3
LR = 0.02
GROWTH_INTERVAL = 2  # the scaler's scale doubles every 2 steps: its state must carry over
LEGS = [  # (world size, accumulation micro-batches, bucket cap in MiB)
    (4, 1, 25.0),
    (2, 1, 2048 / 2**20),  # a bucket closes at 512 float32 elements: 2 buckets instead of 1
    (3, 2, 25.0),
]
STAGES = (1, 2, 3)


def _trainer(comm, stage, accum, bucket_cap_mb, hidden=HIDDEN):
    import train_sharded

    return train_sharded.Trainer(
        comm,
        stage=stage,
        hidden=hidden,
        lr=LR,
        global_batch=GLOBAL_BATCH,
        accum=accum,
        clip=CLIP,
        scaler=True,
        growth_interval=GROWTH_INTERVAL,
        bucket_cap_mb=bucket_cap_mb,
    )


def reshard_leg(root, leg, accum, bucket_cap_mb):
    """Rank body: for each stage, resume from leg - 1's checkpoint (none for leg 0), train
    STEPS steps, save leg's checkpoint, report parameters, scale, lr and history."""
    import torch

    import ringtree as rt

    torch.set_num_threads(1)  # ranks share two cores
    comm = rt.init()
    report = {}
    for stage in STAGES:
        directory = os.path.join(root, f"stage{stage}")
        if leg > 0:
            refused = _refused_other_model(comm, os.path.join(directory, f"leg{leg - 1}"))
        trainer = _trainer(comm, stage, accum, bucket_cap_mb)
        if leg > 0:
            trainer.resume(os.path.join(directory, f"leg{leg - 1}"))
        for _ in range(STEPS):
            trainer.step()
        trainer.save(os.path.join(directory, f"leg{leg}"))
        report[stage] = {
            "params": torch.cat([p.reshape(-1) for p in trainer.full_parameters()]).tolist(),
            "scale": trainer.scaler.get_scale(),
            "lr": trainer.scheduler.get_last_lr()[0],
            "samples": trainer.samples,
            "buckets": len(trainer.zero.buckets),
            "history": trainer.checkpoint.history,
            "other_model_refused": refused if leg > 0 else None,
        }
    comm.close()
    return report


def _refused_other_model(comm, path):
    """Loading into a model of another shape must raise ValueError on every rank before any
    traffic, and leave the communicator usable (the next trainer broadcasts over it)."""
    trainer = _trainer(comm, 2, 1, 25.0, hidden=HIDDEN + 1)
    try:
        trainer.resume(path)
    except ValueError as error:
        return "parameters" in str(error)
    return False


def _reference(steps, clip=CLIP, scaler=True):
    """One process, the whole global batch per step: parameters (flat) after each leg's steps,
    the scales, the lrs, the clip norms and the losses."""
    import torch
    import train_sharded

    data = train_sharded.Stream()
    model = train_sharded.make_model(HIDDEN)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, train_sharded.schedule())
    scaler = torch.amp.GradScaler("cpu", growth_interval=GROWTH_INTERVAL, enabled=scaler)
    snapshots, norms, losses = [], [], []
    for step in range(steps):
        x, y = data.batch(step * GLOBAL_BATCH, GLOBAL_BATCH)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        losses.append(loss.item())
        scaler.scale(loss).backward()
        if clip is not None:
            scaler.unscale_(optimizer)
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item())
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        optimizer.zero_grad()
        if (step + 1) % STEPS == 0:
            snapshots.append(
                {
                    "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
                    "scale": scaler.get_scale(),
                    "lr": scheduler.get_last_lr()[0],
                }
            )
    return snapshots, norms, losses


def _relative_diff(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.timeout(170)
def test_resharded_restarts_follow_uninterrupted_training(tmp_path):
    import torch

    import ringtree.torch as rtt

    snapshots, norms, _ = _reference(STEPS * len(LEGS))
    assert max(norms) > CLIP, norms  # clipping does act
    assert snapshots[-1]["scale"] > snapshots[0]["scale"] > 2.0**16  # the scale grows across legs
    for leg, (world, accum, cap) in enumerate(LEGS):
        results = run_world(
            world, reshard_leg, dict(root=str(tmp_path), leg=leg, accum=accum, bucket_cap_mb=cap), timeout=60
        ).check_ok()
        expected = snapshots[leg]
        for stage in STAGES:
            outs = [r[str(stage)] for r in results]
            for rank, out in enumerate(outs):
                assert out["params"] == outs[0]["params"], (leg, stage, rank, "ranks differ")
                diff = _relative_diff(torch.tensor(out["params"]), expected["params"])
                assert diff <= RELATIVE_TOLERANCE, (leg, world, stage, rank, diff)
                assert out["scale"] == expected["scale"], (leg, stage, out["scale"], expected["scale"])
                assert out["lr"] == pytest.approx(expected["lr"], rel=1e-12), (leg, stage)
                assert out["samples"] == (leg + 1) * STEPS * GLOBAL_BATCH
                if leg > 0:
                    assert out["other_model_refused"] is True, (leg, stage, rank)
            assert outs[0]["buckets"] == (2 if cap < 1 else 1), (leg, outs[0]["buckets"])
            # The history records every world-size change and how the batch followed it.
            history = outs[0]["history"]
            resumes = [h for h in history if h["event"] == "resume"]
            assert [(h["saved_world_size"], h["world_size"]) for h in resumes] == [
                (LEGS[i][0], LEGS[i + 1][0]) for i in range(leg)
            ], history
            assert all(
                h["global_batch"] == GLOBAL_BATCH and h["per_rank_batch"] == GLOBAL_BATCH // h["world_size"]
                for h in history
                if "global_batch" in h
            ), history
            # The checkpoint read back in one process: the same parameters, and the files the
            # format promises.
            path = tmp_path / f"stage{stage}" / f"leg{leg}"
            assert sorted(p.name for p in path.glob("shard-*")) == [
                f"shard-{r:05d}-of-{world:05d}.pt" for r in range(world)
            ]
            meta = rtt.read_checkpoint_metadata(str(path))
            assert meta["world_size"] == world and meta["data"]["samples"] == outs[0]["samples"]
            full = rtt.consolidate_checkpoint(str(path))
            trained = torch.cat([full[name].reshape(-1) for name in meta["param_names"]])
            assert torch.equal(trained, torch.tensor(outs[0]["params"])), (leg, stage)
            assert torch.equal(full["0.std"], torch.full((32,), 2.0))  # a buffer, saved once


# The example prints losses with 4 decimals.
PRINTED_LOSS_TOLERANCE = 1e-4


@pytest.mark.timeout(120)
def test_example_fsdp2_resumes_at_another_world_size(tmp_path):
    """examples/train_sharded.py --fsdp2 under ringtree.launch: 4 steps on 2 ranks with DCP
    checkpoints, then --resume on 3 ranks to step 8; every printed loss follows one process."""
    _, _, losses = _reference(8, clip=None, scaler=False)
    assert losses[-1] < losses[0]
    common = [
        os.path.join(torch_group.EXAMPLES, "train_sharded.py"),
        "--fsdp2",
        "--hidden",
        str(HIDDEN),
        "--lr",
        str(LR),
        "--batch",
        str(GLOBAL_BATCH),
        "--ckpt",
        str(tmp_path),
        "--every",
        "4",
    ]
    printed = {}
    for ranks, extra in ((2, ["--steps", "4"]), (3, ["--steps", "8", "--resume"])):
        launch = [sys.executable, "-m", "ringtree.launch", "-n", str(ranks), "--timeout", "50"]
        run = subprocess.run(
            launch + common + extra,
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
        )
        assert run.returncode == 0, run.stdout + run.stderr
        found = re.findall(r"step +(\d+) .* loss ([\d.]+)", run.stdout)
        printed.update({int(step): float(loss) for step, loss in found})
    assert "resumed" in run.stdout and "(saved on 2 ranks)" in run.stdout, run.stdout
    assert sorted(printed) == list(range(1, 9)), printed
    for step, loss in printed.items():
        assert abs(loss - losses[step - 1]) <= PRINTED_LOSS_TOLERANCE, (step, loss, losses[step - 1])
