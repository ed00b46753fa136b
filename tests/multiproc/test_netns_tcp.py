"""The TCP transport between real, separate network stacks: emulated hosts of one rank each
(network namespaces joined by a bridge, bench/rtbench/netns.py), so every byte crosses TCP. The
five main collectives run against numpy at sizes that outgrow the socket buffers and the
reduction staging buffer, with the transport's settings shrunk so that reads end mid-element and
mid-message (an odd staging size, 4 KiB socket buffers), and with its defaults. Bad settings are
refused on every rank before any traffic. Needs root and `ip netns`; skips, saying why, without."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from harness import run_world
from rank_checks import run_case

import ringtree as rt
from rtbench import netns

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
# (dtype, op): 1-, 2-, 4- and 8-byte elements; integers and min/max are exact.
DTYPE_OPS = [
    ("int32", "sum"),
    ("float16", "max"),
    ("float64", "sum"),
    ("int8", "min"),
    ("bfloat16", "sum"),
    ("int64", "prod"),
]
# Small buffers everywhere: an odd staging size splits elements across reads, and 4 KiB socket
# buffers make every large message arrive in many partial reads.
SHRUNK = {"RINGTREE_TCP_STAGING_BYTES": "4099", "RINGTREE_TCP_SOCKBUF": "4096"}


def flat_algos(coll):
    """Every flat algorithm the collective has, and auto."""
    return [rt._core.ALGOS[a] for a in rt._core.supported_algos(rt._core.COLLECTIVES.index(coll))] + ["auto"]


def sweep(counts):
    comm = rt.init(timeout=40.0)
    P, failures, checks, i = comm.size, [], 0, 0
    for coll in COLLECTIVES:
        for algo in flat_algos(coll):
            for N in counts:
                dtype, op = DTYPE_OPS[i % len(DTYPE_OPS)]
                i += 1
                wrong, desc = run_case(comm, coll, N, dtype, op, algo, in_place=i % 2 == 0, root=i % P, salt=i)
                checks += 1
                if wrong:
                    failures.append(f"{desc}: {wrong} wrong")
    transports = [comm.status().transports[q] if q != comm.rank else "self" for q in range(P)]
    comm.close()
    return {"checks": checks, "failures": failures, "transports": transports}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("settings", [{}, SHRUNK], ids=["defaults", "shrunk-buffers"])
@pytest.mark.parametrize("namespace_hosts", [2, 3], indirect=True, ids=["2hosts", "3hosts"])
def test_collectives_over_tcp_between_namespaces_match_numpy(namespace_hosts, settings):
    hosts = namespace_hosts
    P = len(hosts.names)
    # 1 and 7: single elements and remainders; 65537 and 700001: many messages larger than the
    # staging buffer and (shrunk) the socket buffers, odd so chunks split unevenly between ranks.
    counts = [1, 7, 65537, 700001]
    world = run_world(
        P,
        sweep,
        dict(counts=counts),
        timeout=140,
        env=settings,
        unique_id=rt.UniqueId.from_seed(hosts.addrs[0], 29561, uuid.uuid4().hex),
        per_rank_prefix=hosts.prefix,
    )
    for r, res in enumerate(world.check_ok()):
        assert not res["failures"], f"rank {r}: {res['failures']}"
        assert res["checks"] == sum(len(flat_algos(c)) for c in COLLECTIVES) * len(counts)
        assert all(kind == "tcp" for q, kind in enumerate(res["transports"]) if q != r), res["transports"]


def init_outcome():
    try:
        comm = rt.init(timeout=20.0)
    except rt.InvalidArgument as exc:
        return {"raised": "InvalidArgument", "message": str(exc)}
    except rt.Error as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}
    comm.close()
    return {"raised": None}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "name,value,says",
    [
        ("RINGTREE_TCP_SOCKBUF", "100", "RINGTREE_TCP_SOCKBUF must be 0"),
        ("RINGTREE_TCP_SOCKBUF", "-1", "RINGTREE_TCP_SOCKBUF must be 0"),
        ("RINGTREE_TCP_SOCKBUF", "4M", "is not an integer"),
        ("RINGTREE_TCP_STAGING_BYTES", "16", "RINGTREE_TCP_STAGING_BYTES must be"),
    ],
)
def test_bad_tcp_settings_are_refused_on_every_rank_before_traffic(name, value, says):
    # Checked before bootstrap: every rank raises at once, nobody waits for a peer.
    world = run_world(2, init_outcome, {}, timeout=50, env={name: value, "RINGTREE_TRANSPORT": "tcp"})
    for r, res in enumerate(world.check_ok()):
        assert res["raised"] == "InvalidArgument", (r, res)
        assert says in res["message"] and value in res["message"], (r, res)


def scatter_then_close(count):
    """The root scatters and closes its communicator at once: its data is still on the slow link
    (in its socket buffers) when its goodbye reaches the others. What it sent before it left must
    arrive, exactly, and not be taken for a failed peer."""
    comm = rt.init(timeout=60)
    P, r = comm.size, comm.rank
    root = 0
    whole = np.arange(count * P, dtype=np.float64)
    out = np.zeros(count, np.float64)
    comm.barrier()
    try:
        comm.scatter(whole if r == root else None, out, root=root)
    except rt.Error as exc:
        return {"raised": f"{type(exc).__name__}: {exc}", "wrong": None}
    finally:
        comm.close()
    return {"raised": None, "wrong": int((out != whole[r * count : (r + 1) * count]).sum())}


@pytest.mark.timeout(120)
def test_data_sent_before_a_peer_closed_still_arrives():
    try:
        with netns.emulated_hosts(3, rate="200mbit") as hosts:
            world = run_world(
                3,
                scatter_then_close,
                dict(count=1 << 18),  # 2 MiB a rank: about 80 ms on the capped link
                timeout=100,
                unique_id=rt.UniqueId.from_seed(hosts.addrs[0], 29562, uuid.uuid4().hex),
                per_rank_prefix=hosts.prefix,
            )
            for rank, res in enumerate(world.check_ok()):
                assert res == {"raised": None, "wrong": 0}, (rank, res)
    except netns.NetnsUnavailable as exc:
        pytest.skip(str(exc))
