#!/usr/bin/env python3
"""Rank programs of the one-GPU check (bench/gpu_check.sh) that are not tests of the suite:

  allreduce N ITERS   each rank all_reduces N float32 elements of torch CUDA memory ITERS times
                      on its GPU and checks the sums: small, for compute-sanitizer, which runs it
                      under racecheck and synccheck with one and with two channels per rank;
  contexts            one rank per GPU (rank % GPUs): after a few collectives, rank 0 asks
                      nvidia-smi which GPUs each rank's process holds a context on; a rank on
                      any GPU but its own fails the check (the device watchdog used to make one
                      on GPU 0).

Run with `python -m ringtree.launch -n P bench/gpu_check_ranks.py PROGRAM [ARGS]`. Exit status 0
when every check held.
"""

from __future__ import annotations

import os
import subprocess
import sys

import ringtree as rt


def _device(torch) -> int:
    return int(os.environ.get("RINGTREE_RANK", "0")) % torch.cuda.device_count()


def allreduce(n: int, iters: int) -> int:
    import torch

    torch.cuda.set_device(_device(torch))
    comm = rt.init()
    r, P = comm.rank, comm.size
    wrong = 0
    for k in range(iters):
        x = torch.full((n,), float(r + 1 + k), device="cuda")
        comm.all_reduce(x)
        want = sum(q + 1 + k for q in range(P))
        wrong += int((x != want).sum().item())
    print(
        f"rank {r}: {iters} all_reduce of {n} float32, executor {comm.status().cuda_executor}, {wrong} wrong",
        flush=True,
    )
    comm.close()
    return 0 if wrong == 0 else 1


def contexts() -> int:
    import torch

    device = _device(torch)
    torch.cuda.set_device(device)
    comm = rt.init()
    r, P = comm.rank, comm.size
    x = torch.full((1 << 20,), float(r + 1), device="cuda")
    comm.all_reduce(x, async_op=True).wait()
    ok = bool((x == P * (P + 1) / 2).all().item())
    # Every rank's pid and the UUID of its GPU, to rank 0.
    mine = torch.zeros(2, dtype=torch.int64)
    mine[0], mine[1] = os.getpid(), device
    table = torch.zeros(2 * P, dtype=torch.int64)
    comm.all_gather(mine, table)
    status = 0
    if r == 0:
        uuids = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        uuid_of = {int(line.split(",")[0]): line.split(",")[1].strip() for line in uuids.strip().splitlines()}
        apps = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        held = {}
        for line in apps.strip().splitlines():
            pid, uuid = (part.strip() for part in line.split(","))
            held.setdefault(int(pid), set()).add(uuid)
        for q in range(P):
            pid, dev = int(table[2 * q]), int(table[2 * q + 1])
            extra = held.get(pid, set()) - {uuid_of.get(dev)}
            verdict = "ok" if not extra else f"ALSO ON {sorted(extra)}"
            print(f"rank {q} (pid {pid}) on GPU {dev}: contexts {sorted(held.get(pid, set()))}: {verdict}", flush=True)
            status |= bool(extra)
    comm.all_reduce(torch.zeros(1, device="cuda"))
    print(
        f"rank {r}: all_reduce {'right' if ok else 'WRONG'} on GPU {device}, executor {comm.status().cuda_executor}",
        flush=True,
    )
    comm.close()
    return 0 if ok and status == 0 else 1


if __name__ == "__main__":
    program, args = sys.argv[1], [int(a) for a in sys.argv[2:]]
    sys.exit({"allreduce": allreduce, "contexts": contexts}[program](*args))
