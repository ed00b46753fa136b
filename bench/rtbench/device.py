"""CUDA buffers for the sweep (--device cuda): the host arrays stay the source of inputs and
the place where results are checked; torch CUDA tensors of the same sizes are what the
collectives run on. Uploads and downloads happen outside the timed loop, and the timed loop
ends with a device synchronize, so a time covers the device work, not just its enqueueing."""

from __future__ import annotations

import numpy as np


def why_no_cuda(rt) -> str | None:
    """None when --device cuda can run here, else why not."""
    if not rt.cuda_available():
        return "ringtree finds no CUDA device (or was built without CUDA)"
    try:
        import torch
    except ImportError:
        return "--device cuda needs torch with CUDA (pip install torch)"
    if not torch.cuda.is_available():
        return "this torch has no CUDA (a CPU build?)"
    return None


class DeviceBuffers:
    def __init__(self, rank: int):
        import torch

        self.torch = torch
        torch.cuda.set_device(rank % torch.cuda.device_count())

    # ml_dtypes' types (bfloat16, float8) travel as their bit patterns; torch reads the rest directly.
    _BITS = {"bfloat16": np.int16, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}

    def _raw(self, arr: np.ndarray) -> np.ndarray:
        bits = self._BITS.get(arr.dtype.name)
        return arr if bits is None else arr.view(bits)

    def _bits(self, dev, host: np.ndarray):
        """dev as the integer tensor _raw(host) matches."""
        bits = self._BITS.get(host.dtype.name)
        return dev if bits is None else dev.view(self.torch.int16 if bits is np.int16 else self.torch.uint8)

    def like(self, host: np.ndarray):
        """A device tensor with host's size and dtype."""
        t = self.torch.from_numpy(self._raw(host)).to("cuda")
        name = host.dtype.name
        return t.view(getattr(self.torch, name)) if name in self._BITS else t

    def upload(self, dev, host: np.ndarray):
        self._bits(dev, host).copy_(self.torch.from_numpy(self._raw(host)))

    def download(self, host: np.ndarray, dev):
        self._raw(host)[...] = self._bits(dev, host).cpu().numpy()

    def synchronize(self):
        self.torch.cuda.synchronize()
