"""How long a communicator takes to form: set-up time, from the ranks' own clocks.

    python -m ringtree.launch -n 4 bench/setup_time.py --reps 10
    mpiexec -n 4 python bench/setup_time.py --reps 10

The world forms first (rt.init); then, `reps` times, rank 0 makes a fresh unique id, the world
hands it to every rank, the ranks meet in a barrier and each builds a communicator from it
(rendezvous, the authenticated mesh, shared memory, the cost model's figures, clock offsets)
and closes it. A repetition's time is the slowest rank's; rank 0 prints one JSON line with
every repetition's time and their median, in milliseconds. Launch it several times and quote
the median of the launches' medians: process start-up is not in these figures, the machine's
noise is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import ringtree as rt

TOKEN_BYTES = 96


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=10, help="communicators to build, one after another")
    args = p.parse_args(argv)
    world = rt.init()
    token = np.zeros(TOKEN_BYTES, np.uint8)
    mine = np.zeros(1, np.float64)
    slowest = np.zeros(1, np.float64)
    times_ms = []
    for _ in range(args.reps):
        token[:] = 0
        if world.rank == 0:
            raw = str(rt.UniqueId.create()).encode()
            token[: len(raw)] = np.frombuffer(raw, np.uint8)
        world.broadcast(token, root=0)
        world.barrier()
        start = time.perf_counter()
        comm = rt.Communicator(world.rank, world.size, token.tobytes().rstrip(b"\0").decode(), 60.0)
        mine[0] = time.perf_counter() - start
        comm.close()
        world.all_reduce(mine, slowest, op="max")
        times_ms.append(round(float(slowest[0]) * 1e3, 3))
    if world.rank == 0:
        print(json.dumps({"ranks": world.size, "median_ms": statistics.median(times_ms), "times_ms": times_ms}))
    world.close()


if __name__ == "__main__":
    main()
