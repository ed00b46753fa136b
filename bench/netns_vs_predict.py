#!/usr/bin/env python3
"""ringtree.predict's predictions beside namespace runs' measurements (bench/RESULTS.md).

    python bench/netns_vs_predict.py RUN1.json [RUN2.json ...] --hosts 2 --local 2 --link-MBps 238 [--cores 1]

RUN*.json: rt_bench -J output of the same sweep run under bench/netns_launch.py, repeated (the
measured time is the median over the runs, out of place; reduce_scatter and all_gather runs are
read too); the link figure: the raw-socket baseline those runs printed. Prints measured and
predicted time per collective, algorithm and size, and the ratio; the shared-memory figures are
this machine's (its cached probe)."""
import argparse
import json
import statistics

from ringtree import predict


def measured(paths):
    """{(collective, size, count, algo): [seconds per run]}."""
    out = {}
    for path in paths:
        for row in json.load(open(path))["results"]:
            for impl, cell in row["cells"].items():
                algo = impl.partition(":")[2]
                if row["collective"] in predict.COLLECTIVES and algo in predict.COLLECTIVES[row["collective"]]:
                    key = (row["collective"], row["size"], row["count"], algo)
                    out.setdefault(key, []).append(cell["oop"]["seconds"])
    return out


def burst_saving(algo, hosts, local, block, m, coll, burst):
    """What tbf's bucket saves a call: the trees' reduce and broadcast phases use one direction
    each, in turn, so each phase starts on a direction idle (and its bucket refilled) during
    the other, and passes up to `burst` bytes of the host's traffic at line speed; the rings
    keep both directions busy call after call and save nothing once running. Over back-to-back
    calls a direction cannot average more than the rate, so a call still takes at least one
    phase's bytes at the rate: the saving is at most one phase's link time."""
    if not burst or hosts < 2 or algo not in ("tree", "hier_tree"):
        return 0.0
    k = predict.counts(algo, hosts, local, block, m, collective=coll)
    per_phase = k.link / 2 * k.streams  # the host's bytes one way in one phase
    return min(2 * burst, per_phase) / m.tcp_Bps


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+")
    p.add_argument("--hosts", type=int, required=True)
    p.add_argument("--local", type=int, required=True)
    p.add_argument("--link-MBps", type=float, required=True, help="the host link's rate (raw-socket baseline)")
    p.add_argument("--inter-hop-us", type=float, default=None, help="one message between hosts (default: the model's)")
    p.add_argument("--cores", type=int, default=0, help="cores per host (default: one per rank)")
    p.add_argument("--burst-KB", type=float, default=0,
                   help="the emulated link's tc tbf bucket (bench/rtbench/netns.py: 2 ms of the rate, 500 KB at "
                        "2gbit): a link direction that has been idle passes that much at line speed")
    args = p.parse_args(argv)
    over = dict(tcp_Bps=args.link_MBps * 1e6, nics=1, cores=args.cores)
    if args.inter_hop_us is not None:
        over["tcp_hop_s"] = args.inter_hop_us * 1e-6
    m = predict.Machine.from_costs(predict.measured_machine(), **over)
    print(f"# {args.hosts} x {args.local}, link {args.link_MBps:g} MB/s shared by a host's ranks, "
          f"inter-host hop {m.tcp_hop_s * 1e6:g} us, cores per host {args.cores or 'one per rank'}, "
          f"tbf bucket {args.burst_KB:g} KB; "
          f"measured: median of {len(args.results)} run(s)")
    print(f"| {'collective':14s} | {'algo':9s} | {'size':>9s} | measured us | predicted us | predicted / measured |")
    print("|---|---|---:|---:|---:|---:|")
    for (coll, size, count, algo), times in sorted(measured(args.results).items()):
        t = statistics.median(times)
        block = size if coll == "all_reduce" else size // (args.hosts * args.local)
        predicted = predict.predict(algo, args.hosts, args.local, block, m, collective=coll)
        predicted -= burst_saving(algo, args.hosts, args.local, block, m, coll, args.burst_KB * 1e3)
        print(f"| {coll:14s} | {algo:9s} | {size:9d} | {t * 1e6:11.0f} | {predicted * 1e6:12.0f} | {predicted / t:20.2f} |")


if __name__ == "__main__":
    main()
