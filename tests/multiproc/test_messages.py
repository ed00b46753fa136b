"""Tagged messages (Communicator.isend / irecv / probe / iprobe): exact payloads against what
each sender sent, any-source serving, tag matching and order, no deadlock whatever the order of
sends and receives, truncation, self-sends, bad input, dead peers, timeouts, abort, and messages
mixed with collectives.

The rank bodies run in every rank of a test's world (harness.py) and return a JSON report that
the test asserts on. Payloads are derived from (sender, request id) so the receiver computes
what it must have got independently of what arrived."""

import os
import random
import signal
import threading
import time

import numpy as np
import pytest
from harness import run_world

import ringtree as rt


def _payload(sender, ident, n):
    """The int64 payload `sender` sends as request `ident`: its first two words name it."""
    x = np.arange(n, dtype=np.int64) * 7919 + sender * 1_000_003 + ident * 101
    x[:2] = (sender, ident)
    return x


def _outcome(call):
    """(error class name or None, message) of call()."""
    try:
        call()
        return None, ""
    except rt.Error as exc:
        return type(exc).__name__, str(exc)


# --- any-source server ----------------------------------------------------------------------


def server_and_workers(requests=40, seed=5):
    """Rank 0 serves: it takes each request from whichever worker sent it (half through probe
    and a buffer sized from it, half through an any-source receive into a buffer of the largest
    size), checks it word for word, and answers with tag 1000 + request tag and the request's
    sum. Workers send their requests in random order, sizes and tags, all at once, then take the
    answers in whatever order they come."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    rng = random.Random(seed * 100 + r)
    max_words = 5000
    report = {"bad": []}
    if r == 0:
        served = {}
        big = np.empty(max_words, np.int64)
        for k in range(requests * (P - 1)):
            if k % 2 == 0:
                source, tag, nbytes = comm.probe()
                buf = np.empty(nbytes // 8, np.int64)
                work = comm.irecv(buf, src=source, tag=tag)
                work.wait()
                if (work.source, work.tag, work.nbytes) != (source, tag, nbytes):
                    report["bad"].append(
                        f"probe said {(source, tag, nbytes)}, got {(work.source, work.tag, work.nbytes)}"
                    )
            else:
                work = comm.irecv(big)
                work.wait()
                buf = big[: work.nbytes // 8]
            sender, ident = int(buf[0]), int(buf[1])
            if sender != work.source or not np.array_equal(buf, _payload(sender, ident, len(buf))):
                report["bad"].append(f"request {ident} from {work.source}: wrong payload")
            if work.tag != ident % 7:
                report["bad"].append(f"request {ident} from {sender}: tag {work.tag}, sent {ident % 7}")
            served[(sender, ident)] = served.get((sender, ident), 0) + 1
            answer = np.array([ident, int(buf.sum())], np.int64)
            comm.isend(answer, work.source, tag=1000 + work.tag).wait()
        report["served"] = len(served)
        report["duplicates"] = sum(1 for v in served.values() if v != 1)
    else:
        idents = list(range(requests))
        rng.shuffle(idents)
        sent = {i: _payload(r, i, rng.randint(2, max_words)) for i in idents}
        sends = [comm.isend(sent[i], 0, tag=i % 7) for i in idents]
        answers = {}
        for _ in idents:
            got = np.empty(2, np.int64)
            work = comm.irecv(got, src=0)
            work.wait()
            ident = int(got[0])
            if work.tag != 1000 + ident % 7 or int(got[1]) != int(sent[ident].sum()):
                report["bad"].append(f"answer to {ident}: tag {work.tag}, sum {int(got[1])}")
            answers[ident] = True
        for s in sends:
            s.wait()
        report["answered"] = len(answers)
    x = np.full(3, r + 1, np.int64)
    comm.all_reduce(x)
    report["all_reduce"] = x.tolist() == [P * (P + 1) // 2] * 3
    comm.close()
    return report


@pytest.mark.timeout(150)
@pytest.mark.parametrize("hosts", [1, 2])
def test_any_source_server_answers_every_request_exactly(hosts):
    requests = 40
    results = run_world(4, server_and_workers, dict(requests=requests), hosts=hosts, timeout=130).check_ok()
    for rank, res in enumerate(results):
        assert not res["bad"], (rank, res["bad"][:5])
        assert res["all_reduce"]
    assert results[0]["served"] == 3 * requests and results[0]["duplicates"] == 0
    assert all(res["answered"] == requests for res in results[1:])


# --- matching and order ---------------------------------------------------------------------


def tags_and_order(count=50):
    """Rank 1 sends `count` messages with tag 1 and `count` with tag 2, interleaved, each
    carrying its sequence number. Rank 0 takes all of tag 2 first, then tag 1 (order within a
    tag must be the sending order), then a mixed run with any tag from rank 1 (sending order)."""
    comm = rt.init()
    r = comm.rank
    report = {}
    if r == 1:
        works = []
        for i in range(count):
            for tag in (1, 2):
                works.append(comm.isend(np.array([tag, i], np.int64), 0, tag=tag))
        comm.barrier()
        for i in range(count):
            works.append(comm.isend(np.array([9, i], np.int64), 0, tag=10 + i % 3))
        for w in works:
            w.wait()
    else:
        comm.barrier()  # every tag-1/2 message is on its way or here: the receives below must pick
        got = {}
        for tag in (2, 1):
            seq = []
            for _ in range(count):
                buf = np.empty(2, np.int64)
                w = comm.irecv(buf, src=1, tag=tag)
                w.wait()
                if int(buf[0]) != tag or w.tag != tag:
                    seq.append(-1)
                seq.append(int(buf[1]))
            got[tag] = seq
        mixed = []
        for _ in range(count):
            buf = np.empty(2, np.int64)
            w = comm.irecv(buf, src=1)
            w.wait()
            mixed.append((int(buf[1]), w.tag))
        report = {"tag1": got[1], "tag2": got[2], "mixed": mixed}
    comm.close()
    return report


@pytest.mark.timeout(90)
def test_tags_match_and_messages_of_one_tag_never_overtake():
    count = 50
    res = run_world(2, tags_and_order, dict(count=count), timeout=70).check_ok()[0]
    assert res["tag1"] == list(range(count)) and res["tag2"] == list(range(count))
    assert res["mixed"] == [[i, 10 + i % 3] for i in range(count)]


def source_zero_is_one_rank(tag=5):
    """A receive, probe or iprobe for source 0 takes rank 0's message only, never another
    rank's message of the same tag that arrived first (rank 0 is a rank, not "any"). Rank 2
    posts a receive for rank 0 before anything arrives; rank 1's message of that tag arrives
    first (rank 2 waits for a later message on the same link), only then does rank 0 send.
    The same again with rank 1's message waiting in the queue before the receive is posted."""
    comm = rt.init(timeout=30)
    r = comm.rank
    report = {}
    if r == 1:
        for round_ in (0, 1):
            comm.isend(_payload(1, round_, 6), 2, tag=tag).wait()
            comm.isend(np.array([round_], np.int64), 2, tag=tag + 1).wait()  # after it, on the same link
    elif r == 0:
        for round_ in (0, 1):
            comm.irecv(np.empty(1, np.int64), src=2, tag=tag + 2).wait()  # rank 2 has rank 1's message
            comm.isend(_payload(0, round_, 6), 2, tag=tag).wait()
    else:
        got = []
        posted = np.empty(6, np.int64)
        early = comm.irecv(posted, src=0, tag=tag)  # posted before either message arrives
        comm.irecv(np.empty(1, np.int64), src=1, tag=tag + 1).wait()
        taken_early = early.is_completed()
        comm.isend(np.zeros(1, np.int64), 0, tag=tag + 2).wait()
        early.wait()
        got.append([early.source, bool(np.array_equal(posted, _payload(0, 0, 6)))])
        # Round 1: rank 1's message waits in the queue; probe and receive name rank 0.
        comm.irecv(np.empty(1, np.int64), src=1, tag=tag + 1).wait()
        before_zero = comm.iprobe(0, tag)
        comm.isend(np.zeros(1, np.int64), 0, tag=tag + 2).wait()
        probed = comm.probe(0, tag)
        late = np.empty(6, np.int64)
        work = comm.irecv(late, src=0, tag=tag)
        work.wait()
        got.append([work.source, bool(np.array_equal(late, _payload(0, 1, 6)))])
        ones = []
        for round_ in (0, 1):  # rank 1's two messages are still there, for a receive that names it
            buf = np.empty(6, np.int64)
            w = comm.irecv(buf, src=1, tag=tag)
            try:
                w.wait(3.0)
                ones.append([w.source, bool(np.array_equal(buf, _payload(1, round_, 6)))])
            except rt.Timeout:
                ones.append(["timeout", False])
        report = {
            "taken_early": taken_early,
            "got": got,
            "iprobe_before": before_zero,
            "probed": list(probed),
            "from_one": ones,
        }
    comm.barrier()
    comm.close()
    return report


@pytest.mark.timeout(60)
def test_a_receive_from_rank_0_takes_rank_0s_message_only():
    res = run_world(3, source_zero_is_one_rank, timeout=50).check_ok()[2]
    assert res == {
        "taken_early": False,
        "got": [[0, True], [0, True]],
        "iprobe_before": None,
        "probed": [0, 5, 48],
        "from_one": [[1, True], [1, True]],
    }, res


def large_both_ways(mib=64):
    """Both ranks isend a large message to each other before either posts its receive: the
    progress threads read eagerly, so nobody waits for the other's receive."""
    comm = rt.init()
    r = comm.rank
    peer = 1 - r
    n = (mib << 20) // 8
    out = np.arange(n, dtype=np.int64) * 3 + r
    send = comm.isend(out, peer, tag=5)
    send.wait(timeout=50)  # completes with no receive posted on the other side
    got = np.zeros(n, np.int64)
    recv = comm.irecv(got, src=peer, tag=5)
    recv.wait(timeout=50)
    expected = np.arange(n, dtype=np.int64) * 3 + peer
    report = {"equal": bool(np.array_equal(got, expected)), "nbytes": recv.nbytes, "source": recv.source}
    comm.close()
    return report


@pytest.mark.timeout(120)
def test_large_isends_both_ways_before_any_receive_do_not_deadlock():
    for rank, res in enumerate(run_world(2, large_both_ways, dict(mib=64), timeout=100).check_ok()):
        assert res == {"equal": True, "nbytes": 64 << 20, "source": 1 - rank}, rank


def posted_before_and_after():
    """A receive posted before the message leaves, one posted after it arrived (seen by
    iprobe), probe/iprobe on an empty queue, and self-sends."""
    comm = rt.init()
    r = comm.rank
    report = {}
    if r == 0:
        early = np.zeros(100, np.int32)
        w_early = comm.irecv(early, src=1, tag=3)
        report["iprobe empty"] = comm.iprobe(src=1, tag=4)
        report["probe timeout"] = _outcome(lambda: comm.probe(src=1, tag=4, timeout=0.3))[0]
        comm.isend(np.zeros(1, np.int8), 1, tag=0).wait()  # rank 1: send now
        w_early.wait()
        report["early"] = bool(np.array_equal(early, np.arange(100, dtype=np.int32) * 2)) and w_early.nbytes == 400
        deadline = time.monotonic() + 20
        found = None
        while found is None and time.monotonic() < deadline:
            found = comm.iprobe(src=1, tag=4)
            time.sleep(0.01)
        report["iprobe found"] = list(found) if found else None
        late = np.zeros(found[2] // 8 if found else 1, np.float64)
        w_late = comm.irecv(late, src=1, tag=4)
        w_late.wait()
        report["late"] = bool(np.array_equal(late, np.linspace(0, 1, 33)))
        report["iprobe after"] = comm.iprobe(src=1, tag=4)
        # Self-sends, the receive posted first and then the message first.
        mine = np.zeros(8, np.int16)
        w_self = comm.irecv(mine, src=0, tag=9)
        comm.isend(np.arange(8, dtype=np.int16), 0, tag=9).wait()
        w_self.wait()
        comm.isend(np.arange(8, dtype=np.int16) + 5, 0, tag=10).wait()
        found_self = comm.probe(src=rt.ANY_SOURCE, tag=10, timeout=5)
        mine2 = np.zeros(8, np.int16)
        w_self2 = comm.irecv(mine2, tag=10)
        w_self2.wait()
        report["self"] = (mine.tolist(), w_self.source, mine2.tolist(), list(found_self))
    else:
        comm.irecv(np.zeros(1, np.int8), src=0, tag=0).wait()
        comm.isend(np.arange(100, dtype=np.int32) * 2, 0, tag=3).wait()
        comm.isend(np.linspace(0, 1, 33), 0, tag=4).wait()
    comm.barrier()
    comm.close()
    return report


@pytest.mark.timeout(90)
def test_receives_posted_before_and_after_arrival_probe_and_self_sends():
    res = run_world(2, posted_before_and_after, timeout=70).check_ok()[0]
    assert res["iprobe empty"] is None and res["probe timeout"] == "Timeout"
    assert res["early"] and res["late"]
    assert res["iprobe found"] == [1, 4, 33 * 8] and res["iprobe after"] is None
    assert res["self"] == [list(range(8)), 0, [i + 5 for i in range(8)], [0, 10, 16]]


# --- errors ---------------------------------------------------------------------------------


def truncation_then_usable():
    """A message larger than its receive fails that receive (posted before the message, and
    after it arrived) with InvalidArgument naming both sizes, source and tag; its payload is
    discarded and the next message and an all_reduce are right."""
    comm = rt.init()
    r = comm.rank
    report = {}
    if r == 0:
        small = np.zeros(5, np.int64)
        w = comm.irecv(small, src=1, tag=2)  # posted before the message
        comm.isend(np.zeros(1, np.int8), 1, tag=0).wait()
        report["posted"] = _outcome(w.wait)
        report["posted untouched"] = small.tolist() == [0] * 5
        comm.probe(src=1, tag=3, timeout=20)  # the second one arrived, unexpected
        report["unexpected"] = _outcome(comm.irecv(small, src=1, tag=3).wait)
        after = np.zeros(12, np.int64)
        w = comm.irecv(after, src=1)
        w.wait()
        report["next"] = after.tolist() == list(range(12)) and w.tag == 4
    else:
        comm.irecv(np.zeros(1, np.int8), src=0, tag=0).wait()
        comm.isend(np.arange(10, dtype=np.int64), 0, tag=2).wait()
        comm.isend(np.arange(9, dtype=np.int64), 0, tag=3).wait()
        comm.isend(np.arange(12, dtype=np.int64), 0, tag=4).wait()
    x = np.full(4, r + 1.0)
    comm.all_reduce(x)
    report["all_reduce"] = x.tolist() == [3.0] * 4
    comm.close()
    return report


@pytest.mark.timeout(90)
def test_a_message_larger_than_its_receive_fails_that_receive_only():
    results = run_world(2, truncation_then_usable, timeout=70).check_ok()
    res = results[0]
    for case, (nbytes, tag) in (("posted", (80, 2)), ("unexpected", (72, 3))):
        kind, message = res[case]
        assert kind == "InvalidArgument", (case, res[case])
        assert f"{nbytes} bytes" in message and "40 bytes" in message and "rank 1" in message, message
        assert f"tag {tag}" in message, message
    assert res["posted untouched"] and res["next"]
    assert all(r["all_reduce"] for r in results)


def bad_input():
    """Bad calls on rank 0 raise InvalidArgument before any traffic; rank 1 makes none. A marker
    sent afterwards must be the first message rank 1 gets from rank 0 (no stray message came
    before it), and both ranks stay usable."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    report = {}
    if r == 0:
        x = np.zeros(4, np.float32)
        ro = np.zeros(4, np.float32)
        ro.flags.writeable = False
        cases = {
            "dst range": (lambda: comm.isend(x, P), f"[0, {P})"),
            "dst negative": (lambda: comm.isend(x, -1), "got -1"),
            "send tag": (lambda: comm.isend(x, 1, tag=-1), "tag must be >= 0"),
            "recv tag": (lambda: comm.irecv(x, src=1, tag=-2), "got -2"),
            "src range": (lambda: comm.irecv(x, src=P + 1), f"got {P + 1}"),
            "src below any": (lambda: comm.irecv(x, src=-2), "got -2"),
            "read-only": (lambda: comm.irecv(ro, src=1), "read-only"),
            "probe src": (lambda: comm.probe(src=P, timeout=1), f"got {P}"),
            "iprobe tag": (lambda: comm.iprobe(tag=-5), "got -5"),
            "not an int": (lambda: comm.isend(x, 1.5), "must be an int"),
            "not a buffer": (lambda: comm.isend("text", 1), "got str"),
            "null pointer": (lambda: comm._core.isend(0, 16, 1, 0), "null buffer"),
            "wait timeout": (lambda: comm.irecv(x, src=1).wait(timeout=-1), "timeout must be positive"),
        }
        for name, (call, needle) in cases.items():
            kind, message = _outcome(call)
            report[name] = "ok" if kind == "InvalidArgument" and needle in message else f"{kind}: {message}"
        comm.isend(np.array([42], np.int64), 1, tag=77).wait()
    else:
        first = np.zeros(1, np.int64)
        w = comm.irecv(first, src=0)
        w.wait()
        report["first"] = [int(first[0]), w.tag]
    y = np.full(2, r + 1, np.int64)
    comm.all_reduce(y)
    report["all_reduce"] = y.tolist() == [3, 3]
    comm.close()
    return report


@pytest.mark.timeout(90)
def test_bad_input_raises_before_traffic_on_the_calling_rank_only():
    results = run_world(2, bad_input, timeout=70).check_ok()
    bad = {k: v for k, v in results[0].items() if k != "all_reduce" and v != "ok"}
    assert not bad, bad
    assert len(results[0]) == 14
    assert results[1]["first"] == [42, 77]
    assert all(r["all_reduce"] for r in results)


def killed_peer(victim=2):
    """The victim dies by SIGKILL. Receives naming it fail with PeerFailure naming it, within
    the wait's timeout, as does a send to it; any-source receives, one posted before the death
    and one after, still get messages from the live rank 1."""
    comm = rt.init(timeout=60)
    r = comm.rank
    report = {}
    if r == 0:
        early_any = np.zeros(3, np.int64)
        w_any = comm.irecv(early_any, src=rt.ANY_SOURCE, tag=1)
        w_victim = comm.irecv(np.zeros(3, np.int64), src=victim, tag=0)
    comm.barrier()
    if r == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    if r == 0:
        started = time.monotonic()
        kind, message = _outcome(lambda: w_victim.wait(timeout=20))
        report["named"] = [kind, f"rank {victim} (pid" in message and "died" in message, time.monotonic() - started]
        report["later named"] = _outcome(comm.irecv(np.zeros(3, np.int64), src=victim).wait)[0]
        report["send"] = _outcome(comm.isend(np.zeros(3, np.int64), victim).wait)[0]
        late_any = np.zeros(3, np.int64)
        w_late = comm.irecv(late_any, tag=2)
        comm.isend(np.zeros(1, np.int8), 1, tag=9).wait()  # rank 1: now send
        w_any.wait(timeout=20)
        w_late.wait(timeout=20)
        report["any"] = [early_any.tolist(), w_any.source, late_any.tolist(), w_late.source]
    elif r == 1:
        comm.irecv(np.zeros(1, np.int8), src=0, tag=9).wait(timeout=30)
        comm.isend(np.array([1, 2, 3], np.int64), 0, tag=1).wait()
        comm.isend(np.array([4, 5, 6], np.int64), 0, tag=2).wait()
    comm.close()
    return report


@pytest.mark.timeout(90)
def test_a_killed_peer_fails_receives_naming_it_while_any_source_goes_on():
    world = run_world(3, killed_peer, dict(victim=2), timeout=70)
    assert world.returncodes[2] == -signal.SIGKILL
    assert world.returncodes[0] == 0 and world.returncodes[1] == 0, world.failure_report()
    res = world.results[0]
    kind, names_it, seconds = res["named"]
    assert kind == "PeerFailure" and names_it and seconds < 15, res["named"]
    assert res["later named"] == "PeerFailure" and res["send"] == "PeerFailure"
    assert res["any"] == [[1, 2, 3], 1, [4, 5, 6], 1]


def timeout_then_later_message(mib=64):
    """A receive whose wait times out is cancelled: the message that comes later lands in a
    new receive, and the old buffer never changes. Twice: the message sent after the timeout,
    and a large one still arriving when the wait gives up (its first part already in the old
    buffer moves out of it)."""
    comm = rt.init()
    r = comm.rank
    report = {}
    n = (mib << 20) // 8
    if r == 0:
        old = np.zeros(1000, np.int64)
        started = time.monotonic()
        kind, _ = _outcome(lambda: comm.irecv(old, src=1, tag=4).wait(timeout=0.5))
        report["timeout"] = [kind, time.monotonic() - started]
        comm.isend(np.zeros(1, np.int8), 1, tag=0).wait()  # rank 1: send
        new = np.zeros(1000, np.int64)
        comm.irecv(new, src=1, tag=4).wait()
        report["small"] = [bool((old == 0).all()), bool((new == 7).all())]
        del old
        big_old = np.zeros(n, np.int64)
        w = comm.irecv(big_old, src=1, tag=5)
        comm.isend(np.zeros(1, np.int8), 1, tag=0).wait()  # rank 1: send the large one
        comm.irecv(np.zeros(1, np.int8), src=1, tag=6).wait()  # sent just before it: it is arriving now
        kind, _ = _outcome(lambda: w.wait(timeout=0.002))
        snapshot = big_old.copy()
        big_new = np.zeros(n, np.int64)
        if kind == "Timeout":
            comm.irecv(big_new, src=1, tag=5).wait(timeout=50)
        else:
            big_new[:] = big_old
        report["large"] = [
            kind,
            bool(np.array_equal(big_old, snapshot)),
            bool(np.array_equal(big_new, np.arange(n, dtype=np.int64))),
        ]
        # A send that times out part written: the rest goes from a copy, the caller's buffer is free.
        big_new[:] = np.arange(n, dtype=np.int64) * 5
        kind, message = _outcome(lambda: comm.isend(big_new, 1, tag=8).wait(timeout=0.002))
        big_new[:] = -1
        # Cancelled before its first byte, it never goes; else rank 1 gets all of it.
        goes = kind is None or "already written" in message
        report["send"] = [kind, goes]
        comm.isend(np.array([goes], np.int8), 1, tag=9).wait()
    else:
        comm.irecv(np.zeros(1, np.int8), src=0, tag=0).wait()
        comm.isend(np.full(1000, 7, np.int64), 0, tag=4).wait()
        big = np.arange(n, dtype=np.int64)
        comm.irecv(np.zeros(1, np.int8), src=0, tag=0).wait()
        comm.isend(np.zeros(1, np.int8), 0, tag=6)
        comm.isend(big, 0, tag=5).wait(timeout=50)
        goes = np.zeros(1, np.int8)
        comm.irecv(goes, src=0, tag=9).wait(timeout=50)
        if goes[0]:
            comm.irecv(big, src=0, tag=8).wait(timeout=50)
        report["sent whole"] = bool(not goes[0] or np.array_equal(big, np.arange(n, dtype=np.int64) * 5))
    comm.barrier()
    comm.close()
    return report


@pytest.mark.timeout(120)
def test_a_timed_out_receive_is_cancelled_and_later_messages_do_not_touch_its_buffer():
    results = run_world(2, timeout_then_later_message, dict(mib=64), timeout=100).check_ok()
    res = results[0]
    assert res["send"][0] in ("Timeout", None) and results[1]["sent whole"], (res["send"], results[1])
    kind, seconds = res["timeout"]
    assert kind == "Timeout" and 0.4 < seconds < 5, res["timeout"]
    assert res["small"] == [True, True]
    kind, old_unchanged, new_right = res["large"]
    assert kind in ("Timeout", None) and old_unchanged and new_right, res["large"]


def abort_from_thread():
    """comm.abort() from a watchdog thread ends rank 0's pending receive with Aborted; rank 1's
    receive from rank 0 fails with PeerFailure as rank 0's connections close."""
    comm = rt.init()
    r = comm.rank
    comm.barrier()
    started = time.monotonic()
    if r == 0:
        w = comm.irecv(np.zeros(4, np.int64), src=1)
        threading.Timer(0.5, lambda: comm.abort("watchdog")).start()
        kind, message = _outcome(lambda: w.wait(timeout=30))
        later = _outcome(lambda: comm.isend(np.zeros(1), 1))[0]
    else:
        kind, message = _outcome(lambda: comm.irecv(np.zeros(4, np.int64), src=0).wait(timeout=30))
        later = None
    report = {"kind": kind, "message": message, "seconds": time.monotonic() - started, "later": later}
    comm.close()
    return report


@pytest.mark.timeout(90)
def test_abort_from_another_thread_ends_a_pending_receive():
    results = run_world(2, abort_from_thread, timeout=70).check_ok()
    assert results[0]["kind"] == "Aborted" and "watchdog" in results[0]["message"], results[0]
    assert results[0]["seconds"] < 10 and results[0]["later"] == "Aborted"
    assert results[1]["kind"] == "PeerFailure" and "rank 0" in results[1]["message"], results[1]
    assert results[1]["seconds"] < 15


def closed_peer():
    """A rank that closes its communicator says goodbye: the other rank's receive naming it
    fails with PeerFailure saying so, while messages it sent before closing are delivered."""
    comm = rt.init()
    r = comm.rank
    report = {}
    if r == 1:
        comm.isend(np.arange(6, dtype=np.int64), 0, tag=1)
        comm.close()  # flushes the send first
        return report
    time.sleep(0.5)
    got = np.zeros(6, np.int64)
    comm.irecv(got, src=1, tag=1).wait(timeout=20)
    report["delivered"] = got.tolist() == list(range(6))
    kind, message = _outcome(lambda: comm.irecv(np.zeros(6, np.int64), src=1).wait(timeout=20))
    report["after"] = [kind, "rank 1" in message and "closed its communicator" in message, message]
    report["any"] = _outcome(lambda: comm.irecv(np.zeros(6, np.int64)).wait(timeout=20))[0]
    comm.close()
    return report


@pytest.mark.timeout(90)
def test_a_closed_peer_delivers_what_it_sent_then_receives_naming_it_fail():
    res = run_world(2, closed_peer, timeout=70).check_ok()[0]
    assert res["delivered"]
    assert res["after"][:2] == ["PeerFailure", True], res["after"]
    assert res["any"] == "PeerFailure"


def with_collectives(rounds=20):
    """Messages and collectives interleaved: each round every rank isends to its right
    neighbour, runs an all_reduce, receives from its left neighbour, and broadcasts; every
    value is checked."""
    comm = rt.init()
    r, P = comm.rank, comm.size
    bad = []
    for i in range(rounds):
        right, left = (r + 1) % P, (r - 1) % P
        send = comm.isend(np.full(64 + i, 100 * r + i, np.int32), right, tag=i)
        x = np.full(8, r + i, np.int64)
        comm.all_reduce(x)
        if x.tolist() != [sum(q + i for q in range(P))] * 8:
            bad.append(f"all_reduce {i}")
        got = np.zeros(64 + i, np.int32)
        w = comm.irecv(got, src=left, tag=i)
        w.wait()
        if not (got == 100 * left + i).all() or w.nbytes != 4 * (64 + i):
            bad.append(f"message {i}")
        b = np.full(3, i if r == i % P else -1, np.int64)
        comm.broadcast(b, root=i % P)
        if b.tolist() != [i] * 3:
            bad.append(f"broadcast {i}")
        send.wait()
    comm.close()
    return {"bad": bad}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 3])
def test_messages_and_collectives_interleave(nranks):
    for rank, res in enumerate(run_world(nranks, with_collectives, timeout=100).check_ok()):
        assert not res["bad"], (rank, res["bad"])


def split_messages():
    """Communicators from split() have message connections of their own: a message on the
    sub-communicator uses its ranks and does not reach the parent's receives."""
    comm = rt.init()
    r = comm.rank
    sub = comm.split(r % 2)
    parent_any = comm.irecv(np.zeros(2, np.int64))
    peer = (sub.rank + 1) % sub.size
    sub.isend(np.array([r, sub.rank], np.int64), peer, tag=3).wait()
    got = np.zeros(2, np.int64)
    w = sub.irecv(got, src=rt.ANY_SOURCE, tag=3)
    w.wait(timeout=20)
    report = {
        "got": got.tolist(),
        "source": w.source,
        "sub_rank": sub.rank,
        "sub_size": sub.size,
        "parent_pending": not parent_any.is_completed(),
    }
    report["cancelled"] = parent_any.cancel()
    comm.barrier()  # nobody closes the parent (which fails any-source receives) before every rank looked
    sub.close()
    comm.close()
    return report


@pytest.mark.timeout(90)
def test_split_communicators_get_message_connections():
    results = run_world(4, split_messages, timeout=70).check_ok()
    for rank, res in enumerate(results):
        group = [q for q in range(4) if q % 2 == rank % 2]
        left = group[(res["sub_rank"] - 1) % res["sub_size"]]
        assert res["sub_size"] == 2 and res["got"] == [left, group.index(left)] and res["source"] == group.index(left)
        assert res["parent_pending"] and res["cancelled"]


def reserved_tags_and_any_tag():
    """A user's pending any-tag receive never takes a message on ringtree's reserved tags
    (shrink's agreement travels there): it gets the user's later message, and the reserved one
    stays for a receive that names its tag."""
    from ringtree._args import RESERVED_TAGS

    comm = rt.init(timeout=30)
    if comm.rank == 1:
        mine = np.zeros(4, np.int64)
        pending = comm.irecv(mine, src=0)  # ANY_TAG, posted before anything arrives
        comm.barrier()
        pending.wait()
        reserved = np.zeros(4, np.int64)
        comm._irecv(reserved, 0, RESERVED_TAGS + 3, "test").wait()
        result = {
            "any_tag": [pending.tag] + mine.tolist(),
            "reserved": reserved.tolist(),
            "probe_sees_reserved": comm.iprobe(0) is not None,
        }
    else:
        comm.barrier()
        comm._isend(np.full(4, 9, np.int64), 1, RESERVED_TAGS + 3, "test").wait()
        time.sleep(0.2)  # the reserved message is there first
        comm.isend(np.full(4, 5, np.int64), 1, tag=7).wait()
        result = {}
    comm.barrier()  # rank 1's iprobe names rank 0, which must not have closed yet
    comm.close()
    return result


@pytest.mark.timeout(60)
def test_any_tag_receives_never_take_reserved_tags():
    res = run_world(2, reserved_tags_and_any_tag, timeout=50).check_ok()[1]
    assert res == {"any_tag": [7, 5, 5, 5, 5], "reserved": [9, 9, 9, 9], "probe_sees_reserved": False}, res
