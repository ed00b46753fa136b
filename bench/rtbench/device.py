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

    def _raw(self, arr: np.ndarray) -> np.ndarray:
        # bfloat16 (ml_dtypes) travels as its 16-bit pattern; torch reads the rest directly.
        return arr.view(np.int16) if arr.dtype.name == "bfloat16" else arr

    def like(self, host: np.ndarray):
        """A device tensor with host's size and dtype."""
        t = self.torch.from_numpy(self._raw(host)).to("cuda")
        return t.view(self.torch.bfloat16) if host.dtype.name == "bfloat16" else t

    def upload(self, dev, host: np.ndarray):
        src = self.torch.from_numpy(self._raw(host))
        target = dev.view(self.torch.int16) if host.dtype.name == "bfloat16" else dev
        target.copy_(src)

    def download(self, host: np.ndarray, dev):
        src = dev.view(self.torch.int16) if host.dtype.name == "bfloat16" else dev
        self._raw(host)[...] = src.cpu().numpy()

    def synchronize(self):
        self.torch.cuda.synchronize()
