"""Point-to-point on the ringtree torch backend (tagged messages): dist.send / recv / isend /
irecv with tags and from any source give what Gloo gives on the same inputs in the same
processes, and torch's own test_send_recv_any_source and test_send_recv_with_tag
(torch/testing/_internal/distributed/distributed_test.py) pass on ringtree, run as they are."""

import pytest

pytest.importorskip("torch")

from harness import run_world  # noqa: E402
from torch_group import finish_group, init_group  # noqa: E402


def _scenario(group, r, P):
    """Every p2p pattern once on `group`; returns what each receive got, as lists."""
    import torch
    import torch.distributed as dist

    got = {}
    # torch's test_send_recv_with_tag: each rank in turn receives from every other rank with
    # tag = the sender's rank.
    for dst in range(P):
        if dst == r:
            for src in range(P):
                if src != r:
                    out = torch.full((10,), -1.0)
                    dist.recv(out, src, group=group, tag=src)
                    got[f"tag from {src}"] = out.tolist()
        else:
            dist.send(torch.full((10,), float(r)), dst, group=group, tag=r)
    # torch's test_send_recv_any_source: recv and irecv with no source, the sender reported.
    senders = []
    for dst in range(P):
        if dst == r:
            for _ in range(2 * (P - 1)):
                out = torch.full((10,), -1.0)
                if len(senders) % 2 == 0:
                    sender = dist.recv(out, group=group)
                else:
                    work = dist.irecv(out, group=group)
                    work.wait()
                    sender = work._source_rank()
                senders.append([sender, bool(out.eq(sender).all())])
        else:
            dist.send(torch.full((10,), float(r)), dst, group=group)
            dist.send(torch.full((10,), float(r)), dst, group=group)
    got["any source senders"] = sorted(senders)
    # Tags out of order between one pair, several dtypes, isend/irecv in flight together.
    if r == 0:
        works = [
            dist.isend(torch.arange(6, dtype=torch.int64) * 3, 1, group=group, tag=5),
            dist.isend(torch.tensor([True, False, True]), 1, group=group, tag=6),
            dist.isend(torch.linspace(0, 1, 7, dtype=torch.float16), 1, group=group, tag=7),
        ]
        for w in works:
            w.wait()
    elif r == 1:
        half = torch.zeros(7, dtype=torch.float16)
        flags = torch.zeros(3, dtype=torch.bool)
        ints = torch.zeros(6, dtype=torch.int64)
        works = [dist.irecv(half, 0, group=group, tag=7), dist.irecv(flags, 0, group=group, tag=6)]
        for w in works:
            w.wait()
        dist.recv(ints, 0, group=group, tag=5)
        got["out of order"] = [half.float().tolist(), flags.tolist(), ints.tolist()]
    # A ring of isend/irecv with tags, both ways at once.
    nxt, prv = (r + 1) % P, (r - 1) % P
    behind, ahead = torch.zeros(4), torch.zeros(4)
    works = [
        dist.isend(torch.full((4,), 10.0 * r + 1), nxt, group=group, tag=11),
        dist.isend(torch.full((4,), 10.0 * r + 2), prv, group=group, tag=12),
        dist.irecv(behind, prv, group=group, tag=11),
        dist.irecv(ahead, nxt, group=group, tag=12),
    ]
    for w in works:
        w.wait()
    got["ring"] = [behind.tolist(), ahead.tolist()]
    dist.barrier(group=group)
    return got


def messages_vs_gloo():
    import torch.distributed as dist

    r, P = init_group()
    gloo = dist.new_group(backend="gloo")
    ours = _scenario(dist.group.WORLD, r, P)
    theirs = _scenario(gloo, r, P)
    # Independent of both: what each receive must hold.
    expected_senders = sorted([q, True] for q in range(P) if q != r for _ in range(2))
    checks = {
        "tags": all(ours[f"tag from {q}"] == [float(q)] * 10 for q in range(P) if q != r),
        "any source": ours["any source senders"] == expected_senders,
        "ring": ours["ring"] == [[10.0 * ((r - 1) % P) + 1] * 4, [10.0 * ((r + 1) % P) + 2] * 4],
    }
    if r == 1:
        checks["out of order"] = ours["out of order"][1:] == [[True, False, True], [0, 3, 6, 9, 12, 15]]
    finish_group()
    return {"same as gloo": ours == theirs, "ours": ours, "gloo": theirs, "checks": checks}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("nranks", [2, 3])
def test_send_recv_with_tags_and_any_source_match_gloo(nranks):
    results = run_world(nranks, messages_vs_gloo, timeout=130).check_ok()
    for rank, res in enumerate(results):
        assert all(res["checks"].values()), (rank, res["checks"], res["ours"])
        assert res["same as gloo"], (rank, res["ours"], res["gloo"])


def p2p_errors():
    """Bad p2p arguments raise before traffic; a recv whose message is shorter than the tensor
    raises (as on Gloo) and the group stays usable."""
    import torch
    import torch.distributed as dist

    r, P = init_group(timeout=20)
    report = {}

    def expect(name, call, error_type, needle):
        try:
            call()
            report[name] = "no error"
        except error_type as exc:
            report[name] = "ok" if needle in str(exc) else str(exc)
        except Exception as exc:  # noqa: BLE001 - reported
            report[name] = f"{type(exc).__name__}: {exc}"

    expect("negative tag", lambda: dist.send(torch.ones(2), (r + 1) % P, tag=-1), ValueError, "tag must be >= 0")
    expect("negative recv tag", lambda: dist.recv(torch.ones(2), tag=-3), ValueError, "tag must be >= 0")
    if r == 0:
        dist.send(torch.arange(3.0), 1, tag=4)
        dist.send(torch.arange(4.0) + 1, 1, tag=5)
    else:
        expect("short message", lambda: dist.recv(torch.zeros(5), 0, tag=4), ValueError, "12 bytes")
        wide = torch.zeros(4, 3)
        dist.recv(wide[:, 1], 0, tag=5)  # a non-contiguous tensor: through a copy
        report["non-contiguous"] = (
            "ok" if wide[:, 1].tolist() == [1.0, 2.0, 3.0, 4.0] and wide.sum() == 10 else str(wide)
        )
    x = torch.ones(2)
    dist.all_reduce(x)
    report["usable"] = "ok" if x.tolist() == [float(P)] * 2 else str(x)
    finish_group()
    return report


@pytest.mark.timeout(100)
def test_p2p_errors_are_clear_and_leave_the_group_usable():
    results = run_world(2, p2p_errors, timeout=80).check_ok()
    for rank, res in enumerate(results):
        assert all(v == "ok" for v in res.values()), (rank, res)
    assert "short message" in results[1]


TORCH_OWN_P2P_TESTS = ["_test_send_recv_any_source", "_test_send_recv_with_tag"]


def torch_own_p2p_tests():
    """torch's own test methods, run as they are on the ringtree backend: an instance of
    torch's _DistTestBase (a unittest.TestCase) calls them after init_process_group, with and
    without torch's autograd profiler around them."""
    import os
    import unittest

    os.environ["BACKEND"] = "ringtree"  # torch's test module reads these at import
    os.environ["WORLD_SIZE"] = os.environ["RINGTREE_WORLD_SIZE"]
    import torch.testing._internal.distributed.distributed_test as torch_tests

    r, P = init_group()

    class OnRingtree(torch_tests.DistributedTest._DistTestBase, unittest.TestCase):
        def runTest(self):  # noqa: N802 - unittest's name
            pass

    case = OnRingtree()
    ran = []
    for name in TORCH_OWN_P2P_TESTS:
        for profiler in (None, torch_tests._create_autograd_profiler()):
            getattr(case, name)(profiler_ctx=profiler)
            ran.append(f"{name}{'' if profiler is None else ' (autograd profiler)'}")
    finish_group()
    return {"ran": ran}


@pytest.mark.timeout(150)
def test_torch_own_send_recv_tests_pass_on_ringtree(tmp_path, nranks=3):
    pytest.importorskip("expecttest")  # torch's test modules import it
    # torch's file barrier (its tests call self._barrier()) lives in TEMP_DIR/barrier.
    temp_dir = tmp_path / "torch-tests"
    (temp_dir / "barrier").mkdir(parents=True)
    results = run_world(nranks, torch_own_p2p_tests, env={"TEMP_DIR": str(temp_dir)}, timeout=140).check_ok()
    for res in results:
        assert len(res["ran"]) == 2 * len(TORCH_OWN_P2P_TESTS), res
