"""The framework recipes of the manual (docs/launching.md) run end to end on the ringtree backend:
PyTorch Lightning and Hugging Face Accelerate train over 2 CPU processes as a user starts them,
and both ranks end with the same bits, equal (to float rounding) to one process that trains with
plain torch on the same samples in batches twice as large."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys

import pytest
from markdown_examples import REPO

torch = pytest.importorskip("torch")

RANKS = 2
TIMEOUT = 180


def _example(name):
    """The example's own module: its data set, initial model and hyper-parameters."""
    path = os.path.join(REPO, "examples", name)
    spec = importlib.util.spec_from_file_location(name[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return path, module


def _run(command, cwd):
    env = dict(os.environ, RINGTREE_TIMEOUT="30", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )  # the ranks a framework starts die with it on a timeout
    try:
        output, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{' '.join(command)} did not finish in {TIMEOUT} s:\n{output}")
    finally:
        try:  # a rank the framework started and left behind, after a failure say
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, f"{' '.join(command)} exited {proc.returncode}:\n{output}"
    for r in range(RANKS):
        assert f"rank {r} of {RANKS}: backend ringtree" in output, output
    return output


def _reference(example, epochs, epoch_order):
    """One process, plain torch and no framework: SGD on consecutive batches of RANKS x BATCH
    samples of each epoch's order, the union of what the ranks read in one step."""
    x, y = example.dataset().tensors
    net = example.make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=example.LR)
    first_loss = torch.nn.functional.mse_loss(net(x), y).item()
    step = RANKS * example.BATCH
    for epoch in range(epochs):
        order = epoch_order(epoch)
        for start in range(0, len(order), step):
            batch = order[start : start + step]
            torch.nn.functional.mse_loss(net(x[batch]), y[batch]).backward()
            optimizer.step()
            optimizer.zero_grad()
    with torch.no_grad():
        assert torch.nn.functional.mse_loss(net(x), y).item() < 0.5 * first_loss, "the reference did not learn"
    return net.state_dict()


def _check_weights(prefix, reference):
    ranks = [torch.load(f"{prefix}-rank{r}.pt", weights_only=True) for r in range(RANKS)]
    assert ranks[0].keys() == reference.keys()
    for name, expected in reference.items():
        assert torch.equal(ranks[0][name], ranks[1][name]), f"{name} differs between the ranks"
        torch.testing.assert_close(ranks[0][name], expected, rtol=1e-5, atol=1e-6, msg=name)


def test_lightning_trains_on_ringtree_as_one_process_would(tmp_path):
    pytest.importorskip("pytorch_lightning")
    path, example = _example("lightning_ddp.py")
    epochs = 2
    # Lightning starts the second rank itself, as `python examples/lightning_ddp.py` does.
    _run([sys.executable, path, "--epochs", str(epochs), "--save", str(tmp_path / "w")], tmp_path)
    # The order Lightning's DistributedSampler reads: torch's own shuffle for each epoch.
    sampler = torch.utils.data.DistributedSampler(example.dataset(), num_replicas=1, rank=0, shuffle=True, seed=0)

    def epoch_order(epoch):
        sampler.set_epoch(epoch)
        return list(sampler)

    _check_weights(tmp_path / "w", _reference(example, epochs, epoch_order))


def test_accelerate_trains_on_ringtree_as_one_process_would(tmp_path):
    pytest.importorskip("accelerate")
    path, example = _example("accelerate_ddp.py")
    epochs = 2
    _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(RANKS),
            path,
            "--epochs",
            str(epochs),
            "--save",
            str(tmp_path / "w"),
        ],
        tmp_path,
    )
    # Accelerate gives rank r the loader's batches r, r + RANKS, ...: together, the samples in order.
    _check_weights(tmp_path / "w", _reference(example, epochs, lambda epoch: list(range(example.SAMPLES))))
