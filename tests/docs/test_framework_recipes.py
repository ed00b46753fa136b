"""The framework recipes of the manual (docs/launching.md) run end to end on the ringtree backend:
PyTorch Lightning, Hugging Face Accelerate, DeepSpeed ZeRO and Ray Train train over 2 CPU
processes as a user starts them, and both ranks end with the same bits, equal (to float rounding)
to one process that trains with plain torch on the same samples in batches twice as large.
DeepSpeed and Ray Train also train on Gloo, and ringtree's run ends with Gloo's bits: with 2 ranks
a sum has one order of its terms, so the backends agree exactly."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings

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


def _kill_marked(mark):
    """Kills every process whose environment carries `mark`: what a framework started in a
    session of its own (Ray's workers), which the process group does not reach."""
    needle = mark.encode()
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                marked = needle in f.read().split(b"\0")
            if marked:
                os.kill(int(pid), signal.SIGKILL)
        except OSError:  # gone, or not ours to read
            pass


def _run(command, cwd, backend="ringtree"):
    token = f"{os.getpid()}-{os.urandom(6).hex()}"
    env = dict(os.environ, RINGTREE_TIMEOUT="30", OMP_NUM_THREADS="1", RINGTREE_RECIPE_TEST=token)
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
        # And those it started in sessions of their own (a Ray worker after shutdown).
        _kill_marked(f"RINGTREE_RECIPE_TEST={token}")
    assert proc.returncode == 0, f"{' '.join(command)} exited {proc.returncode}:\n{output}"
    for r in range(RANKS):
        assert f"rank {r} of {RANKS}: backend {backend}" in output, output
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


def _torchrun(path, *args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(RANKS), path, *args]


def _reference_steps(example, steps):
    """One process, plain torch: SGD on the consecutive batches of RANKS x BATCH samples."""
    x, y = example.dataset()
    net = example.make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=example.LR)
    first_loss = torch.nn.functional.mse_loss(net(x), y).item()
    step = RANKS * example.BATCH
    for s in range(steps):
        batch = slice(s * step % example.SAMPLES, s * step % example.SAMPLES + step)
        torch.nn.functional.mse_loss(net(x[batch]), y[batch]).backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        assert torch.nn.functional.mse_loss(net(x), y).item() < 0.5 * first_loss, "the reference did not learn"
    return net.state_dict()


def _check_same_bits(ringtree_prefix, gloo_prefix, reference):
    """Per rank, ringtree's weights and losses are Gloo's, bit for bit; the ranks agree, and
    their weights are the reference's to float rounding."""
    ranks = [torch.load(f"{ringtree_prefix}-rank{r}.pt", weights_only=True) for r in range(RANKS)]
    for r, got in enumerate(ranks):
        gloo = torch.load(f"{gloo_prefix}-rank{r}.pt", weights_only=True)
        assert got["losses"] == gloo["losses"], f"rank {r}: the losses differ from Gloo's"
        assert got["weights"].keys() == gloo["weights"].keys() == reference.keys()
        for name, expected in gloo["weights"].items():
            assert torch.equal(got["weights"][name], expected), f"rank {r}: {name} differs from Gloo's"
    assert ranks[0]["losses"] != ranks[1]["losses"], "the ranks trained on the same samples"
    for name, expected in reference.items():
        assert torch.equal(ranks[0]["weights"][name], ranks[1]["weights"][name]), f"{name} differs between the ranks"
        torch.testing.assert_close(ranks[0]["weights"][name], expected, rtol=1e-5, atol=1e-6, msg=name)


DEEPSPEED_STAGES = (1, 2, 3)
DEEPSPEED_STEPS = 8
REFERENCE_LAUNCHES = 3


@pytest.fixture(scope="module")
def deepspeed_runs(tmp_path_factory):
    """The DeepSpeed recipe on each backend: one torchrun each, training every ZeRO stage in turn
    (`--stage 1 2 3`, each from the initial model, as a launch of its own would). One launch per
    backend rather than per stage and backend: most of a launch is the ranks importing torch and
    DeepSpeed. Returns the save prefix of each backend and the launch's output."""
    pytest.importorskip("deepspeed")
    path, _ = _example("deepspeed_zero.py")  # DeepSpeed on the CPU, as in the example
    tmp_path = tmp_path_factory.mktemp("deepspeed")
    stages = [str(s) for s in DEEPSPEED_STAGES]
    runs = {}
    for backend in ("ringtree", "gloo"):
        args = ["--stage", *stages, "--steps", str(DEEPSPEED_STEPS), "--backend", backend]
        command = _torchrun(path, *args, "--save", str(tmp_path / backend))
        # Gloo is the reference here, not what is tested. Its launch sometimes ends with a rank
        # aborted at teardown ("terminate called without an active exception", SIGABRT) after
        # every stage has trained and saved: 2 of 20 launches beside a busy core, while ringtree's
        # launch did not fail in 20 the same way. So the reference gets up to three launches, each
        # failure kept visible as a warning; a failure of ringtree's launch fails at once.
        launches = 1 if backend == "ringtree" else REFERENCE_LAUNCHES
        for attempt in range(launches):
            try:
                output = _run(command, tmp_path, backend)
                break
            except AssertionError as failure:
                if attempt == launches - 1:
                    raise
                warnings.warn(f"the Gloo reference launch failed; launched again:\n{failure}", stacklevel=1)
        runs[backend] = (tmp_path / backend, output)
    return runs


@pytest.mark.parametrize("stage", DEEPSPEED_STAGES)
def test_deepspeed_zero_trains_on_ringtree_as_on_gloo(deepspeed_runs, stage):
    _, example = _example("deepspeed_zero.py")
    for backend, (_, output) in deepspeed_runs.items():
        for r in range(RANKS):
            assert f"rank {r} of {RANKS}: backend {backend}, ZeRO stage {stage}," in output, output
    _check_same_bits(
        f"{deepspeed_runs['ringtree'][0]}-stage{stage}",
        f"{deepspeed_runs['gloo'][0]}-stage{stage}",
        _reference_steps(example, DEEPSPEED_STEPS),
    )


@pytest.mark.timeout(TIMEOUT + 30)
def test_ray_train_trains_on_ringtree_as_on_gloo(tmp_path):
    pytest.importorskip("ray.train.torch")
    path, example = _example("ray_train_ddp.py")
    steps = 8
    # One Ray instance (2 CPUs, no dashboard) trains on both backends in turn; the example shuts
    # it down however the training ends. Its session files go to a short folder of their own:
    # under tmp_path, the paths of Ray's sockets pass the 107 bytes a Unix socket's name may have.
    args = ["--steps", str(steps), "--backend", "ringtree", "gloo", "--save", str(tmp_path / "w")]
    ray_tmp = tempfile.mkdtemp(prefix="ray-")
    try:
        output = _run([sys.executable, path, *args, "--tmp", ray_tmp], tmp_path)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    for r in range(RANKS):
        assert f"rank {r} of {RANKS}: backend gloo" in output, output
    _check_same_bits(tmp_path / "w-ringtree", tmp_path / "w-gloo", _reference_steps(example, steps))
