"""torch's coalesced calls on the ringtree backend, each one grouped ringtree operation, against
Gloo bit for bit: all_reduce_coalesced, the coalescing manager's all_reduce,
all_gather_into_tensor and reduce_scatter_tensor (blocking and async), across real processes."""

import pytest
from harness import run_world
from torch_group import finish_group, init_group


def coalesced_vs_gloo():
    import torch
    import torch.distributed as dist

    r, P = init_group()
    gloo = dist.new_group(backend="gloo")
    world = dist.group.WORLD
    comm = world.comm

    def data(key, n, dtype, rank=r):
        g = torch.Generator().manual_seed(hash((key, rank)) % (1 << 31))
        if dtype.is_floating_point and P == 2:
            return torch.randn(n, generator=g).to(dtype)  # two addends: the same bits in any order
        # Integer-valued: exact whatever the order of the sum.
        return torch.randint(-1000, 1000, (n,), generator=g).to(dtype)

    def tensors(dtype):
        small = [data(("s", i), 1 + i % 7, dtype) for i in range(20)]
        return small + [data(("b", 0), 40_000, dtype), data(("b", 1), 30_000, dtype)]

    report = {}

    def both(name, run):
        ours, theirs = run(world), run(gloo)
        report[name] = len(ours) == len(theirs) and all(
            a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1), b.view(-1))
            for a, b in zip(ours, theirs)
        )

    def coalesced(group, dtype):
        ts = tensors(dtype)
        dist.all_reduce_coalesced(ts, group=group)
        return ts

    first = comm.record()["recorded"]
    both("all_reduce_coalesced float32", lambda g: coalesced(g, torch.float32))
    calls = [c["coll"] for c in comm.record()["calls"] if c["id"] > first]
    # One group: the 20 small tensors fused into one call, the two large ones alone.
    report["one_operation"] = calls == ["all_reduce"] * 3
    both("all_reduce_coalesced int64", lambda g: coalesced(g, torch.int64))

    def manager(group, async_ops):
        ts = tensors(torch.float64)
        with dist._coalescing_manager(group=group, async_ops=async_ops) as cm:
            for t in ts:
                dist.all_reduce(t, group=group)
        if async_ops:
            cm.wait()
        return ts

    for async_ops in (False, True):
        both(f"manager all_reduce async={async_ops}", lambda g, a=async_ops: manager(g, a))

    def gathers(group, async_ops):
        outs = [torch.empty(P * (i + 2), dtype=torch.float32) for i in range(5)]
        outs.append(torch.empty(P * 20_000, dtype=torch.float32))
        with dist._coalescing_manager(group=group, async_ops=async_ops) as cm:
            for i, out in enumerate(outs):
                dist.all_gather_into_tensor(out, data(("g", i), out.numel() // P, torch.float32), group=group)
        if async_ops:
            cm.wait()
        return outs

    def scatters(group, async_ops):
        outs = [torch.empty(i + 1, dtype=torch.float32) for i in range(5)] + [torch.empty(9000, dtype=torch.int64)]
        with dist._coalescing_manager(group=group, async_ops=async_ops) as cm:
            for i, out in enumerate(outs):
                x = data(("rs", i), P * out.numel(), out.dtype)
                dist.reduce_scatter_tensor(out, x, group=group)
        if async_ops:
            cm.wait()
        return outs

    for async_ops in (False, True):
        both(f"all_gather_into_tensor coalesced async={async_ops}", lambda g, a=async_ops: gathers(g, a))
        both(f"reduce_scatter_tensor coalesced async={async_ops}", lambda g, a=async_ops: scatters(g, a))
    # The process group's own entry point, as FSDP calls it.
    outs = [torch.empty(P * 3), torch.empty(P * 5)]
    ins = [torch.full((3,), float(r)), torch.full((5,), float(r + 1))]
    world.allgather_into_tensor_coalesced(outs, ins).wait()
    report["allgather_into_tensor_coalesced"] = torch.equal(
        outs[0], torch.arange(P).repeat_interleave(3).float()
    ) and torch.equal(outs[1], (torch.arange(P) + 1).repeat_interleave(5).float())
    finish_group()
    return report


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nranks", [2, 3])
def test_coalesced_calls_are_one_group_and_match_gloo(nranks):
    for res in run_world(nranks, coalesced_vs_gloo, timeout=200).check_ok():
        assert res and all(res.values()) and len(res) == 10, res
