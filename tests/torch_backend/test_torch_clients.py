"""torch's own clients that once failed on the ringtree backend, each against Gloo: DCP's
broadcast_from_rank0 and async_save (they need the group's device types), bitwise all_reduce,
and all_gather_coalesced as torch's distributed tests run it (with the other coalesced calls and
batch_isend_irecv beside it); and FSDP2 with the group's allocation hook (allocate_tensor).

The rank bodies run in every rank of a test's world (harness.py) and return a JSON report. Where
torch's client reads the default group (DCP), one world runs on each backend; elsewhere one world
holds a ringtree group and a Gloo group and runs both on the same inputs."""

import numpy as np
import pytest

pytest.importorskip("torch")

from harness import run_world  # noqa: E402
from torch_group import finish_group, init_group  # noqa: E402


def _model(seed):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _train_step(model, optimizer, seed):
    import torch

    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(seed))
    model(x).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def _optimizer_tensors(optimizer):
    """Every tensor of an optimizer's state, in a fixed order."""
    import torch

    state = optimizer.state_dict()["state"]
    return [v for key in sorted(state) for _, v in sorted(state[key].items()) if isinstance(v, torch.Tensor)]


def dcp_clients(backend, directory):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    r, P = init_group(backend=backend)
    report = {"devices": sorted({d.type for d in dist.group.WORLD._device_types})}

    # broadcast_from_rank0: rank 0 holds the full state dict, the others start from other weights
    # and pass an empty one.
    net = _model(seed=100 + r)
    full = _model(seed=7).state_dict() if r == 0 else {}
    set_model_state_dict(net, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    report["broadcast"] = {k: v.tolist() for k, v in net.state_dict().items()}

    # async_save of a replicated model and its Adam state, then load into a fresh model whose
    # optimizer state holds other values.
    net = _model(seed=11)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.05)
    _train_step(net, optimizer, seed=12)
    model_sd, optim_sd = get_state_dict(net, optimizer)
    dcp.async_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=directory).result()

    fresh = _model(seed=200 + r)
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.05)
    _train_step(fresh, fresh_optimizer, seed=300 + r)
    model_sd, optim_sd = get_state_dict(fresh, fresh_optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=directory)
    set_state_dict(fresh, fresh_optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    saved = list(net.state_dict().values()) + _optimizer_tensors(optimizer)
    loaded = list(fresh.state_dict().values()) + _optimizer_tensors(fresh_optimizer)
    report["loaded_equal"] = len(saved) == len(loaded) and all(torch.equal(a, b) for a, b in zip(saved, loaded))
    report["loaded"] = [t.tolist() for t in loaded]
    finish_group()
    return report


@pytest.mark.timeout(120)
def test_dcp_broadcast_from_rank0_and_async_save_as_on_gloo(tmp_path):
    import torch

    reports = {
        backend: run_world(
            2, dcp_clients, dict(backend=backend, directory=str(tmp_path / backend)), timeout=100
        ).check_ok()
        for backend in ("ringtree", "gloo")
    }
    rank0_state = {k: v.tolist() for k, v in _model(seed=7).state_dict().items()}
    assert not torch.equal(_model(seed=101)[0].weight, _model(seed=7)[0].weight)  # rank 1 had to receive them
    for backend, ranks in reports.items():
        for rank, res in enumerate(ranks):
            assert res["devices"] == ["cpu", "cuda"], (backend, rank, res["devices"])
            assert res["broadcast"] == rank0_state, (backend, rank)
            assert res["loaded_equal"], (backend, rank)
    for rank in range(2):
        assert reports["ringtree"][rank]["loaded"] == reports["gloo"][rank]["loaded"], rank


BITWISE_DTYPES = ("int8", "uint8", "int16", "int32", "int64", "bool")
BITWISE_OPS = {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}


def _bitwise_input(dtype_name, op, n, rank):
    """Values that use every bit of the dtype, different on each rank."""
    import torch

    case = 3 * BITWISE_DTYPES.index(dtype_name) + list(BITWISE_OPS).index(op)
    g = torch.Generator().manual_seed(7919 * rank + 31 * n + case)
    dtype = getattr(torch, dtype_name)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (n,), generator=g, dtype=dtype)


def bitwise_vs_gloo():
    import torch
    import torch.distributed as dist

    r, P = init_group()
    gloo = dist.new_group(backend="gloo")
    cases = []
    for dtype_name in BITWISE_DTYPES:
        for op in BITWISE_OPS:
            for n in (0, 1, 37):
                x = _bitwise_input(dtype_name, op, n, r)
                mine, theirs = x.clone(), x.clone()
                dist.all_reduce(mine, op=getattr(dist.ReduceOp, op))
                try:
                    dist.all_reduce(theirs, op=getattr(dist.ReduceOp, op), group=gloo)
                    theirs = theirs.tolist()
                except (RuntimeError, ValueError):  # a dtype Gloo does not reduce
                    theirs = None
                cases.append({"dtype": dtype_name, "op": op, "n": n, "ringtree": mine.tolist(), "gloo": theirs})

    # Async, on a non-contiguous column.
    x = _bitwise_input("int32", "BXOR", 24, r).reshape(8, 3)
    work = dist.all_reduce(x[:, 1], op=dist.ReduceOp.BXOR, async_op=True)
    work.wait()
    column = x[:, 1].tolist()
    # Bitwise ops on floats are refused on this rank before any traffic; the group stays usable.
    try:
        dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BXOR)
        refused = "accepted"
    except ValueError as exc:
        refused = str(exc)
    after = torch.tensor([1 << r])
    dist.all_reduce(after, op=dist.ReduceOp.BOR)
    finish_group()
    return {"cases": cases, "column": column, "float_refused": refused, "after": after.tolist()}


@pytest.mark.timeout(120)
def test_bitwise_all_reduce_matches_numpy_and_gloo():
    P = 3
    ranks = run_world(P, bitwise_vs_gloo, timeout=100).check_ok()
    gloo_compared = set()
    for i, case in enumerate(ranks[0]["cases"]):
        dtype = np.dtype(case["dtype"])
        inputs = np.array(
            [_bitwise_input(case["dtype"], case["op"], case["n"], q).numpy() for q in range(P)], dtype=dtype
        ).reshape(P, case["n"])
        want = BITWISE_OPS[case["op"]].reduce(inputs, axis=0).tolist()
        for rank, res in enumerate(ranks):
            got = res["cases"][i]
            assert got["ringtree"] == want, (rank, case["dtype"], case["op"], case["n"])
            if got["gloo"] is not None:
                assert got["ringtree"] == got["gloo"], (rank, case["dtype"], case["op"], case["n"])
                gloo_compared.add(case["dtype"])
    # Gloo has no int16 reductions; numpy alone checks those.
    assert gloo_compared == set(BITWISE_DTYPES) - {"int16"}, gloo_compared
    columns = np.array([_bitwise_input("int32", "BXOR", 24, q).numpy().reshape(8, 3)[:, 1] for q in range(P)])
    for rank, res in enumerate(ranks):
        assert res["column"] == np.bitwise_xor.reduce(columns, axis=0).tolist(), rank
        assert "integer or bool" in res["float_refused"], res["float_refused"]
        assert res["after"] == [(1 << P) - 1], res["after"]


def _filled(dim, value, dtype):
    """torch's distributed tests' _build_multidim_tensor(dim, dim, value): dim**dim elements."""
    import torch

    return torch.empty([dim] * dim, dtype=dtype).fill_(value)


def _lists_equal(got, want):
    """Lists of tensor lists, equal tensor by tensor."""
    import torch

    return all(torch.equal(a, b) for got_list, want_list in zip(got, want) for a, b in zip(got_list, want_list))


def coalesced_vs_gloo():
    import torch
    import torch.distributed as dist

    r, P = init_group()
    worlds = {"ringtree": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    pairs = {"ringtree": dist.new_group([1, 2]), "gloo": dist.new_group([1, 2], backend="gloo")}
    fulls = {"ringtree": dist.new_group(), "gloo": dist.new_group(backend="gloo")}
    report = {}

    def gather_cases(backend, group, members, dtype):
        """_test_all_gather_coalesced_helper: 1, 2 and 3 tensors of growing rank in one call."""
        outcomes = []
        for case in range(2, 5):
            inputs = [_filled(t, r + t, dtype) for t in range(1, case)]
            outputs = [[_filled(t, -1, dtype) for t in range(1, case)] for _ in members]
            dist.all_gather_coalesced(outputs, inputs, group[backend])
            expected = [[_filled(t, q + t, dtype) for t in range(1, case)] for q in members]
            outcomes.append(_lists_equal(outputs, expected))
        return outcomes

    for backend in ("ringtree", "gloo"):
        results = {
            "simple": gather_cases(backend, worlds, range(P), torch.float),
            "complex": gather_cases(backend, worlds, range(P), torch.cfloat),
            "full_group": gather_cases(backend, fulls, range(P), torch.float),
        }
        if r in (1, 2):
            results["group"] = gather_cases(backend, pairs, [1, 2], torch.float)
        # test_all_gather_coalesced_with_empty, and async.
        inputs = [r * torch.ones(2, 2), torch.ones(0), (r + 1) * torch.ones(3, 3), torch.ones(0), torch.ones(0)]
        outputs = [[-torch.ones(t.shape) for t in inputs] for _ in range(P)]
        dist.all_gather_coalesced(outputs, inputs, worlds[backend], async_op=True).wait()
        expected = [
            [q * torch.ones(2, 2), torch.ones(0), (q + 1) * torch.ones(3, 3), torch.ones(0), torch.ones(0)]
            for q in range(P)
        ]
        results["with_empty"] = [_lists_equal(outputs, expected)]
        report[backend] = results

    # The other coalesced calls and batch_isend_irecv, on both backends.
    def other_calls(group):
        gathered = [torch.empty(P * (i + 2), dtype=torch.int64) for i in range(3)]
        scattered = [torch.empty(i + 1) for i in range(3)]
        with dist._coalescing_manager(group=group, async_ops=True) as cm:
            for i, out in enumerate(gathered):
                dist.all_gather_into_tensor(out, torch.arange(i + 2) + 10 * r, group=group)
        cm.wait()
        with dist._coalescing_manager(group=group, async_ops=True) as cm:
            for i, out in enumerate(scattered):
                dist.reduce_scatter_tensor(out, torch.arange(P * (i + 1), dtype=torch.float32) * (r + 1), group=group)
        cm.wait()
        received = torch.empty(5)
        ops = [
            dist.P2POp(dist.isend, torch.full((5,), float(r)), (r + 1) % P, group),
            dist.P2POp(dist.irecv, received, (r - 1) % P, group),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return [t.tolist() for t in gathered + scattered + [received]]

    report["other_calls"] = {backend: other_calls(group) for backend, group in worlds.items()}
    finish_group()
    return report


@pytest.mark.timeout(120)
def test_all_gather_coalesced_as_torch_tests_it_and_as_gloo():
    P = 3
    for rank, res in enumerate(run_world(P, coalesced_vs_gloo, timeout=100).check_ok()):
        for backend in ("ringtree", "gloo"):
            cases = ["simple", "complex", "full_group", "with_empty"] + (["group"] if rank in (1, 2) else [])
            for case in cases:
                assert res[backend][case] and all(res[backend][case]), (rank, backend, case, res[backend][case])
        other = res["other_calls"]
        assert other["ringtree"] == other["gloo"], (rank, other)
        gathered = [sum(([q * 10 + k for k in range(i + 2)] for q in range(P)), []) for i in range(3)]
        rank_sum = sum(q + 1 for q in range(P))
        scattered = [[float(rank_sum * (rank * (i + 1) + k)) for k in range(i + 1)] for i in range(3)]
        assert other["ringtree"] == gathered + scattered + [[float((rank - 1) % P)] * 5], (rank, other["ringtree"])


def fsdp2_allocation_hook_vs_gloo(steps=4):
    """FSDP2 (fully_shard per Linear and at the root, Adam) trained on the ringtree group with its
    allocation hook on, and on a Gloo group over the same ranks, from the same start and data."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    rank, P = init_group()
    groups = {"ringtree": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    pool = groups["ringtree"]._pool
    report = {}
    for backend, group in groups.items():
        model = _model(0)
        mesh = DeviceMesh.from_group(group, "cpu")
        layers = [layer for layer in model if isinstance(layer, torch.nn.Linear)]
        for layer in layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if backend == "ringtree":
            for layer in layers:  # the setting is per fully_shard module
                layer.set_allocate_memory_from_process_group_for_comm(True)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        before = (pool.allocated, pool.reused)
        for step in range(steps):
            _train_step(model, optimizer, seed=100 * step + rank)
        report[backend] = [p.full_tensor().reshape(-1).tolist() for p in model.parameters()]
        report[f"{backend}_pool"] = [pool.allocated - before[0], pool.reused - before[1]]
    report["hooked"] = groups["ringtree"]._get_backend(torch.device("cpu")).supports_tensor_alloc(torch.device("cpu"))
    finish_group()
    return report


@pytest.mark.timeout(120)
def test_fsdp2_with_the_allocation_hook_matches_gloo():
    for rank, res in enumerate(run_world(2, fsdp2_allocation_hook_vs_gloo, timeout=100).check_ok()):
        assert res["hooked"], rank
        assert res["ringtree"] == res["gloo"], rank  # bit for bit at P = 2
        allocated, reused = res["ringtree_pool"]
        # FSDP2 took its all-gather outputs and reduce-scatter inputs from the pool, and later
        # steps reused the first steps' buffers; the Gloo run never asks it.
        assert allocated >= 1 and reused > allocated, (rank, res["ringtree_pool"])
        assert res["gloo_pool"] == [0, 0], (rank, res["gloo_pool"])
