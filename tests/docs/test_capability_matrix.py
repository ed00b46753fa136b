"""Every cell of the manual's capability matrix (docs/capabilities_page.py) is checked by running
it on 3 ranks: host buffers over shared memory and over TCP between emulated hosts, CUDA buffers
over the CUDA stand-in through the `ipc` and `staged` executors and to the stand-in's fake NCCL
(which sets up and moves no data), and every dtype with every reduce op on each path. The page
must be what the script prints, so a cell that stops being true fails here."""

from __future__ import annotations

import inspect
import os
import sys

import _ringtree_testing as testing
import pytest
import standin
from capability_probe import REDUCED, probe_column, probe_reductions
from harness import run_world
from markdown_examples import REPO

import ringtree as rt

sys.path.insert(0, os.path.join(REPO, "docs"))
try:
    import capabilities_page as page
finally:
    sys.path.pop(0)

ROWS = [name for name, _, _ in page.ROWS]
NCCL_ENV = {**standin.ENV, "RINGTREE_NCCL_LIBRARY": testing.__file__}
# Column: (hosts, environment, CUDA buffers, algo)
WORLDS = {
    "shm": (1, {}, False, None),
    "tcp": (3, {}, False, None),
    "ipc": (1, {**standin.ENV, "RINGTREE_CUDA_IPC": "1"}, True, None),
    "staged": (1, {**standin.ENV, "RINGTREE_CUDA_IPC": "0"}, True, None),
    "nccl": (1, NCCL_ENV, True, "nccl"),
}
# The fake NCCL's answer to a call that reached it.
REACHED_NCCL = "moves no data"


def merged(results: list, key: str) -> str:
    """One outcome of a row over every rank: the first rank's failure, else "ok staged" where
    any rank's host communicator ran it, else "ok"."""
    outcomes = [res[key] for res in results]
    failed = [o for o in outcomes if not o.startswith("ok")]
    if failed:
        return failed[0]
    return "ok staged" if "ok staged" in outcomes else "ok"


def expected(claim: str, column: str):
    """(the outcome a claim stands for, or for a refusal the words it must carry)."""
    if claim.startswith("refused:"):
        return "InvalidArgument", page.REFUSALS[claim.split(":", 1)[1]]
    if claim == "nccl":
        return "Error", REACHED_NCCL
    if claim == "yes":
        assert column in ("shm", "tcp"), column
        return "ok", None
    if claim == "ipc":
        return "ok", None
    return "ok staged", None  # staged, staged-noalgo, host


def check(outcome: str, claim: str, column: str, what: str):
    kind, words = expected(claim, column)
    if words is None:
        assert outcome == kind, f"{what}: the page says {claim!r}, the run gave {outcome!r}"
    else:
        assert outcome.startswith(kind + ":") and words in outcome, (
            f"{what}: the page says {claim!r}, the run gave {outcome!r}"
        )
        assert "(aborted)" not in outcome, f"{what}: the refusal aborted the communicator: {outcome}"


@pytest.fixture(autouse=True, scope="module")
def _standin_built():
    if not standin.available():
        pytest.fail("the test module _ringtree_testing is missing: build with RINGTREE_TESTING=ON (the default)")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("column", [k for k, _, _ in page.COLUMNS])
def test_every_call_does_what_its_cell_says(column):
    hosts, env, device, algo = WORLDS[column]
    args = dict(rows=ROWS, device=device, algo=algo)
    results = run_world(3, probe_column, args, hosts=hosts, env=env, timeout=180).check_ok()
    for name, _, cells in page.ROWS:
        check(merged(results, name), cells[column], column, f"{name} on {column}")
    transports = {t for res in results for t in res["transports"]}
    assert transports == ({"tcp"} if column == "tcp" else {"shm"}), (column, transports)
    executors = {res["executor"] for res in results}
    want = {"ipc": "ipc", "staged": "staged", "nccl": "ipc"}.get(column, "not set up")
    assert all(e.startswith(want) for e in executors), (column, executors)


def test_calls_the_page_says_take_no_algo_have_none():
    no_algo = {"all_to_all_v": ["all_to_all_v"], "send/recv": ["send", "recv"], "sendrecv": ["sendrecv"]}
    for name, _, cells in page.ROWS:
        methods = no_algo.get(name, [name] if hasattr(rt.Communicator, name) else [])
        for method in methods:
            has_algo = "algo" in inspect.signature(getattr(rt.Communicator, method)).parameters
            if cells["nccl"] != "host":  # barrier: no buffers, nothing to hand to NCCL
                assert has_algo == (cells["nccl"] != "staged-noalgo"), (name, method)


def _dtypes(numpy_lacks: bool) -> list:
    every = page.INTEGERS + page.FLOATS + page.COMPLEX
    assert sorted(every) == sorted(rt._core.DTYPES), "the page's dtypes are the core's"
    return [d for d in every if numpy_lacks or d not in page.TORCH_ONLY]


def check_reductions(results, table, dtypes, nccl=False):
    assert tuple(REDUCED) == page.OPS == tuple(rt._core.OPS)
    for dtype in dtypes:
        for op in page.OPS:
            key = f"{dtype} {op}"
            outcome = merged(results, key)
            if op in table[dtype]:
                if nccl:
                    assert outcome.startswith("Error:") and REACHED_NCCL in outcome, (key, outcome)
                else:
                    assert outcome.startswith("ok"), (key, outcome)
            else:
                assert outcome.startswith("InvalidArgument:"), (key, outcome)
                # NCCL's refusal names the op it would reduce with: avg and premul_sum are sums.
                named = "sum" if nccl and op in ("avg", "premul_sum") else op
                assert named in outcome and "(aborted)" not in outcome, (key, outcome)
                # The dtype is named where it is the reason (NCCL has no bitwise op for any).
                assert dtype in outcome or (nccl and op in ("band", "bor", "bxor")), (key, outcome)


@pytest.mark.timeout(200)
def test_every_dtype_and_op_on_the_host():
    dtypes = _dtypes(True)
    args = dict(dtypes=dtypes, ops=list(page.OPS))
    results = run_world(3, probe_reductions, args, timeout=180).check_ok()
    check_reductions(results, page.HOST_OPS, dtypes)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("column", ["ipc", "staged", "nccl"])
def test_every_dtype_and_op_on_cuda_buffers(column):
    _, env, _, algo = WORLDS[column]
    dtypes = _dtypes(False)
    args = dict(dtypes=dtypes, ops=list(page.OPS), device=True, algo=algo)
    results = run_world(3, probe_reductions, args, env=env, timeout=280).check_ok()
    check_reductions(results, page.NCCL_OPS if column == "nccl" else page.HOST_OPS, dtypes, nccl=column == "nccl")


def test_a_wrong_cell_is_caught():
    # The checks fail a claim the run contradicts, in each direction.
    with pytest.raises(AssertionError):
        check("ok staged", "ipc", "ipc", "all_reduce")
    with pytest.raises(AssertionError):
        check("ok", "refused:messages", "ipc", "grouped")
    with pytest.raises(AssertionError):
        check("InvalidArgument: x: messages take host buffers (aborted)", "refused:messages", "ipc", "isend")
    check("InvalidArgument: irecv: messages take host buffers; got ...", "refused:messages", "ipc", "isend")
    assert merged([{"a": "ok"}, {"a": "ok staged"}], "a") == "ok staged"
    assert merged([{"a": "ok"}, {"a": "wrong: [1]"}], "a") == "wrong: [1]"


def test_the_committed_page_is_the_scripts():
    with open(os.path.join(REPO, "docs", "capabilities.md")) as f:
        assert f.read() == page.page(), "docs/capabilities.md is stale: python docs/capabilities_page.py"


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "hosts,algo,want",
    [(1, "ring", "ok"), (1, "tree", "ok"), (1, "oneshot", "ok staged"), (3, None, "ok staged")],
    ids=["ring", "tree", "oneshot", "across-hosts"],
)
def test_what_the_page_says_of_the_ipc_executor(hosts, algo, want):
    # "takes the calls marked IPC kernel with algo ring, tree...; oneshot is staged", and
    # "across hosts CUDA buffers take the staged path".
    _, env, _, _ = WORLDS["ipc"]
    args = dict(rows=["all_reduce", "broadcast"], device=True, algo=algo)
    results = run_world(3, probe_column, args, hosts=hosts, env=env, timeout=180).check_ok()
    for row in ("all_reduce", "broadcast"):
        assert merged(results, row) == want, (row, results)
    executors = {res["executor"] for res in results}
    if hosts > 1:
        assert all(e.startswith("staged:") for e in executors), executors
        assert any("is on another host" in e for e in executors), executors  # the rank that saw why
    else:
        assert executors == {"ipc"}, executors


@pytest.mark.timeout(200)
@pytest.mark.parametrize("column,want", [("ipc", "ok"), ("staged", "ok staged"), ("nccl", "InvalidArgument")])
def test_deterministic_mode_where_the_page_says(column, want):
    # "Deterministic mode is refused by algo='nccl'"; the ipc kernel walks rank_order.
    hosts, env, device, algo = WORLDS[column]
    args = dict(rows=["deterministic"], device=device, algo=algo)
    results = run_world(3, probe_column, args, hosts=hosts, env=env, timeout=180).check_ok()
    outcome = merged(results, "deterministic")
    if want == "InvalidArgument":
        assert outcome.startswith("InvalidArgument:") and "deterministic" in outcome, outcome
        assert "(aborted)" not in outcome, outcome
    else:
        assert outcome == want, outcome


@pytest.mark.timeout(200)
def test_bfloat16_and_float8_cuda_arrays_are_refused_as_the_page_says():
    _, env, _, _ = WORLDS["ipc"]
    args = dict(dtypes=list(page.TORCH_ONLY), ops=["sum"], device=True)
    results = run_world(2, probe_reductions, args, env=env, timeout=180).check_ok()
    for dtype in page.TORCH_ONLY:
        outcome = merged(results, f"{dtype} sum")
        assert outcome.startswith("InvalidArgument:") and "use a torch tensor" in outcome, outcome
