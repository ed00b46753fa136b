"""What a group of small all_reduces costs against one plain call, interleaved in one run.

    python -m ringtree.launch -n 2 bench/group_cost.py --calls 64 --rounds 30

Per round, in the same processes and on the same buffers: a block of plain
`comm.all_reduce(x)` calls, a block of groups (`with comm.group():` then `calls` all_reduces),
a block of the same group as one list call (`comm.all_reduce_coalesced(xs)`), and a block of
starts of one persistent group of `calls` all_reduces; 8-byte float32 buffers.
Each block's time per call (per group) is rank 0's; the table gives the medians over the rounds
and each against the plain call. With the test module (_ringtree_testing) installed, the same
comparison through the C++ entry (group_start, the calls, group_end, and run_coalesced with the
same calls as one list) follows, timed in C++. The
ranks either spin or sleep while they wait for each other, depending on the machine's load,
and a plain call's time changes several-fold between the two: compare figures of one run only.
Every result is checked: the values stay integers (rank r holds r + 1; max over the ranks).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import ringtree as rt


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=64, help="all_reduces in a group")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--reps", type=int, default=20, help="calls (groups) per block")
    args = p.parse_args(argv)
    comm = rt.init()
    r, P = comm.rank, comm.size
    x = np.full(2, r + 1, np.float32)
    xs = [np.full(2, r + 1, np.float32) for _ in range(args.calls)]
    with comm.group(persistent=True) as persistent:
        for g in xs:
            comm.all_reduce(g, op="max")
    start = persistent.request.start

    def plain():
        comm.all_reduce(x, op="max")

    def group():
        with comm.group():
            for g in xs:
                comm.all_reduce(g, op="max")

    def coalesced():
        comm.all_reduce_coalesced(xs, op="max")

    times = {
        "plain call": [],
        f"group of {args.calls}": [],
        f"coalesced list of {args.calls}": [],
        f"persistent group of {args.calls}": [],
    }
    for _ in range(args.rounds):
        for name, body in zip(times, (plain, group, coalesced, start)):
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(args.reps):
                body()
            times[name].append((time.perf_counter() - t0) / args.reps * 1e6)
    wrong = sum(int(np.count_nonzero(a != P)) for a in [x, *xs])
    cpp = None
    try:
        import _ringtree_testing
    except ImportError:
        _ringtree_testing = None
    if _ringtree_testing is not None and "RINGTREE_UNIQUE_ID" in os.environ:
        comm.barrier()
        cpp = _ringtree_testing.bench_group(
            r, P, os.environ["RINGTREE_UNIQUE_ID"], calls=args.calls, count=2, blocks=args.rounds, reps=args.reps
        )
    comm.close()
    if r == 0:
        base = statistics.median(times["plain call"])
        print(f"# P={P}, 8-byte float32 all_reduces, medians of {args.rounds} interleaved rounds (rank 0)")
        for name, values in times.items():
            m = statistics.median(values)
            print(f"{name:>28}: {m:9.2f} us  {m / base:6.2f}x")
        if cpp is not None:
            print(f"{'C++ plain call':>28}: {cpp[0]:9.2f} us  {1.0:6.2f}x")
            print(f"{f'C++ group of {args.calls}':>28}: {cpp[1]:9.2f} us  {cpp[1] / cpp[0]:6.2f}x")
            print(f"{f'C++ list of {args.calls}':>28}: {cpp[2]:9.2f} us  {cpp[2] / cpp[0]:6.2f}x")
        print(f"# wrong elements: {wrong}")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
