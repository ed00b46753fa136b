"""What went wrong, from the ranks' flight records: python -m ringtree.analyze DIR.

DIR holds the dumps of a job (ringtree-<comm id>-rank<r>.json: written after a Timeout,
PeerFailure or CollectiveMismatch when RINGTREE_DUMP_DIR is set, by rt.dump() or
Communicator.dump(), on SIGUSR1, or at exit with RINGTREE_DUMP_ON_EXIT=1) and/or its traces
(RINGTREE_TRACE). The records are merged per communicator; times are moved to rank 0's clock
(t - offset_ns) and printed in seconds since the communicator's first recorded call.

The report says, in words and then in a table:

- which rank never entered which call while the others wait in it, since when and how long;
- where ranks left no record: the calls every recorded rank entered and did not finish, and
  which missing rank the survivors' errors and waits name;
- which ranks called different collectives (or counts, dtypes, ops, roots) at the same seq;
- which peers a stuck call still waits on (to send to, to receive from);
- the last call every rank completed, and the failures recorded.

The command line::

    python -m ringtree.analyze DIR                 # the diagnosis
    python -m ringtree.analyze DIR --stragglers    # who arrives last at collectives, how late
    python -m ringtree.analyze DIR --plot late.png # lateness per rank over the calls
    python -m ringtree.analyze DIR --trace all.json  # one Perfetto timeline of every rank
    python -m ringtree.analyze DIR --json          # the findings as JSON
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from .timeline import P2P, call_name, read_records, write_trace

__all__ = ["diagnose", "stragglers", "format_report", "format_stragglers", "plot_stragglers", "main"]

_SIGNATURE = ("coll", "count", "dtype", "op", "root", "algo")


# --- one communicator's records ---------------------------------------------------------------


class _Comm:
    """The records of one communicator, by rank, with an aligned clock."""

    def __init__(self, records):
        self.records = {r["rank"]: r for r in records}
        first = records[0]
        self.comm_id, self.size = first["comm_id"], first["size"]
        self.ranks = sorted(self.records)
        self.missing = [q for q in range(self.size) if q not in self.records]
        starts = [self.t(q, c["enqueued_ns"]) for q in self.ranks for c in self.records[q]["calls"] if c["enqueued_ns"]]
        self.origin = min(starts) if starts else min(self.t(q, self.records[q]["dumped_ns"]) for q in self.ranks)
        # Collectives (not p2p) by rank and seq.
        self.by_seq = {q: {c["seq"]: c for c in self.records[q]["calls"] if c["coll"] not in P2P} for q in self.ranks}

    def t(self, rank, ns):
        """A time of `rank`'s clock on rank 0's, in ns."""
        return ns - self.records[rank]["clock"]["offset_ns"]

    def rel(self, rank, ns):
        """Seconds since the first recorded call, on rank 0's clock."""
        return (self.t(rank, ns) - self.origin) / 1e9

    def last_seq(self, rank):
        seqs = self.by_seq[rank]
        return max(seqs) if seqs else None

    def issued(self, rank, seq):
        """Whether `rank` issued collective `seq` by its dump (seqs run in order, so a later one
        implies it), or None when unknowable (its window holds only point-to-point calls)."""
        last = self.last_seq(rank)
        if last is not None:
            return seq <= last
        rec = self.records[rank]
        return None if rec["recorded"] > rec["capacity"] else False


def _communicators(records) -> list:
    """The records grouped per communicator, the largest first."""
    by_comm = {}
    for rec in records:
        by_comm.setdefault(rec["comm_id"], []).append(rec)
    return [_Comm(recs) for _, recs in sorted(by_comm.items(), key=lambda kv: (-kv[1][0]["size"], kv[0]))]


def _describe(call) -> str:
    """A call with its arguments: all_reduce #3 (count 1024, float32, sum, ring)."""
    parts = [f"count {call['count']}", call["dtype"]]
    if call.get("op"):
        parts.append(call["op"])
    if call.get("root", -1) >= 0:
        parts.append(f"root {call['root']}")
    parts.append(call["algo"])
    if call.get("label", -1) >= 0:
        parts.append(f"label {call['label']}")
    return f"{call_name(call)} ({', '.join(parts)})"


def _ranks(ranks) -> str:
    ranks = list(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def _waited(comm, rank, call):
    """(since, seconds waited) of a started call: to its end, or to the dump while running."""
    if call.get("started_ns") is None:
        return None, None
    end = call["ended_ns"] if call.get("ended_ns") is not None else comm.records[rank]["dumped_ns"]
    return comm.rel(rank, call["started_ns"]), (end - call["started_ns"]) / 1e9


def _rank_rows(comm):
    rows = []
    for q in comm.ranks:
        rec = comm.records[q]
        calls = rec["calls"]
        done = [c for c in calls if c["state"] == "done"]
        current = next((c for c in calls if c["state"] in ("running", "queued")), None)
        if current is None and calls and calls[-1]["state"] == "failed":
            current = calls[-1]
        since, waited = _waited(comm, q, current) if current else (None, None)
        row = {
            "rank": q,
            "reason": rec["reason"],
            "recorded": rec["recorded"],
            "last_done": call_name(done[-1]) if done else None,
            "last_done_at": comm.rel(q, done[-1]["ended_ns"]) if done else None,
            "current": call_name(current) if current else None,
            "state": (current["state"] + (f" ({current['error_kind']})" if current.get("error_kind") else ""))
            if current
            else "idle",
            "since": since,
            "waited_s": waited,
            "waiting_on": current.get("waiting_on") if current else None,
            "dumped_at": comm.rel(q, rec["dumped_ns"]),
            "clock_error_us": rec["clock"]["error_ns"] / 1e3,
            "aborted": rec["aborted"],
        }
        rows.append(row)
    return rows


def _never_entered(comm):
    """Calls some ranks are in (or failed in) that others never issued."""
    findings = []
    pending = sorted({c["seq"] for q in comm.ranks for c in comm.by_seq[q].values() if c["state"] != "done"})
    for seq in pending:
        absent = [q for q in comm.ranks if comm.issued(q, seq) is False]
        if not absent:
            continue
        entered = [q for q in comm.ranks if seq in comm.by_seq[q]]
        call = comm.by_seq[entered[0]][seq]
        waiting = []
        for q in entered:
            c = comm.by_seq[q][seq]
            since, waited = _waited(comm, q, c)
            waiting.append(
                {
                    "rank": q,
                    "state": c["state"],
                    "since": since,
                    "waited_s": waited,
                    "error_kind": c.get("error_kind"),
                    "waiting_on": c.get("waiting_on"),
                }
            )
        last = {
            q: (call_name(comm.by_seq[q][comm.last_seq(q)]) if comm.last_seq(q) is not None else None) for q in absent
        }
        text = (
            f"{_ranks(absent).capitalize()} never entered {_describe(call)}; "
            + "; ".join(_waiting_words(w) for w in waiting)
            + ". "
            + " ".join(f"Rank {q}'s last collective was {last[q] or 'none recorded'}." for q in absent)
        )
        findings.append(
            {
                "kind": "never_entered",
                "seq": seq,
                "call": call_name(call),
                "absent": absent,
                "entered": entered,
                "waiting": waiting,
                "text": text,
            }
        )
    return findings


def _waiting_words(w) -> str:
    what = {
        "running": "has waited",
        "queued": "is queued behind earlier calls for",
        "failed": "waited",
        "done": "finished after",
    }[w["state"]]
    if w["since"] is None:
        return f"rank {w['rank']} queued it"
    tail = (
        f" until its {w['error_kind']}"
        if w["state"] == "failed" and w.get("error_kind")
        else (" so far" if w["state"] == "running" else "")
    )
    return f"rank {w['rank']} entered it at t={w['since']:+.3f} s and {what} {w['waited_s']:.3f} s{tail}"


def _missing_records(comm):
    """Calls the recorded ranks are in (or failed in) that every recorded rank entered, while some
    ranks left no record: the call waited on one of those, and the survivors' errors or waits
    that name one say which."""
    if not comm.missing:
        return []
    findings = []
    pending = sorted({c["seq"] for q in comm.ranks for c in comm.by_seq[q].values() if c["state"] != "done"})
    for seq in pending:
        if any(comm.issued(q, seq) is False for q in comm.ranks):
            continue  # a recorded rank is absent: _never_entered reports it
        entered = [q for q in comm.ranks if seq in comm.by_seq[q]]
        call = comm.by_seq[entered[0]][seq]
        waiting, named = [], set()
        for q in entered:
            c = comm.by_seq[q][seq]
            since, waited = _waited(comm, q, c)
            w = c.get("waiting_on") or {}
            names = {int(r) for r in re.findall(r"\brank (\d+)", c.get("error") or "")}
            names |= set(w.get("send", [])) | set(w.get("recv", []))
            named |= names & set(comm.missing)
            waiting.append(
                {
                    "rank": q,
                    "state": c["state"],
                    "since": since,
                    "waited_s": waited,
                    "error_kind": c.get("error_kind"),
                    "waiting_on": c.get("waiting_on"),
                    "names_missing": sorted(names & set(comm.missing)),
                }
            )
        suspects = sorted(named) or list(comm.missing)
        evidence = "; ".join(
            _waiting_words(w) + (f", naming {_ranks(w['names_missing'])}" if w["names_missing"] else "")
            for w in waiting
        )
        text = (
            f"{_ranks(suspects).capitalize()} left no record, and the records there point at "
            f"{'it' if len(suspects) == 1 else 'them'}: every rank that left one entered {_describe(call)} "
            f"and did not finish it; {evidence}. "
            + ("The survivors' errors name " + _ranks(suspects) + ", so " if named else "So ")
            + f"{_ranks(suspects)} most likely never got there (hung, stopped or died before it): "
            f"dump {'it' if len(suspects) == 1 else 'them'} (rt.dump() or SIGUSR1) or see how "
            f"{'it' if len(suspects) == 1 else 'they'} ended."
        )
        findings.append(
            {
                "kind": "missing_record",
                "seq": seq,
                "call": call_name(call),
                "suspects": suspects,
                "named_by_survivors": sorted(named),
                "entered": entered,
                "waiting": waiting,
                "text": text,
            }
        )
    return findings


def _mismatches(comm):
    """Seqs at which ranks issued different collectives or arguments, naming both calls."""
    findings = []
    seqs = sorted({s for q in comm.ranks for s in comm.by_seq[q]})
    for seq in seqs:
        groups = {}
        for q in comm.ranks:
            c = comm.by_seq[q].get(seq)
            if c is not None:
                groups.setdefault(tuple(c.get(k) for k in _SIGNATURE), []).append(q)
        if len(groups) < 2:
            continue
        ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1]))
        calls = [(ranks, comm.by_seq[ranks[0]][seq]) for _, ranks in ordered]
        differs = [k for k in _SIGNATURE if len({c.get(k) for _, c in calls}) > 1]
        text = (
            f"At seq {seq} the ranks called different collectives: "
            + " but ".join(f"{_ranks(ranks)} called {_describe(c)}" for ranks, c in calls)
            + f" (they differ in {', '.join(differs)})."
        )
        findings.append(
            {
                "kind": "mismatch",
                "seq": seq,
                "differs": differs,
                "calls": [{"ranks": ranks, "call": _describe(c)} for ranks, c in calls],
                "text": text,
            }
        )
    return findings


def _stuck(comm):
    """Calls still running at the dump, with the peers they wait for."""
    out = []
    for q in comm.ranks:
        for c in comm.records[q]["calls"]:
            if c["state"] != "running":
                continue
            w = c.get("waiting_on") or {"send": [], "recv": []}
            since, waited = _waited(comm, q, c)
            parts = []
            if w["recv"]:
                parts.append(f"data from {_ranks(w['recv'])}")
            if w["send"]:
                parts.append(f"room to send to {_ranks(w['send'])}")
            text = (
                f"Rank {q} is in {call_name(c)} since t={since:+.3f} s ({waited:.3f} s), waiting for "
                + (" and ".join(parts) if parts else "nothing on the wire (local work or its own input)")
                + "."
            )
            out.append(
                {
                    "kind": "stuck",
                    "rank": q,
                    "call": call_name(c),
                    "since": since,
                    "waited_s": waited,
                    "waiting_on": w,
                    "text": text,
                }
            )
    return out


def _failures(comm):
    out = []
    for q in comm.ranks:
        for c in comm.records[q]["calls"]:
            if c["state"] == "failed":
                out.append(
                    {
                        "kind": "failure",
                        "rank": q,
                        "call": call_name(c),
                        "error_kind": c["error_kind"],
                        "error": c["error"],
                        "text": f"Rank {q}: {call_name(c)} failed with {c['error_kind']}: {c['error']}",
                    }
                )
    return out


def _completed_by_all(comm):
    """The highest collective seq every rank has finished (None: none in every window)."""
    best = None
    for q in comm.ranks:
        done = [s for s, c in comm.by_seq[q].items() if c["state"] == "done"]
        if not done:
            return None
        best = max(done) if best is None else min(best, max(done))
    return best


def diagnose(records) -> list:
    """The findings, one dict per communicator (JSON-ready): ranks that never entered a
    call, missing records, calls that differ across ranks, and calls stuck in flight.

    Parameters
    ----------
    records : list of dict
        Flight records, as read_records returns them (dumps and traces of any ranks).

    Returns
    -------
    list of dict
        Per communicator: its id, size, the ranks with records and without, and its findings,
        each with a readable "text".
    """
    out = []
    for comm in _communicators(records):
        comm_id = comm.comm_id
        findings = _never_entered(comm) + _missing_records(comm) + _mismatches(comm) + _stuck(comm)
        common = _completed_by_all(comm)
        any_seq = next((comm.by_seq[q][common] for q in comm.ranks if common in comm.by_seq[q]), None)
        out.append(
            {
                "comm_id": comm_id,
                "size": comm.size,
                "ranks": comm.ranks,
                "missing_ranks": comm.missing,
                "findings": findings,
                "failures": _failures(comm),
                "ranks_table": _rank_rows(comm),
                "completed_by_all": call_name(any_seq) if any_seq else None,
            }
        )
    return out


def format_report(diagnosis) -> str:
    """The diagnosis as the command prints it.

    Parameters
    ----------
    diagnosis : list of dict
        What diagnose returned.

    Returns
    -------
    str
        One section per communicator, one line per finding.
    """
    lines = []
    for d in diagnosis:
        lines.append(f"== communicator {d['comm_id']}: {d['size']} ranks, records from {_ranks(d['ranks'])}")
        if d["missing_ranks"]:
            lines.append(f"   No record from {_ranks(d['missing_ranks'])}: dump them too (rt.dump() or SIGUSR1).")
        for f in d["findings"]:
            lines.append("   * " + f["text"])
        if not d["findings"] and d["missing_ranks"]:
            lines.append(
                f"   * Among the records there, no rank is missing from a call, no call differs across "
                f"ranks and nothing is stuck; {_ranks(d['missing_ranks'])} left no record, so what "
                f"{'it' if len(d['missing_ranks']) == 1 else 'they'} did is unknown."
            )
        elif not d["findings"]:
            lines.append("   * No rank is missing from a call, no call differs across ranks, nothing is stuck.")
        lines.append(f"   Every rank completed up to: {d['completed_by_all'] or 'nothing recorded on every rank'}.")
        for f in d["failures"]:
            lines.append("   ! " + f["text"][:300])
        lines.append("")
        header = [
            "rank",
            "dump",
            "last done",
            "at (s)",
            "current / last",
            "state",
            "since (s)",
            "waited (s)",
            "waiting on",
            "clock err (us)",
        ]
        rows = []
        for r in d["ranks_table"]:
            w = r["waiting_on"]
            rows.append(
                [
                    str(r["rank"]),
                    r["reason"],
                    r["last_done"] or "-",
                    _num(r["last_done_at"]),
                    r["current"] or "-",
                    r["state"],
                    _num(r["since"]),
                    _num(r["waited_s"], "{:.3f}"),
                    (f"send {w['send']} recv {w['recv']}" if w else "-"),
                    f"{r['clock_error_us']:.1f}",
                ]
            )
        lines += ["   " + line for line in _table(header, rows)]
        lines.append("   (times: seconds since the communicator's first recorded call, on rank 0's clock)")
        lines.append("")
    return "\n".join(lines)


def _num(x, fmt="{:+.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def _table(header, rows) -> list:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [fmt.format(*row) for row in rows]


# --- stragglers ------------------------------------------------------------------------------


def stragglers(records) -> list:
    """Per communicator: each completed collective seen on every rank, each rank's arrival
    (its start, aligned) relative to the first arrival, and per-rank statistics.

    Parameters
    ----------
    records : list of dict
        Flight records, as read_records returns them (dumps and traces of any ranks).

    Returns
    -------
    list of dict
        One report per communicator of two ranks or more whose records are all there.
    """
    import numpy as np

    out = []
    for comm in _communicators(records):
        comm_id = comm.comm_id
        if comm.missing or comm.size < 2:
            continue
        seqs = sorted(set.intersection(*(set(comm.by_seq[q]) for q in comm.ranks)))
        calls, lateness, in_call = [], [], np.zeros(comm.size)
        for seq in seqs:
            cs = [comm.by_seq[q][seq] for q in comm.ranks]
            if any(c["state"] != "done" for c in cs) or len({c["coll"] for c in cs}) > 1:
                continue
            arrive = np.array([comm.t(q, c["started_ns"]) for q, c in zip(comm.ranks, cs)], dtype=np.float64)
            late = (arrive - arrive.min()) / 1e9
            calls.append(
                {
                    "seq": seq,
                    "call": call_name(cs[0]),
                    "label": cs[0]["label"],
                    "last": int(np.argmax(late)),
                    "lateness_s": late.tolist(),
                }
            )
            lateness.append(late)
            in_call += [(c["ended_ns"] - c["started_ns"]) / 1e9 for c in cs]
        if not calls:
            out.append({"comm_id": comm_id, "size": comm.size, "calls": [], "ranks": []})
            continue
        late = np.array(lateness)  # calls x ranks
        ranks = []
        for q in range(comm.size):
            mine = [i for i, c in enumerate(calls) if c["last"] == q]
            # What the others spent waiting for q in the calls q came last to.
            caused = float(sum((late[i, q] - late[i]).sum() for i in mine))
            others_in_calls = float(in_call.sum() - in_call[q])
            ranks.append(
                {
                    "rank": q,
                    "last_count": len(mine),
                    "mean_late_s": float(late[:, q].mean()),
                    "p99_late_s": float(np.percentile(late[:, q], 99)),
                    "max_late_s": float(late[:, q].max()),
                    "others_waited_s": caused,
                    "others_waited_fraction": caused / others_in_calls if others_in_calls > 0 else 0.0,
                }
            )
        worst = max(ranks, key=lambda r: (r["last_count"], r["others_waited_s"]))
        errors = [comm.records[q]["clock"]["error_ns"] / 1e3 for q in comm.ranks]
        out.append(
            {
                "comm_id": comm_id,
                "size": comm.size,
                "calls": calls,
                "ranks": ranks,
                "straggler": worst["rank"],
                "clock_error_us": max(errors),
            }
        )
    return out


def format_stragglers(report) -> str:
    """The straggler report as the command prints it.

    Parameters
    ----------
    report : list of dict
        What stragglers returned.

    Returns
    -------
    str
        Per communicator, who arrives last how often and how late, and what the others waited.
    """
    lines = []
    for s in report:
        lines.append(f"== stragglers, communicator {s['comm_id']} ({s['size']} ranks)")
        if not s["calls"]:
            lines.append("   No completed collective recorded on every rank.\n")
            continue
        n = len(s["calls"])
        w = s["ranks"][s["straggler"]]
        lines.append(
            f"   Rank {w['rank']} arrives last in {w['last_count']} of {n} collectives, "
            f"{w['mean_late_s'] * 1e3:.1f} ms after the first rank on average "
            f"(p99 {w['p99_late_s'] * 1e3:.1f} ms); the other ranks spent {w['others_waited_s']:.3f} s "
            f"waiting for it, {100 * w['others_waited_fraction']:.0f}% of their time in these calls."
        )
        header = [
            "rank",
            "last (calls)",
            "mean late (ms)",
            "p99 late (ms)",
            "max late (ms)",
            "others waited (s)",
            "of their call time",
        ]
        rows = [
            [
                str(r["rank"]),
                f"{r['last_count']}/{n}",
                f"{r['mean_late_s'] * 1e3:.2f}",
                f"{r['p99_late_s'] * 1e3:.2f}",
                f"{r['max_late_s'] * 1e3:.2f}",
                f"{r['others_waited_s']:.3f}",
                f"{100 * r['others_waited_fraction']:.0f}%",
            ]
            for r in s["ranks"]
        ]
        lines += ["   " + line for line in _table(header, rows)]
        lines.append(
            f"   (arrival: a call's start on rank 0's clock; lateness below the clock error, "
            f"{s['clock_error_us']:.1f} us, is noise)"
        )
        lines.append("")
    return "\n".join(lines)


def plot_stragglers(report, path) -> str:
    """Lateness per rank over the calls, one panel per communicator, as a PNG (needs
    matplotlib).

    Parameters
    ----------
    report : list of dict
        What stragglers returned.
    path : str or os.PathLike
        The PNG file to write.

    Returns
    -------
    str
        `path`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [s for s in report if s["calls"]]
    fig, axes = plt.subplots(max(1, len(shown)), 1, figsize=(9, 3.2 * max(1, len(shown))), squeeze=False)
    for ax, s in zip(axes[:, 0], shown):
        seqs = [c["seq"] for c in s["calls"]]
        for q in range(s["size"]):
            ax.plot(seqs, [c["lateness_s"][q] * 1e3 for c in s["calls"]], marker=".", label=f"rank {q}")
        ax.set_title(f"communicator {s['comm_id']}: arrival after the first rank")
        ax.set_xlabel("collective seq")
        ax.set_ylabel("late (ms)")
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# --- command line ----------------------------------------------------------------------------


def main(argv=None) -> int:
    """The command line: python -m ringtree.analyze DIR [--stragglers] [--plot FILE.png]
    [--trace FILE.json] [--json].

    Parameters
    ----------
    argv : list of str or None
        The arguments; None: sys.argv[1:].

    Returns
    -------
    int
        The exit status: 0, or 1 when DIR holds no flight record.
    """
    p = argparse.ArgumentParser(
        prog="python -m ringtree.analyze",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", help="directory of dumps (ringtree-*.json) and/or traces (trace-*.json)")
    p.add_argument("--stragglers", action="store_true", help="who arrives last at collectives, and how late")
    p.add_argument("--plot", metavar="FILE.png", help="plot each rank's lateness over the calls")
    p.add_argument("--trace", metavar="FILE.json", help="merge every record into one Perfetto / Chrome trace")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    a = p.parse_args(argv)
    records = read_records(a.dir)
    if not records:
        print(f"ringtree.analyze: no flight records in {a.dir}", file=sys.stderr)
        return 1
    result = {"diagnosis": diagnose(records)}
    if a.stragglers or a.plot:
        result["stragglers"] = stragglers(records)
    if a.plot:
        plot_stragglers(result["stragglers"], a.plot)
    if a.trace:
        write_trace(records, a.trace)
    if a.json:
        print(json.dumps(result, indent=1))
        return 0
    if a.stragglers:  # the report asked for leads
        print(format_stragglers(result["stragglers"]))
    print(format_report(result["diagnosis"]))
    if "stragglers" in result and not a.stragglers:
        print(format_stragglers(result["stragglers"]))
    if a.plot:
        print(f"lateness plot: {a.plot}")
    if a.trace:
        print(f"merged trace: {a.trace} (open in https://ui.perfetto.dev)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
