"""The fault campaign: seeded trials, each of which starts P real ranks,
injects one fault into one of them and checks what the others see.

A trial is a pure function of (seed, index), named "SEED-INDEX", so any one of a thousand can be
run again alone:
`python -m pytest -s tests/multiproc/test_fault_campaign.py -k soak --fault-only SEED-INDEX`. It chooses:

- kind: how the victim fails. sigkill; sigstop (alive but silent); exit (os._exit: the kernel
  closes its sockets, nobody says goodbye); shutdown (its TCP connections are shut down while
  it lives on, as when its network fails); raise (its Python raises between calls and the interpreter exits without
  the program closing anything); abort (comm.abort() from a watchdog thread); mismatch (it makes
  a different call);
- moment: bootstrap (before or while rt.init), before_first (after init, before any call),
  inside (a timer fires while the victim is in a run of calls), between (after k calls), shrink
  (a second victim fails while the survivors shrink after a first failure);
- collective, size (small: 16 elements a block; large: 2 MiB a block), algorithm (those the
  collective has), transport (shm; tcp everywhere; two emulated hosts; two network-namespace
  hosts), P in {2, 3, 4, 8}, the victim rank and the root.

The victim injects its own fault, so the fault's moment is exact; it prints the wall-clock time
first ("ringtree-fault {...}" in its output). Every survivor runs the trial's collective in a
loop, checking every completed result exactly, until the call raises; it reports the error's
type, message and time. run_trial() launches the ranks, waits for the survivors within a hard
bound (a survivor still running then is a hang), resumes a stopped victim, and judges the trial
(see PROBLEMS). After the error the survivors shrink and check an all_reduce on the result:
shrink_and_check().
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import threading
import time
from dataclasses import asdict, dataclass

import numpy as np

import ringtree as rt

KINDS = ("sigkill", "sigstop", "exit", "shutdown", "raise", "abort", "mismatch")
MOMENTS = ("bootstrap", "before_first", "inside", "between", "shrink")
# The moments a kind can happen at: an exception or a mismatch is a call the victim makes, so
# never from a timer; abort needs a communicator, mismatch a call to differ from.
KIND_MOMENTS = {
    "sigkill": MOMENTS,
    "sigstop": MOMENTS,
    "exit": MOMENTS,
    "shutdown": ("bootstrap", "before_first", "inside", "between"),
    "raise": ("bootstrap", "before_first", "between", "shrink"),
    "abort": ("before_first", "inside", "between"),
    "mismatch": ("before_first", "between"),
}
ALGOS = {
    "all_reduce": ("auto", "ring", "tree"),
    "reduce_scatter": ("auto", "ring"),
    "all_gather": ("auto", "ring"),
    "broadcast": ("auto", "ring", "tree"),
    "reduce": ("auto", "ring", "tree"),
    "all_to_all": ("auto", "direct"),
    "gather": ("auto", "direct"),
    "scatter": ("auto", "direct"),
    "barrier": ("auto",),
}
TRANSPORTS = ("shm", "tcp", "hosts2", "netns")
SIZES = {"small": 16, "large": 1 << 19}  # elements per block (float32)
NRANKS = (2, 3, 4, 8)
# What the survivors must raise: the kind every rank learns first-hand or through the control
# plane's notice (which carries the first detector's kind). Errors raised by rt.init also may be
# a BootstrapError or Timeout (a missing rank and a silent one look alike during rendezvous).
EXPECTED = {
    "sigkill": {"PeerFailure"},
    "exit": {"PeerFailure"},
    "shutdown": {"PeerFailure"},
    "raise": {"PeerFailure"},
    "sigstop": {"Timeout"},
    "abort": {"Aborted"},
    "mismatch": {"CollectiveMismatch"},
}
IN_INIT = {"BootstrapError", "Timeout", "PeerFailure"}
SLACK = 5.0  # detection must come within the timeout in force plus this many seconds
PROBLEMS = (
    "hang",
    "victim_hang",
    "crash",
    "no_fault",
    "no_error",
    "wrong_kind",
    "unnamed",
    "slow",
    "wrong_result",
    "shrink",
)


@dataclass(frozen=True)
class Trial:
    id: str
    kind: str
    moment: str
    collective: str
    size: str
    algo: str
    transport: str
    nranks: int
    victim: int
    root: int
    calls_before: int  # calls the victim completes before a between/inside fault
    delay_ms: float  # timer delay of an inside or bootstrap fault (0: before rt.init)
    second_victim: int  # fails during shrink (moment "shrink"), else -1
    timeout: float = 3.0  # every collective's
    init_timeout: float = 6.0

    @property
    def survivors(self) -> list:
        return [r for r in range(self.nranks) if r not in (self.victim, self.second_victim)]


def make_trial(seed: int, index: int) -> Trial:
    """Trial `index` of campaign `seed`, independent of every other trial."""
    rng = random.Random(f"ringtree-faults:{seed}:{index}")
    kind = rng.choice(KINDS)
    moment = rng.choice(KIND_MOMENTS[kind])
    collective = rng.choice(tuple(ALGOS))
    nranks = rng.choice(NRANKS)
    if moment == "shrink" and nranks == 2:
        nranks = rng.choice(NRANKS[1:])  # someone must be left after two failures
    victim = rng.randrange(nranks)
    others = [r for r in range(nranks) if r != victim]
    if moment == "bootstrap":
        delay = 0.0 if kind == "raise" or rng.random() < 0.3 else round(rng.uniform(1, 400), 1)
    else:
        delay = round(rng.uniform(0, 30), 1)
    return Trial(
        id=f"{seed}-{index}",
        kind=kind,
        moment=moment,
        collective=collective,
        size=rng.choice(tuple(SIZES)),
        algo=rng.choice(ALGOS[collective]),
        transport=rng.choice(TRANSPORTS),
        nranks=nranks,
        victim=victim,
        root=rng.randrange(nranks),
        calls_before=0 if moment == "before_first" else rng.randrange(4),
        delay_ms=delay,
        second_victim=rng.choice(others) if moment == "shrink" else -1,
    )


def make_campaign(seed: int, count: int) -> list:
    return [make_trial(seed, i) for i in range(count)]


def parse_trial_id(trial_id: str) -> Trial:
    seed, _, index = trial_id.rpartition("-")
    return make_trial(int(seed), int(index))


def covering_slice(seed: int, want: int, *, pool: int = 400, max_ranks: int = 4) -> list:
    """`want` trials of campaign `seed` that between them cover every kind, moment, transport,
    collective and P up to max_ranks: greedily, the trial adding most uncovered values first
    (cheaper trials win ties: no sigstop, which waits out a timeout); then quick ones (neither
    a stop nor a fault in bootstrap, which wait out a timeout) in campaign order."""
    candidates = [t for t in make_campaign(seed, pool) if t.nranks <= max_ranks]
    features = lambda t: {
        ("kind", t.kind),
        ("moment", t.moment),
        ("transport", t.transport),  # noqa: E731
        ("collective", t.collective),
        ("nranks", t.nranks),
        ("size", t.size),
    }
    uncovered = set().union(*(features(t) for t in candidates))
    chosen = []
    while uncovered and len(chosen) < want:
        best = max(candidates, key=lambda t: (len(features(t) & uncovered), t.kind != "sigstop"))
        chosen.append(best)
        candidates.remove(best)
        uncovered -= features(best)
    quick = [t for t in candidates if t.kind != "sigstop" and t.moment != "bootstrap"]
    return chosen + quick[: max(0, want - len(chosen))]


# --- in every rank ---------------------------------------------------------------------------


class Workload:
    """The trial's collective on buffers whose every result is known exactly (small integers in
    float32): run() makes one call and says whether its result was right on this rank."""

    def __init__(self, comm, trial: Trial, rank: int):
        self.comm, self.t, self.rank = comm, trial, rank
        P, n, r, root = comm.size, SIZES[trial.size], rank, trial.root
        base = (np.arange(n) % 13).astype(np.float32)
        blocks = lambda f: np.concatenate([f(q) for q in range(P)])  # noqa: E731
        total = P * (P - 1) // 2
        self.x = self.out = self.expected = None
        c = trial.collective
        if c == "all_reduce":
            self.x, self.out, self.expected = base + r, np.empty(n, np.float32), P * base + total
        elif c == "reduce_scatter":
            self.x = blocks(lambda q: base + r + q)
            self.out, self.expected = np.empty(n, np.float32), P * (base + r) + total
        elif c == "all_gather":
            self.x, self.out, self.expected = base + r, np.empty(n * P, np.float32), blocks(lambda q: base + q)
        elif c == "all_to_all":
            self.x, self.out = blocks(lambda q: base + 16 * r + q), np.empty(n * P, np.float32)
            self.expected = blocks(lambda q: base + 16 * q + r)
        elif c == "broadcast":
            self.x, self.expected = base + root, base + root
        elif c == "reduce":
            self.x, self.out = base + r, np.empty(n, np.float32)
            self.expected = P * base + total if r == root else None
        elif c == "gather":
            self.x = base + r
            if r == root:
                self.out, self.expected = np.empty(n * P, np.float32), blocks(lambda q: base + q)
        elif c == "scatter":
            self.x = blocks(lambda q: base + 16 * q) if r == root else None
            self.out, self.expected = np.empty(n, np.float32), base + 16 * r

    def run(self, timeout=None) -> bool:
        c, comm, t = self.t.collective, self.comm, self.t
        kw = dict(algo=t.algo, timeout=timeout or t.timeout)
        if self.out is not None:
            self.out.fill(-1)
        if c == "all_reduce":
            comm.all_reduce(self.x, self.out, **kw)
        elif c == "reduce_scatter":
            comm.reduce_scatter(self.x, self.out, **kw)
        elif c == "all_gather":
            comm.all_gather(self.x, self.out, **kw)
        elif c == "all_to_all":
            comm.all_to_all(self.x, self.out, **kw)
        elif c == "broadcast":
            if self.rank != t.root:
                self.x.fill(-1)
            comm.broadcast(self.x, root=t.root, **kw)
            return bool(np.array_equal(self.x, self.expected))
        elif c == "reduce":
            comm.reduce(self.x, self.out, root=t.root, **kw)
        elif c == "gather":
            comm.gather(self.x, self.out, root=t.root, **kw)
        elif c == "scatter":
            comm.scatter(self.x, self.out, root=t.root, **kw)
        elif c == "barrier":
            comm.barrier(timeout=kw["timeout"])
        return self.expected is None or bool(np.array_equal(self.out, self.expected))

    def mismatched(self):
        """A call that differs from the trial's: what a mismatch victim makes instead."""
        if self.t.collective == "barrier":
            self.comm.all_reduce(np.ones(16, np.float32), timeout=self.t.timeout)
        else:
            self.comm.barrier(timeout=self.t.timeout)


class InjectedFault(Exception):
    """The exception a "raise" victim's program lets escape."""


class Victim:
    """Injects the trial's fault into this process, announcing the moment first."""

    def __init__(self, trial: Trial):
        self.t = trial
        self.phase = "start"  # start, init, call, between: where the process was when it failed
        self.comm = None
        self.fired = False

    def announce(self, kind=None):
        print(
            "ringtree-fault " + json.dumps({"wall": time.time(), "phase": self.phase, "kind": kind or self.t.kind}),
            flush=True,
        )

    def inject(self, kind=None):
        kind = kind or self.t.kind
        self.fired = True
        if kind == "shutdown":
            return self.shut_sockets()
        self.announce(kind)
        if kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif kind == "exit":
            os._exit(17)
        elif kind == "abort":
            self.comm.abort("fault campaign: injected abort")
        elif kind == "raise":
            raise InjectedFault(f"fault campaign: trial {self.t.id} raises in rank {self.t.victim}")

    def inject_later(self, delay_ms, kind=None):
        assert (kind or self.t.kind) != "raise", "an exception in a timer thread would not reach the program"
        timer = threading.Timer(delay_ms / 1000.0, self.inject, (kind,))
        timer.daemon = True
        timer.start()
        return timer

    def shut_sockets(self):
        """Shuts down every connected TCP socket of this process, as a failed network would
        (one socket alone could be a message link, whose loss collectives rightly ignore); waits
        for one to exist (early in bootstrap there may be none yet). During bootstrap the network
        stays failed until init's timeout: connections set-up opens later are shut down too, or a
        fault that hit only the set-up's first connection would spare the job (its control and
        data connections come later)."""
        deadline = time.monotonic() + self.t.init_timeout
        announced = False
        while time.monotonic() < deadline:
            sockets = connected_tcp_sockets()
            if sockets and not announced:
                self.announce()
                announced = True
            for s in sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # shut down already
                s.close()  # the duplicate only: the runtime's own descriptor stays open
            if announced and self.phase != "init":
                return
            time.sleep(0.001)


def connected_tcp_sockets() -> list:
    """Duplicates of this process's connected TCP sockets, in descriptor order."""
    found = []
    for name in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        if (
            s.family in (socket.AF_INET, socket.AF_INET6)
            and s.type == socket.SOCK_STREAM
            and not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        ):
            found.append(s)
        else:
            s.close()
    return found


def error_report(exc, phase, calls) -> dict:
    return {"error": type(exc).__name__, "message": str(exc), "wall": time.time(), "phase": phase, "calls": calls}


def fault_rank(trial: dict) -> dict:
    """The rank body of every rank of a trial (see the module's docstring)."""
    t = Trial(**trial)
    rank = int(os.environ["RINGTREE_RANK"])  # known before rt.init, for a fault during it
    victim = Victim(t) if rank == t.victim else None
    if victim and t.moment == "bootstrap":
        if t.delay_ms == 0 and t.kind != "shutdown":  # a process has no socket to shut before rt.init
            victim.inject()
        else:
            victim.inject_later(t.delay_ms)
    phase = "init"
    if victim:
        victim.phase = phase
    try:
        comm = rt.init(timeout=t.init_timeout)
    except rt.Error as exc:
        return {"rank": rank, **error_report(exc, phase, 0)}
    if victim:
        victim.comm, victim.phase = comm, "between"
    work = Workload(comm, t, rank)
    calls, wrong = 0, []
    # A loop no fault ends is a failure of its own (no_error); it must end well before the
    # runner's hard bound so that it is told apart from a hang.
    give_up = time.monotonic() + t.init_timeout + 2 * t.timeout + 5
    report = {"rank": rank, "error": None}
    try:
        while time.monotonic() < give_up:
            if victim and calls == t.calls_before:
                if t.moment in ("before_first", "between", "shrink"):
                    victim.phase = "between"
                    if t.kind == "mismatch":
                        victim.announce()
                        phase = "call"
                        work.mismatched()
                    else:
                        victim.inject()
                elif t.moment == "inside":
                    victim.inject_later(t.delay_ms)
            phase = "call"
            if victim:
                victim.phase = phase
            if not work.run():
                wrong.append(calls)
            calls += 1
            phase = "between"
            if victim:
                victim.phase = phase
    except rt.Error as exc:
        report = {"rank": rank, **error_report(exc, phase, calls)}
    report["wrong_results"] = wrong[:10]
    if victim is None:
        report["shrink"] = shrink_and_check(comm, t, rank)
    comm.close()
    return report


def shrink_and_check(comm, t: Trial, rank: int) -> dict:
    """The survivors of the failure shrink to a communicator of the live ranks and check an
    exact all_reduce on it. With moment "shrink", the second victim fails during the shrink
    (it never returns a report). The victim never takes part: every survivor expects
    len(t.survivors) ranks, densely renumbered in the old order."""
    if t.moment == "shrink" and rank == t.second_victim:
        second = Victim(t)
        second.comm, second.phase = comm, "shrink"
        if t.kind == "raise":
            second.inject()  # leaves this function, and the process, at once
        timer = second.inject_later(t.delay_ms)
        # Its fault must land during the shrink: if the shrink ends first, it fails at once (on
        # the new communicator, which the others then find broken and shrink again).
        try:
            new = comm.shrink(timeout=t.timeout)
        except rt.Error:
            new = comm
        timer.cancel()
        if not second.fired:
            second.comm = new
            second.inject()
        return {"status": "second victim"}
    start = time.monotonic()
    try:
        # A second failure during the shrink (moment "shrink") either fails the new
        # communicator's set-up on every member (then they shrink the old one again) or comes
        # after it formed (then its first call fails on every member and they shrink the new one).
        tries = 2 if t.moment == "shrink" else 1
        for attempt in range(tries):
            try:
                new = comm.shrink(timeout=t.timeout)
            except (rt.PeerFailure, rt.Timeout, rt.BootstrapError) as failed:
                if attempt + 1 == tries:
                    raise
                print(f"shrink failed ({type(failed).__name__}: {failed}); retrying on the old communicator")
                continue
            x = np.full(5, new.rank + 1, np.int64)
            try:
                new.all_reduce(x, timeout=t.timeout)
                # A rank that dies during a collective may let it complete on some ranks and
                # fail on the others; the next collective fails on every rank, so it is what
                # tells a rank whether the others need it for another shrink.
                new.barrier(timeout=t.timeout)
                break
            except (rt.PeerFailure, rt.Timeout) as failed:
                if attempt + 1 == tries:
                    raise
                print(f"the new communicator failed ({type(failed).__name__}: {failed}); shrinking it")
                comm = new
        expect = {"size": len(t.survivors), "rank": t.survivors.index(rank) if rank in t.survivors else -1}
        got = {"size": new.size, "rank": new.rank}
        right = got == expect and bool(np.all(x == new.size * (new.size + 1) // 2))
        new.close()
        return {
            "status": "ok" if right else "wrong",
            "expected": expect,
            "got": got,
            "sum": int(x[0]),
            "seconds": time.monotonic() - start,
        }
    except rt.Error as exc:
        return {
            "status": "error",
            "error": type(exc).__name__,
            "message": str(exc),
            "seconds": time.monotonic() - start,
        }


# --- the runner ------------------------------------------------------------------------------


def fault_lines(output: str) -> list:
    return [json.loads(line.split(" ", 1)[1]) for line in output.splitlines() if line.startswith("ringtree-fault {")]


def run_trial(trial: Trial, namespaces=None) -> dict:
    """Runs one trial and judges it; the record's "problems" is empty when every check held.
    namespaces: (names, addresses) of two network namespaces, for netns trials."""
    from harness import spawn_world

    t = trial
    if t.transport == "netns" and namespaces is None:
        return {"trial": asdict(t), "skipped": "no network namespaces here", "problems": []}
    options = dict(
        env={"RINGTREE_TRANSPORT": "tcp"} if t.transport == "tcp" else {}, hosts=2 if t.transport == "hosts2" else 1
    )
    if t.transport == "netns":
        names, addrs = namespaces
        port = 20000 + int(t.id.rpartition("-")[2]) % 20000
        options["unique_id"] = rt.UniqueId.from_seed(addrs[0], port, f"fault-campaign-{t.id}")
        options["per_rank_prefix"] = lambda r: ["ip", "netns", "exec", names[r * 2 // t.nranks]]
    started = time.monotonic()
    running = spawn_world(t.nranks, fault_rank, dict(trial=asdict(t)), **options)
    try:
        # Bound: start-up (a second a rank on a loaded 2-core machine), rendezvous, the loop's own
        # limit (see fault_rank), a shrink and its check.
        bound = started + t.nranks + t.init_timeout + 4 * t.timeout + 15
        hung = running.wait(t.survivors, deadline=bound)
        for v in (t.victim, t.second_victim):
            if v >= 0 and running.procs[v].poll() is None:
                running.procs[v].send_signal(signal.SIGCONT)  # a stopped victim must now finish too
        victims_hung = running.wait(deadline=time.monotonic() + t.timeout + SLACK)
    finally:
        world = running.collect()
    record = judge(t, world, hung, [v for v in victims_hung if v not in hung])
    record["seconds"] = round(time.monotonic() - started, 2)
    if record["problems"]:
        record["outputs"] = {r: out[-6000:] for r, out in enumerate(world.outputs)}
        record["returncodes"] = world.returncodes
    return record


def judge(t: Trial, world, hung: list, victims_hung: list) -> dict:
    problems = []
    faults = fault_lines(world.outputs[t.victim])
    fault = faults[0] if faults else None
    if hung:
        problems.append(("hang", f"ranks {hung} still running at the hard bound"))
    if victims_hung:
        problems.append(
            ("victim_hang", f"victim {victims_hung} still running {t.timeout + SLACK} s after the survivors")
        )
    if fault is None:
        problems.append(("no_fault", "the victim never injected its fault"))
    survivors = []
    for r in t.survivors:
        res = world.results[r]
        if r in hung:
            continue
        if res is None or world.returncodes[r] != 0:
            problems.append(("crash", f"rank {r} exited {world.returncodes[r]} without a report"))
            continue
        entry = {
            "rank": r,
            "error": res["error"],
            "message": (res.get("message") or "")[:400],
            "phase": res.get("phase"),
            "calls": res.get("calls"),
            "shrink": res.get("shrink"),
        }
        if res.get("wrong_results"):
            problems.append(("wrong_result", f"rank {r}: wrong results in calls {res['wrong_results']}"))
        if res["error"] is None:
            problems.append(("no_error", f"rank {r} finished its calls without an error"))
        else:
            in_init = res["phase"] == "init"
            allowed = EXPECTED[t.kind] | (IN_INIT if in_init else set())
            if res["error"] not in allowed:
                problems.append(
                    ("wrong_kind", f"rank {r}: {res['error']} (expected {sorted(allowed)}): {res['message']}")
                )
            if not in_init and not names_the_call(res["message"], t):
                problems.append(("unnamed", f"rank {r}: the message does not name {t.collective}: {res['message']}"))
            if fault is not None:
                entry["detection_s"] = round(res["wall"] - fault["wall"], 4)
                limit = (t.init_timeout if in_init else t.timeout) + SLACK
                if entry["detection_s"] > limit:
                    problems.append(("slow", f"rank {r}: {entry['detection_s']} s after the fault (limit {limit} s)"))
        shrink = res.get("shrink") or {}
        if shrink.get("status") not in (None, "ok"):
            problems.append(("shrink", f"rank {r}: {shrink}"))
        survivors.append(entry)
    victim = world.results[t.victim]
    return {
        "trial": asdict(t),
        "fault": fault,
        "survivors": survivors,
        "victim": {
            "returncode": world.returncodes[t.victim],
            "error": victim and victim.get("error"),
            "message": victim and (victim.get("message") or "")[:400],
        },
        "problems": [f"{kind}: {text}" for kind, text in problems],
    }


def names_the_call(message: str, t: Trial) -> bool:
    """Errors name the collective and its sequence number ("all_reduce #3"); a mismatch may name
    the victim's call on a rank that saw only that."""
    names = [t.collective] + (["barrier", "all_reduce"] if t.kind == "mismatch" else [])
    return any(f"{name} #" in message for name in names)


def problem_kinds(record) -> list:
    return sorted({p.split(":", 1)[0] for p in record["problems"]})


def summarize(records: list) -> dict:
    """Counts, problems by kind, detection times (median, worst) by fault kind, and for a
    SIGKILLed peer after rendezvous: how soon the survivors of a crash learn of it."""
    ran = [r for r in records if "skipped" not in r]
    skipped = {}
    for r in records:
        if "skipped" in r:
            skipped[r["skipped"]] = skipped.get(r["skipped"], 0) + 1
    by_problem = {}
    for r in ran:
        for kind in problem_kinds(r):
            by_problem.setdefault(kind, []).append(r["trial"]["id"])

    def detection(rs):
        d = sorted(s["detection_s"] for r in rs for s in r["survivors"] if "detection_s" in s)
        return {
            "survivors": len(d),
            "median_s": round(statistics.median(d), 3) if d else None,
            "worst_s": round(d[-1], 3) if d else None,
        }

    per_kind = {}
    for kind in KINDS:
        rs = [r for r in ran if r["trial"]["kind"] == kind]
        if rs:
            per_kind[kind] = {"trials": len(rs), "failed": sum(1 for r in rs if r["problems"]), **detection(rs)}
    per_moment = {}
    for moment in MOMENTS:
        rs = [r for r in ran if r["trial"]["moment"] == moment]
        if rs:  # where the fault landed: in rt.init, in a call or between calls
            landed = [r["fault"]["phase"] for r in rs if r["fault"]]
            per_moment[moment] = {
                "trials": len(rs),
                "failed": sum(1 for r in rs if r["problems"]),
                **detection(rs),
                "landed": {p: landed.count(p) for p in sorted(set(landed))},
            }
    killed = [r for r in ran if r["trial"]["kind"] == "sigkill" and r["trial"]["moment"] != "bootstrap"]
    seconds = [r["seconds"] for r in ran]
    return {
        "trials": len(records),
        "ran": len(ran),
        "skipped": skipped,
        "hangs": len(by_problem.get("hang", [])),
        "failed": sum(1 for r in ran if r["problems"]),
        "problems": {k: {"trials": len(v), "ids": v[:20]} for k, v in sorted(by_problem.items())},
        "killed_peer_detection": detection(killed),
        "per_kind": per_kind,
        "per_moment": per_moment,
        "trial_seconds": {
            "median": round(statistics.median(seconds), 2) if seconds else None,
            "worst": max(seconds, default=None),
            "total": round(sum(seconds), 1),
        },
    }


def describe(record) -> str:
    """A failing trial in words: parameters, problems, and the ranks' output."""
    t = record["trial"]
    lines = [
        f"trial {t['id']}: " + ", ".join(f"{k}={v}" for k, v in t.items() if k != "id"),
        f"rerun: python -m pytest -s tests/multiproc/test_fault_campaign.py -k soak --fault-only {t['id']}",
    ]
    lines += [f"  {p}" for p in record["problems"]]
    for r, out in (record.get("outputs") or {}).items():
        lines.append(f"--- rank {r} (exit {record['returncodes'][int(r)]}) ---\n{out.rstrip()}")
    return "\n".join(lines)


# --- the soak: many trials, a line each, then the summary ----------------------------------------


def machine_state() -> dict:
    here = os.path.dirname(os.path.abspath(__file__))
    commit = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    dirty = subprocess.run(
        ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout
    return {
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "commit": commit.strip() + ("+changes" if dirty.strip() else ""),
        "root": os.geteuid() == 0,
    }


def trial_line(record) -> str:
    t = record["trial"]
    head = (
        f"{t['id']:>9} {t['kind']:>8} {t['moment']:>12} {t['collective']:>14} {t['size']:>5} {t['algo']:>6} "
        f"{t['transport']:>6} P={t['nranks']} v={t['victim']}"
    )
    if "skipped" in record:
        return f"{head}  skipped"
    detections = [s["detection_s"] for s in record["survivors"] if "detection_s" in s]
    worst = f"{max(detections):6.2f}" if detections else "   n/a"
    verdict = "ok" if not record["problems"] else "FAIL " + ",".join(problem_kinds(record))
    return f"{head}  detect<={worst}s  {record['seconds']:5.1f}s  {verdict}"


def soak_report(summary) -> str:
    out = [f"trials {summary['trials']} (ran {summary['ran']}), hangs {summary['hangs']}, failed {summary['failed']}"]
    for reason, n in summary["skipped"].items():
        out.append(f"skipped {n}: {reason}")
    for kind, p in summary["problems"].items():
        out.append(f"problem {kind}: {p['trials']} trials, e.g. {' '.join(p['ids'][:8])}")
    k = summary["killed_peer_detection"]
    out.append(
        f"SIGKILLed peer after rendezvous: median {k['median_s']} s, worst {k['worst_s']} s "
        f"over {k['survivors']} survivors"
    )
    out.append(f"{'fault kind':>12} {'trials':>6} {'failed':>6} {'survivors':>9} {'median s':>8} {'worst s':>8}")
    for kind, p in summary["per_kind"].items():
        out.append(
            f"{kind:>12} {p['trials']:>6} {p['failed']:>6} {p['survivors']:>9} {p['median_s']!s:>8} {p['worst_s']!s:>8}"
        )
    out.append(f"{'moment':>12} {'trials':>6} {'failed':>6} {'median s':>8} {'worst s':>8}  landed in")
    for moment, p in summary["per_moment"].items():
        landed = ", ".join(f"{where} {n}" for where, n in p["landed"].items())
        out.append(f"{moment:>12} {p['trials']:>6} {p['failed']:>6} {p['median_s']!s:>8} {p['worst_s']!s:>8}  {landed}")
    s = summary["trial_seconds"]
    out.append(f"trial wall time: median {s['median']} s, worst {s['worst']} s, total {s['total']} s")
    return "\n".join(out)


def soak(trials: list, namespaces=None, out_dir=None, minutes=None, in_full=False, echo=print) -> dict:
    """Runs `trials` one after the other (none started after `minutes`), echoing a line each (and,
    in_full, every trial's description and records), and returns the summary. With out_dir,
    writes summary.json, records.jsonl (every trial) and failures/ID.txt (a failing trial's
    parameters, problems and every rank's output) there."""
    state = machine_state()
    if out_dir:
        os.makedirs(os.path.join(out_dir, "failures"), exist_ok=True)
    records, started = [], time.monotonic()
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(open(os.path.join(out_dir, "records.jsonl"), "w")) if out_dir else None
        for trial in trials:
            if minutes is not None and time.monotonic() - started > minutes * 60:
                echo(f"stopping: {minutes} minutes are up after {len(records)} trials")
                break
            record = run_trial(trial, namespaces)
            records.append(record)
            echo(trial_line(record))
            if in_full or record["problems"]:
                text = describe(record)
                if in_full:
                    echo(text)
                    echo(json.dumps({k: record.get(k) for k in ("fault", "survivors", "victim")}, indent=1))
                if out_dir and record["problems"]:
                    with open(os.path.join(out_dir, "failures", f"{trial.id}.txt"), "w") as f:
                        f.write(text + "\n")
            if log:
                log.write(json.dumps(record) + "\n")
                log.flush()
    summary = summarize(records)
    summary.update(wall_seconds=round(time.monotonic() - started, 1), machine=state, load_average_after=os.getloadavg())
    if out_dir:
        with open(os.path.join(out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
    return summary
