"""rt.explain: why algo="auto" picks what it picks, in the cost model's own numbers."""

from __future__ import annotations

import sys

from . import _core

_FLOAT_REDUCTIONS = ("all_reduce", "reduce_scatter", "reduce")
# Every dtype that is not an integer: deterministic mode orders their reductions.
_FLOATS = ("float32", "float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "complex64", "complex128")


def _split(formula: str, seconds: float):
    """(latency, data) seconds of a formula that ends '= call + hops + data us'."""
    try:
        terms = formula.rsplit(" = ", 1)[1].split(" + ")
        call, data = float(terms[0]) * 1e-6, float(terms[-1].split()[0]) * 1e-6
    except (IndexError, ValueError):
        return None
    return seconds - call - data, data


def _hier_verdict(chosen: str, hier, flat) -> str:
    """Why auto does or does not take the best hierarchical candidate, in the model's two terms:
    latency (hops on the critical path) and data (the busiest rank's bytes, those across hosts at
    the link's pace)."""
    (h, ht, hf), (f, ft, ff) = hier, flat
    hs, fs = _split(hf, ht), _split(ff, ft)
    why = ""
    if hs and fs:
        why = (
            f": latency {hs[0] * 1e6:.1f} vs {fs[0] * 1e6:.1f} us, data {hs[1] * 1e6:.1f} vs {fs[1] * 1e6:.1f} us "
            f"({h} vs {f})"
        )
    if chosen.startswith("hier"):
        return f"hierarchical {h} wins by {(ft - ht) / ft:.0%}{why}"
    margin = "within 1% of" if ht >= ft * 0.99 else f"{(ht - ft) / ft:.0%} more than"
    return f"flat {chosen} stays: {h} would take {ht * 1e6:.1f} us, {margin} {f}{why}"


def _deterministic_lines(comm, collective, nbytes, dtype, chosen, auto_times) -> list:
    """What deterministic mode (RINGTREE_DETERMINISTIC=1 or deterministic=True) would run, and its
    predicted cost against auto's choice."""
    det = sorted(comm.estimate(collective, nbytes, dtype, deterministic=True), key=lambda e: e[1])
    if not det:
        return []
    pick = comm.choose_algo(collective, nbytes, "auto", dtype, deterministic=True)
    lines = ["  deterministic mode (RINGTREE_DETERMINISTIC=1 or deterministic=True): reduces in rank order"]
    for algo, seconds, formula in det:
        mark = "*" if algo == pick else " "
        lines.append(f"{mark} {algo:9s} {seconds * 1e6:9.1f} us   {formula}")
    t = dict((a, s) for a, s, _ in det)[pick]
    base = auto_times.get(chosen)
    if base:
        lines.append(f"  deterministic mode chooses {pick}: {t * 1e6:.1f} us, {t / base:.2f}x auto's {chosen}")
    return lines


def explain(collective: str, nbytes: int, comm=None, dtype: str = "float32", file=sys.stdout) -> str:
    """Print (and return) every candidate algorithm's predicted time for a call of
    `collective` on this communicator, the formula behind each, and the choice: across hosts, why
    hierarchical wins or not; for a floating-point reduction, what deterministic mode would run
    (rank_order or oneshot) and its cost against auto's choice.

    Parameters
    ----------
    collective : str
        The collective's name ("all_reduce", ...).
    nbytes : int
        One rank's block (count x itemsize), as for Communicator.choose_algo.
    comm : Communicator
        The communicator the call would run on (required).
    dtype : str
        The element type's name.
    file : io.TextIOBase or None
        Where to print the report; None prints nothing.

    Returns
    -------
    str
        The report.

    Raises
    ------
    InvalidArgument
        No communicator, or an unknown collective or dtype.
    """
    if comm is None:
        raise _core.InvalidArgument("explain needs the communicator the call would run on: explain(..., comm=comm)")
    status = comm.status()
    m = status.machine
    chosen = comm.choose_algo(collective, nbytes, "auto", dtype)
    where = "one host" if not m["any_tcp"] else "several hosts (TCP between them)"
    lines = [
        f"ringtree explain: {collective}, {int(nbytes)} bytes per rank ({dtype}), {comm.size} ranks on {where}, "
        f"{int(m['local_ranks'])} ranks on {int(m['cores'])} cores here",
        f"  machine ({m['source']}): call {m['call_us']:.2f} us, hop {m['hop_us']:.2f} us, "
        f"switch {m['switch_us']:.2f} us, copy {m['copy_hot_GBps']:.1f}/{m['copy_cold_GBps']:.1f} GB/s, "
        f"reduce {m['reduce_hot_GBps']:.1f}/{m['reduce_cold_GBps']:.1f} GB/s (in cache/from memory)",
        f"  hosts: {m['hosts']}; between hosts: hop {m['tcp_hop_us']:.1f} us, {m['tcp_GBps']:.2f} GB/s "
        f"(RINGTREE_TCP_HOP_US, RINGTREE_TCP_MBPS)",
        f"  single-copy transfers on this host: {status.single_copy}",
        f"  NUMA: {status.numa}; ranks' nodes {list(status.numa_nodes)}",
        f"  shared-memory stores: {status.shm_stores}",
        f"  waiting: {status.wait_policy}",
        f"  {'algo':9s} {'predicted':>12s}   formula",
    ]
    estimates = sorted(comm.estimate(collective, nbytes, dtype), key=lambda e: e[1])
    for algo, seconds, formula in estimates:
        mark = "*" if algo == chosen else " "
        lines.append(f"{mark} {algo:9s} {seconds * 1e6:9.1f} us   {formula}")
    hier = [e for e in estimates if e[0].startswith("hier")]
    flat = [e for e in estimates if not e[0].startswith("hier")]
    if hier and flat:
        lines.append(f"  hierarchical vs flat: {_hier_verdict(chosen, hier[0], flat[0])}")
    elif not hier and m["hosts"].startswith("1 host"):
        lines.append("  hierarchical: not a candidate, every rank is on one host")
    if status.algo_hook:
        lines.append(f"  auto chooses {chosen} (the algorithm hook's choice; Communicator.set_algo_hook)")
    else:
        lines.append(f"  auto chooses {chosen}")
        asks_from, asks_below = status.broadcast_asks_root
        if collective == "broadcast" and asks_from <= nbytes < asks_below and chosen in ("tree", "ring"):
            lines.append(
                f"  but first asks the root: where it holds the buffer mostly on huge pages, direct runs "
                f"(every receiver reads the root's buffer single-copy; ranks outnumber cores, broadcasts of "
                f"{asks_from} bytes and more, below {asks_below})"
            )
    if collective in _FLOAT_REDUCTIONS and dtype in _FLOATS:
        lines += _deterministic_lines(comm, collective, nbytes, dtype, chosen, dict((a, t) for a, t, _ in estimates))
    text = "\n".join(lines)
    if file is not None:
        print(text, file=file)
    return text
