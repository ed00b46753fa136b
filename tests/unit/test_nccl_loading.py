"""NCCL is loaded at run time, not linked: from the nvidia-nccl wheel of the test extra when
it is installed, and a missing library is explained (RINGTREE_NCCL_LIBRARY names the file
tried). No device is needed."""

from __future__ import annotations

import importlib.metadata

import pytest

import ringtree as rt


def _nccl_wheel_version():
    try:
        return importlib.metadata.version("nvidia-nccl-cu13")
    except importlib.metadata.PackageNotFoundError:
        return None


def test_nccl_is_loaded_at_run_time_from_the_wheel():
    wheel = _nccl_wheel_version()
    if wheel is None:
        pytest.skip("nvidia-nccl-cu13 is not installed (the test extra installs it)")
    info = rt.nccl_info()
    major, minor, patch = (int(p) for p in wheel.split(".")[:3])
    assert info["version"] == (major, minor, patch), (info, wheel)
    assert info["code"] == major * 10000 + minor * 100 + patch
    assert info["path"].endswith("libnccl.so.2")


def test_missing_nccl_is_explained(tmp_path):
    import subprocess
    import sys

    missing = tmp_path / "libnccl.so.2"
    code = "import ringtree as rt\ntry:\n    rt.nccl_info()\nexcept rt.Error as e:\n    print('ERROR', e)\n"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**__import__("os").environ, "RINGTREE_NCCL_LIBRARY": str(missing)},
    )
    assert out.returncode == 0, out.stderr
    assert "ERROR NCCL could not be loaded: RINGTREE_NCCL_LIBRARY" in out.stdout and str(missing) in out.stdout, (
        out.stdout
    )
