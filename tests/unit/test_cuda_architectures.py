"""Which GPUs the CUDA path is compiled for (cmake/cuda_architectures.cmake): those the machine
has by default, one PTX target where it has none, and what CMAKE_CUDA_ARCHITECTURES says when set.
The CMake functions run in script mode, fed nvidia-smi's output, so no GPU or nvcc is needed."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")


def choose(tmp_path, smi_output=None, env_value=None):
    script = tmp_path / "choose.cmake"
    call = (
        "ringtree_cuda_architectures(archs)"
        if smi_output is None
        else f'ringtree_cuda_architectures(archs "{smi_output}")'
    )
    script.write_text(f'include("{REPO}/cmake/cuda_architectures.cmake")\n{call}\nmessage(STATUS "ARCHS=${{archs}}")\n')
    env = {k: v for k, v in os.environ.items() if k != "CMAKE_CUDA_ARCHITECTURES"}
    if env_value is not None:
        env["CMAKE_CUDA_ARCHITECTURES"] = env_value
    done = subprocess.run(["cmake", "-P", str(script)], capture_output=True, text=True, env=env, timeout=60, check=True)
    line = next(x for x in done.stdout.splitlines() if "ARCHS=" in x)
    return line.split("ARCHS=", 1)[1].split(";") if line.split("ARCHS=", 1)[1] else []


def test_the_gpus_present_each_once(tmp_path):
    assert choose(tmp_path, "9.0\\n9.0\\n8.0\\n10.0\\n") == ["80-real", "90-real", "100-real"]


def test_no_gpu_builds_one_ptx_target(tmp_path):
    assert choose(tmp_path, "") == ["80-virtual"]
    assert choose(tmp_path, "No devices were found") == ["80-virtual"]


def test_the_environment_wins(tmp_path):
    assert choose(tmp_path, "9.0", env_value="90") == ["90"]
    full = "80-real;90-real;100-real;100-virtual"
    assert choose(tmp_path, "9.0", env_value=full) == full.split(";")


def test_the_documented_full_list_is_the_files(tmp_path):
    text = open(os.path.join(REPO, "cmake", "cuda_architectures.cmake")).read()
    full = text.split('set(RINGTREE_CUDA_ARCHITECTURES_ALL "', 1)[1].split('"', 1)[0]
    for page in ("README.md", "docs/getting-started.md"):
        assert f'CMAKE_CUDA_ARCHITECTURES="{full}"' in open(os.path.join(REPO, page)).read(), page
