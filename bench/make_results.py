#!/usr/bin/env python3
"""Markdown summary tables from rt_bench.py output (used to write bench/RESULTS.md).

  python bench/make_results.py bench/results/p2-openmpi.txt [--every 2]
  python bench/make_results.py --median run1.txt run2.txt run3.txt   # repeated runs, one table

For each collective: one row per size with ringtree (algo=auto, out-of-place where it
exists, else in place), the fastest explicit algorithm at that size, and every peer's
time, busbw and ratio (ringtree busbw / peer busbw, > 1: ringtree faster). With --median,
the files are repeats of one command: times are the median over the runs, and each ratio is
the median of the per-run ratios (each one ringtree against a peer measured in the same run).
"""
import argparse
import statistics

from rtbench.collectives import get as get_collective
from rtbench.report import parse_tables


def human_size(n):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}iB"
    return f"{n} B"


def fmt(x, digits=3):
    if not isinstance(x, (int, float)):
        return str(x)
    if x == 0:
        return "0"
    return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:.0f}"


def measured(x):
    return isinstance(x, (int, float))


def busbw(size, time_us, factor):
    """GB/s from the time, with more digits than the 2 decimals of the table."""
    return size / (time_us * 1e-6) / 1e9 * factor if measured(time_us) and time_us > 0 else "n/a"


def rt_cell(row):
    """(time, placement) of ringtree: out-of-place when measured, else in place."""
    for p in ("oop", "ip"):
        if measured(row[f"{p}_time"]):
            return row[f"{p}_time"], p
    return "n/a", "-"


def summarize(tables, every):
    by_coll = {}
    for t in tables:
        by_coll.setdefault(t["meta"]["collective"], []).append(t)
    out = []
    for coll, group in by_coll.items():
        auto = next((t for t in group if t["meta"]["impl"] == "ringtree:auto"), group[-1])
        explicit = [t for t in group if t is not auto]
        peers = auto["meta"]["peers"]
        factor = get_collective(coll).busbw_factor(int(auto["meta"]["ranks"]))
        head = ["size", "ringtree time (us)", "busbw (GB/s)", "fastest algo"]
        for p in peers:
            head += [f"{p} time (us)", f"{p} busbw", f"rt/{p}"] if p != "memcpy" else ["memcpy busbw"]
        out.append(f"#### {coll} (ranks={auto['meta']['ranks']})\n")
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        for i, row in enumerate(auto["rows"]):
            if i % every and i != len(auto["rows"]) - 1:
                continue
            t, _ = rt_cell(row)
            best, best_time = "-", None
            for tab in explicit:
                ot, _ = rt_cell(tab["rows"][i])
                if measured(ot) and (best_time is None or ot < best_time):
                    best, best_time = tab["meta"]["impl"].split(":")[1], ot
            size = row["size"]
            cells = [human_size(size), fmt(t), fmt(busbw(size, t, factor)), best]
            for p in peers:
                if p == "memcpy":
                    cells.append(fmt(busbw(size, row[f"{p}_time"], 1.0)))
                else:
                    ratio = row[f"{p}_ratio"]
                    cells += [fmt(row[f"{p}_time"]), fmt(busbw(size, row[f"{p}_time"], factor)),
                              f"**{fmt(ratio, 2)}**" if isinstance(ratio, float) and ratio >= 1 else fmt(ratio, 2)]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def median_of_runs(runs):
    """One list of tables from repeated runs: every numeric field is the median over the runs
    (ratios too: each is a same-run comparison, so their median is one as well)."""
    merged = []
    for tables in zip(*runs):
        keys = {(t["meta"]["collective"], t["meta"]["impl"]) for t in tables}
        if len(keys) != 1 or len({len(t["rows"]) for t in tables}) != 1:
            raise SystemExit("--median: the runs differ in tables or sizes; give repeats of one command")
        rows = []
        for row_set in zip(*(t["rows"] for t in tables)):
            row = dict(row_set[0])
            for key, value in row.items():
                values = [r[key] for r in row_set]
                if key not in ("size", "count") and all(measured(v) for v in values):
                    row[key] = statistics.median(values)
            rows.append(row)
        merged.append({"meta": tables[0]["meta"], "rows": rows})
    return merged


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--every", type=int, default=1, help="keep every k-th size (and the last)")
    ap.add_argument("--median", action="store_true", help="the files are repeats: one table of medians")
    args = ap.parse_args()
    if args.median:
        runs = []
        for path in args.files:
            with open(path) as fh:
                runs.append(parse_tables(fh.read()))
        print(summarize(median_of_runs(runs), args.every))
        return
    for path in args.files:
        with open(path) as fh:
            print(summarize(parse_tables(fh.read()), args.every))


if __name__ == "__main__":
    main()
