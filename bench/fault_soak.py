"""The fault campaign as a soak: many seeded trials of one injected fault each (issue 14 item 5;
the trials and their checks are in tests/support/faults.py), then a summary.

    python bench/fault_soak.py --trials 1000 --seed 7 [--out DIR] [--minutes M]
    python bench/fault_soak.py --only 7-123 [7-456 ...]      # rerun trials alone, in full

Prints a line per trial, then the summary: trials, hangs, failures by kind, and detection time
(median and worst, in seconds from the fault to each survivor's error) per fault kind and for a
SIGKILLed peer after rendezvous. With --out, writes DIR/summary.json, DIR/records.jsonl (every
trial) and DIR/failures/ID.txt (a failing trial's parameters, problems and every rank's output).
Exit status 1 when any trial failed. Network-namespace trials need root and `ip netns`; without
them they are skipped, and the summary says why.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

import faults  # noqa: E402
import netns  # noqa: E402


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=100, help="trials to run (indices 0..N-1 of the campaign)")
    p.add_argument("--seed", type=int, default=0, help="campaign seed: trial i of seed S is always the same")
    p.add_argument("--out", default=None, help="directory for the summary, every record and the failures")
    p.add_argument("--minutes", type=float, default=None, help="start no trial after this many minutes")
    p.add_argument("--only", nargs="+", metavar="ID", default=None, help="run these trials (SEED-INDEX) alone")
    return p.parse_args(argv)


def machine_state() -> dict:
    commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "-C", HERE, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout
    return {"cpus": os.cpu_count(), "load_average": os.getloadavg(), "python": platform.python_version(),
            "kernel": platform.release(), "commit": commit.strip() + ("+changes" if dirty.strip() else ""),
            "root": os.geteuid() == 0}


def line(record) -> str:
    t = record["trial"]
    head = f"{t['id']:>9} {t['kind']:>8} {t['moment']:>12} {t['collective']:>14} {t['size']:>5} {t['algo']:>6} " \
           f"{t['transport']:>6} P={t['nranks']} v={t['victim']}"
    if "skipped" in record:
        return f"{head}  skipped"
    detections = [s["detection_s"] for s in record["survivors"] if "detection_s" in s]
    worst = f"{max(detections):6.2f}" if detections else "   n/a"
    verdict = "ok" if not record["problems"] else "FAIL " + ",".join(faults.problem_kinds(record))
    return f"{head}  detect<={worst}s  {record['seconds']:5.1f}s  {verdict}"


def report(summary) -> str:
    out = [f"trials {summary['trials']} (ran {summary['ran']}), hangs {summary['hangs']}, failed {summary['failed']}"]
    for reason, n in summary["skipped"].items():
        out.append(f"skipped {n}: {reason}")
    for kind, p in summary["problems"].items():
        out.append(f"problem {kind}: {p['trials']} trials, e.g. {' '.join(p['ids'][:8])}")
    k = summary["killed_peer_detection"]
    out.append(f"SIGKILLed peer after rendezvous: median {k['median_s']} s, worst {k['worst_s']} s "
               f"over {k['survivors']} survivors")
    out.append(f"{'fault kind':>12} {'trials':>6} {'failed':>6} {'survivors':>9} {'median s':>8} {'worst s':>8}")
    for kind, p in summary["per_kind"].items():
        out.append(f"{kind:>12} {p['trials']:>6} {p['failed']:>6} {p['survivors']:>9} {p['median_s']!s:>8} {p['worst_s']!s:>8}")
    out.append(f"{'moment':>12} {'trials':>6} {'failed':>6} {'median s':>8} {'worst s':>8}  landed in")
    for moment, p in summary["per_moment"].items():
        landed = ", ".join(f"{where} {n}" for where, n in p["landed"].items())
        out.append(f"{moment:>12} {p['trials']:>6} {p['failed']:>6} {p['median_s']!s:>8} {p['worst_s']!s:>8}  {landed}")
    s = summary["trial_seconds"]
    out.append(f"trial wall time: median {s['median']} s, worst {s['worst']} s, total {s['total']} s")
    return "\n".join(out)


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    trials = [faults.parse_trial_id(i) for i in args.only] if args.only else faults.make_campaign(args.seed, args.trials)
    if not hasattr(faults.rt.Communicator, "shrink"):
        print(f"note: {faults.NO_SHRINK}")
    state = machine_state()
    out_dir = args.out
    if out_dir:
        os.makedirs(os.path.join(out_dir, "failures"), exist_ok=True)
    records, started = [], time.monotonic()
    with contextlib.ExitStack() as stack:
        namespaces = None
        if any(t.transport == "netns" for t in trials):
            try:
                namespaces = stack.enter_context(netns.two_namespaces())
            except netns.NetnsUnavailable as exc:
                print(f"note: network-namespace trials are skipped: {exc}")
        log = stack.enter_context(open(os.path.join(out_dir, "records.jsonl"), "w")) if out_dir else None
        for trial in trials:
            if args.minutes is not None and time.monotonic() - started > args.minutes * 60:
                print(f"stopping: {args.minutes} minutes are up after {len(records)} trials")
                break
            record = faults.run_trial(trial, namespaces)
            records.append(record)
            print(line(record), flush=True)
            if args.only or record["problems"]:
                text = faults.describe(record)
                if args.only:
                    print(text)
                    print(json.dumps({k: record.get(k) for k in ("fault", "survivors", "victim")}, indent=1))
                if out_dir and record["problems"]:
                    with open(os.path.join(out_dir, "failures", f"{trial.id}.txt"), "w") as f:
                        f.write(text + "\n")
            if log:
                log.write(json.dumps(record) + "\n")
                log.flush()
    summary = faults.summarize(records)
    summary.update(seed=args.seed, command=" ".join([os.path.basename(sys.executable), "bench/fault_soak.py"] +
                                                    (argv if argv is not None else sys.argv[1:])),
                   wall_seconds=round(time.monotonic() - started, 1), machine=state,
                   load_average_after=os.getloadavg())
    print()
    print(report(summary))
    if out_dir:
        with open(os.path.join(out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
