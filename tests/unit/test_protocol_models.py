"""The device protocol's patterns, checked by the SPIN model checker: the Promela models in
csrc/exec/cuda/models/ (slot message passing through `posted` and slot reuse through `consumed`,
the call-word seqlock, the grid barrier with its reset) explored exhaustively at small sizes
(2-3 ranks or channels, 1-2 slots, 2-4 calls) for failed assertions (stale or torn reads, an
overwritten slot, a false or missed mismatch, a barrier passed early) and invalid end states
(deadlock). Each model must also fail when altered the way a planted fault alters the code, so a
model that checks nothing cannot pass. SPIN interleaves statements (sequential consistency):
these check the protocol's logic, not the fences a weaker memory model needs. Skipped, with the
reason, where spin or a C compiler is missing (.ci/run installs spin)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "csrc", "exec", "cuda", "models")
CC = shutil.which("cc") or shutil.which("gcc")

pytestmark = pytest.mark.skipif(
    shutil.which("spin") is None or CC is None,
    reason="needs the SPIN model checker (Debian package spin) and a C compiler",
)

# (model, defines): each must verify with no error.
SOUND = [
    ("slots", "-DP=2 -DSLOTS=1"),
    ("slots", "-DP=2 -DSLOTS=2"),
    ("slots", "-DP=3 -DSLOTS=1"),
    ("slots", "-DP=3 -DSLOTS=2"),
    ("callword", "-DCALLS=3"),
    ("callword", "-DCALLS=4"),
    ("callword", "-DMISMATCH=1"),
    ("callword", "-DMISMATCH=2"),
    ("barrier", "-DC=2"),
    ("barrier", "-DC=2 -DSTOPCALL=0"),
    ("barrier", "-DC=3 -DSTOPCALL=0"),
    ("barrier", "-DC=2 -DSTOPCALL=1 -DCALLS=3"),
]
# (model, defines, what SPIN must report): the planted faults.
FAULTS = [
    ("slots", "-DP=2 -DSLOTS=1 -DFAULT_PUBLISH_EARLY", "assertion violated"),
    ("slots", "-DP=3 -DSLOTS=2 -DFAULT_PUBLISH_EARLY", "assertion violated"),
    ("slots", "-DP=2 -DSLOTS=2 -DFAULT_NO_CONSUMED_WAIT", "assertion violated"),
    ("slots", "-DP=3 -DSLOTS=1 -DFAULT_CONSUME_EARLY", "assertion violated"),
    ("callword", "-DCALLS=3 -DFAULT_NO_CLEAR", "assertion violated"),
    ("callword", "-DCALLS=3 -DFAULT_ONE_READ", "assertion violated"),
    ("callword", "-DMISMATCH=1 -DFAULT_NO_CLEAR", "assertion violated"),
    ("barrier", "-DC=2 -DSTOPCALL=0 -DFAULT_NO_EXIT_RESET", "assertion violated"),
    ("barrier", "-DC=2 -DFAULT_RELEASE_BEFORE_RESET", "invalid end state"),
    ("barrier", "-DC=3 -DFAULT_RELEASE_BEFORE_RESET", "invalid end state"),
]


def verify(tmp_path, model, defines):
    """SPIN's exhaustive safety search of the model (assertions and invalid end states): its
    report, and the number of errors it found."""
    src = os.path.join(MODELS, f"{model}.pml")
    run = dict(cwd=tmp_path, capture_output=True, text=True, timeout=120)
    gen = subprocess.run(["spin", *defines.split(), "-a", src], **run)
    assert gen.returncode == 0, gen.stdout + gen.stderr
    build = subprocess.run([CC, "-O1", "-o", "pan", "pan.c"], **run)
    assert build.returncode == 0, build.stdout + build.stderr
    out = subprocess.run(["./pan", "-m200000"], **run)
    report = out.stdout + out.stderr
    assert "max search depth too small" not in report, report  # the search must cover every state
    return report, int(re.search(r"errors: (\d+)", report).group(1))


@pytest.mark.parametrize("model,defines", SOUND, ids=[f"{m}{d.replace(' ', '')}" for m, d in SOUND])
def test_the_protocol_model_holds(tmp_path, model, defines):
    report, errors = verify(tmp_path, model, defines)
    assert errors == 0, report
    assert int(re.search(r"(\d+) states, stored", report).group(1)) > 50, report  # it explored


@pytest.mark.parametrize("model,defines,found", FAULTS, ids=[f"{m}{d.replace(' ', '')}" for m, d, _ in FAULTS])
def test_a_planted_fault_is_found(tmp_path, model, defines, found):
    report, errors = verify(tmp_path, model, defines)
    assert errors >= 1 and found in report, report
