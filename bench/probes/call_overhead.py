"""Per-call cost of small collectives in a tight loop, and the first calls of a size, as the
notes in bench/RESULTS.md measured them (issue 13, fifth session).

    python -m ringtree.launch -n 2 bench/probes/call_overhead.py            # ringtree
    mpiexec -n 2 python bench/probes/call_overhead.py --mpi                  # the same loop over mpi4py
    python -m ringtree.launch -n 2 bench/probes/call_overhead.py --torch            # on torch CPU tensors
    python -m ringtree.launch -n 2 bench/probes/call_overhead.py --first-calls 32768

Tight loop: rank 0's best of five rounds of 20000 back-to-back calls (8 B all_reduce out of place,
8 B broadcast from rank 0, barrier, and a count-0 all_gather), after 1000 warm-up calls.
--first-calls N: eight batches of ten N-byte ring all_reduces from a fresh communicator, each
batch's average call and the minor page faults it took (rank 0)."""
import argparse
import resource
import time

import numpy as np


def best_of(call, rounds=5, n=20000, warmup=1000):
    for _ in range(warmup):
        call()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            call()
        times.append((time.perf_counter() - start) / n * 1e6)
    return min(times)


def timed(all_reduce, broadcast, barrier, all_gather):
    """The tight-loop figures for one library's four calls (8 B, 8 B from rank 0, -, count 0)."""
    return {"all_reduce 8 B": best_of(all_reduce), "broadcast 8 B": best_of(broadcast),
            "barrier": best_of(barrier), "all_gather count 0": best_of(all_gather)}


def ringtree_loop(torch_tensors):
    import ringtree as rt
    comm = rt.init()
    if torch_tensors:
        import torch
        x, y, empty = torch.ones(2), torch.empty(2), torch.empty(0)
    else:
        x, y, empty = np.ones(2, np.float32), np.empty(2, np.float32), np.empty(0, np.float32)
    res = timed(lambda: comm.all_reduce(x, y), lambda: comm.broadcast(x, root=0), comm.barrier,
                lambda: comm.all_gather(empty, empty))
    return comm.rank, comm.size, res, comm.close


def mpi_loop():
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    x, y, empty = np.ones(2, np.float32), np.empty(2, np.float32), np.empty(0, np.float32)
    res = timed(lambda: comm.Allreduce(x, y), lambda: comm.Bcast(x, root=0), comm.Barrier,
                lambda: comm.Allgather(empty, empty))
    return comm.Get_rank(), comm.Get_size(), res, lambda: None


def first_calls(nbytes):
    import ringtree as rt
    comm = rt.init()
    x = np.ones(nbytes // 4, np.float32)
    y = np.empty_like(x)
    comm.all_reduce(x, y, algo="ring")
    batches = []
    for _ in range(8):
        comm.barrier()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        for _ in range(10):
            comm.all_reduce(x, y, algo="ring")
        batches.append(((time.perf_counter() - start) / 10 * 1e6,
                        resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults))
    if comm.rank == 0:
        print(f"ring all_reduce {nbytes} B P={comm.size}, batches of 10 calls: "
              + " ".join(f"{t:.1f} us/{f} faults" for t, f in batches), flush=True)
    comm.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mpi", action="store_true", help="time mpi4py's calls instead (run under mpiexec)")
    p.add_argument("--first-calls", type=int, metavar="BYTES", help="time the first calls of one size instead")
    p.add_argument("--torch", action="store_true", help="ringtree's calls on torch CPU tensors")
    a = p.parse_args()
    if a.first_calls:
        first_calls(a.first_calls)
        return
    rank, size, res, close = mpi_loop() if a.mpi else ringtree_loop(a.torch)
    if rank == 0:
        lib = "mpi4py" if a.mpi else "ringtree (torch tensors)" if a.torch else "ringtree"
        print(f"{lib} P={size}: " + "; ".join(f"{k} {v:.2f} us" for k, v in res.items()), flush=True)
    close()


if __name__ == "__main__":
    main()
