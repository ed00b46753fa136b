"""Single-copy transfers on one host (transport/shm/cma.h): large collective messages between
ranks on one host are read straight out of the sender's memory with process_vm_readv.

Every collective that goes single-copy (all_gather, all_to_all, broadcast, scatter; and gather,
which stays two-copy) is checked against numpy below and above the threshold
(RINGTREE_CMA_MIN_BYTES, lowered here so small arrays cross it), in and out of place, with several
dtypes, at P=2, 3 and 4, with the path on and forced off; the count of single-copy messages shows
which path ran. When the probe
fails on one rank (the test hook RINGTREE_TEST_CMA_PROBE_FAIL) every rank falls back and says
why."""

from __future__ import annotations

import mmap
import os
import signal
import threading
import time
from fractions import Fraction

import numpy as np
import pytest
from harness import run_world
from rank_checks import run_case

import ringtree as rt

MIN_BYTES = 4096
HUGE_PAGE = 2 << 20
# (collective, algorithms): every schedule these collectives have on one host.
ROUTED = [
    ("all_gather", ["ring"]),
    ("all_to_all", ["direct"]),
    ("broadcast", ["tree", "ring", "direct"]),
    ("gather", ["auto"]),
    ("scatter", ["auto"]),
]
DTYPES = ["int8", "int32", "float16", "float64"]
# Elements per rank's block: messages well below MIN_BYTES for every dtype, and above it for
# every dtype (3001 x 1 byte is below 4096; 40_003 x 1 byte is above it, not divisible by P).
COUNTS = [3001 // 8, 40_003]


def routed_sweep():
    """Each routed collective x count x dtype x algorithm x placement x root, against numpy;
    returns the failures, the status and how many messages this rank received single-copy."""
    comm = rt.init()
    P = comm.size
    failures, checks = [], 0
    before = comm.status().single_copy_messages
    for coll, algos in ROUTED:
        rooted = coll in ("broadcast", "gather", "scatter")
        for N in COUNTS:
            for i, d in enumerate(DTYPES):
                for algo in algos:
                    for in_place in [False] if coll == "broadcast" else [False, True]:
                        root = (i % P) if rooted else 0
                        wrong, desc = run_case(comm, coll, N, d, "sum", algo, in_place, root, salt=i)
                        checks += 1
                        if wrong:
                            failures.append(f"{desc}: {wrong} wrong")
    # A reduction stays on the two-copy path: its receivers combine, they do not copy.
    x = np.arange(50_000, dtype=np.float64) + comm.rank
    mid = comm.status().single_copy_messages
    got = comm.all_reduce(x.copy(), algo="ring")
    want = sum(np.arange(50_000, dtype=np.float64) + q for q in range(P))
    if not np.array_equal(got, want):
        failures.append("all_reduce ring: wrong result")
    unrouted_messages = comm.status().single_copy_messages - mid
    # So does gather: its root copies every byte either way.
    mid = comm.status().single_copy_messages
    got = comm.gather(x, np.empty(x.size * P, x.dtype) if comm.rank == 0 else None, root=0)
    if comm.rank == 0 and not np.array_equal(
        got, np.concatenate([np.arange(50_000, dtype=np.float64) + q for q in range(P)])
    ):
        failures.append("gather: wrong result")
    unrouted_messages += comm.status().single_copy_messages - mid
    status, received = comm.status().single_copy, comm.status().single_copy_messages - before
    comm.close()
    return {
        "failures": failures,
        "checks": checks,
        "status": status,
        "received": received,
        "unrouted_messages": unrouted_messages,
    }


def small_only():
    """Only messages below the threshold: none may go single-copy."""
    comm = rt.init()
    for d in DTYPES:
        run = run_case(comm, "all_gather", 3001 // 8, d, "sum", "ring", False, 0, salt=1)
        assert run[0] == 0, run[1]
    out = {"status": comm.status().single_copy, "received": comm.status().single_copy_messages}
    comm.close()
    return out


@pytest.mark.parametrize("P", [2, 3, 4])
def test_routed_collectives_exact_with_single_copy(P):
    world = run_world(P, routed_sweep, env={"RINGTREE_CMA_MIN_BYTES": str(MIN_BYTES)}, timeout=240)
    world.check_ok()
    for r, res in enumerate(world.results):
        assert res["failures"] == [], f"rank {r}: {res['failures'][:5]}"
        assert res["checks"] > 0
        assert res["status"].startswith("on: "), res["status"]
        assert f"at least {MIN_BYTES} bytes" in res["status"]
        assert res["unrouted_messages"] == 0
    # Every rank receives large blocks in all_gather and all_to_all, so each read some single-copy.
    assert all(res["received"] > 0 for res in world.results), [res["received"] for res in world.results]


@pytest.mark.parametrize("P", [2, 4])
def test_routed_collectives_exact_with_single_copy_forced_off(P):
    world = run_world(P, routed_sweep, env={"RINGTREE_CMA": "0", "RINGTREE_CMA_MIN_BYTES": str(MIN_BYTES)}, timeout=240)
    world.check_ok()
    for r, res in enumerate(world.results):
        assert res["failures"] == [], f"rank {r}: {res['failures'][:5]}"
        assert res["status"].startswith("off: "), res["status"]
        assert "RINGTREE_CMA=0" in res["status"]
        assert res["received"] == 0


def test_messages_below_threshold_stay_two_copy():
    world = run_world(2, small_only, env={"RINGTREE_CMA_MIN_BYTES": str(MIN_BYTES)}, timeout=120)
    world.check_ok()
    for res in world.results:
        assert res["status"].startswith("on: "), res["status"]
        assert res["received"] == 0


@pytest.mark.parametrize("P,failing", [(2, 1), (3, 0)])
def test_failed_probe_on_one_rank_turns_it_off_everywhere(P, failing):
    """One rank's probe fails (the test hook): every rank on the host falls back, names that rank
    and the reason, and the results stay exact over the two-copy path."""
    env = {"RINGTREE_CMA_MIN_BYTES": str(MIN_BYTES), "RINGTREE_TEST_CMA_PROBE_FAIL": str(failing)}
    world = run_world(P, routed_sweep, env=env, timeout=240)
    world.check_ok()
    for r, res in enumerate(world.results):
        assert res["failures"] == [], f"rank {r}: {res['failures'][:5]}"
        assert res["status"].startswith(f"off: rank {failing}: "), res["status"]
        assert "RINGTREE_TEST_CMA_PROBE_FAIL" in res["status"]
        assert res["received"] == 0


def explain_line():
    comm = rt.init()
    text = rt.explain("all_gather", 1 << 20, comm=comm, file=None)
    comm.close()
    return text


def test_explain_reports_single_copy_state():
    world = run_world(2, explain_line, env={"RINGTREE_CMA": "0"}, timeout=120)
    world.check_ok()
    for text in world.results:
        assert "single-copy transfers on this host: off: rank " in text and "RINGTREE_CMA=0" in text, text


def repeat_until_raised(call, seconds):
    """Calls `call` (at least once) until it raises or `seconds` have passed: how that ended."""
    start = time.monotonic()
    try:
        call()
        while time.monotonic() - start < seconds:
            call()
        return {"raised": None}
    except rt.Error as exc:
        return {"raised": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}


def kill_during(coll, algo="auto", victim=1):
    """The victim SIGKILLs itself in the middle of a run of large single-copy calls (it may die
    while a peer reads its buffer, or while its peers wait for it to read theirs); the others must
    raise PeerFailure naming it, long before the collective timeout."""
    comm = rt.init(timeout=60)
    assert comm.status().single_copy.startswith("on: "), comm.status().single_copy
    n = 1 << 21
    x = np.ones(n, np.float32)
    out = np.empty(n * comm.size, np.float32)
    call = {
        "all_gather": lambda: comm.all_gather(x, out),
        "all_to_all": lambda: comm.all_to_all(out, np.empty_like(out)),
        "broadcast": lambda: comm.broadcast(out, root=0, algo=algo),
    }[coll]
    call()
    comm.barrier()  # every rank is done with the first call (a flat broadcast's root finishes last)
    if comm.rank == victim:
        threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    return repeat_until_raised(call, 30)


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "coll,algo,P",
    [("all_gather", "auto", 3), ("all_to_all", "auto", 3), ("broadcast", "auto", 3), ("broadcast", "direct", 4)],
)
def test_sigkill_mid_single_copy_is_reported_fast_on_every_rank(coll, algo, P):
    # The threshold under a broadcast's segments, so that every one of them goes single-copy.
    env = {"RINGTREE_CMA_MIN_BYTES": str(MIN_BYTES)}
    world = run_world(P, kill_during, dict(coll=coll, algo=algo), env=env, timeout=120)
    assert world.returncodes[1] == -9, world.failure_report()
    for rank in [q for q in range(P) if q != 1]:
        res = world.results[rank]
        assert res is not None and world.returncodes[rank] == 0, world.failure_report()
        assert res["raised"] == "PeerFailure", res
        assert res["seconds"] < 15, res
        assert f"{coll} #" in res["message"], res["message"]


UNREAD_TIMEOUT = 2.0  # the root's per-call timeout
UNREAD_AWAY = 4 * UNREAD_TIMEOUT  # how long rank 1 stays away before it leaves


def unread_broadcast(timeout=UNREAD_TIMEOUT):
    """Rank 1 stops calling collectives. The root of a broadcast only sends, single-copy: its call
    must wait for rank 1 to read its buffer and so time out (not return early, not hang)."""
    comm = rt.init()
    x = np.ones(1 << 17, np.float32)  # 512 KiB: above a one-shot slot (256 KiB), inside one ring
    comm.broadcast(x, root=0)
    if comm.rank == 1:
        time.sleep(UNREAD_AWAY)
        return {"raised": None}
    res = repeat_until_raised(lambda: comm.broadcast(x, root=0, timeout=timeout), 0)
    res["single_copy"] = comm.status().single_copy
    return res


@pytest.mark.timeout(120)
def test_unacknowledged_single_copy_send_times_out():
    world = run_world(2, unread_broadcast, env={"RINGTREE_CMA_MIN_BYTES": str(MIN_BYTES)}, timeout=100)
    res = world.check_ok()[0]
    assert res["single_copy"].startswith("on: "), res
    assert res["raised"] == "Timeout", res
    # Not before its timeout (an early return would mean the root did not wait for the read), and
    # well before rank 1 leaves (then it would be a PeerFailure, or a hang).
    assert 0.75 * UNREAD_TIMEOUT < res["seconds"] < UNREAD_AWAY, res
    assert "broadcast #" in res["message"] and "rank 1" in res["message"], res["message"]


def reuse_after_return(rounds=40):
    """The root rewrites its buffer the moment each broadcast returns: if a call returned before
    the receiver had read the root's memory, the receiver would see the next round's values."""
    comm = rt.init()
    x = np.empty(1 << 16, np.float32)
    wrong = 0
    for k in range(rounds):
        if comm.rank == 0:
            x.fill(k)
        comm.broadcast(x, root=0)
        if comm.rank == 0:
            x.fill(-1.0)  # the caller's next use of its buffer
        elif not (x == k).all():
            wrong += 1
    received = comm.status().single_copy_messages
    comm.close()
    return {"wrong": wrong, "single_copy_messages": received}


@pytest.mark.timeout(120)
def test_a_sender_may_reuse_its_buffer_when_the_call_returns():
    ranks = run_world(2, reuse_after_return, env={"RINGTREE_CMA_MIN_BYTES": str(MIN_BYTES)}, timeout=100).check_ok()
    assert ranks[1]["single_copy_messages"] >= 40, ranks  # the receiver read the root's memory
    assert [r["wrong"] for r in ranks] == [0, 0], ranks


def broadcast_messages(nbytes, algo):
    """Single-copy messages each rank received in one broadcast of nbytes from rank 0."""
    comm = rt.init(timeout=60)
    x = np.arange(nbytes // 4, dtype=np.float32) if comm.rank == 0 else np.zeros(nbytes // 4, np.float32)
    before = comm.status().single_copy_messages
    comm.broadcast(x, root=0, algo=algo)
    got = comm.status().single_copy_messages - before
    exact = bool(np.array_equal(x, np.arange(nbytes // 4, dtype=np.float32)))
    comm.close()
    return {"received": got, "exact": exact}


@pytest.mark.parametrize(
    "P,algo,depth_one",
    [(2, "tree", True), (2, "ring", True), (3, "tree", True), (3, "ring", False), (4, "tree", False)],
)
def test_a_broadcast_of_depth_one_goes_in_single_copy_sized_segments(P, algo, depth_one):
    """Where every receiver reads from the root, a broadcast is cut into segments of the
    single-copy size (one read each), not into the pipeline's 128 KiB; deeper trees keep the
    pipeline's segments."""
    nbytes = 1 << 20
    world = run_world(
        P,
        broadcast_messages,
        dict(nbytes=nbytes, algo=algo),
        env={"RINGTREE_CMA_MIN_BYTES": str(MIN_BYTES)},
        timeout=120,
    )
    results = world.check_ok()
    assert all(res["exact"] for res in results)
    segments = nbytes // MIN_BYTES if depth_one else nbytes // (128 << 10)
    assert [res["received"] for res in results] == [0] + [segments] * (P - 1)


def _smaps_kib(addr):
    """Rss and AnonHugePages (KiB) of the mapping that holds `addr` (/proc/self/smaps)."""
    kib = {}
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head in ("Rss:", "AnonHugePages:"):
                kib[head] = int(line.split()[1])
    return kib.get("Rss:", 0), kib.get("AnonHugePages:", 0)


def paged_array(elems, huge):
    """A float32 array of `elems` zeros on memory of its own, asked for huge pages (madvise) or
    kept off them, aligned to a huge page; and whether it got what it asked for: every byte on huge
    pages, or none (/proc/self/smaps; no huge page where THP is off or none was free)."""
    return part_paged_array(elems, 0 if huge else elems * 4, small_first=True)


def part_paged_array(elems, small_bytes, small_first):
    """A float32 array of `elems` zeros, aligned to a huge page, whose first (small_first) or last
    `small_bytes` (a multiple of the huge page, or all of it) lie on 4 KiB pages and the rest on
    huge pages, as an array that starts inside a huge page has its head on small ones; and whether
    the kernel gave each part the pages asked for."""
    nbytes = elems * 4
    # Room past the end, so the huge part's last huge page lies whole inside the mapping.
    m = mmap.mmap(-1, nbytes + 2 * HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = np.frombuffer(m, np.uint8)  # the array keeps the mapping alive
    start = (-base.ctypes.data) % HUGE_PAGE
    split = start + (small_bytes if small_first else nbytes - small_bytes)
    small, huge = mmap.MADV_NOHUGEPAGE, mmap.MADV_HUGEPAGE
    first, second = (small, huge) if small_first else (huge, small)
    if split > 0:
        m.madvise(first, 0, split)  # two mappings, one on each side of the split
    m.madvise(second, split, len(m) - split)
    a = base[start : start + nbytes].view(np.float32)
    a[:] = 0
    small_start = start if small_first else split
    huge_start = split if small_first else start
    small_on_huge_kib = _smaps_kib(base.ctypes.data + small_start)[1] if small_bytes else 0
    huge_kib = _smaps_kib(base.ctypes.data + huge_start)[1] if small_bytes < nbytes else 0
    return a, small_on_huge_kib == 0 and huge_kib * 1024 >= nbytes - small_bytes


def all_to_all_and_all_gather_paths(cpus_of_rank, huge=True, block_bytes=512 << 10):
    """Pins this rank to its CPUs before set-up, then runs an all_to_all, an all_to_all_v and an
    all_gather whose blocks are block_bytes (512 KiB: between the automatic thresholds), from and into buffers
    on huge pages (or small ones), against numpy; returns how many messages each received
    single-copy, the status, and whether every buffer got the pages it asked for."""
    rank = int(os.environ["RINGTREE_RANK"])
    os.sched_setaffinity(0, cpus_of_rank[rank])
    comm = rt.init()
    P = comm.size
    N = block_bytes // 4  # float32 elements per block
    x, x_as_asked = paged_array(N * P, huge)
    out, out_as_asked = paged_array(N * P, huge)
    paged_as_asked = x_as_asked and out_as_asked
    x[:] = np.arange(N * P, dtype=np.float32) + 1000 * rank
    # all_to_all_v (the torch backend's all_to_all_single) follows all_to_all's threshold.
    want = {
        "all_to_all": np.concatenate(
            [np.arange(rank * N, (rank + 1) * N, dtype=np.float32) + 1000 * q for q in range(P)]
        ),
        "all_gather": np.concatenate([np.arange(N, dtype=np.float32) + 1000 * q for q in range(P)]),
    }
    want["all_to_all_v"] = want["all_to_all"]
    calls = {
        "all_to_all": lambda: comm.all_to_all(x, out),
        "all_to_all_v": lambda: comm.all_to_all_v(x, out, [N] * P, [N] * P),
        "all_gather": lambda: comm.all_gather(x[:N], out),
    }
    received, failures = {}, []
    for coll, call in calls.items():
        out[:] = -1
        before = comm.status().single_copy_messages
        call()
        received[coll] = comm.status().single_copy_messages - before
        if not np.array_equal(out, want[coll]):
            failures.append(f"{coll}: wrong result")
    status = comm.status().single_copy
    cache_bytes = int(comm.status().machine["l3_KiB"] * 1024)
    comm.close()
    return {
        "received": received,
        "failures": failures,
        "status": status,
        "paged_as_asked": paged_as_asked,
        "cache_bytes": cache_bytes,
    }


def skip_without_huge_pages(results):
    if not all(res["paged_as_asked"] for res in results):
        pytest.skip("the kernel gave no huge pages to a buffer that asked (THP off, or none free)")


def _allowed_cpus():
    return sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize("huge", [True, False], ids=["huge-pages", "small-pages"])
@pytest.mark.parametrize("setting", ["auto", "1048576"])
def test_all_to_all_goes_single_copy_from_256_kib_where_ranks_share_a_core(setting, huge):
    """Four ranks allowed one CPU: with the automatic threshold their all_to_all blocks of 512 KiB
    go single-copy (a second copy would take the core another rank waits for), from huge pages or
    small ones, all_gather's stay two-copy; a threshold set by hand holds for both."""
    cpu = _allowed_cpus()[0]
    env = {} if setting == "auto" else {"RINGTREE_CMA_MIN_BYTES": setting}
    args = dict(cpus_of_rank=[[cpu]] * 4, huge=huge)
    world = run_world(4, all_to_all_and_all_gather_paths, args, env=env, timeout=120)
    results = world.check_ok()
    if huge:
        skip_without_huge_pages(results)
    for r, res in enumerate(results):
        assert res["failures"] == [], (r, res)
        assert res["received"]["all_gather"] == 0, (r, res)
        if setting == "auto":
            assert res["received"]["all_to_all"] == 3, (r, res)  # one block from each peer
            assert res["received"]["all_to_all_v"] == 3, (r, res)
            assert "(all_to_all: 262144, ranks outnumber cores) (RINGTREE_CMA_MIN_BYTES auto)" in res["status"]
            want = "(but a broadcast's, and an all_to_all's whose output does not stream: ranks outnumber cores)"
            assert want in res["status"], res["status"]
        else:
            assert res["received"]["all_to_all"] == res["received"]["all_to_all_v"] == 0, (r, res)
            assert "at least 1048576 bytes (RINGTREE_CMA_MIN_BYTES)" in res["status"], res["status"]


def test_ranks_pinned_to_a_core_each_keep_the_1_mib_threshold():
    """Two ranks on a CPU each are not short of cores, whatever each one's CPU count says."""
    cpus = _allowed_cpus()
    if len(cpus) < 2:
        pytest.skip(f"needs two CPUs to pin two ranks apart; this process may use {cpus}")
    world = run_world(2, all_to_all_and_all_gather_paths, dict(cpus_of_rank=[[cpus[0]], [cpus[1]]]), timeout=120)
    for r, res in enumerate(world.check_ok()):
        assert res["failures"] == [], (r, res)
        assert res["received"] == {"all_to_all": 0, "all_gather": 0, "all_to_all_v": 0}, (r, res)
        assert "at least 1048576 bytes (RINGTREE_CMA_MIN_BYTES auto) between the 2 ranks" in res["status"]
        ring_from = f"broadcasts of {res['cache_bytes']} bytes or more (the last-level cache) use the ring"
        assert ring_from in res["status"], res["status"]
        assert "a message mostly on small pages uses the ring;" in res["status"], res["status"]


@pytest.mark.parametrize("huge", [True, False], ids=["huge-pages", "small-pages"])
def test_an_all_to_all_whose_output_streams_reads_small_pages_through_the_ring(huge):
    """Four ranks allowed one CPU, outputs streaming from 1 MiB: the ring's receiver writes a 2 MiB
    output around the cache (the kernel's single copy does not), so from small pages the blocks
    take the ring; from huge pages they are still read single-copy."""
    cpu = _allowed_cpus()[0]
    env = {"RINGTREE_STREAM_BYTES": str(1 << 20)}
    args = dict(cpus_of_rank=[[cpu]] * 4, huge=huge)
    results = run_world(4, all_to_all_and_all_gather_paths, args, env=env, timeout=120).check_ok()
    if huge:
        skip_without_huge_pages(results)
    for r, res in enumerate(results):
        assert res["failures"] == [], (r, res)
        three = 3 if huge else 0  # one block from each peer
        assert res["received"] == {"all_to_all": three, "all_gather": 0, "all_to_all_v": three}, (r, res)


@pytest.mark.parametrize("huge", [True, False], ids=["huge-pages", "small-pages"])
def test_a_message_from_small_pages_takes_the_ring(huge):
    """process_vm_readv pins every page it reads: blocks of 2 MiB (above the 1 MiB threshold) go
    single-copy from huge pages and through the ring from small ones; exact either way."""
    cpus = _allowed_cpus()
    if len(cpus) < 2:
        pytest.skip(f"needs two CPUs to pin two ranks apart; this process may use {cpus}")
    args = dict(cpus_of_rank=[[cpus[0]], [cpus[1]]], huge=huge, block_bytes=2 << 20)
    results = run_world(2, all_to_all_and_all_gather_paths, args, timeout=120).check_ok()
    if huge:
        skip_without_huge_pages(results)
    for r, res in enumerate(results):
        assert res["failures"] == [], (r, res)
        one = 1 if huge else 0  # one block from the one peer
        assert res["received"] == {"all_to_all": one, "all_gather": one, "all_to_all_v": one}, (r, res)


def all_gather_from_part_small_pages(cpus_of_rank, block_bytes, small_bytes, small_first, lead):
    """Pins this rank to its CPUs before set-up, then all_gathers the block_bytes of a mapping whose
    first (small_first) or last small_bytes lie on 4 KiB pages, less its first `lead` float32
    elements; returns how many messages it received single-copy, whether the result was exact,
    and whether the kernel gave the pages asked for."""
    rank = int(os.environ["RINGTREE_RANK"])
    os.sched_setaffinity(0, cpus_of_rank[rank])
    comm = rt.init(timeout=60)
    N = block_bytes // 4 - lead
    x, paged_as_asked = part_paged_array(N + lead, small_bytes, small_first)
    x = x[lead:]
    x[:] = np.arange(N, dtype=np.float32) + 1000 * rank
    out = np.full(N * comm.size, -1, np.float32)
    before = comm.status().single_copy_messages
    comm.all_gather(x, out)
    received = comm.status().single_copy_messages - before
    want = np.concatenate([np.arange(N, dtype=np.float32) + 1000 * q for q in range(comm.size)])
    exact = bool(np.array_equal(out, want))
    comm.close()
    return {"received": received, "exact": exact, "paged_as_asked": paged_as_asked}


KIB = 1 << 10


@pytest.mark.parametrize(
    "mapped_kib,small_kib,small_first,lead_kib,single_copy",
    [
        (4096, 2048, True, 0, True),
        (2560, 2048, True, 512, False),
        (8192, 2048, False, 0, True),
        (8192, 6144, False, 0, False),
    ],
    ids=["half-small-head", "mostly-small-head", "quarter-small-tail", "mostly-small-tail"],
)
def test_a_message_at_least_half_on_huge_pages_goes_single_copy(
    mapped_kib, small_kib, small_first, lead_kib, single_copy
):
    """An array that starts inside a huge page has its head on 4 KiB pages: a message at least half
    on huge pages is still read single-copy (faster than the ring), one mostly on small pages, at
    its head or its tail, takes the ring; exact either way."""
    cpus = _allowed_cpus()
    if len(cpus) < 2:
        pytest.skip(f"needs two CPUs to pin two ranks apart; this process may use {cpus}")
    args = dict(
        cpus_of_rank=[[cpus[0]], [cpus[1]]],
        block_bytes=mapped_kib * KIB,
        small_bytes=small_kib * KIB,
        small_first=small_first,
        lead=lead_kib * KIB // 4,
    )
    results = run_world(2, all_gather_from_part_small_pages, args, timeout=120).check_ok()
    skip_without_huge_pages(results)
    assert [res["exact"] for res in results] == [True, True], results
    assert [res["received"] for res in results] == [int(single_copy)] * 2, results


def pinned_broadcasts(cpus_of_rank, sizes, huge):
    """Pins this rank to its CPUs before set-up, then broadcasts each size from rank 0 (auto) in a
    buffer on huge pages (or small ones); returns [size, single-copy messages this rank received,
    data exact] per size, and whether every buffer got the pages it asked for. A size given as a
    string is that fraction of the last-level cache the machine figures report ("1/4")."""
    rank = int(os.environ["RINGTREE_RANK"])
    os.sched_setaffinity(0, cpus_of_rank[rank])
    comm = rt.init(timeout=60)
    cache_bytes = int(comm.status().machine["l3_KiB"] * 1024)
    out, paged_as_asked = [], True
    for size in sizes:
        nbytes = size if isinstance(size, int) else int(cache_bytes * Fraction(size)) // 4096 * 4096
        want = np.arange(nbytes // 4, dtype=np.float32) * 3 + nbytes
        x, as_asked = paged_array(nbytes // 4, huge)
        paged_as_asked &= as_asked
        if comm.rank == 0:
            x[:] = want
        before = comm.status().single_copy_messages
        comm.broadcast(x, root=0)
        out.append([nbytes, comm.status().single_copy_messages - before, bool(np.array_equal(x, want))])
    comm.close()
    return {"broadcasts": out, "paged_as_asked": paged_as_asked, "cache_bytes": cache_bytes}


def test_a_broadcast_past_the_cache_goes_through_the_ring_where_every_rank_has_a_core():
    """The root of a broadcast has nothing else to do: from the size of the last-level cache, with
    a core for each rank, the ring's two copies stream from and to memory on two cores at once
    (a single copy puts it all on the receiver's core); below that, from huge pages, one read per
    1 MiB segment."""
    cpus = _allowed_cpus()
    if len(cpus) < 2:
        pytest.skip(f"needs two CPUs to pin two ranks apart; this process may use {cpus}")
    args = dict(cpus_of_rank=[[cpus[0]], [cpus[1]]], sizes=["1/4", "1"], huge=True)
    results = run_world(2, pinned_broadcasts, args, timeout=120).check_ok()
    skip_without_huge_pages(results)
    cache = results[0]["cache_bytes"]
    assert results[1]["cache_bytes"] == cache, results
    quarter = cache // 4 // 4096 * 4096
    segments = -(-quarter // (1 << 20))  # 1 MiB segments, the last one shorter
    assert results[1]["broadcasts"] == [[quarter, segments, True], [cache, 0, True]], results
    assert results[0]["broadcasts"] == [[quarter, 0, True], [cache, 0, True]], results


def test_ranks_sharing_a_core_read_a_broadcast_single_copy_even_from_small_pages():
    """Where ranks share a core the ring's second copy takes the core the other rank waits for:
    an 8 MiB broadcast from small pages stays single-copy (in 1 MiB segments)."""
    cpu = _allowed_cpus()[0]
    args = dict(cpus_of_rank=[[cpu], [cpu]], sizes=[8 << 20], huge=False)
    results = run_world(2, pinned_broadcasts, args, timeout=120).check_ok()
    assert results[1]["broadcasts"] == [[8 << 20, 8, True]], results


def root_paged_broadcasts(cpus_of_rank, nbytes, cases):
    """Pins this rank to its CPUs before set-up, then broadcasts nbytes (auto) for each (root,
    root_huge) of `cases`: the root's buffer on huge pages (or small ones), every other rank's on
    the other kind. Returns per case the algorithm this rank's flight record names, the
    single-copy messages it received and whether its data are exact; and whether every buffer
    got the pages it asked for."""
    rank = int(os.environ["RINGTREE_RANK"])
    os.sched_setaffinity(0, cpus_of_rank[rank])
    comm = rt.init(timeout=60)
    out, paged_as_asked = [], True
    for i, (root, root_huge) in enumerate(cases):
        x, as_asked = paged_array(nbytes // 4, root_huge if rank == root else not root_huge)
        paged_as_asked &= as_asked
        want = np.arange(nbytes // 4, dtype=np.float32) * (i + 2) + root
        if rank == root:
            x[:] = want
        before = comm.status().single_copy_messages
        comm.broadcast(x, root=root)
        algo = comm.record()["calls"][-1]["algo"]
        out.append([algo, comm.status().single_copy_messages - before, bool(np.array_equal(x, want))])
    status = comm.status()
    explained = rt.explain("broadcast", nbytes, comm, file=None).splitlines()[-1]
    comm.close()
    return {
        "broadcasts": out,
        "paged_as_asked": paged_as_asked,
        "status": status.single_copy,
        "asks": list(status.broadcast_asks_root),
        "cache_bytes": int(status.machine["l3_KiB"] * 1024),
        "explained": explained,
    }


def test_a_broadcast_where_ranks_share_a_core_follows_the_root_s_pages():
    """Four ranks allowed one CPU: a 2 MiB broadcast whose root holds it on huge pages runs the
    flat tree, every receiver reading the root's buffer single-copy (two 1 MiB segments); from
    the root's small pages the binary tree through the ring. Only the root's pages decide: every
    other rank's buffer is on the other kind, and every rank runs the same algorithm."""
    cpu = _allowed_cpus()[0]
    cases = [(0, True), (0, False), (2, True), (3, False), (1, True)]
    args = dict(cpus_of_rank=[[cpu]] * 4, nbytes=2 << 20, cases=cases)
    results = run_world(4, root_paged_broadcasts, args, timeout=120).check_ok()
    if "asks its root first" not in results[0]["status"]:
        pytest.skip(f"transparent huge pages are off on this host: {results[0]['status']}")
    skip_without_huge_pages(results)
    for r, res in enumerate(results):
        assert res["asks"] == [1 << 20, res["cache_bytes"]], res
        assert f"a broadcast of 1048576 bytes or more, below {res['cache_bytes']} " in res["status"], res["status"]
        assert res["explained"].startswith("  but first asks the root"), res["explained"]
        for (root, root_huge), (algo, received, exact) in zip(cases, res["broadcasts"]):
            assert exact, (r, root, root_huge)
            assert algo == ("direct" if root_huge else "tree"), (r, root, root_huge, algo)
            assert received == (2 if root_huge and r != root else 0), (r, root, root_huge, received)


WITHDRAW_TIMEOUT = 1.0  # the root's timeout in the scenario below
WITHDRAW_AWAY = 3.0  # how long rank 1 stays away from the broadcast


def read_after_the_root_gave_up(how):
    """The root's single-copy broadcast fails before rank 1 reads it (its timeout, or comm.abort()
    from another thread), and the root then does what a caller may do with a buffer once the call
    has returned: rewrite it, or free it. Rank 1 then arrives to read: it must raise, naming its
    call, and never return the rewritten values (nor fail with an untyped error)."""
    comm = rt.init(timeout=30)
    assert comm.status().single_copy.startswith("on: "), comm.status().single_copy
    n = 1 << 20  # 4 MiB: single-copy under the lowered threshold, freed with munmap by numpy
    x = np.full(n, 1.0, np.float32) if comm.rank == 0 else np.zeros(n, np.float32)
    comm.broadcast(x, root=0)  # a first call that completes: both ranks are past set-up
    if comm.rank == 0:
        if how == "abort":
            threading.Timer(WITHDRAW_TIMEOUT, comm.abort).start()
        res = repeat_until_raised(
            lambda: comm.broadcast(x, root=0, timeout=30 if how == "abort" else WITHDRAW_TIMEOUT), 0
        )
        if how == "freed":
            del x
        else:
            x.fill(-1.0)
        time.sleep(WITHDRAW_AWAY + 3.0)  # stays alive (its memory mapped) while rank 1 reads
        return res
    time.sleep(WITHDRAW_AWAY)
    x.fill(0.0)
    res = repeat_until_raised(lambda: comm.broadcast(x, root=0), 0)
    if res["raised"] is None:  # what a call that raised wrote to its output is unspecified
        res["minus_ones"] = int((x == -1.0).sum())
    return res


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["rewritten", "freed", "abort"])
def test_a_failed_sender_withdraws_its_buffer_and_its_reader_raises(how):
    world = run_world(
        2, read_after_the_root_gave_up, dict(how=how), env={"RINGTREE_CMA_MIN_BYTES": str(MIN_BYTES)}, timeout=100
    )
    root, reader = world.check_ok()
    assert root["raised"] == ("Aborted" if how == "abort" else "Timeout"), root
    assert reader["raised"] == ("Aborted" if how == "abort" else "Timeout"), reader  # the root's reason
    assert "broadcast #" in reader["message"] and "on rank 1" in reader["message"], reader["message"]
