#!/usr/bin/env python3
"""Median tables over several rt_bench -J files of one configuration (e.g. the netns_launch runs
in bench/results/netns_tcp_*.json): all_reduce time per size for each ringtree algorithm (in
place, as Gloo runs) and each peer, the median over the files, then ringtree's flat ring against the
raw-socket ring (raw time / ring time, 1.00 = as fast as bare sockets) and against Gloo
(Gloo time / ring time, > 1 = ringtree faster), each ratio taken within a run and then the
median over runs, so a slow moment of the machine hits both sides of a ratio alike.

  python bench/netns_tables.py bench/results/netns_tcp_2x1_run*_after.json
"""
from __future__ import annotations

import json
import statistics
import sys


def cell_seconds(row, name):
    cells = row["cells"].get(name, {})
    cell = cells.get("ip") or cells.get("oop")
    return cell.get("seconds") if cell else None


def table(paths) -> str:
    runs = []
    for p in paths:
        with open(p) as f:
            rows = [r for r in json.load(f)["results"] if r["collective"] == "all_reduce"]
        runs.append({r["size"]: r for r in rows})
    sizes = sorted(set.intersection(*(set(r) for r in runs)))
    algos = sorted({c for run in runs for r in run.values() for c in r["cells"] if c.startswith("ringtree:")})
    peers = [p for p in ("raw", "rawbuf", "gloo") if any(p in r["cells"] for run in runs for r in run.values())]
    names = algos + peers
    head = ["size"] + [n.split(":")[-1] + " us" for n in names] + ["ring vs raw", "ring vs rawbuf", "ring vs gloo"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]

    def med(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    for s in sizes:
        times = {n: med(cell_seconds(run[s], n) for run in runs) for n in names}

        def ratio(num, den_best):
            out = []
            for run in runs:
                best = cell_seconds(run[s], "ringtree:ring")
                other = cell_seconds(run[s], num)
                if best and other:
                    out.append(other / best if den_best else best / other)
            return med(out)
        cols = [f"{s} B" if s < 1024 else f"{s // 1024} KiB" if s < 1 << 20 else f"{s >> 20} MiB"]
        cols += [f"{times[n] * 1e6:.0f}" if times[n] else "-" for n in names]
        for num in ("raw", "rawbuf"):
            r = ratio(num, True)
            cols.append(f"{r:.2f}" if r else "-")
        g = ratio("gloo", True)
        cols.append(f"{g:.2f}x" if g else "-")
        lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print(f"{len(sys.argv) - 1} runs: " + ", ".join(sys.argv[1:]))
    print(table(sys.argv[1:]))
