"""Bench driver: busbw arithmetic, buffer shapes, expected values, #wrong counting.

The expected results are checked against a numpy model of each collective run on
the generated inputs of every rank, and the exactness claims (any reduction order
gives the same bits) against reductions done in the dtype itself, in several orders.
"""

import numpy as np
import pytest

from rtbench import collectives as colls
from rtbench import verify

try:  # bfloat16 is covered where ml_dtypes is installed
    import ml_dtypes  # noqa: F401

    DTYPES = list(verify.EXACT_CAP)
except ImportError:
    DTYPES = [d for d in verify.EXACT_CAP if d != "bfloat16"]

RANKS = (1, 2, 3, 4, 7, 8)


# ------------------------------------------------------------------ busbw


@pytest.mark.parametrize(
    "name,nranks,factor",
    [
        ("all_reduce", 1, 0.0),
        ("all_reduce", 2, 1.0),
        ("all_reduce", 4, 1.5),
        ("all_reduce", 8, 1.75),
        ("reduce_scatter", 4, 0.75),
        ("all_gather", 4, 0.75),
        ("all_to_all", 2, 0.5),
        ("gather", 8, 0.875),
        ("scatter", 4, 0.75),
        ("broadcast", 4, 1.0),
        ("reduce", 4, 1.0),
        ("sendrecv", 4, 1.0),
    ],
)
def test_busbw_factor(name, nranks, factor):
    assert colls.get(name).busbw_factor(nranks) == pytest.approx(factor)


def test_bandwidths_gb_is_1e9_bytes():
    algbw, busbw = colls.bandwidths(2_000_000_000, 2.0, 1.5)
    assert algbw == pytest.approx(1.0) and busbw == pytest.approx(1.5)
    assert colls.bandwidths(1024, 0.0, 1.0) == (0.0, 0.0)


@pytest.mark.parametrize(
    "name,nbytes,nranks,count,size",
    [
        ("all_reduce", 1024, 4, 256, 1024),
        ("reduce_scatter", 1024, 4, 64, 1024),  # count is the per-rank block
        ("all_gather", 1000, 3, 83, 996),  # rounded down to whole blocks
        ("all_to_all", 8, 4, 0, 0),  # smaller than one element per block
        ("broadcast", 6, 2, 1, 4),
        ("gather", 64, 2, 8, 64),
        ("scatter", 64, 2, 8, 64),
        ("sendrecv", 64, 8, 16, 64),
    ],
)
def test_counts_and_sizes_float32(name, nbytes, nranks, count, size):
    c = colls.get(name)
    n = c.count_for_bytes(nbytes, 4, nranks)
    assert n == count
    assert c.size_bytes(n, 4, nranks) == size


def test_inplace_views_follow_nccl_aliasing():
    buf = np.arange(12)
    inp, out = colls.get("reduce_scatter").inplace_views(buf, 3, 4, 2)
    assert inp.size == 12 and list(out) == [6, 7, 8] and np.shares_memory(inp, out)
    inp, out = colls.get("all_gather").inplace_views(buf, 3, 4, 1)
    assert list(inp) == [3, 4, 5] and out.size == 12
    inp, out = colls.get("all_reduce").inplace_views(buf, 5, 4, 3)
    assert inp.size == 5 and inp is not None and np.shares_memory(inp, out)


# ------------------------------------------------------------------ expected values


def model(coll, inputs, nranks, n, root, op, dtype_name):
    """Outputs of each rank, by definition of the collective (exact int64 arithmetic; complex128
    for complex dtypes, whose parts hold small integers)."""
    cplx = verify.np_dtype(dtype_name).kind == "c"
    ints = [x.astype(np.complex128 if cplx else np.int64) for x in inputs]
    combine = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}

    def reduced():
        acc = ints[0].copy()
        for x in ints[1:]:
            acc = combine[op](acc, x)
        if op == "avg":
            return acc / nranks if cplx else acc // nranks
        return acc

    outs = []
    for r in range(nranks):
        name = coll.name
        if name == "all_reduce" or (name == "reduce" and r == root):
            o = reduced()
        elif name == "reduce_scatter":
            o = reduced()[r * n : (r + 1) * n]
        elif name == "all_gather" or (name == "gather" and r == root):
            o = np.concatenate(ints)
        elif name == "all_to_all":
            o = np.concatenate([ints[b][r * n : (r + 1) * n] for b in range(nranks)])
        elif name == "broadcast":
            o = ints[root]
        elif name == "scatter":
            o = ints[root][r * n : (r + 1) * n]
        elif name == "sendrecv":
            o = ints[(r - 1) % nranks]
        else:
            o = None
        outs.append(None if o is None else o.astype(verify.np_dtype(dtype_name)))
    return outs


@pytest.mark.parametrize("name", sorted(colls.COLLECTIVE_SPECS))
@pytest.mark.parametrize("nranks", RANKS)
def test_expected_matches_model(name, nranks):
    coll = colls.get(name)
    n, root = 13, nranks - 1  # 13: not a multiple of any P here
    for dtype_name in DTYPES:
        for op in verify.REDUCTION_KINDS if coll.reduction else [None]:
            inputs = [verify.make_input(coll, r, n, nranks, op, dtype_name) for r in range(nranks)]
            outs = model(coll, inputs, nranks, n, root, op, dtype_name)
            for r in range(nranks):
                exp = verify.make_expected(coll, r, n, nranks, root, op, dtype_name)
                if outs[r] is None:
                    assert exp is None
                else:
                    assert verify.count_wrong(exp, outs[r]) == 0, (dtype_name, op, r)


def test_copy_values_differ_between_ranks_and_blocks():
    a = verify.input_values("copy", 0, np.arange(64), 4, "int8")
    b = verify.input_values("copy", 1, np.arange(64), 4, "int8")
    assert np.count_nonzero(a != b) == 64
    assert len(set(a.tolist())) > 16


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
@pytest.mark.parametrize("nranks", RANKS + (16, 64))
def test_reductions_exact_in_the_dtype_in_any_order(dtype_name, op, nranks):
    """Reduce in the dtype itself (as a ring or tree does, chunk by chunk): every order
    must give the expected bits, or #wrong would flag correct implementations."""
    dt = verify.np_dtype(dtype_name)
    idx = np.arange(257)
    inputs = [verify.input_values(op, r, idx, nranks, dtype_name).astype(dt) for r in range(nranks)]
    expected = verify.reduce_over_ranks(op, idx, nranks, dtype_name).astype(dt)
    combine = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op]
    rng = np.random.default_rng(nranks)
    for order in [list(range(nranks)), list(range(nranks))[::-1], list(rng.permutation(nranks))]:
        with np.errstate(over="raise"):
            acc = inputs[order[0]].copy()
            for r in order[1:]:
                acc = combine(acc, inputs[r]).astype(dt)
        assert verify.count_wrong(acc, expected) == 0
    # Pairwise (tree) order too.
    level = list(inputs)
    while len(level) > 1:
        level = [
            combine(level[i], level[i + 1]).astype(dt) if i + 1 < len(level) else level[i]
            for i in range(0, len(level), 2)
        ]
    assert verify.count_wrong(level[0], expected) == 0


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("nranks", RANKS)
def test_avg_exact_for_ints_and_within_tolerance_for_premultiplied_floats(dtype_name, nranks):
    dt = verify.np_dtype(dtype_name)
    idx = np.arange(300)
    inputs = [verify.input_values("avg", r, idx, nranks, dtype_name) for r in range(nranks)]
    expected = verify.reduce_over_ranks("avg", idx, nranks, dtype_name).astype(dt)
    total = np.sum(inputs, axis=0)
    assert np.all(total == nranks * verify.avg_base(idx, nranks, dtype_name))
    tol = verify.tolerance("avg", dtype_name, nranks)
    if verify.is_float(dtype_name):
        # NCCL-style: multiply each input by 1/P in the dtype, then add in the dtype.
        scale = dt.type(1.0 / nranks)
        acc = (inputs[0].astype(dt) * scale).astype(dt)
        for x in inputs[1:]:
            acc = (acc + (x.astype(dt) * scale).astype(dt)).astype(dt)
        assert verify.count_wrong(acc, expected, tol) == 0
        assert tol > 0
    else:
        assert tol == 0
        assert verify.count_wrong((total // nranks).astype(dt), expected) == 0


# ------------------------------------------------------------------ #wrong


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_count_wrong_catches_a_corrupted_element(dtype_name):
    coll = colls.get("all_reduce")
    for op in verify.REDUCTION_KINDS:
        exp = verify.make_expected(coll, 0, 100, 4, 0, op, dtype_name)
        got = exp.copy()
        tol = verify.tolerance(op, dtype_name, 4)
        assert verify.count_wrong(got, exp, tol) == 0
        assert verify.corrupt(got, exp)
        assert verify.count_wrong(got, exp, tol) == 1, (dtype_name, op)
        # 3 more: a different value in every dtype here, float8's coarse spacing included
        got[50:51] = (np.real(exp[50:51]).astype(np.float32) + 3).astype(got.dtype)
        assert verify.count_wrong(got, exp, tol) == 2


def test_count_wrong_nan_and_sentinel():
    exp = np.arange(8, dtype=np.float32)
    got = exp.copy()
    got[3] = np.nan
    assert verify.count_wrong(got, exp) == 1
    got[...] = verify.sentinel("float32")  # an output that was never written
    assert verify.count_wrong(got, exp) == 8
    assert verify.count_wrong(np.zeros(0, np.int8), np.zeros(0, np.int8)) == 0
    with pytest.raises(ValueError):
        verify.count_wrong(np.zeros(3), np.zeros(4))


def test_unchecked_outputs_on_non_roots():
    assert verify.make_expected(colls.get("reduce"), 1, 4, 2, 0, "sum", "float32") is None
    assert verify.make_expected(colls.get("gather"), 0, 4, 2, 1, None, "float32") is None
    assert verify.corrupt(np.zeros(4), None) is False
