"""Functions that run inside each rank of a torch test world (see test_torch_*.py). Each
returns a JSON-serialisable report; the tests assert on it.

The collective checks run every torch.distributed call twice in the same processes, once
on the ringtree group and once on a Gloo group, with the same inputs, and compare.
"""
from __future__ import annotations

import datetime
import os
import signal
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))


def _init(timeout=60.0):
    import torch
    import torch.distributed as dist

    import ringtree.torch as rtt
    torch.set_num_threads(1)  # ranks share two cores
    rtt.init_process_group(timeout=datetime.timedelta(seconds=timeout))
    return dist.get_rank(), dist.get_world_size()


def _finish():
    import torch.distributed as dist
    dist.barrier()
    dist.destroy_process_group()


def _error_name(exc):
    return type(exc).__name__


# --- every collective against Gloo ---------------------------------------------------------


def collectives_vs_gloo(large=1 << 20):
    import torch
    import torch.distributed as dist

    r, P = _init()
    gloo = dist.new_group(backend="gloo")
    ours = dist.group.WORLD
    failures, checked = [], []

    def inputs(case, n, dtype, low=-3, high=4, rank=None):
        # crc32, not hash(): string hashes differ between processes.
        g = torch.Generator().manual_seed(1000 * (r if rank is None else rank) + zlib.crc32(repr(case).encode()) % 1000)
        if dtype == torch.bool:
            return torch.randint(0, 2, (n,), generator=g).bool()
        if dtype.is_complex:
            return torch.randint(low, high, (n, 2), generator=g).float().view(dtype).reshape(n)
        if not dtype.is_signed and not dtype.is_floating_point:
            low = 0
        return torch.randint(low, high, (n,), generator=g).to(dtype)

    def compare(case, got, want, exact=True):
        checked.append(case)
        got = list(got) if isinstance(got, (list, tuple)) else [got]
        want = list(want) if isinstance(want, (list, tuple)) else [want]
        for a, b in zip(got, want):
            same = torch.equal(a, b) if exact else torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6)
            if not same:
                failures.append(f"{case}: ringtree {a.flatten()[:6].tolist()} vs gloo {b.flatten()[:6].tolist()}")
                return

    def both(case, run, exact=True):
        """run(group) -> output tensor(s); runs on ringtree then gloo and compares."""
        try:
            got = run(ours)
        except Exception as exc:  # noqa: BLE001 - reported
            failures.append(f"{case}: ringtree raised {_error_name(exc)}: {exc}")
            return
        want = run(gloo)
        compare(case, got, want, exact)

    # all_reduce: every op, several dtypes and counts.
    ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
           "max": dist.ReduceOp.MAX}
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8, torch.float16,
                  torch.bfloat16):
        for n in (0, 1, 7, 3 * P + 1, 1000):
            for name, op in ops.items():
                low, high = (-1, 3) if name == "prod" else (-3, 4)

                def run(group, n=n, dtype=dtype, op=op, low=low, high=high, name=name):
                    x = inputs(("ar", name, n), n, dtype, low, high)
                    dist.all_reduce(x, op=op, group=group)
                    return x

                both(f"all_reduce {name} {dtype} n={n}", run)
    for n in (large, 1000):
        both(f"all_reduce sum float32 n={n}", lambda g, n=n: _ar(inputs(("big", n), n, torch.float32), g))
    # Random floats: ring and gloo sum in different orders, so within rounding.
    both("all_reduce sum random float32",
         lambda g: _ar(torch.randn(4099, generator=torch.Generator().manual_seed(r)), g), exact=False)

    # avg and premul_sum, which Gloo lacks: against Gloo's sum.
    def avg_ringtree(dtype):
        x = inputs(("avg",), 1001, dtype)
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
        return x

    def avg_from_gloo_sum(dtype):
        x = inputs(("avg",), 1001, dtype)
        dist.all_reduce(x, group=gloo)
        return x / P if dtype.is_floating_point else torch.div(x, P, rounding_mode="trunc")

    for dtype in (torch.float32, torch.int64):
        compare(f"all_reduce avg {dtype}", avg_ringtree(dtype), avg_from_gloo_sum(dtype), exact=False)
    premul = dist._make_nccl_premul_sum(0.5)
    x = inputs(("premul",), 513, torch.float32)
    y = x.clone() * 0.5
    dist.all_reduce(x, op=premul)
    dist.all_reduce(y, group=gloo)
    compare("all_reduce premul_sum(0.5)", x, y)

    # Unsupported ops fail clearly and leave the group usable.
    for name in ("BAND", "BOR", "BXOR"):
        try:
            dist.all_reduce(torch.ones(3, dtype=torch.int32), op=getattr(dist.ReduceOp, name))
            failures.append(f"ReduceOp.{name} did not raise")
        except ValueError as exc:
            if name not in str(exc):
                failures.append(f"ReduceOp.{name} message: {exc}")
        checked.append(f"ReduceOp.{name} refused")
    both("all_reduce after refused ops", lambda g: _ar(inputs(("after",), 5, torch.int64), g))

    # Non-contiguous tensors, complex numbers, async work.
    # A non-contiguous column (Gloo does not handle these: against a sum of the inputs).
    x = inputs(("strided",), 40, torch.float32).reshape(8, 5)
    dist.all_reduce(x[:, 1])
    want = inputs(("strided",), 40, torch.float32).reshape(8, 5)
    want[:, 1] = sum(inputs(("strided",), 40, torch.float32, rank=q).reshape(8, 5)[:, 1] for q in range(P))
    compare("all_reduce non-contiguous column", x, want)
    both("all_reduce complex64", lambda g: _ar(inputs(("cplx",), 9, torch.complex64), g))

    def async_allreduce(group):
        x = inputs(("async",), 100, torch.int32)
        work = dist.all_reduce(x, async_op=True, group=group)
        value = work.get_future().wait()
        assert work.wait() is True and work.is_completed()
        return [x, value[0]]

    both("all_reduce async_op get_future", async_allreduce)
    both("all_reduce_coalesced", lambda g: _coalesced(inputs, g))

    # broadcast: every root; bool and int16 (which Gloo refuses; ringtree moves them as
    # bytes) against the root's input.
    for root in range(P):
        def run(group, root=root, dtype=torch.float32):
            x = inputs(("bc", root), 37, dtype)
            dist.broadcast(x, src=root, group=group)
            return x
        both(f"broadcast root={root}", run)
        for dtype in (torch.bool, torch.int16):
            compare(f"broadcast root={root} {dtype}", run(ours, dtype=dtype), inputs(("bc", root), 37, dtype, rank=root))

    # reduce: every root.
    for root in range(P):
        def run(group, root=root):
            x = inputs(("red", root), 33, torch.float32)
            dist.reduce(x, dst=root, op=dist.ReduceOp.MAX, group=group)
            return x if r == root else torch.zeros(0)  # elsewhere the contents are unspecified
        both(f"reduce max root={root}", run)

    # all_gather (list and into one tensor), uneven sizes through the list form.
    for dtype in (torch.float32, torch.int64, torch.bool):
        def run(group, dtype=dtype):
            outs = [torch.empty(6, dtype=dtype) for _ in range(P)]
            dist.all_gather(outs, inputs(("ag",), 6, dtype), group=group)
            return outs
        if dtype == torch.bool:
            compare("all_gather bool", run(ours), [inputs(("ag",), 6, dtype, rank=q) for q in range(P)])
        else:
            both(f"all_gather {dtype}", run)

    def gather_into(group):
        out = torch.empty(P * 5, dtype=torch.float64)
        dist.all_gather_into_tensor(out, inputs(("agt",), 5, torch.float64), group=group)
        return out

    both("all_gather_into_tensor", gather_into)

    def uneven_gather():
        outs = [torch.empty(q + 1) for q in range(P)]
        dist.all_gather(outs, torch.full((r + 1,), float(r)))
        return outs

    compare("all_gather uneven sizes", uneven_gather(), [torch.full((q + 1,), float(q)) for q in range(P)])

    # reduce_scatter (list and tensor).
    def rs_list(group):
        out = torch.empty(4, dtype=torch.int64)
        dist.reduce_scatter(out, list(inputs(("rs",), 4 * P, torch.int64).chunk(P)), group=group)
        return out

    def rs_tensor(group):
        out = torch.empty(3, dtype=torch.float32)
        dist.reduce_scatter_tensor(out, inputs(("rst",), 3 * P, torch.float32), group=group)
        return out

    both("reduce_scatter", rs_list)
    both("reduce_scatter_tensor", rs_tensor)

    # all_to_all_single with and without split sizes; all_to_all with lists.
    def a2a_even(group):
        out = torch.empty(2 * P, 3)
        dist.all_to_all_single(out, inputs(("a2a",), 6 * P, torch.float32).reshape(2 * P, 3), group=group)
        return out

    both("all_to_all_single", a2a_even)

    def splits(rank):
        return [1 + (rank + q) % 3 for q in range(P)]  # rows rank sends to q

    def a2a_uneven(group):
        send = splits(r)
        recv = [splits(q)[r] for q in range(P)]
        x = inputs(("a2av",), sum(send) * 2, torch.float32).reshape(sum(send), 2)
        out = torch.empty(sum(recv), 2)
        dist.all_to_all_single(out, x, output_split_sizes=recv, input_split_sizes=send, group=group)
        return out

    def a2a_lists(group):
        send = splits(r)
        recv = [splits(q)[r] for q in range(P)]
        ins = [inputs(("a2al", q), send[q], torch.int64) for q in range(P)]
        outs = [torch.empty(recv[q], dtype=torch.int64) for q in range(P)]
        dist.all_to_all(outs, ins, group=group)
        return outs

    def a2a_even_lists(group):
        outs = [torch.empty(3, dtype=torch.int64) for _ in range(P)]
        dist.all_to_all(outs, [inputs(("a2ae", q), 3, torch.int64) for q in range(P)], group=group)
        return outs

    both("all_to_all_single with split sizes", a2a_uneven)
    both("all_to_all lists", a2a_even_lists)
    # Gloo refuses uneven lists: against the senders' inputs.
    compare("all_to_all lists (uneven)", a2a_lists(ours),
            [inputs(("a2al", r), splits(q)[r], torch.int64, rank=q) for q in range(P)])

    # gather / scatter, every root.
    for root in range(P):
        def gather(group, root=root):
            outs = [torch.empty(4) for _ in range(P)] if r == root else None
            dist.gather(inputs(("ga", root), 4, torch.float32), outs, dst=root, group=group)
            return outs if outs is not None else [torch.zeros(0)]

        def scatter(group, root=root):
            out = torch.empty(3, dtype=torch.int32)
            ins = [inputs(("sc", q), 3, torch.int32) for q in range(P)] if r == root else None
            dist.scatter(out, ins, src=root, group=group)
            return out

        both(f"gather root={root}", gather)
        both(f"scatter root={root}", scatter)

    # Objects go through all_gather and broadcast of byte tensors.
    objects = [None] * P
    dist.all_gather_object(objects, {"rank": r, "text": "x" * r})
    compare("all_gather_object", [torch.tensor([o["rank"], len(o["text"])]) for o in objects],
            [torch.tensor([q, q]) for q in range(P)])

    # Point to point: a ring of isend/irecv with a large message (more than the shared
    # memory ring) in both directions at once, then blocking send/recv.
    n = 3 << 20
    nxt, prv = (r + 1) % P, (r - 1) % P
    got_next, got_prev = torch.empty(n), torch.empty(n)
    works = [dist.isend(torch.full((n,), float(r)), nxt), dist.irecv(got_prev, prv)]
    if P > 2:
        works += [dist.isend(torch.full((n,), float(r)), prv), dist.irecv(got_next, nxt)]
    for w in works:
        w.wait()
    compare("isend/irecv ring", got_prev, torch.full((n,), float(prv)))
    if P > 2:
        compare("isend/irecv reverse ring", got_next, torch.full((n,), float(nxt)))
    if r == 0:
        for q in range(1, P):
            dist.send(torch.arange(5) * q, dst=q)
    else:
        x = torch.empty(5, dtype=torch.int64)
        dist.recv(x, src=0)
        compare("send/recv", x, torch.arange(5) * r)

    ops = [dist.P2POp(dist.isend, torch.full((4,), float(r)), nxt), dist.P2POp(dist.irecv, got_prev[:4], prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    compare("batch_isend_irecv", got_prev[:4], torch.full((4,), float(prv)))

    # Functional collectives (what torch.compile and DTensor use) and the coalescing manager.
    import torch.distributed._functional_collectives as funcol
    both("functional all_reduce", lambda g: funcol.all_reduce(inputs(("fc",), 6, torch.float32), "sum", g).wait())

    def coalesced_manager(group):
        tensors = [inputs(("cm", i), 3 + i, torch.int64) for i in range(3)]
        with dist._coalescing_manager(group=group, async_ops=True) as cm:
            for t in tensors:
                dist.all_reduce(t, group=group)
        cm.wait()
        return tensors

    both("_coalescing_manager all_reduce", coalesced_manager)

    # Barrier, then subgroups (every rank calls new_group; members use it).
    dist.barrier()
    checked.append("barrier")
    members = list(range(0, P, 2)) if P > 2 else [0, 1]
    sub_ours = dist.new_group(members)
    sub_gloo = dist.new_group(members, backend="gloo")
    if r in members:
        xs = []
        for group in (sub_ours, sub_gloo):
            x = inputs(("sub",), 11, torch.int64)
            dist.all_reduce(x, group=group)
            xs.append(x)
        compare(f"subgroup {members} all_reduce", xs[0], xs[1])
        b = torch.arange(4.) if r == members[-1] else torch.zeros(4)
        dist.broadcast(b, src=members[-1], group=sub_ours)
        compare(f"subgroup {members} broadcast", b, torch.arange(4.))

    _finish()
    return {"failures": failures, "checked": len(checked)}


def _ar(x, group):
    import torch.distributed as dist
    dist.all_reduce(x, group=group)
    return x


def _coalesced(inputs, group):
    import torch
    import torch.distributed as dist
    tensors = [inputs(("coal", i), 3 + i, torch.float32) for i in range(3)]
    dist.all_reduce_coalesced(tensors, group=group)
    return tensors


# --- rendezvous paths ------------------------------------------------------------------------


def rendezvous(method, port):
    """init_process_group("ringtree") through env:// or tcp://, then one all_reduce."""
    import torch
    import torch.distributed as dist

    import ringtree.torch  # noqa: F401 - registers the backend
    rank, size = int(os.environ["RINGTREE_RANK"]), int(os.environ["RINGTREE_WORLD_SIZE"])
    if method == "env":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
        dist.init_process_group("ringtree")
    else:
        dist.init_process_group("ringtree", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    x = torch.full((3,), float(rank + 1))
    dist.all_reduce(x)
    backend = dist.get_backend()
    dist.destroy_process_group()
    return {"sum": x.tolist(), "backend": backend}


# --- errors ----------------------------------------------------------------------------------


def errors(timeout=3.0):
    """Bad arguments, a mismatched call and a stalled peer, each as a clear typed error.

    After the mismatch the world group is aborted (ringtree aborts on every rank), so the
    stall runs on a fresh group."""
    import torch
    import torch.distributed as dist

    import ringtree as rt
    r, P = _init(timeout=timeout)
    report = {}

    def expect(name, call, error_type, needle=None):
        started = time.monotonic()
        try:
            call()
            report[name] = {"raised": None}
        except Exception as exc:  # noqa: BLE001 - reported
            report[name] = {"raised": _error_name(exc), "ok": isinstance(exc, error_type) and
                            (needle is None or needle in str(exc)), "message": str(exc)[:300],
                            "seconds": time.monotonic() - started}

    expect("BAND", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND), ValueError, "BAND")
    expect("reduction dtype", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)), ValueError, "int16")
    expect("tag", lambda: dist.send(torch.ones(2), dst=(r + 1) % P, tag=7), ValueError, "tag")
    expect("recv any source", lambda: dist.recv(torch.ones(2)), ValueError, "any source")
    expect("all_gather list length", lambda: dist.all_gather([torch.ones(2)] * (P + 1), torch.ones(2)),
           ValueError, "output tensors")
    x = torch.ones(3)
    dist.all_reduce(x)
    report["usable after bad arguments"] = {"raised": None, "ok": x.tolist() == [float(P)] * 3}

    # Mismatch: rank 0 reduces 4 elements, the others 5.
    expect("mismatch", lambda: dist.all_reduce(torch.ones(4 if r == 0 else 5)), rt.CollectiveMismatch)

    # Two fresh groups (every rank calls new_group), then rank 1 stalls in each.
    fresh = [dist.new_group(list(range(P)), timeout=datetime.timedelta(seconds=timeout)) for _ in range(2)]
    if r == 1:
        time.sleep(2 * timeout + 2.0)
        return {"report": {"victim": {"raised": None, "ok": True}}}
    expect("stall", lambda: dist.all_reduce(torch.ones(2), group=fresh[0]), rt.Timeout)
    # The async form: wait() and the future raise the typed error.
    work = dist.all_reduce(torch.ones(2), group=fresh[1], async_op=True)
    expect("stall async wait", work.wait, rt.Timeout)
    # Futures carry errors to C++ (DDP) as RuntimeError, named after the ringtree error.
    expect("stall async future", work.get_future().wait, RuntimeError, "Timeout: ")
    return {"report": report}


def kill_during_ddp(victim=1):
    """The victim SIGKILLs itself between steps; the survivors' next step must raise."""
    import ringtree as rt
    import train_ddp
    r, P = _init(timeout=60)
    ddp = train_ddp.wrap(train_ddp.make_model(32))
    train_ddp.train(ddp, 2, 16, 0.05, log=None)
    if r == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    started = time.monotonic()
    try:
        train_ddp.train(ddp, 3, 16, 0.05, log=None)
        return {"raised": None}
    except Exception as exc:  # noqa: BLE001 - reported
        # Through DDP's C++ reducer the error arrives as a RuntimeError that names it.
        return {"raised": _error_name(exc), "peer_failure": isinstance(exc, rt.PeerFailure) or "PeerFailure: " in str(exc),
                "message": str(exc)[:500], "seconds": time.monotonic() - started}


# --- training equivalence --------------------------------------------------------------------


def _flat_params(model):
    import torch
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _single_process(steps, batch, lr, hidden, micro_batches=1, extra_unused=False):
    """The reference: one process, the whole batch each step."""
    import torch

    import train_ddp
    model = _model(hidden, extra_unused)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        x, y = train_ddp.global_batch(step, batch)
        optimizer.zero_grad()
        for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
            (torch.nn.functional.cross_entropy(model(xm), ym) / micro_batches).backward()
        optimizer.step()
    return model


def _model(hidden, extra_unused=False):
    import torch

    import train_ddp
    net = train_ddp.make_model(hidden, seed=0)
    if not extra_unused:
        return net

    class WithUnused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net
            self.unused = torch.nn.Linear(3, 3)  # never in forward: DDP needs find_unused_parameters

        def forward(self, x):
            return self.net(x)

    return WithUnused()


def _distributed_steps(module, params, steps, batch, lr, rank, world, micro_batches=1, no_sync=None,
                       before_step=None):
    import contextlib

    import torch

    import train_ddp
    optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9)
    for step in range(steps):
        x, y = train_ddp.global_batch(step, batch)
        optimizer.zero_grad()
        micro = list(zip(x.chunk(micro_batches), y.chunk(micro_batches)))
        for i, (xm, ym) in enumerate(micro):
            last = i == len(micro) - 1
            context = no_sync() if (no_sync is not None and not last) else contextlib.nullcontext()
            with context:
                out = module(train_ddp.local_slice(xm, rank, world))
                loss = torch.nn.functional.cross_entropy(out, train_ddp.local_slice(ym, rank, world)) / micro_batches
                loss.backward()
        if before_step is not None:
            before_step()
        optimizer.step()


def training_matches_single_process(steps=4, batch=24, lr=0.05, hidden=24):
    """DDP (plain, find_unused_parameters, static_graph, no_sync, allreduce hook) and
    DataParallelHook (plain, accumulation) against single-process full-batch training."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ringtree.torch as rtt
    r, P = _init()
    world_comm = dist.group.WORLD.comm
    gloo = dist.new_group(backend="gloo")
    configs = {
        "ddp": dict(),
        "ddp find_unused_parameters": dict(extra_unused=True, ddp=dict(find_unused_parameters=True)),
        "ddp static_graph": dict(ddp=dict(static_graph=True)),
        "ddp no_sync x2": dict(micro=2, no_sync=True),
        "ddp allreduce_hook": dict(hook=(rtt.AllReduceState, rtt.allreduce_hook)),
        "ddp small buckets": dict(ddp=dict(bucket_cap_mb=0.002)),
        "hook": dict(dp=dict()),
        "hook small buckets, finish() by hand": dict(dp=dict(bucket_cap_mb=0.002, finish_in_backward=False)),
        "hook accumulation_steps=2": dict(micro=2, dp=dict(accumulation_steps=2)),
        "hook no_sync x2, unused param": dict(micro=2, no_sync=True, extra_unused=True, dp=dict()),
    }
    results, calls, expected_calls = {}, {}, {}
    for name, cfg in configs.items():
        extra_unused, micro = cfg.get("extra_unused", False), cfg.get("micro", 1)
        model = _model(hidden, extra_unused)
        if "dp" in cfg:
            counting = _CountingComm(world_comm)
            hook = rtt.DataParallelHook(model, counting, **cfg["dp"])
            module, no_sync = model, (hook.no_sync if cfg.get("no_sync") else None)
        else:
            module = DDP(model, **cfg.get("ddp", {}))
            if "hook" in cfg:
                make_state, function = cfg["hook"]
                module.register_comm_hook(make_state(), function)
            no_sync, hook = (module.no_sync if cfg.get("no_sync") else None), None
        before_step = hook.finish if hook is not None and not hook.finish_in_backward else None
        _distributed_steps(module, list(model.parameters()), steps, batch, lr, r, P, micro, no_sync, before_step)
        reference = _single_process(steps, batch, lr, hidden, micro, extra_unused)
        mine = _flat_params(model)
        everyone = [torch.empty_like(mine) for _ in range(P)]
        dist.all_gather(everyone, mine, group=gloo)  # checked through Gloo, not the system under test
        results[name] = {
            "identical_across_ranks": all(torch.equal(everyone[0], e) for e in everyone),
            "max_diff_vs_single": (mine - _flat_params(reference)).abs().max().item(),
            "moved": (mine - _flat_params(_model(hidden, extra_unused))).abs().max().item(),
        }
        if hook is not None:
            hook.remove()
            calls[name] = counting.all_reduce_calls
            expected_calls[name] = steps * len(hook.bucket_assignment)
    _finish()
    return {"results": results, "all_reduce_calls": calls, "expected_calls": expected_calls}


class _CountingComm:
    """A ringtree communicator that counts all_reduce calls."""

    def __init__(self, comm):
        self._comm = comm
        self.all_reduce_calls = 0

    def all_reduce(self, *args, **kwargs):
        self.all_reduce_calls += 1
        return self._comm.all_reduce(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._comm, name)


def compression_converges(steps=40, batch=32, lr=0.1, hidden=32):
    """The example trained with each comm hook: every loss curve comes down, close to the
    uncompressed one."""
    import train_ddp
    r, P = _init()
    losses = {}
    for hook in ("none", "fp16", "bf16", "int8"):
        ddp = train_ddp.wrap(train_ddp.make_model(hidden), hook)
        losses[hook] = train_ddp.train(ddp, steps, batch, lr, log=None)
    _finish()
    return {"losses": losses}


# --- bucketing without torch -----------------------------------------------------------------


def bucketer_numpy(sizes, cap_mb, order_seed, skipped=0):
    """numpy gradients, marked in a rank-dependent order: each gradient ends as the average
    of every rank's. In the last step rank 0 never marks gradient `skipped` (it counts as
    zeros there). torch must not be imported along the way."""
    import numpy as np

    import ringtree as rt
    from ringtree.bucketing import Bucketer
    comm = rt.init()
    r, P = comm.rank, comm.size
    bucketer = Bucketer(sizes, dtypes=np.float64, bucket_cap_mb=cap_mb)
    wrong, steps = [], 3
    for step in range(steps):
        missing = {skipped} if step == steps - 1 else set()
        grads = [np.full(n, float(r + 1 + step + i), dtype=np.float64) for i, n in enumerate(sizes)]
        bucketer.start_step(comm)
        for i in np.random.default_rng(order_seed + 17 * r + step).permutation(len(sizes)):
            if not (r == 0 and int(i) in missing):
                bucketer.mark_ready(int(i), grads[int(i)])
        reduced = bucketer.finish()
        for i, n in enumerate(sizes):
            want = sum(float(q + 1 + step + i) for q in range(P) if not (q == 0 and i in missing)) / P
            got = reduced[i] if (r == 0 and i in missing) else grads[i]
            if n and not np.allclose(got, want):
                wrong.append(f"step {step} grad {i}: {got[:3]} != {want}")
    comm.close()
    return {"wrong": wrong, "assignment": bucketer.assignment, "torch_imported": "torch" in sys.modules}
