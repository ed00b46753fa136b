"""topk_hook (top-k sparsification with error feedback) in real rank processes, on the ringtree
backend and on Gloo: every rank's averaged bucket and residual equal a numpy model of the rule
(add the residual, send the k = ceil(ratio n) largest magnitudes, lowest index first among
equal ones, average the P sparse messages in rank order, keep the rest) computed here from all
ranks' gradients; ratio 1 is plain averaging; empty buckets, ties, 16-bit buckets, warm-up,
bad ratios and ratios that differ between ranks; and DDP with the hook on a real model.

The rank bodies return what the hook produced; the numpy model runs in the test process."""

import math
from decimal import Decimal

import numpy as np
import pytest

pytest.importorskip("torch")

from harness import run_world  # noqa: E402
from torch_group import finish_group, init_group  # noqa: E402

# (name, bucket sizes, ratio, steps, gradient kind, dtype, warm-up steps)
CASES = [
    ("distinct", (1000, 37, 1, 0), 0.01, 3, "normal", "float32", 0),
    ("distinct 0.07", (100, 333), 0.07, 3, "normal", "float32", 0),
    ("ties", (200, 50), 0.05, 3, "small integers", "float32", 0),
    ("ratio 1", (64, 5), 1.0, 2, "normal", "float32", 0),
    ("float16", (300,), 0.1, 3, "normal", "float16", 0),
    ("warm-up", (120,), 0.05, 3, "normal", "float32", 1),
]
GLOO_CASES = CASES[:3]


def _gradient(kind, rank, step, bucket, size):
    """Rank `rank`'s gradient for one bucket at one step, the same in the rank and in the test."""
    rng = np.random.default_rng([rank, step, bucket, size])
    if kind == "small integers":  # many equal magnitudes, zeros among them
        return rng.integers(-3, 4, size).astype(np.float32)
    return (rng.standard_normal(size) * rng.uniform(0.1, 10.0)).astype(np.float32)


class _Bucket:
    """What topk_hook reads of a dist.GradBucket (which Python cannot construct)."""

    def __init__(self, buffer, index, last, params):
        self._buffer, self._index, self._last, self._params = buffer, index, last, params

    def buffer(self):
        return self._buffer

    def index(self):
        return self._index

    def is_last(self):
        return self._last

    def parameters(self):
        return self._params


def _run_case(case, rank, with_plain):
    import torch

    import ringtree.torch as rtt

    name, sizes, ratio, steps, kind, dtype, warmup = case
    state = rtt.TopKState(ratio=ratio, warmup_steps=warmup)
    params = [[torch.empty(0)] for _ in sizes]  # stand-ins: a fixed parameter list per bucket
    outputs, residuals, plain = [], [], []
    for step in range(steps):
        for per_step in (outputs, residuals, plain):
            per_step.append([])
        for i, size in enumerate(sizes):
            grad = torch.from_numpy(_gradient(kind, rank, step, i, size)).to(getattr(torch, dtype))
            bucket = _Bucket(grad.clone(), i, i == len(sizes) - 1, params[i])
            out = rtt.topk_hook(state, bucket).wait()
            assert out is bucket.buffer()  # averaged in place, as DDP expects
            outputs[-1].append(out.to(torch.float64).tolist())
            residual = state.residuals.get(i)
            residuals[-1].append(None if residual is None else residual[1].tolist())
            if with_plain:
                plain_bucket = _Bucket(grad.clone(), i, False, params[i])
                plain[-1].append(rtt.allreduce_hook(rtt.AllReduceState(), plain_bucket).wait().tolist())
    return {
        "outputs": outputs,
        "residuals": residuals,
        "plain": plain,
        "sent_bytes": state.sent_bytes,
        "dense_bytes": state.dense_bytes,
        "steps_counted": state.step,
    }


def topk_cases(backend, cases, mismatch=False):
    """Each case through topk_hook; then bad ratios on one rank (refused before any traffic,
    the group still usable) and, with `mismatch`, ratios that differ between ranks."""
    import torch
    import torch.distributed as dist

    import ringtree.torch as rtt

    r, P = init_group(backend=backend)
    report = {name: _run_case(case, r, name == "ratio 1") for case in cases for name in [case[0]]}

    refused = []
    if r == 0:
        for bad in (0, -0.5, 1.5, float("nan"), float("inf"), "0.1", True, None):
            try:
                rtt.TopKState(ratio=bad)
            except ValueError as e:
                refused.append(str(e))
        state = rtt.TopKState(ratio=0.5)
        try:
            state.ratio = 2
        except ValueError as e:
            refused.append(str(e))
        try:
            rtt.TopKState(warmup_steps=-1)
        except ValueError as e:
            refused.append(str(e))
    report["refused"] = refused
    # The group still works after rank 0's refusals: one more hook call on every rank.
    bucket = _Bucket(torch.full((10,), float(r + 1)), 0, True, [])
    report["after_refusals"] = rtt.topk_hook(rtt.TopKState(ratio=0.2), bucket).wait().tolist()

    if mismatch:  # k = 10 on rank 0, 20 elsewhere: an error on every rank, not a hang
        bucket = _Bucket(torch.ones(1000), 0, True, [])
        try:
            rtt.topk_hook(rtt.TopKState(ratio=0.01 if r == 0 else 0.02), bucket).wait()
            report["mismatch_error"] = None
        except RuntimeError as e:
            report["mismatch_error"] = str(e)
        dist.destroy_process_group()
    else:
        finish_group()
    return report


def _count(ratio, n):
    return min(n, math.ceil(Decimal(repr(ratio)) * n))


def _send(acc, k, wire=np.float32):
    """The rule for one rank's summed gradient `acc` (float32): (chosen indices, values sent,
    residual left). Among equal magnitudes the lower index goes first."""
    chosen = np.argsort(-np.abs(acc), kind="stable")[:k]
    values = acc[chosen].astype(wire)
    left = acc.copy()
    left[chosen] -= values.astype(np.float32)
    return chosen, values, left


def _reference(case, world):
    """The rule in numpy, from every rank's gradients: (outputs, residuals, sent bytes per rank)
    indexed [step][bucket] (residuals [rank][step][bucket])."""
    name, sizes, ratio, steps, kind, dtype, warmup = case
    wire = np.float16 if dtype == "float16" else np.float32
    residual = {}
    outputs = []
    residuals = [[] for _ in range(world)]
    sent = 0
    for step in range(steps):
        outputs.append([])
        for r in range(world):
            residuals[r].append([])
        for i, size in enumerate(sizes):
            grads = [_gradient(kind, r, step, i, size).astype(wire) for r in range(world)]
            if step < warmup:  # plain averaging, no residual
                outputs[-1].append(np.mean(np.stack(grads).astype(np.float64), axis=0))
                for r in range(world):
                    residuals[r][-1].append(None)
                continue
            k = _count(ratio, size)
            total = np.zeros(size, dtype=np.float32)
            for r in range(world):
                acc = grads[r].astype(np.float32) + residual.get((r, i), np.zeros(size, dtype=np.float32))
                chosen, values, left = _send(acc, k, wire)
                total[chosen] += values.astype(np.float32)
                residual[(r, i)] = left
                residuals[r][-1].append(left if size else None)
            if k:
                pad = lambda b: -(-b // 8) * 8  # noqa: E731
                sent += pad(4 * k) + pad(k * np.dtype(wire).itemsize)
            outputs[-1].append((total / np.float32(world)).astype(wire))
    return outputs, residuals, sent


def _check_case(case, reports):
    name, sizes, ratio, steps, kind, dtype, warmup = case
    world = len(reports)
    outputs, residuals, sent = _reference(case, world)
    if kind == "normal":  # "exact selection" needs distinct magnitudes: make sure the data has them
        for step in range(steps):
            for i, size in enumerate(sizes):
                for r in range(world):
                    mags = np.abs(_gradient(kind, r, step, i, size))
                    assert len(np.unique(mags)) == size, (name, r, step, i)
    for r, rep in enumerate(reports):
        got = rep[name]
        assert got["steps_counted"] == steps, (name, r)
        assert got["sent_bytes"] == sent, (name, r, got["sent_bytes"], sent)
        dense = sum(s * (2 if dtype == "float16" else 4) for s in sizes) * (steps - warmup)
        assert got["dense_bytes"] == dense, (name, r)
        for step in range(steps):
            for i in range(len(sizes)):
                mine = np.array(got["outputs"][step][i])
                want = outputs[step][i]
                if step < warmup:  # all_reduce adds in its own order: close, not exact
                    np.testing.assert_allclose(mine, want, rtol=1e-6, atol=1e-6, err_msg=f"{name} r{r} s{step} b{i}")
                    assert got["residuals"][step][i] is None
                    continue
                where = f"{name}, rank {r}, step {step}, bucket {i}"
                np.testing.assert_array_equal(mine, want.astype(np.float64), err_msg=where)
                res_want = residuals[r][step][i]
                res_got = got["residuals"][step][i]
                if res_want is None:
                    assert not res_got, where
                else:
                    np.testing.assert_array_equal(np.array(res_got, dtype=np.float32), res_want, err_msg=where)
        if name == "ratio 1":  # everything is sent: plain averaging, and nothing is left
            for step in range(steps):
                for i in range(len(sizes)):
                    assert not np.any(got["residuals"][step][i]), (r, step, i)
                    np.testing.assert_allclose(got["outputs"][step][i], got["plain"][step][i], rtol=1e-6, atol=1e-7)


def _check_common(reports, bad_ratio_count):
    world = len(reports)
    assert len(reports[0]["refused"]) == bad_ratio_count, reports[0]["refused"]
    assert all("ratio" in e or "warmup_steps" in e for e in reports[0]["refused"])
    # k = 2 of 10 equal values per rank: indices 0 and 1 (ties go to the lower index), average
    # of 1..P there, zeros elsewhere.
    expected = [(world + 1) / 2] * 2 + [0.0] * 8
    for rep in reports:
        assert rep["after_refusals"] == expected, rep["after_refusals"]


@pytest.mark.timeout(60)
def test_topk_hook_matches_numpy_on_ringtree():
    reports = run_world(3, topk_cases, dict(backend="ringtree", cases=CASES, mismatch=True), timeout=55).check_ok()
    for case in CASES:
        _check_case(case, reports)
    _check_common(reports, 10)
    for rep in reports:
        assert rep["mismatch_error"] and "ismatch" in rep["mismatch_error"], rep["mismatch_error"]


@pytest.mark.timeout(60)
def test_topk_hook_matches_numpy_on_gloo():
    reports = run_world(2, topk_cases, dict(backend="gloo", cases=GLOO_CASES), timeout=55).check_ok()
    for case in GLOO_CASES:
        _check_case(case, reports)
    _check_common(reports, 10)


def ddp_with_topk(steps=3, ratio=0.02, hidden=16):
    """DDP with small buckets and topk_hook: each call's input gradient, output and residual,
    with the bucket's parameters as positions in the model."""
    import inspect

    import torch
    import torch.distributed as dist
    import train_ddp
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ringtree.torch as rtt

    r, P = init_group()
    model = train_ddp.make_model(hidden)
    position = {id(p): n for n, p in enumerate(model.parameters())}
    # Per-bucket caps (torch >= 2.10) give two buckets in the first step, which DDP then rebuilds
    # into one: the residual of bucket 0 must not follow its index into the rebuilt bucket.
    small = "bucket_cap_mb_list" in inspect.signature(DDP).parameters
    ddp = DDP(model, **(dict(bucket_cap_mb_list=[0.002] * 4) if small else dict(bucket_cap_mb=0.002)))
    state = rtt.TopKState(ratio=ratio)
    calls = []

    def recording_hook(state, bucket):
        index = bucket.index()
        call = {
            "index": index,
            "params": [position[id(p)] for p in bucket.parameters()],
            "grad": bucket.buffer().tolist(),
        }
        calls.append(call)  # in the order DDP calls the hook, the same on every rank

        def record(fut):
            call.update(out=fut.value().tolist(), residual=state.residuals[index][1].tolist())
            return fut.value()

        return rtt.topk_hook(state, bucket).then(record)

    ddp.register_comm_hook(state, recording_hook)
    train_ddp.train(ddp, steps, 32, 0.1, log=None)
    mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(mine) for _ in range(P)]
    dist.all_gather(everyone, mine, group=dist.new_group(backend="gloo"))  # checked through Gloo
    finish_group()
    return {
        "calls": calls,
        "identical": all(torch.equal(everyone[0], e) for e in everyone),
        "steps_counted": state.step,
        "rebuilds": small,
    }


@pytest.mark.timeout(60)
def test_ddp_with_topk_hook_matches_numpy():
    reports = run_world(2, ddp_with_topk, dict(steps=3, ratio=0.02), timeout=55).check_ok()
    calls = [rep["calls"] for rep in reports]
    assert len(calls[0]) == len(calls[1]) and len(calls[0]) >= 3
    residual = {}
    for n in range(len(calls[0])):
        pair = [calls[r][n] for r in range(2)]
        assert pair[0]["index"] == pair[1]["index"] and pair[0]["params"] == pair[1]["params"]
        size = len(pair[0]["grad"])
        k = _count(0.02, size)
        total = np.zeros(size, dtype=np.float32)
        for r, call in enumerate(pair):
            key = (r, call["index"], tuple(call["params"]))  # a rebuilt bucket starts afresh
            acc = np.array(call["grad"], dtype=np.float32) + residual.get(key, np.float32(0))
            chosen, values, residual[key] = _send(acc, k)
            total[chosen] += values
            np.testing.assert_array_equal(
                np.array(call["residual"], dtype=np.float32), residual[key], err_msg=f"call {n}"
            )
        for call in pair:
            np.testing.assert_array_equal(
                np.array(call["out"], dtype=np.float32), total / np.float32(2), err_msg=f"call {n}"
            )
    for rep in reports:
        assert rep["identical"]
        assert rep["steps_counted"] == 3
        if rep["rebuilds"]:  # bucket 0 held other parameters after the rebuild
            assert len({tuple(c["params"]) for c in rep["calls"] if c["index"] == 0}) == 2
