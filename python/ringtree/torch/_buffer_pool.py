"""Host buffers for FSDP2's all-gather outputs and reduce-scatter inputs, reused step after step."""

from __future__ import annotations

import threading

import torch

# Idle staging buffers a group keeps for reuse (allocate_tensor), in bytes.
POOL_BYTES = 1 << 30


def _storage_users(tensor):
    """How many tensors hold tensor's storage (torch's own count; the storage object asked adds one)."""
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata) - 1


class BufferPool:
    """Host buffers for ProcessGroupRingtree.allocate_tensor: FSDP2's all-gather outputs and
    reduce-scatter inputs, the same few sizes every step. A buffer is handed out again once
    nothing but the pool holds its storage, so a step reuses warm memory instead of asking the
    allocator (and, for buffers past glibc's mmap threshold, the kernel) for fresh pages, and
    collectives run on it in place. Holds at most `max_bytes` of idle buffers."""

    def __init__(self, max_bytes: int):
        self._max_bytes = max_bytes
        self._buffers = []  # uint8 tensors, oldest first
        self._lock = threading.Lock()
        self.reused = 0
        self.allocated = 0

    def take(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        nbytes = numel * dtype.itemsize
        with self._lock:
            for buffer in self._buffers:
                if buffer.numel() == nbytes and _storage_users(buffer) == 1:
                    self.reused += 1
                    return buffer.view(dtype)
            buffer = torch.empty(nbytes, dtype=torch.uint8)
            self.allocated += 1
            self._buffers.append(buffer)
            held = sum(b.numel() for b in self._buffers)
            for old in list(self._buffers):  # drop idle buffers, oldest first, beyond the cap
                if held <= self._max_bytes:
                    break
                if old is not buffer and _storage_users(old) == 1:
                    self._buffers.remove(old)
                    held -= old.numel()
            return buffer.view(dtype)


class AllocatingBackend:
    """What ProcessGroupRingtree._get_backend(device) returns: the registered stand-in backend
    (every attribute read goes to it) that also answers FSDP2's allocation hook with the group's
    own allocate_tensor. torch cannot build a C++ Backend from Python, and FSDP2 asks the backend,
    not the group, through this Python call (_fsdp_collectives.ProcessGroupAllocMixin)."""

    __slots__ = ("_backend", "_group")

    def __init__(self, backend, group):
        self._backend, self._group = backend, group

    def supports_tensor_alloc(self, device) -> bool:
        return self._group.supports_tensor_alloc(device)

    def allocate_tensor(self, size, *, dtype, device):
        return self._group.allocate_tensor(size, dtype=dtype, device=device)

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def __repr__(self):
        return f"<ringtree allocating view of {self._backend!r}>"
