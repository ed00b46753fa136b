"""Streaming stores into the shared-memory rings (RINGTREE_SHM_STREAM_STORES).

A sender copies each payload piece into its ring with plain stores, or with streaming stores that
go to memory; 'auto' times both on every ring and streams while that is clearly faster (which it is
when the two ranks' cores do not share a cache). Every setting must give exact results on every
collective that goes through the rings; the piece counter shows which stores ran; a bad setting
fails init with a clear error."""

from __future__ import annotations

import re

import numpy as np
import pytest
from harness import run_world

import ringtree as rt

# Elements per rank: several 64 KiB pieces and a ring (1 MiB) that wraps, not divisible by P.
COUNT = (3 << 20) // 8 + 5


def ring_sweep():
    comm = rt.init()
    P, r = comm.size, comm.rank
    rng = np.random.default_rng(7)
    inputs = [rng.integers(-1 << 20, 1 << 20, COUNT).astype(np.int64) for _ in range(P)]
    failures = []
    before = comm.status().streamed_pieces
    for dtype in (np.int64, np.float32):  # float32 of small integers sums exactly
        xs = [x.astype(dtype) for x in inputs]
        total = sum(xs)
        out = np.empty_like(xs[r])
        comm.all_reduce(xs[r], out, algo="ring")
        if not np.array_equal(out, total):
            failures.append(f"all_reduce {dtype.__name__}: {int((out != total).sum())} wrong")
        block = COUNT // P
        rs = np.empty(block, dtype)
        comm.reduce_scatter(xs[r][: block * P], rs, algo="ring")
        if not np.array_equal(rs, total[r * block : (r + 1) * block]):
            failures.append(f"reduce_scatter {dtype.__name__}: wrong")
        ag = np.empty(COUNT * P, dtype)
        comm.all_gather(xs[r], ag, algo="ring")
        if not np.array_equal(ag, np.concatenate(xs)):
            failures.append(f"all_gather {dtype.__name__}: wrong")
        bc = xs[r].copy()
        comm.broadcast(bc, root=P - 1, algo="ring")
        if not np.array_equal(bc, xs[P - 1]):
            failures.append(f"broadcast {dtype.__name__}: wrong")
    streamed = comm.status().streamed_pieces - before
    stores = comm.status().shm_stores
    explained = rt.explain("all_reduce", 4 << 20, comm=comm, file=None)
    comm.close()
    return {"failures": failures, "streamed": streamed, "stores": stores, "explained": explained}


# Single copy off, so all_gather and broadcast go through the rings too.
@pytest.mark.parametrize("setting", ["auto", "on", "off"])
@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.timeout(150)
def test_every_setting_gives_exact_results(setting, P):
    env = {"RINGTREE_SHM_STREAM_STORES": setting, "RINGTREE_CMA": "0"}
    ranks = run_world(P, ring_sweep, env=env, timeout=120).check_ok()
    for rank, res in enumerate(ranks):
        assert res["failures"] == [], (rank, res)
    streamed = [res["streamed"] for res in ranks]
    for rank, res in enumerate(ranks):
        # One ring to every other rank, each saying which stores it uses.
        peers = [q for q in range(P) if q != rank]
        assert all(f"ring to rank {q}: " in res["stores"] for q in peers), res["stores"]
        assert f"shared-memory stores: {res['stores']}" in res["explained"]
        if setting == "auto":  # the ring schedules send to the next rank only
            measured = (
                rf"ring to rank {(rank + 1) % P}: (plain|streaming) \(auto: plain \d+, streaming \d+ cycles per KiB\)"
            )
            assert re.search(measured, res["stores"]), res["stores"]
        else:
            word = "streaming" if setting == "on" else "plain"
            assert res["stores"].count(f"{word} (RINGTREE_SHM_STREAM_STORES={setting})") == len(peers) + 1, res[
                "stores"
            ]
    if setting == "off":
        assert streamed == [0] * P
    else:
        # 'on' streams every large piece; 'auto' tries streaming on its second measured piece
        # and then once every 128 at least, so both show on every rank.
        assert all(n > 0 for n in streamed), streamed


def bad_setting():
    try:
        rt.init()
    except rt.InvalidArgument as e:
        return {"error": str(e)}
    return {"error": None}


@pytest.mark.timeout(60)
def test_a_bad_setting_fails_init_on_every_rank_with_the_reason():
    ranks = run_world(2, bad_setting, env={"RINGTREE_SHM_STREAM_STORES": "sometimes"}, timeout=45).check_ok()
    for res in ranks:
        assert res["error"] and "RINGTREE_SHM_STREAM_STORES" in res["error"] and "sometimes" in res["error"], res


def first_lap_faults():
    """Minor page faults while 32 KiB ring all_reduces make the first lap of their 1 MiB rings."""
    import resource

    comm = rt.init()
    x = np.arange(8192, dtype=np.float32)
    out = np.empty_like(x)
    comm.all_reduce(x, out, algo="ring")  # the call's own first-use costs (schedule, buffers)
    comm.barrier()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(60):  # 60 x 16 KiB each way: most of a lap of each ring
        comm.all_reduce(x, out, algo="ring")
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    ok = bool(np.array_equal(out, x * comm.size))
    comm.close()
    return {"faults": faults, "ok": ok}


@pytest.mark.timeout(60)
def test_rings_are_mapped_before_the_first_lap():
    # Left to first touch, each 4 KiB of a ring faults once in the writer and once in the reader:
    # about 10 faults per call here (300+ over these calls), at 2 us each on a VM.
    for rank, res in enumerate(run_world(2, first_lap_faults, timeout=45).check_ok()):
        assert res["ok"], (rank, res)
        assert res["faults"] < 40, (rank, res)


def copies_into_large_outputs():
    """all_gather, all_to_all and gather copy the rank's own block into a large output (with
    streaming stores from RINGTREE_STREAM_BYTES up); every block must land exactly, odd sizes too."""
    comm = rt.init()
    P, r = comm.size, comm.rank
    failures = []
    for count in (40_001, 123_457):  # 160 KB and 494 KB of int32 a block: not multiples of a line
        xs = [np.arange(count, dtype=np.int32) * (q + 3) - q for q in range(P)]
        for algo in ("ring", "direct", "auto"):
            try:
                ag = comm.all_gather(xs[r], np.full(count * P, -7, np.int32), algo=algo)
            except rt.InvalidArgument:
                continue  # not an all_gather algorithm
            if not np.array_equal(ag, np.concatenate(xs)):
                failures.append(f"all_gather {algo} {count}: {int((ag != np.concatenate(xs)).sum())} wrong")
        send = np.concatenate([xs[r][:count] + 1000 * q for q in range(P)])
        a2a = comm.all_to_all(send, np.full(count * P, -7, np.int32))
        expected = np.concatenate([xs[q][:count] + 1000 * r for q in range(P)])
        if not np.array_equal(a2a, expected):
            failures.append(f"all_to_all {count}: {int((a2a != expected).sum())} wrong")
        got = comm.gather(xs[r], np.full(count * P, -7, np.int32) if r == 0 else None, root=0)
        if r == 0 and not np.array_equal(got, np.concatenate(xs)):
            failures.append(f"gather {count}: wrong")
    comm.close()
    return failures


@pytest.mark.parametrize("cma", ["1", "0"])
@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.timeout(120)
def test_own_blocks_copied_into_streamed_outputs_are_exact(cma, P):
    env = {"RINGTREE_STREAM_BYTES": "65536", "RINGTREE_CMA": cma, "RINGTREE_CMA_MIN_BYTES": "65536"}
    for rank, failures in enumerate(run_world(P, copies_into_large_outputs, env=env, timeout=100).check_ok()):
        assert failures == [], (rank, failures)


def output_stores():
    try:
        comm = rt.init()
    except rt.InvalidArgument as e:
        return {"error": str(e)}
    status = comm.status()
    comm.close()
    return {"error": None, "stores": status.shm_stores, "l3_bytes": int(status.machine["l3_KiB"] * 1024)}


@pytest.mark.parametrize("setting", ["auto", "65536", "0", "lots"])
@pytest.mark.timeout(60)
def test_outputs_stream_from_half_the_last_level_cache_or_the_setting(setting):
    """An output that fits in the cache beside its inputs is written with plain stores: by default
    streaming starts at half the last-level cache the machine figures report; a bad value fails
    init on every rank."""
    env = {} if setting == "auto" else {"RINGTREE_STREAM_BYTES": setting}
    for rank, res in enumerate(run_world(2, output_stores, env=env, timeout=45).check_ok()):
        if setting == "lots":
            assert "RINGTREE_STREAM_BYTES" in res["error"], (rank, res)
            continue
        assert res["error"] is None, (rank, res)
        want = {
            "auto": f"outputs: streaming stores from {res['l3_bytes'] // 2} bytes (RINGTREE_STREAM_BYTES auto: half",
            "65536": "outputs: streaming stores from 65536 bytes (RINGTREE_STREAM_BYTES)",
            "0": "outputs: plain stores (RINGTREE_STREAM_BYTES)",
        }[setting]
        assert want in res["stores"], (rank, res)
