"""The manual's capability matrix: which call runs on which buffers, over which path.

    python docs/capabilities_page.py > docs/capabilities.md

The cells below are claims, and tests/docs/test_capability_matrix.py checks every one by running
it: each row on 3 ranks for each column (host buffers over shared memory and over TCP; CUDA
buffers over the CUDA stand-in through the `ipc` and `staged` executors and to a fake NCCL), and
each dtype and reduce op on every path. A cell that stops being true fails that test, and the
committed page must be what this script prints, so the page cannot drift from the code.
"""

from __future__ import annotations

import sys

# Columns: (key, heading, what checks it).
COLUMNS = (
    ("shm", "host, one host (shm)", "run here on 3 ranks sharing memory, in every test run"),
    ("tcp", "host, across hosts (TCP)", "run here on 3 emulated hosts, every pair over TCP, in every test run"),
    (
        "ipc",
        "CUDA, one host (`ipc`)",
        "run here over the CUDA stand-in (the executors' host code and the device kernels compiled "
        "for the CPU, 3 processes), in every test run; on a GPU once, 2 and 4 processes sharing one "
        "H100 under MPS, every collective against numpy with no wrong element",
    ),
    (
        "staged",
        "CUDA, `staged`",
        "run here over the CUDA stand-in with `RINGTREE_CUDA_IPC=0` (3 processes), in every test run; "
        "on a GPU once, 2 processes on one host and between two emulated hosts",
    ),
    (
        "nccl",
        'CUDA, `algo="nccl"`',
        "checked here against a fake NCCL that sets up as NCCL does and moves no data; on a GPU once, "
        "one rank (float32, int32, float16 against numpy) and NCCL's refusal of two ranks on one GPU, "
        "raised on both",
    ),
)

# What a cell says, and how it reads on the page.
CELL_TEXT = {
    "yes": "yes",
    "ipc": "yes: IPC kernel",
    "staged": "yes: staged",
    "staged-noalgo": "yes: staged (no `algo`)",
    "nccl": "yes: NCCL",
    "host": "host call",
}
# Refusals: InvalidArgument before any traffic, with these words (the footnotes quote them).
REFUSALS = {
    "messages": "messages take host buffers",
}

HOST = {"shm": "yes", "tcp": "yes"}
IPC_KERNEL = {**HOST, "ipc": "ipc", "staged": "staged", "nccl": "nccl"}
THROUGH_HOST = {**HOST, "ipc": "staged", "staged": "staged", "nccl": "staged-noalgo"}

# (row, the call it stands for, cells by column)
ROWS = (
    ("all_reduce", "`all_reduce`", IPC_KERNEL),
    ("reduce_scatter", "`reduce_scatter`", IPC_KERNEL),
    ("all_gather", "`all_gather`", IPC_KERNEL),
    ("all_to_all", "`all_to_all`", IPC_KERNEL),
    ("all_to_all_v", "`all_to_all_v`", THROUGH_HOST),
    ("broadcast", "`broadcast`", IPC_KERNEL),
    ("reduce", "`reduce`", IPC_KERNEL),
    ("gather", "`gather`", IPC_KERNEL),
    ("scatter", "`scatter`", IPC_KERNEL),
    ("barrier", "`barrier`", {**HOST, "ipc": "host", "staged": "host", "nccl": "host"}),
    ("send/recv", "`send`, `recv`", THROUGH_HOST),
    ("sendrecv", "`sendrecv`", THROUGH_HOST),
    (
        "isend/irecv",
        "`isend`, `irecv`",
        {**HOST, "ipc": "refused:messages", "staged": "refused:messages", "nccl": "refused:messages"},
    ),
    (
        "grouped",
        "grouped: `with comm.group():`",
        IPC_KERNEL,
    ),
    (
        "persistent",
        "persistent: `all_reduce_init`",
        IPC_KERNEL,
    ),
    (
        "coalesced",
        "coalesced: `all_reduce_coalesced`",
        IPC_KERNEL,
    ),
)

OPS = ("sum", "prod", "min", "max", "avg", "premul_sum", "band", "bor", "bxor")
_ARITH = frozenset(OPS[:6])
_ALL = frozenset(OPS)
_SUMS = frozenset({"sum", "avg", "premul_sum"})
# The reduce ops each dtype takes: on the host (shared memory, TCP) and the CUDA executors that
# walk ringtree's schedules (`ipc`, `staged`), and with algo="nccl". Data movement (all_gather,
# broadcast, ...) takes every dtype everywhere.
INTEGERS = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
FLOATS = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2")
COMPLEX = ("complex64", "complex128")
HOST_OPS = {
    **{d: _ALL for d in INTEGERS},
    **{d: _ARITH for d in FLOATS},
    **{d: frozenset(_ARITH - {"min", "max"}) for d in COMPLEX},
}
NCCL_OPS = {
    **{d: _ARITH for d in INTEGERS if d not in ("int16", "uint16")},
    "int16": frozenset(),
    "uint16": frozenset(),
    **{d: _ARITH for d in ("float16", "bfloat16", "float32", "float64")},
    # NCCL reduces float8 from 2.24 on; with an older NCCL the call is refused, saying so.
    "float8_e4m3fn": _ARITH,
    "float8_e5m2": _ARITH,
    **{d: _SUMS for d in COMPLEX},
}
# Dtypes numpy lacks: on the host they come as torch CPU tensors or ml_dtypes arrays (checked
# with the latter); on CUDA as torch tensors only, which need torch on a GPU to check.
TORCH_ONLY = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def cell(claim: str) -> str:
    if claim.startswith("refused:"):
        key = claim.split(":", 1)[1]
        return f"no [{list(REFUSALS).index(key) + 1}]"
    return CELL_TEXT[claim]


def ops_text(ops) -> str:
    if ops == _ALL:
        return "all"
    if ops == _ARITH:
        return "all but band, bor, bxor"
    if not ops:
        return "none (data movement only)"
    return ", ".join(o for o in OPS if o in ops)


def page() -> str:
    lines = [
        "# Capability matrix",
        "",
        "<!-- Generated by docs/capabilities_page.py; edit the script, not this page. -->",
        "",
        "Which call runs on which buffers, and how: host buffers (numpy arrays, torch CPU tensors)",
        "over shared memory within a host and TCP between hosts, and CUDA buffers (torch CUDA",
        "tensors, cupy and anything with `__cuda_array_interface__`) through the executors of the",
        "[GPU page](gpu.md#executors). The tests run every cell of both tables (but bfloat16 and",
        "float8 on CUDA buffers, as said below) and fail when one stops being true; the last lines",
        "say how far each column has been run.",
        "",
        "- **yes: IPC kernel**: each rank's schedule is walked by a kernel over CUDA IPC mailboxes.",
        "- **yes: staged**: the device data are copied to pinned host memory on the caller's stream",
        "  and the host communicator runs the call (shared memory or TCP, as for host buffers).",
        "- **yes: NCCL**: the call is handed to NCCL, loaded at run time.",
        "- **host call**: no buffers; the host communicator runs it whatever the other calls' buffers.",
        "- **no [n]**: `InvalidArgument` before any traffic; the communicator stays usable.",
        "",
    ]
    heads = [h for _, h, _ in COLUMNS]
    lines += ["| call | " + " | ".join(heads) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for _, call, cells in ROWS:
        lines.append(f"| {call} | " + " | ".join(cell(cells[k]) for k, _, _ in COLUMNS) + " |")
    lines.append("")
    for i, words in enumerate(REFUSALS.values(), 1):
        lines.append(f'{i}. `InvalidArgument`: "... {words} ..."')
    lines += [
        "",
        "Calls without an `algo` argument (all_to_all_v, send, recv, sendrecv) cannot ask for NCCL;",
        "on CUDA buffers they take the `staged` path. The `ipc` executor needs every rank on one host",
        "(across hosts CUDA buffers take the `staged` path) and takes the calls marked IPC kernel with",
        '`algo` auto, ring, tree, direct or rank_order; `algo="oneshot"` is staged. The algorithms',
        "each collective has are listed in [Choosing an algorithm](choosing.md).",
        "",
        "## Dtypes and reduce ops",
        "",
        "Reductions (all_reduce, reduce_scatter, reduce) take these ops per dtype; a pair left out",
        "is refused with `InvalidArgument` before any traffic, naming the op (and the dtype, where",
        "the dtype is the reason: NCCL has no bitwise op for any dtype). Every",
        "other call moves bytes and takes every dtype on every path.",
        "",
        '| dtype | host, `ipc`, `staged` | `algo="nccl"` |',
        "|---|---|---|",
    ]
    for dtype in INTEGERS + FLOATS + COMPLEX:
        mark = " *" if dtype in TORCH_ONLY else ""
        lines.append(f"| `{dtype}`{mark} | {ops_text(HOST_OPS[dtype])} | {ops_text(NCCL_OPS[dtype])} |")
    lines += [
        "",
        "`avg` and `premul_sum` are sums with a scaling before or after, on every path; NCCL takes",
        "complex sums as pairs of reals, and reduces float8 from NCCL 2.24 on (an older NCCL refuses",
        "the call, saying so).",
        "",
        "\\* numpy has no such dtype: on the host, pass torch CPU tensors or `ml_dtypes` arrays (the",
        "tests use the latter); on CUDA, torch tensors only (an array offering",
        "`__cuda_array_interface__` cannot say it holds bfloat16 or float8, and is refused with",
        "`InvalidArgument`). Those CUDA cells need torch on a GPU and are not checked here.",
        "",
        "A floating-point reduction in deterministic mode",
        '(`deterministic=True`) is refused by `algo="nccl"`, which has no fixed reduction order;',
        "the IPC kernel and the staged path walk `rank_order`.",
        "",
        "## How far each column has run",
        "",
    ]
    for _, head, checked in COLUMNS:
        lines.append(f"- **{head}**: {checked}.")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(page())
