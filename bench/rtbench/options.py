"""Command line of the bench driver: nccl-tests flags plus ringtree's own.

nccl-tests meanings are kept where a flag exists there (-b -e -f -i -n -w -c -o -d
-r -a -J -T), so a user can paste an nccl-tests command line and get the same sweep.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field

from . import load

COLLECTIVES = (
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "all_to_all",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "sendrecv",
)
REDUCE_OPS = ("sum", "prod", "min", "max", "avg")
ALGOS = ("ring", "tree", "direct", "oneshot", "hier", "hier_tree", "rank_order", "auto")
PEERS = ("mpi", "gloo", "nccl", "memcpy", "raw", "rawbuf")

# Canonical dtype names are numpy's; nccl-tests spellings are accepted on input.
DTYPES = (
    "int8",
    "uint8",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "int16",
    "uint16",
    "uint32",
    "uint64",
    "float8_e4m3fn",
    "float8_e5m2",
    "complex64",
    "complex128",
)
DTYPE_ALIASES = {
    "half": "float16",
    "fp16": "float16",
    "bf16": "bfloat16",
    "float": "float32",
    "fp32": "float32",
    "double": "float64",
    "fp64": "float64",
    "fp8_e4m3": "float8_e4m3fn",
    "f8e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "f8e5m2": "float8_e5m2",
}

# -a as in nccl-tests: how the per-rank average iteration times become one number.
AVERAGE_MODES = {0: "rank0", 1: "avg", 2: "min", 3: "max"}

_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmg]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'8' -> 8, '1K' -> 1024, '64M' -> 67108864, '1.5k' -> 1536 (binary units as nccl-tests)."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(f"invalid size {text!r}: expected a number with an optional K, M or G suffix")
    number, unit = match.groups()
    return int(float(number) * _SIZE_UNITS[unit.lower()])


def calls_per_batch(
    size: int,
    iters: int,
    batch_bytes: int = 0,
    max_iters: int = 0,
    batch_seconds: float = 0.0,
    call_seconds: float = 0.0,
) -> int:
    """Timed calls in one batch at `size` bytes: `iters`, raised towards batch_bytes / size (at
    most max_iters, and at most batch_seconds of calls that took call_seconds each in the warm-up)
    when batch_bytes is set. A batch starts right after a barrier; ten 8-byte calls are 10-40 us,
    which times how the ranks leave the barrier more than the call. The time bound keeps a
    library whose small calls cost a millisecond (Gloo at P=4) from running minutes per launch."""
    if batch_bytes <= 0:
        return iters
    calls = min(max_iters, batch_bytes // max(size, 1))
    if batch_seconds > 0 and call_seconds > 0:
        calls = min(calls, int(batch_seconds / call_seconds))
    return max(iters, calls)


def batch_rule(iters: int, batch_bytes: int = 0, max_iters: int = 0, batch_seconds: float = 0.0) -> str:
    """calls_per_batch in words, for reports and the performance page."""
    if batch_bytes <= 0:
        return f"{iters} calls"
    mib = f"{batch_bytes >> 20} MiB" if batch_bytes % (1 << 20) == 0 else f"{batch_bytes} B"
    bound = f", {batch_seconds * 1e3:g} ms / warm-up call" if batch_seconds > 0 else ""
    return f"max({iters}, min({max_iters}, {mib} / size{bound})) calls"


def size_list(min_bytes: int, max_bytes: int, factor: float = 1, step: int = 0) -> list[int]:
    """Sizes from min_bytes to max_bytes inclusive: times factor when factor > 1, else plus step."""
    if min_bytes < 0 or max_bytes < min_bytes:
        raise ValueError(f"need 0 <= minbytes <= maxbytes, got {min_bytes} and {max_bytes}")
    if factor <= 1 and step <= 0:
        raise ValueError("need a step factor > 1 (-f) or a step increment > 0 (-i)")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        if factor > 1:
            if size == 0:  # 0 * factor never grows; the next size nccl-tests would reach is 1
                size = 1
            else:
                size = int(size * factor) if int(size * factor) > size else size + 1
        else:
            size += step
    return sizes


def _split_names(
    text: str, known: tuple[str, ...], what: str, aliases: dict | None = None, normalize=lambda s: s
) -> list[str]:
    """'a,b' -> ['a','b'] checked against known; 'all' -> every known name, order kept."""
    names = []
    for raw in str(text).split(","):
        name = normalize(raw.strip().lower())
        if not name:
            continue
        if name == "all":
            return list(known)
        name = (aliases or {}).get(name, name)
        if name not in known:
            raise ValueError(f"unknown {what} {raw.strip()!r}; choose from {', '.join(known)} or all")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError(f"no {what} given")
    return names


def _normalize_collective(name: str) -> str:
    # Accept allreduce / all-reduce / all_reduce / send_recv alike.
    compact = name.replace("_", "").replace("-", "")
    for known in COLLECTIVES:
        if known.replace("_", "") == compact:
            return known
    return name


@dataclass
class Options:
    sizes: list[int]
    min_bytes: int
    max_bytes: int
    step_factor: float
    step_bytes: int
    iters: int
    warmup: int
    check: bool
    ops: list[str]
    dtypes: list[str]
    root: int
    average: int
    json_path: str | None
    timeout: float | None
    algos: list[str]
    collectives: list[str]
    peers: list[str]
    plot_path: str | None
    device: str
    if_gpu: bool
    progress: bool
    inject_error: bool = False
    trace_dir: str | None = None
    background_load: int = 0
    persistent: bool = False
    group: int = 0
    coalesced: bool = False
    extra: dict = field(default_factory=dict)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rt_bench.py",
        description="ringtree collectives benchmark, nccl-tests compatible. Start it with "
        "`python -m ringtree.launch -n P`, `mpiexec -n P` or `torchrun --nproc-per-node P`.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    # nccl-tests defaults: one 32 MiB size, 20 timed iterations after 5 warm-up ones.
    p.add_argument("-b", "--minbytes", default="32M", help="smallest size (K/M/G suffixes)")
    p.add_argument("-e", "--maxbytes", default="32M", help="largest size (K/M/G suffixes)")
    p.add_argument("-f", "--stepfactor", type=float, default=None, help="multiply the size by this factor at each step")
    p.add_argument(
        "-i", "--stepbytes", default=None, help="add this many bytes at each step (default 1M when -f is not given)"
    )
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="untimed iterations per size")
    p.add_argument(
        "-c",
        "--check",
        type=int,
        default=1,
        choices=(0, 1),
        help="check every result against the exactly predictable expected values",
    )
    p.add_argument("-o", "--op", default="sum", help="reduction: sum, prod, min, max, avg or all")
    p.add_argument(
        "-d",
        "--datatype",
        default="float32",
        help="int8, uint8, int32, int64, float16, bfloat16, float32, float64, int16, uint16, uint32, uint64, "
        "float8_e4m3fn, float8_e5m2, complex64, complex128 (nccl-tests names half/float/double/f8e4m3/f8e5m2 "
        "too), comma list, or all",
    )
    p.add_argument("-r", "--root", type=int, default=0, help="root of rooted collectives")
    p.add_argument(
        "-a",
        "--average",
        type=int,
        default=3,
        choices=sorted(AVERAGE_MODES),
        help="combine the ranks' times: 0 rank 0's, 1 average, 2 minimum, "
        "3 maximum (the slowest rank; nccl-tests' default is 1)",
    )
    p.add_argument("-J", "--json", default=None, metavar="FILE", help="also write results as JSON")
    p.add_argument(
        "-T",
        "--timeout",
        type=float,
        default=None,
        help="seconds before a ringtree collective raises Timeout (default: RINGTREE_TIMEOUT)",
    )
    p.add_argument(
        "--algo",
        default="auto",
        help="ringtree algorithm: ring, tree, direct, oneshot, hier, hier_tree, rank_order, auto, comma list, or all "
        "(hier needs ranks on several hosts to differ from flat: launch with --hosts H)",
    )
    p.add_argument(
        "--collective", default="all_reduce", help="collective(s): " + ", ".join(COLLECTIVES) + ", comma list, or all"
    )
    p.add_argument(
        "--vs", default="", help="peers measured side by side: mpi, gloo, nccl, memcpy, raw, rawbuf (comma list)"
    )
    p.add_argument("--plot", default=None, metavar="FILE.png", help="write busbw vs size plots")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where buffers live")
    p.add_argument(
        "--if-gpu",
        action="store_true",
        help="with --device cuda: where no GPU is usable, say why and exit 0 instead of 2",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress on rank 0's stderr")
    p.add_argument(
        "--trace",
        default=None,
        metavar="DIR",
        help="each rank writes its timeline of ringtree's calls (the last RINGTREE_FLIGHT_RECORDER) "
        "to DIR at the end; merge: python -m ringtree.analyze DIR --trace all.json",
    )
    p.add_argument(
        "--background-load",
        default="0",
        metavar="N",
        help="start N CPU-burning processes beside the job (from rank 0) for its duration",
    )
    p.add_argument(
        "--persistent",
        action="store_true",
        help="time ringtree's persistent calls (comm.all_reduce_init() ... then start()) instead of plain ones",
    )
    p.add_argument(
        "--group",
        type=int,
        default=0,
        metavar="N",
        help="time N of each ringtree call issued inside one comm.group() (each row's time is the group's); "
        "with --persistent, a persistent group of them, started",
    )
    p.add_argument(
        "--coalesced",
        action="store_true",
        help="with --group N, issue the N calls as one list call (comm.all_reduce_coalesced, "
        "all_gather_coalesced, reduce_scatter_coalesced) instead of N calls inside comm.group()",
    )
    # Test hook: corrupts one ringtree result element so tests can prove #wrong catches it.
    p.add_argument("--inject-error", action="store_true", help=argparse.SUPPRESS)
    return p


def parse_args(argv=None) -> Options:
    """Parse and validate; raises SystemExit (argparse) with a message on bad input."""
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        min_bytes, max_bytes = parse_size(a.minbytes), parse_size(a.maxbytes)
        if a.stepfactor is not None and a.stepbytes is not None:
            raise ValueError("give either -f (step factor) or -i (step increment), not both")
        factor = a.stepfactor if a.stepfactor is not None else 1
        step = parse_size(a.stepbytes) if a.stepbytes is not None else (0 if factor > 1 else 1 << 20)
        if a.stepfactor is not None and a.stepfactor <= 1:
            raise ValueError(f"-f must be > 1, got {a.stepfactor}")
        sizes = size_list(min_bytes, max_bytes, factor, step)
        if a.iters < 1:
            raise ValueError(f"-n must be >= 1, got {a.iters}")
        if a.warmup_iters < 0:
            raise ValueError(f"-w must be >= 0, got {a.warmup_iters}")
        if a.root < 0:
            raise ValueError(f"-r must be >= 0, got {a.root}")
        if a.group < 0:
            raise ValueError(f"--group takes N >= 1, got {a.group}")
        if a.coalesced and (a.group < 1 or a.persistent):
            raise ValueError("--coalesced needs --group N (the list's length) and no --persistent")
        ops = _split_names(a.op, REDUCE_OPS, "op")
        dtypes = _split_names(a.datatype, DTYPES, "datatype", DTYPE_ALIASES)
        algos = _split_names(a.algo, ALGOS, "algorithm")
        collectives = _split_names(a.collective, COLLECTIVES, "collective", normalize=_normalize_collective)
        peers = _split_names(a.vs, PEERS, "peer") if a.vs.strip() else []
        background_load = load.check_count(a.background_load)
    except ValueError as exc:
        parser.error(str(exc))
    return Options(
        sizes=sizes,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        step_factor=factor,
        step_bytes=step,
        iters=a.iters,
        warmup=a.warmup_iters,
        check=bool(a.check),
        ops=ops,
        dtypes=dtypes,
        root=a.root,
        average=a.average,
        json_path=a.json,
        timeout=a.timeout,
        algos=algos,
        collectives=collectives,
        peers=peers,
        plot_path=a.plot,
        device=a.device,
        if_gpu=a.if_gpu,
        progress=not a.no_progress,
        inject_error=a.inject_error,
        trace_dir=a.trace,
        background_load=background_load,
        persistent=a.persistent,
        group=a.group,
        coalesced=a.coalesced,
    )
