"""Flight records as a timeline: Chrome / Perfetto trace-event JSON, one track per rank.

A record is what Communicator.record() returns and what dumps hold (format
ringtree-flight-recorder/1): a rank's last calls, stamped with its own steady clock, and its
clock's offset to rank 0. Here every time is moved to rank 0's clock (aligned = t - offset_ns),
so one rank waiting for another shows as a long slice on the waiter beside a late start on the
other, not as slow work. Open the file in https://ui.perfetto.dev or chrome://tracing.

Tracks: one process per rank (pid = its rank in the largest communicator it belongs to,
named "rank r"), one thread per communicator of that rank (tid 0: the largest). Each call is a
complete event ("ph": "X") from its start to its end (a call still running ends at the
dump), named like the error messages ("all_reduce #3"), with its arguments: seq, count,
dtype, op, algo, bytes, label, state, error, and queued_us (time from the call being issued
to it starting: async calls wait behind earlier ones). Calls still queued are instant events.
Times are microseconds on rank 0's CLOCK_MONOTONIC, so separate files merge by concatenation.

RINGTREE_TRACE=DIR: each rank writes DIR/trace-<comm id>-rank<r>.json when a communicator
closes (Communicator.close, or at exit); `python -m ringtree.analyze DIR --trace all.json`
merges them (and any dumps there) into one file. The records themselves ride along under the
key "ringtreeDumps", so the analyzer reads traces as well as dumps.
"""

from __future__ import annotations

import glob
import json
import os

from ._files import write_json

__all__ = ["RECORD_FORMAT", "read_records", "trace_document", "write_trace", "write_rank_trace", "process_offsets"]

RECORD_FORMAT = "ringtree-flight-recorder/1"
TRACE_FORMAT = "ringtree-trace/1"
P2P = ("send", "recv", "sendrecv")


def read_records(directory) -> list:
    """Every flight record in `directory`: dumps (`ringtree-*.json`) and traces carrying
    their records; the newest per (comm id, rank).

    Parameters
    ----------
    directory : str, os.PathLike or list
        A directory, whose .json files are read, or a list of files.

    Returns
    -------
    list of dict
        The records.
    """
    paths = (
        sorted(glob.glob(os.path.join(directory, "*.json")))
        if isinstance(directory, (str, os.PathLike))
        else list(directory)
    )
    newest = {}
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            continue  # a half-written file or something else's JSON
        records = (
            [doc]
            if isinstance(doc, dict) and doc.get("format") == RECORD_FORMAT
            else (doc.get("ringtreeDumps", []) if isinstance(doc, dict) else [])
        )
        for rec in records:
            key = (rec["comm_id"], rec["rank"])
            if key not in newest or rec["dumped_ns"] > newest[key]["dumped_ns"]:
                newest[key] = rec
    return [newest[k] for k in sorted(newest)]


def _process(rec):
    return rec.get("host", ""), rec.get("pid", 0)


def process_offsets(records) -> dict:
    """Each process's clock offset to rank 0, taken from the largest communicator it belongs
    to, so all its communicators share one aligned clock.

    Parameters
    ----------
    records : list of dict
        Flight records, as read_records returns them (dumps and traces of any ranks).

    Returns
    -------
    dict
        (host, pid) -> (offset_ns, error_ns, rank, comm_id).
    """
    out = {}
    for rec in sorted(records, key=lambda r: (-r["size"], r["comm_id"])):
        out.setdefault(
            _process(rec), (rec["clock"]["offset_ns"], rec["clock"]["error_ns"], rec["rank"], rec["comm_id"])
        )
    return out


def call_name(call) -> str:
    """A call as the error messages name it: 'all_reduce #3', 'send to 1 #0'."""
    coll = call["coll"]
    if coll == "send":
        return f"send to {call['peer']} #{call['seq']}"
    if coll == "recv":
        return f"recv from {call['peer']} #{call['seq']}"
    if coll == "sendrecv":
        return f"sendrecv to {call['peer']} #{call['seq']} from {call['recv_peer']} #{call['recv_seq']}"
    return f"{coll} #{call['seq']}"


def _args(call) -> dict:
    args = {k: call[k] for k in ("id", "seq", "count", "dtype", "op", "algo", "bytes", "label", "state")}
    if call["coll"] in P2P:
        args.update(peer=call["peer"], recv_peer=call["recv_peer"], recv_seq=call["recv_seq"])
    if call.get("root", -1) >= 0:
        args["root"] = call["root"]
    if call.get("error"):
        args["error"] = f"{call['error_kind']}: {call['error']}"
    if call.get("started_ns") and call.get("enqueued_ns"):
        args["queued_us"] = round((call["started_ns"] - call["enqueued_ns"]) / 1e3, 3)
    if "waiting_on" in call:
        args["waiting_on"] = call["waiting_on"]
    return args


def trace_document(records) -> dict:
    """The trace-event JSON object of these records (any ranks, any communicators): one
    process per OS process, one track per communicator, on the clock aligned to rank 0.

    Parameters
    ----------
    records : list of dict
        Flight records, as read_records returns them (dumps and traces of any ranks).

    Returns
    -------
    dict
        The Chrome / Perfetto trace document.
    """
    offsets = process_offsets(records)
    # One trace process per OS process, numbered by its rank in its largest communicator.
    pids, taken = {}, set()
    for proc, (_, _, rank, _) in sorted(offsets.items(), key=lambda kv: kv[1][2]):
        pid = rank
        while pid in taken:
            pid += 1000
        pids[proc] = pid
        taken.add(pid)
    threads = {}  # (proc, comm_id) -> tid
    events = []
    for proc, pid in pids.items():
        offset, error, _, _ = offsets[proc]
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        mine = sorted((r for r in records if _process(r) == proc), key=lambda r: (-r["size"], r["comm_id"]))
        for tid, rec in enumerate(mine):
            threads[(proc, rec["comm_id"])] = tid
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": pid,
                    "tid": tid,
                    "args": {
                        "name": f"comm {rec['comm_id']} (rank {rec['rank']} of {rec['size']}, "
                        f"clock {offset / 1e3:+.1f} us +- {error / 1e3:.1f} us)"
                    },
                }
            )
    for rec in records:
        proc = _process(rec)
        pid, tid, offset = pids[proc], threads[(proc, rec["comm_id"])], offsets[proc][0]

        def us(t):
            return round((t - offset) / 1e3, 3)

        for call in rec["calls"]:
            cat = "p2p" if call["coll"] in P2P else "collective"
            base = {"name": call_name(call), "cat": cat, "pid": pid, "tid": tid, "args": _args(call)}
            if call.get("started_ns") is None:  # still queued at the dump
                events.append(dict(base, ph="i", s="t", ts=us(call["enqueued_ns"])))
                continue
            end = call["ended_ns"] if call.get("ended_ns") is not None else rec["dumped_ns"]
            events.append(
                dict(base, ph="X", ts=us(call["started_ns"]), dur=round(max(0, end - call["started_ns"]) / 1e3, 3))
            )
    clock = "; ".join(
        f"rank {pids[p]}: {o / 1e3:+.1f} us +- {e / 1e3:.1f} us"
        for p, (o, e, _, _) in sorted(offsets.items(), key=lambda kv: pids[kv[0]])
    )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"format": TRACE_FORMAT, "clock": "us on rank 0's CLOCK_MONOTONIC (t - offset)", "offsets": clock},
        "ringtreeDumps": list(records),
    }


def write_trace(records, path) -> str:
    """Write the trace of `records` to `path`, atomically.

    Parameters
    ----------
    records : list of dict
        Flight records, as read_records returns them (dumps and traces of any ranks).
    path : str or os.PathLike
        The JSON file to write.

    Returns
    -------
    str
        The path written.
    """
    return write_json(os.fspath(path), json.dumps(trace_document(records)))


def write_rank_trace(comm, directory) -> str:
    """RINGTREE_TRACE: this rank's trace of `comm` as DIR/trace-<comm id>-rank<r>.json.

    Parameters
    ----------
    comm : Communicator
        The communicator whose record is written.
    directory : str or os.PathLike
        Where the file goes.

    Returns
    -------
    str
        The path written.
    """
    return write_trace([comm.record("trace")], os.path.join(directory, f"trace-{comm.id}-rank{comm.rank}.json"))
