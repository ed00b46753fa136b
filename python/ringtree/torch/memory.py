"""Bytes of tensor storage a training setup holds, for comparing sharded and replicated training.

    meter = StorageMeter([zero], model)        # or [ddp_model, optimizer]
    loss_fn(model(x), y).backward(); meter.sample("backward done")
    zero.step(); meter.sample("step done")
    meter.peak, meter.peak_at, meter.last

torch keeps no allocation statistics for the CPU, and tracemalloc does not see its allocator, so
the meter counts storage instead: at each sample, every tensor reachable from `roots` through
Python attributes, __slots__, dicts, lists, tuples and sets (a tensor's .grad too), each
distinct storage once (by address), at its current size (a storage resized to 0 counts 0).
That covers parameters, gradients, optimizer state and a wrapper's own buffers; it does not
see what lives only in C++ (autograd's saved activations, DDP's reducer buckets unless
gradient_as_bucket_view=True, temporaries of an op).

With a model, the meter also samples around every module's forward (after its pre-hooks
gather, before its forward hooks release) and after every parameter's gradient is
accumulated (after hooks registered before the meter, such as a wrapper's).
"""

from __future__ import annotations

import types

import torch

__all__ = ["storage_bytes", "StorageMeter"]

_OPAQUE = (
    type,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    types.ModuleType,
    str,
    bytes,
    int,
    float,
    bool,
    type(None),
    torch.dtype,
    torch.device,
    torch.Size,
)


def storage_bytes(roots) -> int:
    """Bytes of the distinct tensor storages reachable from roots (see the module doc).

    Parameters
    ----------
    roots : iterable
        Models, optimizers, tensors, or containers and objects that hold them; a storage
        reached twice counts once.

    Returns
    -------
    int
        The bytes.
    """
    seen, storages, stack = set(), {}, list(roots)
    while stack:
        item = stack.pop()
        if isinstance(item, _OPAQUE) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            if item.layout == torch.strided:
                storage = item.untyped_storage()
                if storage.data_ptr():
                    storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
            if item.grad is not None:
                stack.append(item.grad)
            continue
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        else:
            stack.extend(getattr(item, "__dict__", {}).values())
            for cls in type(item).__mro__:
                for slot in getattr(cls, "__slots__", ()):
                    if hasattr(item, slot):
                        stack.append(getattr(item, slot))
    return sum(storages.values())


class StorageMeter:
    """The largest storage_bytes(roots) over its samples; with a model, sampled by hooks too.

    Its `peak` is the largest sample in bytes, `peak_at` the label of that sample, and `last`
    the latest sample.

    Parameters
    ----------
    roots : iterable
        What to measure: models, optimizers, tensors, containers of them (see storage_bytes).
    model : torch.nn.Module or None
        If given, a sample is taken before and after each module's forward and after each
        parameter's gradient is accumulated.
    """

    def __init__(self, roots, model: torch.nn.Module | None = None):
        self.roots = list(roots)
        self.peak, self.peak_at, self.last = 0, None, 0
        self._handles = []
        if model is not None:
            for name, module in model.named_modules():
                self._handles.append(module.register_forward_pre_hook(self._hook(f"before forward {name or 'model'}")))
                self._handles.append(
                    module.register_forward_hook(self._hook(f"after forward {name or 'model'}"), prepend=True)
                )
            for name, param in model.named_parameters():
                if param.requires_grad:
                    self._handles.append(param.register_post_accumulate_grad_hook(self._hook(f"gradient of {name}")))

    def _hook(self, label):
        def sample(*args):  # returns None: a hook's result would replace the module's inputs or output
            self.sample(label)

        return sample

    def sample(self, label: str | None = None) -> int:
        """Measure now, and keep the measure as the peak if it is the largest so far.

        Parameters
        ----------
        label : str or None
            Names the sample in `peak_at`.

        Returns
        -------
        int
            The bytes measured.
        """
        self.last = storage_bytes(self.roots)
        if self.last > self.peak:
            self.peak, self.peak_at = self.last, label
        return self.last

    def reset(self):
        """Forget the peak, to measure a new phase."""
        self.peak, self.peak_at = 0, None

    def remove(self):
        """Remove the hooks put on the model; samples are then taken only by sample()."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
