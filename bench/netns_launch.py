#!/usr/bin/env python3
"""Run a ringtree program on emulated hosts made of network namespaces (as root).

  python bench/netns_launch.py --hosts 2 --ranks-per-host 2 --rate 2gbit -- \\
      python bench/rt_bench.py -b 64K -e 16M -f 4 --algo ring,tree,hier --vs gloo

Each host is a network namespace with its own stack; the hosts are joined by a bridge, and with
--rate every host's link is capped in both directions by `tc tbf` (bench/rtbench/netns.py makes
and removes all of it). Ranks of one host share memory; ranks of different hosts use TCP. Before
the program, a raw-socket baseline streams --raw-mb MB from host 0 to host 1 with plain Python
sockets and prints what the link carries, so the program's figures can be read against it.
Every rank gets RINGTREE_RANK, RINGTREE_WORLD_SIZE and RINGTREE_UNIQUE_ID (rank 0 listens on host
0's address), RINGTREE_IFNAME, and MASTER_ADDR / GLOO_SOCKET_IFNAME so torch's Gloo (rt_bench
--vs gloo) runs over the same links. --tcp-figures also hands the measured link rate to the cost
model (RINGTREE_TCP_MBPS) unless it is set.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time

from rtbench import netns

HERE = os.path.dirname(os.path.abspath(__file__))

RAW_PORT = 29611
CHUNK = 1 << 20


def _parse(argv):
    p = argparse.ArgumentParser(prog="bench/netns_launch.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=2, help="namespace hosts (2-4 in the tests; more work)")
    p.add_argument("--ranks-per-host", type=int, default=2, help="ranks in each host's namespace")
    p.add_argument("--rate", default=None, help="cap every host link at this tc rate (e.g. 2gbit)")
    p.add_argument("--raw-mb", type=int, default=64, help="MB the raw-socket baseline streams (0: skip it)")
    p.add_argument("--raw-repeats", type=int, default=3, help="raw-socket runs; the median is printed")
    p.add_argument(
        "--raw-ring",
        metavar="FIRST:LAST:FACTOR",
        default=None,
        help="also time the raw-socket ring baseline (bench/raw_socket.py) at these all_reduce sizes, "
        "e.g. 4K:64M:4, and print it beside the program's -J results",
    )
    p.add_argument("--raw-iters", default="10:3", metavar="N:W", help="raw ring: timed and warm-up iterations a size")
    p.add_argument("--raw-opts", default="", help="extra raw_socket.py flags, e.g. '--sockbuf 4194304 --streams 2'")
    p.add_argument(
        "--tcp-figures", action="store_true", help="set RINGTREE_TCP_MBPS from the raw baseline for the cost model"
    )
    p.add_argument("--timeout", type=float, default=None, help="stop every rank after this many seconds")
    p.add_argument("program", nargs=argparse.REMAINDER, help="-- command [args...] (run once per rank)")
    # one end of the raw baseline, run inside a namespace by the launcher itself
    p.add_argument("--raw-receive", nargs=2, metavar=("ADDR", "PORT"), help=argparse.SUPPRESS)
    p.add_argument("--raw-send", nargs=3, metavar=("ADDR", "PORT", "MB"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.raw_receive or args.raw_send:
        return args
    if args.program and args.program[0] == "--":
        args.program = args.program[1:]
    if not args.program:
        p.error("give the command to run after --")
    if args.raw_ring:
        import raw_socket

        try:
            raw_socket.parse_sizes(args.raw_ring)
            args.raw_n, args.raw_w = (int(x) for x in args.raw_iters.split(":"))
        except ValueError as exc:
            p.error(f"--raw-ring/--raw-iters: {exc}")
    if not 1 <= args.hosts <= 64 or not 1 <= args.ranks_per_host <= 64:
        p.error("--hosts and --ranks-per-host must be between 1 and 64")
    return args


# --- the raw-socket baseline: one TCP stream, the program's payload without any protocol --------


def raw_receive(addr: str, port: int):
    """Accepts one stream, reads it to the end, answers one byte (the sender's clock stops there)."""
    with socket.create_server((addr, port)) as server:
        print("ready", flush=True)
        conn, _ = server.accept()
        with conn:
            buf = bytearray(CHUNK)
            while conn.recv_into(buf):
                pass
            conn.sendall(b"k")


def raw_send(addr: str, port: int, mb: int):
    """Streams `mb` MB and prints the seconds from connecting to the receiver's answer."""
    payload = memoryview(bytes(CHUNK))
    total = mb * 1_000_000
    with socket.create_connection((addr, port), timeout=60) as conn:
        start = time.perf_counter()
        sent = 0
        while sent < total:
            sent += conn.send(payload[: min(CHUNK, total - sent)])
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)
        print(time.perf_counter() - start, flush=True)


def raw_baseline(hosts, mb: int, repeats: int) -> dict:
    """MB/s of a plain Python TCP stream from host 0 to host 1: the median of `repeats` runs."""
    me = [sys.executable, os.path.abspath(__file__)]
    runs = []
    for i in range(repeats):
        port = str(RAW_PORT + i)
        receiver = subprocess.Popen(
            hosts.prefix(1) + me + ["--raw-receive", hosts.addrs[1], port], stdout=subprocess.PIPE, text=True
        )
        try:
            receiver.stdout.readline()  # "ready": listening
            sender = subprocess.run(
                hosts.prefix(0) + me + ["--raw-send", hosts.addrs[1], port, str(mb)],
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            )
            runs.append(mb / float(sender.stdout.split()[-1]))
        finally:
            receiver.wait(timeout=30)
    return {"MBps": statistics.median(runs), "runs": runs}


def raw_ring(hosts, args) -> dict:
    """{size: seconds}: bench/raw_socket.py on every host at once, the slowest host's time a size."""
    cmd = [
        sys.executable,
        os.path.join(HERE, "raw_socket.py"),
        "--addrs",
        ",".join(hosts.addrs),
        "--sizes",
        args.raw_ring,
        "-n",
        str(args.raw_n),
        "-w",
        str(args.raw_w),
        *args.raw_opts.split(),
    ]
    procs = [
        subprocess.Popen(hosts.prefix(h) + cmd + ["--host", str(h)], stdout=subprocess.PIPE, text=True)
        for h in range(len(hosts.names))
    ]
    outs = []
    try:
        for pr in procs:
            out, _ = pr.communicate(timeout=600)
            if pr.returncode:
                raise RuntimeError(f"raw_socket.py failed with status {pr.returncode}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
    return {int(k): max(o["seconds"][k] for o in outs) for k in outs[0]["seconds"]}


def json_path(program) -> str:
    for flag, value in zip(program, program[1:]):
        if flag == "-J":
            return value
    return None


def summary(raw: dict, path: str, hosts: int, ranks_per_host: int):
    """One table: every ringtree algorithm and Gloo (in place, as Gloo runs) beside the raw-socket
    ring, as time in us and as raw time / their time (1.00: as fast as the bare sockets). The raw
    time is rt_bench's own `--vs raw` cell of the same run when there is one, else --raw-ring's."""
    with open(path) as f:
        results = [r for r in json.load(f)["results"] if r["collective"] == "all_reduce"]
    if not results:
        return

    def seconds(row, name):
        cells = row["cells"].get(name, {})
        cell = cells.get("ip") or cells.get("oop")
        return cell.get("seconds") if cell else None

    cols = sorted({c for r in results for c in r["cells"] if c != "raw"}, key=lambda c: (c == "gloo", c == "rawbuf", c))
    print(
        f"# netns_launch summary: all_reduce {results[0]['dtype']}, {hosts} hosts x {ranks_per_host} ranks, "
        "in place, slowest rank's average us; (x) = raw socket time / this time",
        flush=True,
    )
    print("#" + "size".rjust(11) + "raw".rjust(11) + "".join(c.split(":")[-1].rjust(16) for c in cols), flush=True)
    for r in results:
        base = seconds(r, "raw") or raw.get(r["size"])
        row = f"{r['size']:12d}" + (f"{base * 1e6:11.0f}" if base else "-".rjust(11))
        for c in cols:
            t = seconds(r, c)
            row += (f"{t * 1e6:.0f}" + (f" ({base / t:.2f})" if base else "")).rjust(16) if t else "-".rjust(16)
        print(row, flush=True)


# --- the launch ---------------------------------------------------------------------------------


def rank_env(rank, size, token, hosts, extra) -> dict:
    from ringtree.launch import rank_environment

    env = rank_environment(rank, size, token, 1)  # hosts are real here: no emulated host names
    env.update(RINGTREE_IFNAME=hosts.device, MASTER_ADDR=hosts.addrs[0], GLOO_SOCKET_IFNAME=hosts.device)
    env.update(extra)
    return env


def launch(args) -> int:
    import ringtree as rt
    from ringtree.launch import supervise

    size = args.hosts * args.ranks_per_host
    with netns.emulated_hosts(args.hosts, rate=args.rate) as hosts:
        print(f"# netns_launch: {hosts.describe()}", flush=True)
        print(
            f"# netns_launch: {size} ranks, {args.ranks_per_host} per host: "
            + " ".join(
                f"host{h}={{{','.join(str(h * args.ranks_per_host + i) for i in range(args.ranks_per_host))}}}"
                for h in range(args.hosts)
            ),
            flush=True,
        )
        print(f"# netns_launch: this machine has {os.cpu_count()} cores for all {size} ranks", flush=True)
        extra = {}
        if args.raw_mb > 0 and args.hosts >= 2:
            raw = raw_baseline(hosts, args.raw_mb, args.raw_repeats)
            print(
                f"# netns_launch: raw socket host0 -> host1: {raw['MBps']:.0f} MB/s "
                f"(median of {', '.join(f'{x:.0f}' for x in raw['runs'])}; {args.raw_mb} MB, one Python TCP stream)",
                flush=True,
            )
            if args.tcp_figures:
                extra.setdefault("RINGTREE_TCP_MBPS", os.environ.get("RINGTREE_TCP_MBPS", f"{raw['MBps']:.0f}"))
        raw = {}
        if args.raw_ring and args.hosts >= 2:
            raw = raw_ring(hosts, args)
            print(
                f"# netns_launch: raw socket ring ({args.hosts} hosts, bench/raw_socket.py {args.raw_opts}): "
                + ", ".join(f"{k}: {v * 1e6:.0f} us" for k, v in raw.items()),
                flush=True,
            )
        uid = rt.UniqueId.from_seed(hosts.addrs[0], 29500, secrets.token_hex(16))  # rank 0 listens on host 0
        procs = []
        try:
            for r in range(size):
                procs.append(
                    subprocess.Popen(
                        hosts.prefix(r // args.ranks_per_host) + args.program,
                        env=rank_env(r, size, str(uid), hosts, extra),
                    )
                )
        except BaseException:
            for p in procs:
                p.kill()
            raise
        status = supervise(procs, args.timeout, name="netns_launch")
        if status == 0 and json_path(args.program):
            summary(raw, json_path(args.program), args.hosts, args.ranks_per_host)
        return status


def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.raw_receive:
        raw_receive(args.raw_receive[0], int(args.raw_receive[1]))
        return 0
    if args.raw_send:
        raw_send(args.raw_send[0], int(args.raw_send[1]), int(args.raw_send[2]))
        return 0
    try:
        return launch(args)
    except netns.NetnsUnavailable as exc:
        print(f"netns_launch: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
