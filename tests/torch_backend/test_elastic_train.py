"""examples/elastic_train.py end to end: 4 ranks train, one is SIGKILLed mid-step, the others
shrink to 3 and resume from the checkpoint with the learning rate scaled to the world, a
replacement joins through grow's token, and all 4 end with identical parameters and a lower
loss (the example checks both on every rank and exits non-zero otherwise)."""

import os
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "elastic_train.py")


@pytest.mark.timeout(150)
def test_elastic_training_survives_a_kill_and_grows_back():
    run = subprocess.run([sys.executable, EXAMPLE], capture_output=True, text=True, timeout=140)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    assert out.count("shrank from 4 to 3 ranks") == 3, out[-6000:]
    assert "world 3, global batch 96, lr 0.0375" in out, out[-6000:]
    assert "[rank 3/4] joined at step 35" in out, out[-6000:]
    assert out.count("parameters equal to rank 0's: True") == 4, out[-6000:]
    assert "exit codes [0, 0, -9, 0, 0]" in out, out[-6000:]
