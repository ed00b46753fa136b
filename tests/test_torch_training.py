"""Training on the ringtree backend: DDP (with find_unused_parameters, static_graph,
no_sync, comm hooks) and DataParallelHook keep every rank's parameters bit-identical and
follow single-process full-batch training; the compression hooks converge; the example
runs under ringtree.launch and torchrun."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from torch_rank_worker import run_torch_world  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_ddp.py")

# float32, 4 SGD steps with momentum on a 64-24-24-10 MLP: P ranks sum their gradients in
# another order than one process does, which moves parameters by a few ulps (1.5e-8 seen).
SINGLE_PROCESS_TOLERANCE = 1e-6


@pytest.mark.timeout(150)
def test_ddp_and_hook_match_single_process_training():
    world = run_torch_world(2, "training_matches_single_process", timeout=140)
    results = world.check_ok()
    assert len(results[0]["results"]) == 10
    for rank, res in enumerate(results):
        for name, outcome in res["results"].items():
            assert outcome["identical_across_ranks"], (rank, name, outcome)
            assert outcome["max_diff_vs_single"] <= SINGLE_PROCESS_TOLERANCE, (rank, name, outcome)
            assert outcome["moved"] > 1e-3, (rank, name, outcome)  # training did happen
        for name, calls in res["all_reduce_calls"].items():
            # Accumulation: one all_reduce per bucket per optimizer step, not per micro-batch.
            assert calls == res["expected_calls"][name], (rank, name, calls, res["expected_calls"][name])


@pytest.mark.timeout(120)
def test_compression_hooks_converge_like_uncompressed_training():
    world = run_torch_world(2, "compression_converges", timeout=110)
    losses = world.check_ok()[0]["losses"]
    baseline = losses["none"]
    assert baseline[-1] < baseline[0] - 0.3, baseline
    for hook in ("fp16", "bf16", "int8"):
        curve = losses[hook]
        assert curve[-1] < curve[0] - 0.3, (hook, curve)
        assert abs(curve[-1] - baseline[-1]) < 0.05, (hook, curve[-1], baseline[-1])


def _run_example(launcher, extra=()):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(launcher + [EXAMPLE, "--steps", "6", "--hidden", "32", *extra], capture_output=True,
                          text=True, timeout=100, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 6, proc.stdout
    assert "backend ringtree" in proc.stdout, proc.stdout
    return proc.stdout


@pytest.mark.timeout(120)
def test_example_runs_under_ringtree_launch():
    _run_example([sys.executable, "-m", "ringtree.launch", "-n", "2", "--timeout", "90"], ["--hook", "int8"])


@pytest.mark.timeout(120)
def test_example_runs_under_torchrun():
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                str(_free_port())]
    _run_example(launcher)


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
