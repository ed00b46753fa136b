"""ringtree.moe between real rank processes, against a single-process reference.

Every rank generates every rank's tokens, routing and output gradient from seeds, runs the
distributed dispatch -> experts -> combine -> backward on its own share, and compares it with
`reference`, a plain loop over all ranks' assignments (no ringtree, no sorting) that applies the
drop rule by counting, runs the same Linear experts on the rows each expert keeps, and lets
autograd compute every gradient. Both run in float64, so only summation order differs."""

from __future__ import annotations

import math

import pytest
from harness import run_world

pytest.importorskip("torch")

H = 6
KS = (1, 2, 4)
FACTORS = (0.5, 1.0, 1.25, None)
ROUTINGS = ("balanced", "unbalanced")
HOT_EXPERT = 1  # where the unbalanced routing sends 85% of first choices


def tokens_of(rank, case):
    return 9 + 4 * rank + case % 3  # T differs between ranks, so does each rank's capacity


def make_inputs(rank, case, k, E, routing):
    """(tokens, expert_ids, expert_weights, output gradient) of `rank` in `case`, from seeds."""
    import torch

    g = torch.Generator().manual_seed(1000 * case + rank)
    T = tokens_of(rank, case)
    tokens = torch.randn(T, H, generator=g, dtype=torch.float64)
    ids = torch.randint(0, E, (T, k), generator=g)  # a token may pick one expert twice
    if routing == "unbalanced":
        ids[torch.rand(T, generator=g) < 0.85, 0] = HOT_EXPERT
    weights = torch.softmax(torch.randn(T, k, generator=g, dtype=torch.float64), dim=1)
    grad = torch.randn(T, H, generator=g, dtype=torch.float64)
    return tokens, ids, weights, grad


def make_experts(E):
    import torch

    experts = []
    for e in range(E):
        torch.manual_seed(50_000 + e)
        experts.append(torch.nn.Linear(H, H, dtype=torch.float64))
    return experts


def reference(inputs, E, factor):
    """Outputs, gradients and drop counts for every rank's inputs at once, one assignment at a time."""
    import torch

    experts = make_experts(E)
    leaves = [(x.clone().requires_grad_(), w.clone().requires_grad_()) for x, _, w, _ in inputs]
    rows = [[] for _ in range(E)]  # per expert: (rank, token, slot) in source rank, then token order
    dropped = []
    for r, (_x, ids, _w, _) in enumerate(inputs):
        T, k = ids.shape
        capacity = math.inf if factor is None else math.ceil(factor * T * k / E)
        taken, lost = [0] * E, [0] * E
        for t in range(T):
            for j in range(k):
                e = int(ids[t, j])
                if taken[e] < capacity:
                    taken[e] += 1
                    rows[e].append((r, t, j))
                else:
                    lost[e] += 1
        dropped.append(lost)
    expert_in = [
        torch.stack([leaves[r][0][t] for r, t, _ in rows[e]]) if rows[e] else torch.zeros(0, H, dtype=torch.float64)
        for e in range(E)
    ]
    expert_out = [experts[e](expert_in[e]) for e in range(E)]
    contributions = [[] for _ in inputs]
    for e in range(E):
        for i, (r, t, j) in enumerate(rows[e]):
            contributions[r].append((t, leaves[r][1][t, j] * expert_out[e][i]))
    outputs = []
    for r, (x, _, _, _) in enumerate(inputs):
        out = torch.zeros_like(x)
        if contributions[r]:
            ts = torch.tensor([t for t, _ in contributions[r]])
            out = out.index_add(0, ts, torch.stack([c for _, c in contributions[r]]))
        outputs.append(out)
    sum((out * inputs[r][3]).sum() for r, out in enumerate(outputs)).backward()
    return dict(
        outputs=[o.detach() for o in outputs],
        expert_in=[x.detach() for x in expert_in],
        grad_tokens=[x.grad for x, _ in leaves],
        grad_weights=[w.grad for _, w in leaves],
        experts=experts,
        dropped=dropped,
        kept=[len(rows[e]) for e in range(E)],
    )


def run_case(comm, case, k, E, factor, routing):
    """One dispatch/combine/backward on this rank; the list of what differs from the reference."""
    import torch

    import ringtree.moe as moe

    P, r = comm.size, comm.rank
    inputs = [make_inputs(q, case, k, E, routing) for q in range(P)]
    want = reference(inputs, E, factor)
    tokens, ids, weights, grad = inputs[r]
    tokens, weights = tokens.clone().requires_grad_(), weights.clone().requires_grad_()
    experts = make_experts(E)
    expert_inputs, handle = moe.dispatch(tokens, ids, weights, E, capacity_factor=factor, comm=comm, global_stats=True)
    chunks = expert_inputs.split(handle.expert_counts)
    out = moe.combine(torch.cat([experts[e](x) for e, x in zip(handle.local_experts, chunks)]), handle)
    (out * grad).sum().backward()

    tag = f"case {case} k={k} E={E} factor={factor} {routing}"
    wrong = []

    def close(name, got, expected):
        if got is None or expected is None:  # an expert no row reached: None on one side, zeros on the other
            got, expected = (
                torch.zeros_like(got if expected is None else expected) if v is None else v for v in (got, expected)
            )
        if got.shape != expected.shape or not torch.allclose(got, expected, rtol=1e-12, atol=1e-12):
            wrong.append(f"{tag}: {name} differs: {got.tolist()} vs {expected.tolist()}")

    for e, x in zip(handle.local_experts, chunks):
        if not torch.equal(x, want["expert_in"][e]):  # the rows themselves, in the documented order
            wrong.append(f"{tag}: expert {e}'s inputs differ")
        close(f"expert {e} weight grad", experts[e].weight.grad, want["experts"][e].weight.grad)
        close(f"expert {e} bias grad", experts[e].bias.grad, want["experts"][e].bias.grad)
    close("output", out.detach(), want["outputs"][r])
    close("token grad", tokens.grad, want["grad_tokens"][r])
    close("weight grad", weights.grad, want["grad_weights"][r])
    s = handle.stats
    global_dropped = [sum(d[e] for d in want["dropped"]) for e in range(E)]
    counts = dict(
        dropped=(s.dropped.tolist(), want["dropped"][r]),
        kept=((s.kept + s.dropped).tolist(), torch.bincount(ids.reshape(-1), minlength=E).tolist()),
        global_dropped=(s.global_dropped.tolist(), global_dropped),
        global_kept=(s.global_kept.tolist(), want["kept"]),
        expert_kept=(s.expert_kept.tolist(), [want["kept"][e] for e in handle.local_experts]),
        expert_dropped=(s.expert_dropped.tolist(), [global_dropped[e] for e in handle.local_experts]),
    )
    for name, (got, expected) in counts.items():
        if got != expected:
            wrong.append(f"{tag}: {name} {got} != {expected}")
    return wrong, sum(global_dropped)


def sweep():
    import torch

    import ringtree as rt

    torch.set_num_threads(1)  # ranks share two cores
    comm = rt.init(timeout=30)
    P = comm.size
    wrong, dropped_by_routing, case = [], {}, 0
    for routing in ROUTINGS:
        for k in KS:
            for factor in FACTORS:
                # E = 2P: two experts per rank (expert-major reordering); E = P every third case.
                E = P if case % 3 == 2 else 2 * P
                bad, dropped = run_case(comm, case, k, E, factor, routing)
                wrong += bad
                dropped_by_routing[f"{routing} {factor}"] = dropped_by_routing.get(f"{routing} {factor}", 0) + dropped
                case += 1
    comm.close()
    return dict(wrong=wrong, cases=case, dropped=dropped_by_routing)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("nranks", [2, 4])
def test_dispatch_combine_against_reference(nranks):
    results = run_world(nranks, sweep, timeout=80).check_ok()
    for r, res in enumerate(results):
        assert res["cases"] == len(KS) * len(FACTORS) * len(ROUTINGS)
        assert res["wrong"] == [], f"rank {r}:\n" + "\n".join(res["wrong"][:10])
    dropped = results[0]["dropped"]
    # The sweep must exercise the drop rule: the hot expert overflows at every finite factor,
    # and nothing drops without a capacity.
    assert all(dropped[f"unbalanced {f}"] > 0 for f in FACTORS if f is not None), dropped
    assert dropped["balanced None"] == dropped["unbalanced None"] == 0, dropped


def errors():
    """Bad input raises on its own rank before traffic; disagreements raise on every rank."""
    import torch
    import torch.distributed as dist

    import ringtree as rt
    import ringtree.moe as moe
    import ringtree.torch as rtt

    torch.set_num_threads(1)
    report = {}
    x, ids, w = torch.randn(5, H), torch.zeros(5, 2, dtype=torch.long), torch.ones(5, 2)
    try:
        moe.dispatch(x, ids, w, 4)
        report["no_comm"] = "no error"
    except rt.InvalidArgument as exc:
        report["no_comm"] = "ok" if "comm=" in str(exc) else str(exc)

    rtt.init_process_group()
    comm = dist.group.WORLD.comm
    r, P = comm.rank, comm.size

    def usable():
        """A correct dispatch/combine on every rank (the default comm: the torch group's)."""
        tokens = torch.randn(3 + r, H)
        inputs, handle = moe.dispatch(
            tokens, torch.arange(3 + r).remainder(2 * P)[:, None], torch.ones(3 + r, 1), 2 * P, capacity_factor=None
        )
        return bool(torch.equal(moe.combine(inputs, handle), tokens))

    bad_calls = {
        "weights_shape": lambda: moe.dispatch(x, ids, w[:, :1], 4, comm=comm),
        "ids_rows": lambda: moe.dispatch(x, ids[:4], w[:4], 4, comm=comm),
        "ids_range": lambda: moe.dispatch(x, ids + 4, w, 4, comm=comm),
        "ids_negative": lambda: moe.dispatch(x, ids - 1, w, 4, comm=comm),
        "ids_float": lambda: moe.dispatch(x, ids.double(), w, 4, comm=comm),
        "k_zero": lambda: moe.dispatch(x, ids[:, :0], w[:, :0], 4, comm=comm),
        "tokens_1d": lambda: moe.dispatch(x[0], ids, w, 4, comm=comm),
        "tokens_int": lambda: moe.dispatch(x.long(), ids, w, 4, comm=comm),
        "not_divisible": lambda: moe.dispatch(x, ids, w, 2 * P + 1, comm=comm),
        "negative_capacity": lambda: moe.dispatch(x, ids, w, 4, capacity_factor=-0.5, comm=comm),
        "nan_capacity": lambda: moe.dispatch(x, ids, w, 4, capacity_factor=float("nan"), comm=comm),
    }
    for name, call in bad_calls.items():
        if r == 1:  # only rank 1 errs; rank 0 must not be left waiting for traffic
            try:
                call()
                report[name] = "no error"
            except ValueError as exc:  # InvalidArgument is a ValueError
                report[name] = "ok" if isinstance(exc, rt.InvalidArgument) else repr(exc)
        report[f"{name}_usable"] = usable()

    inputs, handle = moe.dispatch(x, ids, w, 2 * P, capacity_factor=None, comm=comm)
    if r == 1:
        for name, bad in (("combine_shape", inputs[:, :-1]), ("combine_dtype", inputs.double())):
            try:
                moe.combine(bad, handle)
                report[name] = "no error"
            except rt.InvalidArgument:
                report[name] = "ok"
    report["combine_after_bad"] = bool(torch.allclose(moe.combine(inputs, handle), x * 2))

    # Disagreements the count exchange catches: on every rank, and the communicator stays usable.
    for name, tokens in (
        ("H", torch.randn(5, H + r)),
        ("dtype", torch.randn(5, H, dtype=torch.float64 if r else torch.float32)),
    ):
        try:
            moe.dispatch(tokens, ids, w, 2 * P, comm=comm)
            report[f"mismatch_{name}"] = "no error"
        except rt.InvalidArgument as exc:
            report[f"mismatch_{name}"] = "ok" if "disagree" in str(exc) else str(exc)
        report[f"mismatch_{name}_usable"] = usable()
    # num_experts changes the count exchange's size: ringtree's fingerprint catches that (it aborts
    # the communicator, as after any mismatch), so this goes last.
    try:
        moe.dispatch(x, ids, w, 2 * P * (1 + r), comm=comm)
        comm.barrier()
        report["mismatch_E"] = "no error"
    except rt.CollectiveMismatch as exc:
        report["mismatch_E"] = "ok" if any("num_experts" in n for n in getattr(exc, "__notes__", [])) else str(exc)
    except rt.Error as exc:
        report["mismatch_E"] = f"{type(exc).__name__}: {exc}"
    return report


@pytest.mark.timeout(60)
def test_bad_input_and_disagreements():
    results = run_world(2, errors, timeout=50).check_ok()
    for r, res in enumerate(results):
        bad = {name: value for name, value in res.items() if value not in ("ok", True)}
        assert bad == {}, f"rank {r}: {bad}"
    assert "weights_shape" in results[1] and "weights_shape" not in results[0]
    assert "mismatch_E" in results[0] and "mismatch_E" in results[1]
