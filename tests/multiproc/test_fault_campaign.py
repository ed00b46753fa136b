"""A quick, fixed slice of the fault campaign (support/faults.py): trials that between them inject
every fault kind at every moment over every transport, at P = 2, 3 and 4, into real rank
processes. Each must end with every survivor raising the typed error its fault calls for, naming
the call, within the timeout plus 5 s of the fault, with every completed call's result exact and
no process left running.

The same campaign as a soak of many trials (skipped unless asked for; -s shows a line per trial,
then the summary: hangs, failures by kind, detection times per fault kind and moment):

    python -m pytest -s tests/multiproc/test_fault_campaign.py -k soak --fault-trials 1000 --fault-seed 7 \
        [--fault-out DIR] [--fault-minutes M]
    python -m pytest -s tests/multiproc/test_fault_campaign.py -k soak --fault-only 7-123 [7-456 ...]

Network-namespace trials need root and `ip netns`; without them they are skipped, and the summary
says why."""

import faults
import pytest

from rtbench import netns

SEED = 14
SLICE = faults.covering_slice(SEED, want=12)


@pytest.fixture(scope="module")
def namespaces():
    try:
        with netns.two_namespaces() as made:
            yield made
    except netns.NetnsUnavailable as exc:
        yield str(exc)


def test_the_slice_covers_every_kind_moment_and_transport():
    assert {t.kind for t in SLICE} == set(faults.KINDS)
    assert {t.moment for t in SLICE} == set(faults.MOMENTS)
    assert {t.transport for t in SLICE} == set(faults.TRANSPORTS)
    assert {2, 3, 4} <= {t.nranks for t in SLICE}


def test_trials_are_reproducible_from_their_id():
    trial = faults.make_trial(SEED, 123)
    assert faults.parse_trial_id(trial.id) == trial
    assert faults.make_campaign(SEED, 200)[123] == trial
    assert faults.make_trial(SEED + 1, 123) != trial


@pytest.mark.timeout(90)
@pytest.mark.parametrize("trial", SLICE, ids=lambda t: f"{t.id}-{t.kind}-{t.moment}-{t.transport}-P{t.nranks}")
def test_every_survivor_raises_a_typed_error_naming_the_call(trial, namespaces):
    if trial.transport == "netns" and isinstance(namespaces, str):
        pytest.skip(namespaces)
    record = faults.run_trial(trial, None if isinstance(namespaces, str) else namespaces)
    if "skipped" in record:
        pytest.skip(record["skipped"])
    assert not record["problems"], faults.describe(record)
    assert record["fault"] is not None and len(record["survivors"]) == len(trial.survivors)
    for survivor in record["survivors"]:
        assert survivor["error"] in faults.EXPECTED[trial.kind] | faults.IN_INIT, survivor


def test_the_judge_flags_hangs_silence_wrong_errors_and_slow_detection():
    """The checks themselves, on made-up rank reports: each fault the campaign must catch is caught."""
    from harness import World

    trial = faults.make_trial(SEED, 0)
    t = faults.Trial(**{**trial.__dict__, "kind": "sigkill", "moment": "between", "nranks": 4, "victim": 1})
    fault = 'ringtree-fault {"wall": 100.0, "phase": "between", "kind": "sigkill"}\n'
    good = {
        "error": "PeerFailure",
        "message": f"{t.collective} #2 on rank 0: rank 1 died",
        "wall": 100.3,
        "phase": "call",
        "calls": 2,
        "wrong_results": [],
    }

    def judged(r0=good, r2=good, r3=good, hung=()):
        world = World([0, -9, 0, 0], ["", fault, "", ""], [r0, None, r2, r3])
        return faults.problem_kinds({"problems": faults.judge(t, world, list(hung), [])["problems"]})

    assert judged() == []
    assert judged(hung=[3], r3=None) == ["hang"]
    assert judged(r2={**good, "error": None}) == ["no_error"]
    assert judged(r2={**good, "error": "Timeout"}) == ["wrong_kind"]
    assert judged(r2={**good, "message": "rank 1 died"}) == ["unnamed"]
    assert judged(r2={**good, "wall": 100 + t.timeout + faults.SLACK + 0.1}) == ["slow"]
    assert judged(r2={**good, "wrong_results": [1]}) == ["wrong_result"]
    assert judged(r0=None) == ["crash"]


def test_fault_soak(request, namespaces):
    """Every trial of the soak asked for on the command line passes (see the top of this file)."""
    option = request.config.getoption
    if option("--fault-only"):
        trials = [faults.parse_trial_id(i) for i in option("--fault-only")]
    elif option("--fault-trials") > 0:
        trials = faults.make_campaign(option("--fault-seed"), option("--fault-trials"))
    else:
        pytest.skip("a soak runs when asked for: --fault-trials N [--fault-seed S] or --fault-only ID ...")
    if isinstance(namespaces, str) and any(t.transport == "netns" for t in trials):
        print(f"note: network-namespace trials are skipped: {namespaces}")
    summary = faults.soak(
        trials,
        None if isinstance(namespaces, str) else namespaces,
        out_dir=option("--fault-out"),
        minutes=option("--fault-minutes"),
        in_full=bool(option("--fault-only")),
    )
    print()
    print(faults.soak_report(summary))
    assert summary["failed"] == 0, faults.soak_report(summary)
