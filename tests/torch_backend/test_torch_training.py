"""Training on the ringtree backend: DDP (with find_unused_parameters, static_graph,
no_sync, comm hooks) and DataParallelHook keep every rank's parameters bit-identical and
follow single-process full-batch training; the compression hooks converge; the example
runs under ringtree.launch and torchrun.

The rank bodies (training_matches_single_process, compression_converges) run in every rank of a
test's world (harness.py) and return a JSON report that the test asserts on."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from harness import run_world  # noqa: E402
from torch_group import finish_group, init_group  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_ddp.py")


# float32, 4 SGD steps with momentum on a 64-24-24-10 MLP: P ranks sum their gradients in
# another order than one process does, which moves parameters by a few ulps (1.5e-8 seen).
SINGLE_PROCESS_TOLERANCE = 1e-6


def _flat_params(model):
    import torch

    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _single_process(steps, batch, lr, hidden, micro_batches=1, extra_unused=False):
    """The reference: one process, the whole batch each step."""
    import torch
    import train_ddp

    model = _model(hidden, extra_unused)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        x, y = train_ddp.global_batch(step, batch)
        optimizer.zero_grad()
        for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
            (torch.nn.functional.cross_entropy(model(xm), ym) / micro_batches).backward()
        optimizer.step()
    return model


def _model(hidden, extra_unused=False):
    import torch
    import train_ddp

    net = train_ddp.make_model(hidden, seed=0)
    if not extra_unused:
        return net

    class WithUnused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net
            self.unused = torch.nn.Linear(3, 3)  # never in forward: DDP needs find_unused_parameters

        def forward(self, x):
            return self.net(x)

    return WithUnused()


def _distributed_steps(module, params, steps, batch, lr, rank, world, micro_batches=1, no_sync=None, before_step=None):
    import contextlib

    import torch
    import train_ddp

    optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9)
    for step in range(steps):
        x, y = train_ddp.global_batch(step, batch)
        optimizer.zero_grad()
        micro = list(zip(x.chunk(micro_batches), y.chunk(micro_batches)))
        for i, (xm, ym) in enumerate(micro):
            last = i == len(micro) - 1
            context = no_sync() if (no_sync is not None and not last) else contextlib.nullcontext()
            with context:
                out = module(train_ddp.local_slice(xm, rank, world))
                loss = torch.nn.functional.cross_entropy(out, train_ddp.local_slice(ym, rank, world)) / micro_batches
                loss.backward()
        if before_step is not None:
            before_step()
        optimizer.step()


def training_matches_single_process(steps=4, batch=24, lr=0.05, hidden=24):
    """DDP (plain, find_unused_parameters, static_graph, no_sync, allreduce hook) and
    DataParallelHook (plain, accumulation) against single-process full-batch training."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ringtree.torch as rtt

    r, P = init_group()
    world_comm = dist.group.WORLD.comm
    gloo = dist.new_group(backend="gloo")
    configs = {
        "ddp": dict(),
        "ddp find_unused_parameters": dict(extra_unused=True, ddp=dict(find_unused_parameters=True)),
        "ddp static_graph": dict(ddp=dict(static_graph=True)),
        "ddp no_sync x2": dict(micro=2, no_sync=True),
        "ddp allreduce_hook": dict(hook=(rtt.AllReduceState, rtt.allreduce_hook)),
        "ddp small buckets": dict(ddp=dict(bucket_cap_mb=0.002)),
        "hook": dict(dp=dict()),
        "hook small buckets, finish() by hand": dict(dp=dict(bucket_cap_mb=0.002, finish_in_backward=False)),
        "hook accumulation_steps=2": dict(micro=2, dp=dict(accumulation_steps=2)),
        "hook no_sync x2, unused param": dict(micro=2, no_sync=True, extra_unused=True, dp=dict()),
    }
    results, calls, expected_calls = {}, {}, {}
    for name, cfg in configs.items():
        extra_unused, micro = cfg.get("extra_unused", False), cfg.get("micro", 1)
        model = _model(hidden, extra_unused)
        if "dp" in cfg:
            counting = _CountingComm(world_comm)
            hook = rtt.DataParallelHook(model, counting, **cfg["dp"])
            module, no_sync = model, (hook.no_sync if cfg.get("no_sync") else None)
        else:
            module = DDP(model, **cfg.get("ddp", {}))
            if "hook" in cfg:
                make_state, function = cfg["hook"]
                module.register_comm_hook(make_state(), function)
            no_sync, hook = (module.no_sync if cfg.get("no_sync") else None), None
        before_step = hook.finish if hook is not None and not hook.finish_in_backward else None
        _distributed_steps(module, list(model.parameters()), steps, batch, lr, r, P, micro, no_sync, before_step)
        reference = _single_process(steps, batch, lr, hidden, micro, extra_unused)
        mine = _flat_params(model)
        everyone = [torch.empty_like(mine) for _ in range(P)]
        dist.all_gather(everyone, mine, group=gloo)  # checked through Gloo, not the system under test
        results[name] = {
            "identical_across_ranks": all(torch.equal(everyone[0], e) for e in everyone),
            "max_diff_vs_single": (mine - _flat_params(reference)).abs().max().item(),
            "moved": (mine - _flat_params(_model(hidden, extra_unused))).abs().max().item(),
        }
        if hook is not None:
            # The all_reduce ran in place on the buckets, and the gradients are views of them.
            bucket_storages = {b.buffer.untyped_storage().data_ptr() for b in hook.bucketer.buckets}
            results[name]["grads_are_bucket_views"] = all(
                p.grad is not None and p.grad.untyped_storage().data_ptr() in bucket_storages for p in hook.params
            )
            hook.remove()
            calls[name] = counting.all_reduce_calls
            expected_calls[name] = steps * len(hook.bucket_assignment)
    finish_group()
    return {"results": results, "all_reduce_calls": calls, "expected_calls": expected_calls}


class _CountingComm:
    """A ringtree communicator that counts all_reduce calls."""

    def __init__(self, comm):
        self._comm = comm
        self.all_reduce_calls = 0

    def all_reduce(self, *args, **kwargs):
        self.all_reduce_calls += 1
        return self._comm.all_reduce(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._comm, name)


@pytest.mark.timeout(150)
def test_ddp_and_hook_match_single_process_training():
    world = run_world(2, training_matches_single_process, timeout=140)
    results = world.check_ok()
    assert len(results[0]["results"]) == 10
    for rank, res in enumerate(results):
        for name, outcome in res["results"].items():
            assert outcome["identical_across_ranks"], (rank, name, outcome)
            assert outcome["max_diff_vs_single"] <= SINGLE_PROCESS_TOLERANCE, (rank, name, outcome)
            assert outcome["moved"] > 1e-3, (rank, name, outcome)  # training did happen
            assert outcome.get("grads_are_bucket_views", True), (rank, name, outcome)
        for name, calls in res["all_reduce_calls"].items():
            # Accumulation: one all_reduce per bucket per optimizer step, not per micro-batch.
            assert calls == res["expected_calls"][name], (rank, name, calls, res["expected_calls"][name])


def compression_converges(steps=40, batch=32, lr=0.1, hidden=32):
    """The example trained with each comm hook: every loss curve comes down, close to the
    uncompressed one."""
    import train_ddp

    r, P = init_group()
    losses = {}
    for hook in ("none", "fp16", "bf16", "int8"):
        ddp = train_ddp.wrap(train_ddp.make_model(hidden), hook)
        losses[hook] = train_ddp.train(ddp, steps, batch, lr, log=None)
    finish_group()
    return {"losses": losses}


@pytest.mark.timeout(120)
def test_compression_hooks_converge_like_uncompressed_training():
    world = run_world(2, compression_converges, timeout=110)
    losses = world.check_ok()[0]["losses"]
    baseline = losses["none"]
    assert baseline[-1] < baseline[0] - 0.3, baseline
    for hook in ("fp16", "bf16", "int8"):
        curve = losses[hook]
        assert curve[-1] < curve[0] - 0.3, (hook, curve)
        assert abs(curve[-1] - baseline[-1]) < 0.05, (hook, curve[-1], baseline[-1])


def _run_example(launcher, extra=()):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        launcher + [EXAMPLE, "--steps", "6", "--hidden", "32", *extra],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 6, proc.stdout
    assert "backend ringtree" in proc.stdout, proc.stdout
    return proc.stdout


@pytest.mark.timeout(120)
def test_example_runs_under_ringtree_launch():
    _run_example(
        [sys.executable, "-m", "ringtree.launch", "-n", "2", "--no-label", "--timeout", "90"], ["--hook", "int8"]
    )


@pytest.mark.timeout(120)
def test_example_runs_under_torchrun():
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(_free_port()),
    ]
    _run_example(launcher)


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
