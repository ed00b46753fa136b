"""The later dtypes through the "ringtree" torch.distributed backend: int16, uint16, uint32, uint64,
float8_e4m3fn, float8_e5m2, complex64 and complex128 tensors in all_reduce (every op torch passes
for the dtype), reduce_scatter_tensor, all_gather_into_tensor and broadcast, each against an exact
expectation computed from every rank's input, and against Gloo on the same inputs in the same
processes wherever Gloo takes the dtype. The report also records what Gloo and torch refuse, so the
test states which comparisons ran."""

import zlib

import pytest

pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")

from harness import run_world  # noqa: E402
from torch_group import finish_group, init_group  # noqa: E402

NAMES = ["int16", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "complex64", "complex128"]


def dtypes_vs_expectation_and_gloo(n=37):
    import ml_dtypes
    import numpy as np
    import torch
    import torch.distributed as dist

    r, P = init_group()
    gloo = dist.new_group(backend="gloo")
    report = {"failures": [], "checked": 0, "gloo_compared": [], "gloo_refused": {}, "torch_refused": {}}

    def numpy_of(t):
        """A tensor as numpy (float8 through ml_dtypes), for exact comparison."""
        if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            kind = ml_dtypes.float8_e4m3fn if t.dtype == torch.float8_e4m3fn else ml_dtypes.float8_e5m2
            return t.contiguous().view(torch.uint8).numpy().view(kind).astype(np.float64)
        return t.numpy()

    def inputs(name, case, rank, count):
        """Small integers: float8 in -1..1 (exact partial sums), prod inputs 1, 2 (and -1 signed)."""
        g = np.random.default_rng([zlib.crc32(f"{name}/{case}".encode()), rank])
        if case == "prod":
            v = g.choice([1, 2] if name.startswith("uint") else [1, 2, -1], size=count).astype(np.float64)
        elif name.startswith("float8"):
            v = g.integers(-1, 2, size=count).astype(np.float64)
        else:
            v = g.integers(0 if name.startswith("uint") else -3, 4, size=count).astype(np.float64)
        if name.startswith("complex"):
            v = v + 1j * g.integers(-3, 4, size=count)
        dtype = getattr(torch, name)
        if name.startswith("float8"):
            return torch.from_numpy(v.astype(np.float32)).to(dtype)
        if name.startswith("uint"):
            return torch.from_numpy(v.astype(np.int64).astype(name))
        return torch.from_numpy(v.astype(name if name.startswith("complex") else np.int64)).to(dtype)

    def expect(name, case, count):
        xs = [numpy_of(inputs(name, case, q, count)) for q in range(P)]
        wide = [x.astype(np.complex128 if name.startswith("complex") else np.float64) for x in xs]
        if name.startswith(("int", "uint")):
            wide = [x.astype(np.int64) if name != "uint64" else x.astype(np.uint64) for x in xs]
        op = case.split("/")[0]
        f = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op]
        acc = wide[0]
        for x in wide[1:]:
            acc = f(acc, x)
        if op == "avg":
            if name.startswith(("int", "uint")):
                acc = np.sign(acc) * (np.abs(acc) // P) if name != "uint64" else acc // np.uint64(P)
            else:  # part by part (numpy's complex division multiplies by 1/P)
                acc = acc.real / P + 1j * (acc.imag / P) if name.startswith("complex") else acc / P
        if name.startswith("float8"):
            kind = getattr(ml_dtypes, name)
            return acc.astype(np.float32).astype(kind).astype(np.float64)
        return acc.astype(name)

    def same(got, want, case):
        report["checked"] += 1
        if got.shape != want.shape or not np.array_equal(got, want):
            report["failures"].append(f"rank {r}: {case}: got {got[:6].tolist()}, want {want[:6].tolist()}")

    def against_gloo(name, case, run):
        """run(group) on ringtree was checked; the same on Gloo must agree where Gloo runs it."""
        try:
            theirs = run(gloo)
        except Exception as exc:  # noqa: BLE001 - which dtypes Gloo lacks is part of the report
            report["gloo_refused"].setdefault(name, f"{type(exc).__name__}: {str(exc)[:120]}")
            return
        report["gloo_compared"].append(case)
        same(numpy_of(run(dist.group.WORLD)), numpy_of(theirs), f"{case} vs gloo")

    for name in NAMES:
        dtype = getattr(torch, name)
        ops = ["sum", "avg"] if name.startswith("complex") else ["sum", "prod", "min", "max", "avg"]
        for op in ops:
            torch_op = {"prod": "PRODUCT"}.get(op, op.upper())

            def run(group, name=name, op=op, torch_op=torch_op):
                x = inputs(name, op, r, n)
                dist.all_reduce(x, op=getattr(dist.ReduceOp, torch_op), group=group)
                return x

            try:
                got = run(dist.group.WORLD)
            except Exception as exc:  # noqa: BLE001 - recorded: torch itself may refuse an op for a dtype
                report["torch_refused"][f"{name} {op}"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                continue
            same(numpy_of(got), expect(name, op, n), f"all_reduce {op} {name}")
            if op != "avg":  # Gloo has no avg
                against_gloo(name, f"all_reduce {op} {name}", run)

        def reduce_scatter(group, name=name):
            out = torch.zeros(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, inputs(name, "sum/rs", r, n * P), group=group)
            return out

        try:
            got = reduce_scatter(dist.group.WORLD)
            same(numpy_of(got), expect(name, "sum/rs", n * P)[r * n : (r + 1) * n], f"reduce_scatter {name}")
        except Exception as exc:  # noqa: BLE001 - recorded
            report["torch_refused"][f"{name} reduce_scatter"] = f"{type(exc).__name__}: {str(exc)[:160]}"

        def all_gather(group, name=name):
            out = torch.zeros(n * P, dtype=dtype)
            dist.all_gather_into_tensor(out, inputs(name, "gather", r, n), group=group)
            return out

        want = np.concatenate([numpy_of(inputs(name, "gather", q, n)) for q in range(P)])
        same(numpy_of(all_gather(dist.group.WORLD)), want, f"all_gather {name}")
        against_gloo(name, f"all_gather {name}", all_gather)

        def broadcast(group, name=name):
            x = inputs(name, "bcast", r, n)
            dist.broadcast(x, src=P - 1, group=group)
            return x

        same(numpy_of(broadcast(dist.group.WORLD)), numpy_of(inputs(name, "bcast", P - 1, n)), f"broadcast {name}")
        against_gloo(name, f"broadcast {name}", broadcast)
    finish_group()
    return report


@pytest.mark.timeout(150)
def test_new_dtypes_through_the_torch_backend():
    reports = run_world(3, dtypes_vs_expectation_and_gloo, timeout=140).check_ok()
    for rank, res in enumerate(reports):
        assert not res["failures"], (rank, res["failures"])
        # Every dtype's reductions ran here: torch refuses nothing it hands a backend for these dtypes.
        assert not res["torch_refused"], (rank, res["torch_refused"])
        assert res["checked"] >= 8 * 5, res
    print("\ncompared with Gloo:", len(reports[0]["gloo_compared"]), "cases; Gloo refused:", reports[0]["gloo_refused"])
    assert reports[0]["gloo_compared"], "Gloo took none of the new dtypes"
