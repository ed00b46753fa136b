#!/usr/bin/env python3
"""The cost model's choice beside measured times, re-read from saved bench runs: for each
`--algo all` table in the runs (rt_bench output, the same command repeated), the median measured
time of every explicit algorithm, the choice this build's model makes (rank 0's estimate()), and
auto/best = the median measured time of that choice over the best median (the best among auto's candidates;
a miss where auto's schedule is identical to the best one's is marked: it is noise). Lets a change to the
model be judged against measurements taken once, before it is measured again.

    mpiexec -n 2 python bench/model_choices.py bench/results/p2-run{1,2,3}.txt --collective all_reduce,broadcast
"""
import argparse
import re
import statistics

import ringtree as rt
from ringtree import _core

SEGMENT = 128 << 10  # RINGTREE_TREE_SEGMENT_BYTES' default: the pipelined schedules' segment


def same_schedule(coll, a, b, P, count):
    """Whether algorithms a and b build the same schedule for every rank (at P=2 a broadcast's
    chain and binary tree, say): their measured difference is then noise, not a choice."""
    if "oneshot" in (a, b):
        return a == b
    c, seg = _core.COLLECTIVES.index(coll), SEGMENT // 4
    return all(_core.schedule(c, _core.ALGOS.index(a), P, r, count, 0, seg) ==
               _core.schedule(c, _core.ALGOS.index(b), P, r, count, 0, seg) for r in range(P))

TABLE = re.compile(r"^# Table: collective=(\w+) impl=ringtree:(\w+) ranks=(\d+)")


def measured(paths, colls, ranks):
    """{coll: {size: {algo: [oop or ip us per run]}}} from the runs' explicit-algorithm tables."""
    out = {}
    for path in paths:
        coll = None
        for line in open(path):
            m = TABLE.match(line)
            if m:
                coll, algo = (m.group(1), m.group(2)) if m.group(1) in colls and int(m.group(3)) == ranks else (None, None)
                continue
            if coll is None or algo == "auto" or line.startswith("#") or not line.strip():
                continue
            f = line.split()
            cell = f[9] if coll == "broadcast" else f[5]  # the bench's convention: broadcast in place
            if not f[0].isdigit() or cell == "n/a":  # oneshot past its slots' capacity
                continue
            time, size = float(cell), int(f[0])
            out.setdefault(coll, {}).setdefault(size, {}).setdefault(algo, []).append(time)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--collective", default="all_reduce,broadcast")
    args = p.parse_args()
    comm = rt.init()
    colls = args.collective.split(",")
    data = measured(args.runs, colls, comm.size)
    lines = []
    for coll in colls:
        hits = total = same = 0
        lines.append(f"# {coll}, P={comm.size}: median of {len(args.runs)} runs (us); auto = this build's choice")
        for size in sorted(data.get(coll, {})):
            count = size // 4 if coll not in ("reduce_scatter", "all_gather", "all_to_all") else size // 4 // comm.size
            auto = comm.choose_algo(coll, count * 4, "auto", "float32")
            pred = {a: t * 1e6 for a, t, _ in comm.estimate(coll, count * 4, "float32")}
            # auto's candidates only: on one host hier and hier_tree run their intra-host phases
            # alone (the same schedules as ring and tree), which auto does not weigh there
            meds = {a: statistics.median(v) for a, v in data[coll][size].items() if a in pred}
            best = min(meds, key=meds.get)
            ratio = meds.get(auto, float("nan")) / meds[best]
            twin = ratio > 1.10 and same_schedule(coll, auto, best, comm.size, count)
            total += 1
            hits += ratio <= 1.10
            same += twin
            cells = "  ".join(f"{a} {meds[a]:9.1f}/{pred.get(a, float('nan')):9.1f}" for a in sorted(meds))
            lines.append(f"{size:>10d}  {cells}  best {best:8s} auto {auto:8s} {ratio:5.2f}"
                         + ("  (same schedule as best)" if twin else ""))
        lines.append(f"# {coll}: auto within 10% of the best median at {hits} of {total} sizes"
                     + (f"; {same} more where auto's schedule is the best's (noise)" if same else ""))
    if comm.rank == 0:
        print("\n".join(lines))
    comm.close()


if __name__ == "__main__":
    main()
