"""The suite by kind: unit/ (no processes), multiproc/ (rank processes over shared memory and
TCP), torch_backend/ (the torch backend, bucketing, training), gpu/ (marked gpu: skipped, with the
reason, without a CUDA device), bench/ (the bench suite's parsing and runs). What they share is in
support/: harness.py starts rank worlds (rank_worker.py is each rank's entry point), reference.py
computes expected results, rank_checks.py holds helpers of rank bodies, faults.py is the fault
campaign. Tests import these, the bench's package (rtbench, whose netns.py makes
network-namespace hosts) and the examples by name: pyproject.toml's pytest settings put
support/, bench/ and examples/ on the import path, and the harness gives rank processes the same."""


def pytest_addoption(parser):
    # The fault campaign as a soak (tests/multiproc/test_fault_campaign.py::test_fault_soak).
    group = parser.getgroup("fault soak", "many seeded trials of the fault campaign (support/faults.py)")
    group.addoption("--fault-trials", type=int, default=0, help="trials 0..N-1 of the campaign (0: no soak)")
    group.addoption("--fault-seed", type=int, default=0, help="campaign seed: trial i of seed S is always the same")
    group.addoption("--fault-minutes", type=float, default=None, help="start no trial after this many minutes")
    group.addoption("--fault-out", default=None, help="directory for summary.json, records.jsonl and failures/")
    group.addoption(
        "--fault-only",
        nargs="+",
        default=None,
        metavar="ID",
        help="run these trials (SEED-INDEX) alone, printing each in full",
    )
