#!/usr/bin/env python3
"""The simulator's predictions beside a namespace run's measurements (bench/RESULTS.md).

    python bench/netns_vs_simulate.py RESULTS.json --hosts 2 --local 2 --link-MBps 238 [--cores 1]

RESULTS.json: rt_bench -J output of an all_reduce sweep run under bench/netns_launch.py; the link
figure: the raw-socket baseline that run printed. Prints measured and predicted time per algorithm
and size, and the ratio; the shared-memory figures are this machine's (its cached probe)."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

from ringtree import simulate  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results")
    p.add_argument("--hosts", type=int, required=True)
    p.add_argument("--local", type=int, required=True)
    p.add_argument("--link-MBps", type=float, required=True, help="the host link's rate (raw-socket baseline)")
    p.add_argument("--inter-hop-us", type=float, default=None, help="one message between hosts (default: the model's)")
    p.add_argument("--cores", type=int, default=0, help="cores per host (default: one per rank)")
    args = p.parse_args(argv)
    over = dict(tcp_Bps=args.link_MBps * 1e6, nics=1, cores=args.cores)
    if args.inter_hop_us is not None:
        over["tcp_hop_s"] = args.inter_hop_us * 1e-6
    m = simulate.Machine.from_costs(simulate.measured_machine(), **over)
    print(f"# {args.hosts} x {args.local}, link {args.link_MBps:g} MB/s shared by a host's ranks, "
          f"inter-host hop {m.tcp_hop_s * 1e6:g} us, cores per host {args.cores or 'one per rank'}")
    print(f"| {'algo':9s} | {'size':>9s} | measured us | predicted us | predicted / measured |")
    print("|---|---:|---:|---:|---:|")
    for row in json.load(open(args.results))["results"]:
        for impl, cell in row["cells"].items():
            algo = impl.partition(":")[2]
            if algo not in simulate.ALGOS:
                continue
            measured = cell["oop"]["seconds"]
            predicted = simulate.predict(algo, args.hosts, args.local, row["size"], m)
            print(f"| {algo:9s} | {row['size']:9d} | {measured * 1e6:11.0f} | {predicted * 1e6:12.0f} | "
                  f"{predicted / measured:20.2f} |")


if __name__ == "__main__":
    main()
