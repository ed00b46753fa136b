"""Background CPU load beside a bench job (--background-load N), and the page state of buffers.

BackgroundLoad(n) starts n processes that spin on the CPU until stopped, so a job can be
timed on a machine that is also busy, as users' machines are. The processes must never
outlive the bench: they are stopped when the context exits (normally, on an exception, on
Ctrl-C), and each asks the kernel to kill it if its parent dies first (PR_SET_PDEATHSIG), which
covers a parent killed by SIGKILL or a crash.

page_state(buffers) reports the transparent-huge-page settings and how much of each buffer's
mappings the kernel backs with huge pages (AnonHugePages in /proc/self/smaps).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

THP_DIR = "/sys/kernel/mm/transparent_hugepage"
THP_MODES = ("always", "madvise", "never")

# The burner: tells its parent it runs (one byte on stdout), then spins. SIGTERM's default
# action ends it; no Python handler is involved, so a busy loop cannot delay it.
_BURNER = "import sys; sys.stdout.write('r'); sys.stdout.flush()\nwhile True:\n    pass\n"


def _die_with_parent():
    # Runs in the child between fork and exec: SIGKILL it when the parent thread exits.
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # noqa: BLE001 - without prctl the explicit stop still applies
        pass


def check_count(n) -> int:
    """n as a valid process count, else ValueError with the reason."""
    try:
        value = int(n)
    except (TypeError, ValueError):
        raise ValueError(f"--background-load needs a whole number of processes, got {n!r}") from None
    if value < 0:
        raise ValueError(f"--background-load must be >= 0, got {value}")
    if value > 256:
        raise ValueError(f"--background-load {value} is more processes than a bench should start (max 256)")
    return value


class BackgroundLoad:
    """Context manager: n CPU-burning processes for the duration of the block."""

    def __init__(self, n: int):
        self.n = check_count(n)
        self.procs: list[subprocess.Popen] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self):
        try:
            for _ in range(self.n):
                proc = subprocess.Popen(
                    [sys.executable, "-c", _BURNER],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    preexec_fn=_die_with_parent,
                )
                self.procs.append(proc)
            for proc in self.procs:  # each is spinning before the timed work starts
                if proc.stdout.read(1) != b"r":
                    raise RuntimeError(f"background load process {proc.pid} did not start")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


def describe(load: BackgroundLoad) -> str:
    if not load.n:
        return "none"
    return f"{load.n} CPU-burning process(es), pids {' '.join(map(str, load.pids))}"


# ------------------------------------------------------------------ page state


def read_thp(name: str = "enabled", thp_dir: str = THP_DIR) -> str | None:
    """The selected value of a THP setting ('always [madvise] never' -> 'madvise'), or None."""
    try:
        with open(os.path.join(thp_dir, name)) as fh:
            text = fh.read()
    except OSError:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return text.strip() or None


def set_thp(mode: str, thp_dir: str = THP_DIR) -> str:
    """Set THP 'enabled' to mode; returns the previous mode. ValueError with the reason if it
    cannot (unknown mode, not root, no such setting on this kernel)."""
    if mode not in THP_MODES:
        raise ValueError(f"--thp must be one of {', '.join(THP_MODES)}, got {mode!r}")
    path = os.path.join(thp_dir, "enabled")
    old = read_thp("enabled", thp_dir)
    if old is None:
        raise ValueError(f"--thp: {path} is not readable here (no transparent huge pages?)")
    if not os.access(path, os.W_OK):
        raise ValueError(f"--thp needs root: {path} is not writable by this user")
    try:
        with open(path, "w") as fh:
            fh.write(mode)
    except OSError as exc:
        raise ValueError(f"--thp: cannot write {path}: {exc}") from None
    if read_thp("enabled", thp_dir) != mode:
        raise ValueError(f"--thp: wrote {mode!r} to {path} but it reads {read_thp('enabled', thp_dir)!r}")
    return old


def thp_settings(thp_dir: str = THP_DIR) -> dict:
    return {name: read_thp(name, thp_dir) for name in ("enabled", "defrag", "shmem_enabled")}


def smaps_mappings(path: str = "/proc/self/smaps") -> list[dict]:
    """[{start, end, anon_huge_kb, rss_kb}] for every mapping of the process."""
    maps, current = [], None
    with open(path) as fh:
        for line in fh:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = head.split("-")
                current = {"start": int(lo, 16), "end": int(hi, 16), "anon_huge_kb": 0, "rss_kb": 0}
                maps.append(current)
            elif current is not None and head == "AnonHugePages:":
                current["anon_huge_kb"] = int(line.split()[1])
            elif current is not None and head == "Rss:":
                current["rss_kb"] = int(line.split()[1])
    return maps


def buffer_pages(address: int, nbytes: int, maps: list[dict]) -> dict:
    """Huge-page backing of the mapping(s) that hold [address, address + nbytes). smaps counts
    per mapping, and the kernel may merge neighbouring anonymous mappings, so the figures are of
    the whole mapping(s): mapping_bytes says how much that is."""
    hit = [m for m in maps if m["start"] < address + nbytes and address < m["end"]]
    return {
        "bytes": int(nbytes),
        "mapping_bytes": sum(m["end"] - m["start"] for m in hit),
        "anon_huge_kb": sum(m["anon_huge_kb"] for m in hit),
        "rss_kb": sum(m["rss_kb"] for m in hit),
    }


def page_state(buffers: dict, smaps_path: str = "/proc/self/smaps") -> dict:
    """{'thp': settings, 'buffers': {name: buffer_pages}, 'huge': any buffer mapping has huge pages}
    for numpy arrays (or anything with .ctypes.data and .nbytes)."""
    maps = smaps_mappings(smaps_path)
    bufs = {name: buffer_pages(arr.ctypes.data, arr.nbytes, maps) for name, arr in buffers.items()}
    return {"thp": thp_settings(), "buffers": bufs, "huge": any(b["anon_huge_kb"] > 0 for b in bufs.values())}
