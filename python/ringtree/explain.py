"""rt.explain: why algo="auto" picks what it picks, in the cost model's own numbers."""
from __future__ import annotations

import sys

from . import _core


def explain(collective: str, nbytes: int, comm=None, dtype: str = "float32", file=sys.stdout) -> str:
    """Prints (and returns) every candidate algorithm's predicted time for a call of
    `collective` on this communicator, the formula behind each, and the choice.

    nbytes is one rank's block (count x itemsize), as for Communicator.choose_algo.
    """
    if comm is None:
        raise _core.InvalidArgument("explain needs the communicator the call would run on: explain(..., comm=comm)")
    m = comm.machine_costs()
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
        f"  single-copy transfers on this host: {comm.single_copy}",
        f"  {'algo':9s} {'predicted':>12s}   formula",
    ]
    estimates = sorted(comm.estimate(collective, nbytes, dtype), key=lambda e: e[1])
    for algo, seconds, formula in estimates:
        mark = "*" if algo == chosen else " "
        lines.append(f"{mark} {algo:9s} {seconds * 1e6:9.1f} us   {formula}")
    hier = [(a, t) for a, t, _ in estimates if a.startswith("hier")]
    flat = [(a, t) for a, t, _ in estimates if not a.startswith("hier")]
    if hier and flat:
        (h, ht), (f, ft) = hier[0], flat[0]
        verdict = (f"hierarchical {h} wins by {(ft - ht) / ft:.0%}" if chosen.startswith("hier")
                   else f"flat {chosen} stays: {h} would take {ht * 1e6:.1f} us, "
                        f"{'within 1% of' if ht >= ft * 0.99 else f'{(ht - ft) / ft:.0%} more than'} {f}")
        lines.append(f"  hierarchical vs flat: {verdict}")
    elif not hier and m["hosts"].startswith("1 host"):
        lines.append("  hierarchical: not a candidate, every rank is on one host")
    lines.append(f"  auto chooses {chosen}")
    text = "\n".join(lines)
    if file is not None:
        print(text, file=file)
    return text
