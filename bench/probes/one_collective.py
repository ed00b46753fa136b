"""One collective at one size, timed in a fresh launch: what the A/B checks in bench/RESULTS.md
ran (each launch its own placement of the ranks on cores, unlike rt_bench's interleaving).

    python -m ringtree.launch -n 2 bench/probes/one_collective.py all_gather 2M [calls]

Prints rank 0's median time per call (a barrier before each), whether single-copy transfers are
on, and which stores its shared-memory writers chose (comm.status().shm_stores)."""
import sys
import time

import numpy as np

import ringtree as rt


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def main():
    collective, nbytes = sys.argv[1], parse_size(sys.argv[2])
    calls = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    comm = rt.init()
    P, n = comm.size, max(1, nbytes // 4)
    x = np.ones(n, np.float32)
    if collective == "all_gather":
        y, call = np.empty(n * P, np.float32), lambda: comm.all_gather(x, y)
    elif collective == "reduce_scatter":
        y, call = np.empty(n // P, np.float32), lambda: comm.reduce_scatter(x[: n // P * P], y)
    elif collective == "all_reduce":
        y, call = np.empty_like(x), lambda: comm.all_reduce(x, y)
    elif collective == "all_to_all":
        y, call = np.empty(n // P * P, np.float32), lambda: comm.all_to_all(x[: n // P * P], y)
    elif collective == "broadcast":
        call = lambda: comm.broadcast(x, root=0)  # noqa: E731
    else:
        raise SystemExit(f"unknown collective {collective!r}")
    for _ in range(5):
        call()
    times = []
    for _ in range(calls):
        comm.barrier()
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    if comm.rank == 0:
        print(f"{collective} {nbytes} B P={P}: {np.median(times) * 1e6:.1f} us median of {calls}; "
              f"single copy {comm.status().single_copy.split(':')[0]}; stores: {comm.status().shm_stores}", flush=True)
    comm.close()


if __name__ == "__main__":
    main()
