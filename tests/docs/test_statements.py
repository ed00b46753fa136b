"""Statements of fact the README and the manual make, checked against the code and the measured
summary they describe, so that a change to either shows up here rather than on the page."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import perf_page
from markdown_examples import REPO


def read(page: str) -> str:
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        return f.read()


def flat(text: str) -> str:
    """Prose with its line breaks folded, so a phrase can be found across them."""
    return re.sub(r"\s+", " ", text)


def test_the_small_call_figures_of_the_readme_are_the_measured_ones():
    with open(os.path.join(REPO, "bench", "results", "summary.json")) as f:
        run = json.load(f)["runs"][0]
    p2, p4 = perf_page.small_call_range(run, "P2"), perf_page.small_call_range(run, "P4")
    claim = f"small calls (up to 512 B) in {p2} us on two ranks and {p4} us on four ranks sharing two CPUs"
    assert claim in flat(read("README.md")), f"the README should say: {claim}"
    assert run["machine"]["cpus"] == 2


# Rank 1's view under Slurm with a secret: the unique id it builds from the node list.
_SLURM_PORT = """
import os
os.environ.update(SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_STEP_ID="1234", SLURM_JOB_ID="7",
                  SLURM_STEP_NODELIST="127.0.0.1", RINGTREE_SECRET="9f3c1a7e5b2d8046c1e9a3f7b5d2086e")
os.environ.pop("RINGTREE_PORT", None)
from ringtree import _core, _launchers
rank, size, token, source = _launchers.from_slurm()
print(_core.UniqueId.parse(token).port)
"""


def test_the_slurm_port_default_is_what_every_page_says():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RINGTREE_"))}
    done = subprocess.run(
        [sys.executable, "-c", _SLURM_PORT], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert int(done.stdout) == 29400 + 1234 % 1000
    said = "29400 + the step id modulo 1000"
    pages = ["docs/settings.md", "docs/launching.md", "docs/security.md"]
    for page in pages:
        text = flat(read(page))
        assert said in text, f"{page} does not give RINGTREE_PORT's Slurm default as {said!r}"
    # Outside Slurm, 0 (the default) is any free port: no page may give another number.
    for page in [*pages, "docs/troubleshooting.md", "README.md"]:
        for m in re.finditer(r"RINGTREE_PORT[^.|]*?default[^.|]*", flat(read(page))):
            assert said in m.group(0) or "0" in m.group(0), f"{page}: {m.group(0)}"


def test_the_readme_tells_a_mismatch_from_a_bad_argument():
    text = flat(read("README.md"))
    assert "leaves the communicator usable" in text
    assert "`CollectiveMismatch` on every rank and abort the communicator" in text
    # The example behind the sentence: a bad argument leaves the communicator usable, a mismatch
    # aborts it (getting-started.md runs it on two ranks).
    guide = read("docs/getting-started.md")
    assert "# still usable" in guide and "assert comm.is_aborted" in guide


def _bytes(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    m = re.fullmatch(r"(\d+)([KMG]?)", text)
    return int(m.group(1)) * units[m.group(2)]


def test_the_readme_bench_sweeps_reach_their_largest_size():
    """-b B -e E -f F runs B, B*F, ... up to E: E must be one of those steps, or the sweep stops
    short of the size the command names (nccl-tests' rule)."""
    commands = re.findall(r"-b (\S+) -e (\S+) -f (\d+)", read("README.md"))
    assert len(commands) >= 2
    for b, e, f in commands:
        size, largest = _bytes(b), _bytes(e)
        while size < largest:
            size *= int(f)
        assert size == largest, f"-b {b} -e {e} -f {f} stops below {e}"


def test_prose_links_to_settings_name_declared_settings():
    from markdown_examples import markdown_pages

    import ringtree._settings as settings

    links = [(page, a) for page in markdown_pages() for a in re.findall(r"settings\.md#([a-z0-9_]+)", read(page))]
    assert len({a for _, a in links}) >= 20, "the pages should link the settings they name"
    for page, anchor in links:
        assert anchor.upper() in settings.TABLE, f"{page} links to settings.md#{anchor}, which is no setting"


def _cell_count(cell: str, n: int, p: int, is_root: bool):
    """A count the semantics table writes ("N", "N·P", "—", "x", "N·P, root only") as elements
    for block size n on p ranks; "x" (the input itself) holds no buffer of its own."""
    words = cell.split(",")
    if "root only" in cell and not is_root:
        return 0
    first = words[0].split(" (")[0].strip()
    return {"N": n, "N·P": n * p, "—": 0, "x": 0}[first]


def test_the_semantics_table_is_the_cores_description():
    import ringtree as rt

    rows = re.findall(r"^\| `(\w+)\(.*?\| (.*?) \| (.*?) \| .*\|$", read("docs/concepts.md"), re.M)
    checked = set()
    for name, inp, out in rows:
        if name in ("all_to_all_v", "send"):
            continue  # counts given per call; point to point
        info = rt.collective_info(name)
        for is_root in (True, False):
            want = (_cell_count(inp, 5, 3, is_root), _cell_count(out, 5, 3, is_root))
            assert tuple(info.buffer_sizes(5, 3, is_root)) == want, (name, is_root)
        checked.add(name)
    assert checked >= {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast"} | {
        "reduce",
        "gather",
        "scatter",
        "barrier",
    }, checked
