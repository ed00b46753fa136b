"""ringtree's nccl-tests-style benchmark driver (see bench/rt_bench.py).

Modules, in the order data flows through them:
  options      command line (nccl-tests flags) -> Options, size list
  collectives  per-collective buffer shapes, busbw factors, in-place layouts
  verify       exactly predictable inputs and expected outputs, #wrong counting
  impls        ringtree and the peers (MPI, Gloo, NCCL, memcpy) behind one interface
  report       nccl-tests table formatting and parsing, JSON
  plot         busbw-vs-size PNG
  driver       the sweep: measure, check, aggregate over ranks, print
Beside them: load (CPU burners beside a job), solo (one library alone, for launch_spread.py),
device (CUDA buffers), netns (emulated hosts made of network namespaces, for netns_launch.py and
the tests), examples (the examples as modules, for the training benches).
"""
