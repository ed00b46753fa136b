"""Sharded checkpoints of a ShardedDataParallel trainer that load back at another world size.

    checkpoint = ShardedCheckpoint(zero, scheduler=scheduler, scaler=scaler)
    checkpoint.save("ckpt/step-100", data={"samples": samples})      # collective
    ...                                                              # later, any world size
    meta = checkpoint.load("ckpt/step-100")                         # reshards; not collective
    samples = meta["data"]["samples"]                                # except the last all-gather

A checkpoint is a directory:

    shard-00000-of-00004.pt ... shard-00003-of-00004.pt    one per rank, written by that rank
    metadata.pt                                            written last, by rank 0
    metadata.json                                          the same without tensors, for people

Coordinates. Each bucket of ShardedDataParallel is a flat buffer of `count` elements (its
parameters back to back, in bucket order) padded to shard_size * P with shard_size =
ceil(count / P); rank r owns [r * shard_size, (r + 1) * shard_size). A shard file holds, per
bucket, the unpadded part of that range, [start, stop) with stop <= count: the fp32 master
values and every per-element optimizer state tensor (exp_avg, momentum_buffer, ...), sliced
the same way. Padding is not stored: it is zero and stays zero (its gradient is zero).

metadata.pt holds what is the same on every rank: the format name, the world size, the
parameters' names, shapes and dtype, each bucket's parameter indices, offsets and count, the
optimizer's class and hyperparameters (its param group, including the current lr), its
per-bucket scalar state (Adam's step), the names of the per-element state keys, the
scheduler's and the GradScaler's state_dicts, the model's buffers and frozen parameters,
the caller's `data` (the data-loader position: samples consumed, a sampler's generator
state, ...), and `history`: one record per save and per resume, with the world size, the
samples consumed, the batch sizes the caller reports and the lr, so a world-size change and
how batch and learning rate followed it stay on record.

Loading maps every element through its parameter: element k of parameter i sits at offset
offsets[i] + k of its bucket in the saved layout and in the new one, so the world size, the
bucket cap and the parameter dtype (hence the bucket layout) may all differ from the saving
run; the parameters' names and shapes and the optimizer class may not. Each rank reads only
the shard files that overlap its new shards. Files are read with torch.load(weights_only=True).
"""

from __future__ import annotations

import json
import os

import torch

from ringtree._files import safe_folder, write_exclusive

__all__ = ["ShardedCheckpoint", "read_checkpoint_metadata", "consolidate_checkpoint"]

FORMAT = "ringtree-sharded-v1"
METADATA = "metadata.pt"


def shard_file(rank: int, world_size: int) -> str:
    return f"shard-{rank:05d}-of-{world_size:05d}.pt"


def read_checkpoint_metadata(path: str) -> dict:
    """The metadata of a complete checkpoint.

    Parameters
    ----------
    path : str
        The checkpoint's directory.

    Returns
    -------
    dict
        What rank 0 wrote last: world size, parameter names and shapes, the history, "data".

    Raises
    ------
    ValueError
        There is no complete checkpoint in `path`, or it is of another format.
    """
    file = os.path.join(path, METADATA)
    if not os.path.exists(file):
        raise ValueError(f"{path!r} holds no complete sharded checkpoint ({METADATA} is missing)")
    meta = torch.load(file, map_location="cpu", weights_only=True)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{file!r} is of format {meta.get('format')!r}, expected {FORMAT!r}")
    return meta


def _owned(count: int, world_size: int, rank: int) -> tuple[int, int]:
    """The unpadded part [start, stop) of rank's shard of a bucket of count elements."""
    shard_size = -(-count // world_size)
    start = min(rank * shard_size, count)
    return start, min(start + shard_size, count)


class _SavedShards:
    """Element ranges of the saved parameters, read from the shard files on first use."""

    def __init__(self, path, meta):
        self.path, self.meta = path, meta
        self.world_size = meta["world_size"]
        self.place = {}  # parameter index -> (bucket, offset)
        for b, bucket in enumerate(meta["buckets"]):
            for index, offset in zip(bucket["indices"], bucket["offsets"]):
                self.place[index] = (b, offset)
        self._files = {}

    def _file(self, rank):
        if rank not in self._files:
            file = os.path.join(self.path, shard_file(rank, self.world_size))
            self._files[rank] = torch.load(file, map_location="cpu", weights_only=True)
        return self._files[rank]

    def copy(self, index, first, last, destinations):
        """Copy elements [first, last) of parameter `index` into each destinations[key]
        (a 1-D tensor of last - first elements); key "master" is the parameter value."""
        b, offset = self.place[index]
        count = self.meta["buckets"][b]["count"]
        shard_size = -(-count // self.world_size)
        position, end = offset + first, offset + last
        while position < end:
            rank = position // shard_size
            piece_end = min(end, (rank + 1) * shard_size)
            saved = self._file(rank)["buckets"][b]
            lo, hi = position - saved["start"], piece_end - saved["start"]
            at = position - offset - first
            for key, destination in destinations.items():
                source = saved["master"] if key == "master" else saved["state"][key]
                destination[at : at + hi - lo].copy_(source[lo:hi])
            position = piece_end


class ShardedCheckpoint:
    """Saves and loads a ShardedDataParallel's model, optimizer shards, LR scheduler,
    GradScaler and the caller's data position as one file per rank (see the module doc).

    `history` lists the saves and resumes so far (carried over from the checkpoint that load()
    read).

    Parameters
    ----------
    zero : ShardedDataParallel
        What is saved and loaded.
    scheduler : torch.optim.lr_scheduler.LRScheduler or None
        An LR scheduler over zero.optimizer.
    scaler : torch.amp.GradScaler or None
        The GradScaler of mixed-precision training.
    """

    def __init__(self, zero, scheduler=None, scaler=None):
        self.zero, self.scheduler, self.scaler = zero, scheduler, scaler
        self.history = []
        names = {id(p): n for n, p in zero.model.named_parameters()}
        self.param_names = [names[id(p)] for p in zero.params]
        trained = set(self.param_names)
        # Buffers and frozen parameters: the same on every rank, saved once.
        self.replicated_names = [n for n in zero.model.state_dict(keep_vars=True) if n not in trained]

    # --- save ---------------------------------------------------------------------------------

    def save(self, path: str, data: dict | None = None, batch: dict | None = None):
        """Write this rank's shard to `path` and, on rank 0, the metadata, last. Collective
        (three barriers).

        Parameters
        ----------
        path : str
            A directory, made if missing.
        data : dict or None
            The data position to restore on load, e.g. {"samples": n}.
        batch : dict or None
            How the batch is formed now, recorded in the history, e.g. {"global_batch": 64,
            "per_rank_batch": 16, "accumulation": 1}.
        """
        zero = self.zero
        zero.synchronize()
        zero.finish()
        comm, rank, world = zero.comm, zero.rank, zero.world_size
        path = safe_folder(path, "ShardedCheckpoint.save")
        if rank == 0:
            # Until the new metadata is written the directory holds no complete checkpoint, and
            # shard files of another world size would only confuse a reader.
            for name in os.listdir(path):
                if name == METADATA or (name.startswith("shard-") and not name.endswith(f"-of-{world:05d}.pt")):
                    os.remove(os.path.join(path, name))
        comm.barrier()
        state = zero.optimizer.state
        buckets, scalars, per_element = [], [], []
        for bucket in zero.buckets:
            start, stop = _owned(bucket.count, world, rank)
            local_start = start - rank * bucket.shard_size
            part = slice(local_start, local_start + stop - start)
            entries = state.get(bucket.master, {})
            sliced = {k: v.detach()[part].cpu().clone() for k, v in entries.items() if zero._per_element(v, bucket)}
            buckets.append(
                {"start": start, "stop": stop, "master": bucket.master.detach()[part].cpu().clone(), "state": sliced}
            )
            scalars.append(
                {
                    k: (v.detach().cpu().clone() if torch.is_tensor(v) else v)
                    for k, v in entries.items()
                    if k not in sliced
                }
            )
            per_element.append(sorted(sliced))
        _atomic_save(
            {"format": FORMAT, "rank": rank, "world_size": world, "buckets": buckets},
            os.path.join(path, shard_file(rank, world)),
        )
        comm.barrier()
        self.history.append(
            {
                "event": "save",
                "world_size": world,
                "samples": (data or {}).get("samples"),
                "lr": zero.optimizer.param_groups[0]["lr"],
                **(batch or {}),
            }
        )
        if rank == 0:
            _atomic_save(self._metadata(scalars, per_element, data), os.path.join(path, METADATA))
            _write_summary(path, self.history, data, world)
        comm.barrier()

    def _metadata(self, scalars, per_element, data):
        zero = self.zero
        group = {k: v for k, v in zero.optimizer.param_groups[0].items() if k != "params"}
        model_state = zero.model.state_dict()
        return {
            "format": FORMAT,
            "world_size": zero.world_size,
            "stage": zero.stage,
            "param_names": self.param_names,
            "param_shapes": [list(p.shape) for p in zero.params],
            "param_dtype": str(zero.param_dtype).replace("torch.", ""),
            "buckets": [
                {"indices": list(b.indices), "offsets": [b.offsets[i] for i in b.indices], "count": b.count}
                for b in zero.buckets
            ],
            "optimizer": type(zero.optimizer).__name__,
            "param_group": group,
            "scalar_state": scalars,
            "per_element_state": per_element,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "replicated": {n: model_state[n].detach().cpu().clone() for n in self.replicated_names},
            "data": data,
            "history": list(self.history),
        }

    # --- load ---------------------------------------------------------------------------------

    def load(self, path: str) -> dict:
        """Load the checkpoint in `path`, saved at any world size, into this rank's shards, the
        model (its parameters are all-gathered: the only collective), the scheduler and the
        scaler.

        Parameters
        ----------
        path : str
            The checkpoint's directory.

        Returns
        -------
        dict
            The metadata; its "data" is what save() was given.

        Raises
        ------
        ValueError
            Before any traffic: no complete checkpoint, or the model's parameters or the optimizer
            class differ.
        """
        zero = self.zero
        meta = read_checkpoint_metadata(path)
        self._check(meta)
        saved = _SavedShards(path, meta)
        zero.synchronize()
        zero.finish()
        inner_state = {}
        with torch.no_grad():
            for b, bucket in enumerate(zero.buckets):
                first_saved = saved.place[bucket.indices[0]][0]
                keys = meta["per_element_state"][first_saved]
                start, stop = _owned(bucket.count, zero.world_size, zero.rank)
                shard = {key: torch.zeros(bucket.shard_size, dtype=torch.float32) for key in ["master"] + keys}
                for index in bucket.indices:
                    offset, numel = bucket.offsets[index], zero.params[index].numel()
                    first, last = max(start, offset), min(stop, offset + numel)
                    if first < last:
                        at = first - start
                        saved.copy(
                            index,
                            first - offset,
                            last - offset,
                            {key: value[at : at + last - first] for key, value in shard.items()},
                        )
                bucket.master.copy_(shard.pop("master"))
                # A copy per bucket: optimizers update scalar state in place (Adam's step += 1),
                # and several new buckets may take it from one saved bucket.
                scalars = meta["scalar_state"][first_saved]
                entries = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in scalars.items()}
                entries.update(shard)
                if entries:
                    inner_state[b] = entries
        group = dict(meta["param_group"], params=list(range(len(zero.buckets))))
        zero.optimizer.load_state_dict({"state": inner_state, "param_groups": [group]})
        if self.scheduler is not None and meta["scheduler"] is not None:
            self.scheduler.load_state_dict(meta["scheduler"])
        if self.scaler is not None and meta["scaler"] is not None:
            self.scaler.load_state_dict(meta["scaler"])
        if meta["replicated"]:
            zero.model.load_state_dict(meta["replicated"], strict=False)
        self.history = list(meta["history"]) + [
            {
                "event": "resume",
                "world_size": zero.world_size,
                "saved_world_size": meta["world_size"],
                "samples": (meta["data"] or {}).get("samples"),
                "lr": meta["param_group"].get("lr"),
            }
        ]
        zero._publish_masters()
        zero.synchronize()
        return meta

    def _check(self, meta):
        zero = self.zero
        shapes = [list(p.shape) for p in zero.params]
        if meta["param_names"] != self.param_names or meta["param_shapes"] != shapes:
            raise ValueError(
                f"ShardedCheckpoint.load: the checkpoint's parameters "
                f"{list(zip(meta['param_names'], meta['param_shapes']))} are not this model's "
                f"{list(zip(self.param_names, shapes))}"
            )
        if meta["optimizer"] != type(zero.optimizer).__name__:
            raise ValueError(
                f"ShardedCheckpoint.load: saved with optimizer {meta['optimizer']}, "
                f"loading into {type(zero.optimizer).__name__}"
            )
        missing = sorted(set(meta["replicated"]) ^ set(self.replicated_names))
        if missing:
            raise ValueError(f"ShardedCheckpoint.load: buffers differ between checkpoint and model: {missing}")


def consolidate_checkpoint(path: str) -> dict:
    """The full model state_dict of a sharded checkpoint, read in one process: for
    evaluation or export.

    Parameters
    ----------
    path : str
        The checkpoint's directory.

    Returns
    -------
    dict
        Parameter and buffer name -> tensor: parameters in fp32, from the masters; buffers as
        saved.

    Raises
    ------
    ValueError
        No complete checkpoint in `path`.
    """
    meta = read_checkpoint_metadata(path)
    saved = _SavedShards(path, meta)
    state = {}
    for index, (name, shape) in enumerate(zip(meta["param_names"], meta["param_shapes"])):
        numel = int(torch.Size(shape).numel())
        value = torch.empty(numel, dtype=torch.float32)
        saved.copy(index, 0, numel, {"master": value})
        state[name] = value.view(shape)
    state.update(meta["replicated"])
    return state


def _atomic_save(obj, file):
    write_exclusive(file, lambda out: torch.save(obj, out))


def _write_summary(path, history, data, world):
    summary = {"format": FORMAT, "world_size": world, "data": data, "history": history}
    text = json.dumps(summary, indent=1, default=repr).encode()
    write_exclusive(os.path.join(path, "metadata.json"), lambda out: out.write(text))
