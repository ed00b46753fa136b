"""Time all_reduce when the scheduler puts ranks on shared cores (a busy machine's placements).

Run it under a launcher, once per placement:
    python -m ringtree.launch -n 2 bench/core_sharing.py same        # both ranks on one core
    python -m ringtree.launch -n 2 bench/core_sharing.py same+burn   # ... plus a CPU burner there
    python -m ringtree.launch -n 2 bench/core_sharing.py own+burn    # a core each, a burner beside each
    python -m ringtree.launch -n 2 bench/core_sharing.py free        # no pinning
Ranks start with every core allowed (so ringtree's wait policy sees enough cores and spins), then
pin themselves; that is what other work arriving later does to a job. Prints rank 0's median time
per call for each size and how many waits yielded to a peer on the same CPU.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

import ringtree as rt

BURNER = "import os\nparent = os.getppid()\nprint(flush=True)\nwhile os.getppid() == parent:\n    pass\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("placement", choices=["same", "same+burn", "own+burn", "free"])
    parser.add_argument("--sizes", default="8,16777216", help="bytes per all_reduce, comma list")
    parser.add_argument("--calls", type=int, default=0, help="calls per size (default: 2000 small, 15 large)")
    args = parser.parse_args()
    comm = rt.init()
    cores = sorted(os.sched_getaffinity(0))
    core = cores[0] if args.placement.startswith("same") else cores[comm.rank % len(cores)]
    burner = None
    if args.placement != "free":
        for tid in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(tid), {core})
    if args.placement == "own+burn" or (args.placement == "same+burn" and comm.rank == 0):
        burner = subprocess.Popen([sys.executable, "-c", BURNER], stdout=subprocess.PIPE)
        os.sched_setaffinity(burner.pid, {core})
        burner.stdout.readline()
    try:
        comm.barrier()
        for nbytes in (int(s) for s in args.sizes.split(",")):
            x = np.ones(max(1, nbytes // 4), np.float32)
            y = np.empty_like(x)
            calls = args.calls or (2000 if nbytes <= 65536 else 15)
            for _ in range(3):
                comm.all_reduce(x, y)
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                comm.all_reduce(x, y)
                times.append(time.perf_counter() - start)
            if not (y == comm.size).all():
                raise SystemExit(f"rank {comm.rank}: wrong result")
            if comm.rank == 0:
                print(f"{args.placement:10s} {nbytes:>10d} B  {np.median(times) * 1e6:10.1f} us/call  "
                      f"(waits yielded to a peer on this CPU: {comm.status().shared_cpu_waits})", flush=True)
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    comm.close()


if __name__ == "__main__":
    main()
