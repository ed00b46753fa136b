#!/usr/bin/env python3
"""ringtree's collectives benchmark, nccl-tests compatible, with peers side by side.

  python -m ringtree.launch -n 4 bench/rt_bench.py -b 8 -e 64M -f 2 --collective all_reduce
  mpiexec -n 4 python bench/rt_bench.py -b 8 -e 64M -f 2 --vs mpi,gloo,memcpy
  torchrun --nproc-per-node 4 bench/rt_bench.py -b 1K -e 1M -f 4 --algo all

Flags: python bench/rt_bench.py --help. Exit status: 0 all results right, 1 some
ringtree result wrong, 2 bad usage, 3 a ringtree error.
"""

import sys

from rtbench.driver import main

if __name__ == "__main__":
    sys.exit(main())
