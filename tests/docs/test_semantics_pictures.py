"""The manual's pictures of each collective (docs/semantics_page.py) are what the code does: the
committed page and SVGs are what the script makes now, each picture's buffers have the sizes the
core reports, and a real 3-rank run of every call, fed a picture's "before" values, ends with
exactly its "after" values."""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest
from harness import run_world
from markdown_examples import REPO

import ringtree as rt

sys.path.insert(0, os.path.join(REPO, "docs"))
try:
    import semantics_page
finally:
    sys.path.pop(0)

PICTURES = semantics_page.pictures()


def _array(values, size):
    return np.array(values if values is not None else [0] * size, np.int64)


def run_every_picture() -> dict:
    """Rank body: each picture's call on this rank with the picture's inputs; the outputs as
    lists (None where the rank has no output). Output sizes come from the core, not the picture."""
    comm = rt.init()
    r, P, root = comm.rank, comm.size, semantics_page.ROOT
    assert P == semantics_page.P
    got = {}
    for pic in semantics_page.pictures():
        x = None if pic.before[r] is None else np.array(pic.before[r], np.int64)
        if pic.name == "all_to_all_v":
            send = list(pic.send_counts[r])
            recv = [pic.send_counts[i][r] for i in range(P)]
            out = np.zeros(sum(recv), np.int64)
            comm.all_to_all_v(x, out, send, recv)
        elif pic.name == "send_recv":
            out = None
            if r == 0:
                comm.send(x, 1)
            elif r == 1:
                out = np.zeros(semantics_page.N, np.int64)
                comm.recv(out, 0)
        elif pic.name == "sendrecv":
            out = np.zeros(semantics_page.N, np.int64)
            comm.sendrecv(x, (r + 1) % P, out, (r - 1) % P)
        elif pic.name == "broadcast":
            comm.broadcast(x, root=root)
            out = x
        else:
            n_out = rt.collective_info(pic.name).buffer_sizes(semantics_page.N, P, r == root)[1]
            out = np.zeros(n_out, np.int64) if n_out else None
            if pic.name in ("reduce", "gather", "scatter"):
                getattr(comm, pic.name)(x, out, root=root)
            else:
                getattr(comm, pic.name)(x, out)
        got[pic.name] = None if out is None else out.tolist()
    comm.barrier()
    return got


@pytest.mark.timeout(120)
def test_a_real_run_ends_as_every_picture_shows():
    results = run_world(semantics_page.P, run_every_picture, timeout=110).check_ok()
    for pic in PICTURES:
        for r, got in enumerate(results):
            assert got[pic.name] == (None if pic.after[r] is None else list(pic.after[r])), (pic.name, r, got)


def test_every_picture_has_the_buffer_sizes_the_core_reports():
    n, P, root = semantics_page.N, semantics_page.P, semantics_page.ROOT
    collectives = {p.name for p in PICTURES} - {"send_recv", "all_to_all_v", "sendrecv"}
    for pic in PICTURES:
        if pic.name not in collectives:
            continue
        for r in range(P):
            want_in, want_out = rt.collective_info(pic.name).buffer_sizes(n, P, r == root)
            if pic.name == "broadcast":  # one buffer: the input is the output
                want_out = want_in
            assert len(pic.before[r] or []) == want_in, (pic.name, r)
            assert len(pic.after[r] or []) == want_out, (pic.name, r)
    # Every collective has a picture, send and recv one together; barrier moves no data and
    # the page says so in words.
    covered = {p.name for p in PICTURES} | {"send", "recv", "barrier"}
    assert set(rt.collectives.COLLECTIVES) <= covered, set(rt.collectives.COLLECTIVES) - covered


def test_the_committed_page_and_pictures_are_the_scripts(tmp_path):
    semantics_page.write(str(tmp_path))
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    docs = os.path.join(REPO, "docs")
    committed = sorted(
        os.path.relpath(os.path.join(folder, f), docs)
        for folder, _, files in os.walk(os.path.join(docs, semantics_page.FOLDER))
        for f in files
    )
    assert [str(p) for p in made if str(p) != "semantics.md"] == committed
    for rel in made:
        with open(os.path.join(docs, rel)) as f:
            assert f.read() == (tmp_path / rel).read_text(), f"docs/{rel} is stale: python docs/semantics_page.py"


def test_each_picture_shows_its_values():
    # The SVG's numbers, row by row, are the picture's data: what the reader sees is what was run.
    for pic in PICTURES:
        text = semantics_page.svg(pic)
        shown = [int(v) for v in re.findall(r'class="v">(-?\d+)<', text)]
        data = []
        for r in range(semantics_page.P):
            data += list(pic.before[r] or []) + list(pic.after[r] or [])
        assert shown == data, pic.name
        assert text.count("no buffer") == sum(v is None for v in pic.before + pic.after), pic.name
