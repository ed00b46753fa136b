"""Started by mpiexec or torchrun (see test_api.py): init from the launcher, check a sum."""
import os

import numpy as np

import ringtree as rt

source = "mpi" if os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") else "torchrun"
comm = rt.init(timeout=60)
x = np.full(10, comm.rank + 1, np.int64)
comm.all_reduce(x)
assert np.all(x == comm.size * (comm.size + 1) // 2), x
print(f"rank {comm.rank} of {comm.size} ok via {source}", flush=True)
comm.close()
