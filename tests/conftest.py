"""The suite by kind (README, "Tests"): unit/ (no processes), multiproc/ (rank processes over
shared memory and TCP), torch/ (the torch backend, bucketing, training), gpu/ (marked gpu:
skipped, with the reason, without a CUDA device), bench/ (the bench suite's parsing and runs).
What they share is in support/: harness.py starts rank worlds (rank_worker.py is each rank's
entry point), reference.py computes expected results, rank_checks.py holds helpers of rank bodies, faults.py is
the fault campaign (also run by bench/fault_soak.py), netns.py makes network-namespace hosts.

support/ goes first on sys.path, so test modules import those by name. tests/ itself comes off
it (pytest puts this file's folder there): its torch/ folder would pass for a torch namespace
package where torch is not installed, and pytest.importorskip("torch") would then not skip."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if not (p and os.path.abspath(p) == HERE)]
sys.path.insert(0, os.path.join(HERE, "support"))
