"""Predicted all_reduce time and bus bandwidth beyond this machine: flat ring, tree and the
hierarchical algorithms on hosts x local ranks, from 8 to 4096 ranks.

    python -m ringtree.simulate --inter-GBps 25 --inter-hop-us 5 --local 8 --size 256M
    python -m ringtree.simulate --machine --plot busbw.png

The prices are the C++ cost model's (csrc/algorithms/pricing.cc), term for term:
    time = call + hops x hop + bytes of each kind x seconds per byte of that kind
with a hop and a byte priced by link (shared memory inside a host, TCP between hosts) and by the
working set (in cache or from memory), as rates_for() there prices them. What the C++ model counts
by building every rank's schedule (O(P^2) work, out of reach at thousands of ranks), this module
writes in closed form: the busiest rank's bytes of each kind (computed for every rank, and the
busiest chosen as pricing.cc chooses it) and the hops on the critical path. tests/unit check these
against the C++ counts and tests/multiproc against the communicator's own estimate().
One addition the C++ model lacks: --nics-per-host shares a host's link among the ranks that cross
it at once (the model gives every rank a full TCP stream), as one veth per namespace host or one
NIC for eight GPUs would; leave it out for one NIC per rank.
Flat tree across hosts is approximate: every hop on its critical path is priced as a hop between
hosts (its pipeline runs at the pace of its slowest link), where the C++ model finds the slowest
path exactly.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, replace

ALGOS = ("ring", "tree", "hier", "hier_tree")
TREE_SEGMENT = 128 << 10  # bytes; RINGTREE_TREE_SEGMENT_BYTES's default (algorithms/build.cc)


@dataclass(frozen=True)
class Machine:
    """The cost model's figures (MachineCosts in algorithms/pricing.h), in seconds and bytes/s."""
    call_s: float = 2.5e-6
    hop_s: float = 0.6e-6
    switch_s: float = 8e-6
    tcp_hop_s: float = 40e-6
    tcp_Bps: float = 2e9
    copy_hot_Bps: float = 20e9
    copy_cold_Bps: float = 8e9
    reduce_hot_Bps: float = 12e9
    reduce_cold_Bps: float = 6e9
    l2_bytes: float = 1 << 20
    l3_bytes: float = 32 << 20
    cores: int = 0  # cores per host; 0: one per local rank (no oversubscription)
    nics: int = 0  # ranks of a host that each get the full tcp_Bps at once; 0: every rank (the C++ model)

    @classmethod
    def from_costs(cls, m: dict, **overrides) -> "Machine":
        """From Communicator.machine_costs()."""
        made = cls(call_s=m["call_us"] * 1e-6, hop_s=m["hop_us"] * 1e-6, switch_s=m["switch_us"] * 1e-6,
                   tcp_hop_s=m["tcp_hop_us"] * 1e-6, tcp_Bps=m["tcp_GBps"] * 1e9,
                   copy_hot_Bps=m["copy_hot_GBps"] * 1e9, copy_cold_Bps=m["copy_cold_GBps"] * 1e9,
                   reduce_hot_Bps=m["reduce_hot_GBps"] * 1e9, reduce_cold_Bps=m["reduce_cold_GBps"] * 1e9,
                   l2_bytes=m["l2_KiB"] * 1024, l3_bytes=m["l3_KiB"] * 1024, cores=int(m["cores"]))
        return replace(made, **overrides)


@dataclass(frozen=True)
class Rates:
    """Seconds per call, per hop and per byte of each kind (rates_for in pricing.cc)."""
    call: float
    hop: float
    net: float
    reduce: float
    copy: float
    remote_hop: float
    remote_net: float
    remote_reduce: float


def rates(m: Machine, buffer_bytes: float, local_ranks: int, streams: int = 1, half: bool = False) -> Rates:
    """The rates for a call whose larger buffer is `buffer_bytes` with `local_ranks` ranks a host;
    `streams`: ranks of one host crossing its link at once (only with m.nics)."""
    working_set = 2 * buffer_bytes
    if working_set <= m.l2_bytes:
        cold = 0.0
    elif working_set >= m.l3_bytes:
        cold = 1.0
    else:
        cold = math.log(working_set / m.l2_bytes) / math.log(m.l3_bytes / m.l2_bytes)
    cores = m.cores or local_ranks
    share = local_ranks / cores if local_ranks > cores else 1.0
    per_byte = lambda hot, cold_rate: (1 - cold) / hot + cold / cold_rate  # noqa: E731
    copy = share * per_byte(m.copy_hot_Bps, m.copy_cold_Bps)
    reduce = share * (2.0 if half else 1.0) * per_byte(m.reduce_hot_Bps, m.reduce_cold_Bps)
    link = m.tcp_Bps * (min(1.0, m.nics / streams) if m.nics else 1.0)
    return Rates(call=m.call_s * share, hop=2 * share * m.switch_s if local_ranks > cores else m.hop_s,
                 net=copy, reduce=reduce, copy=copy, remote_hop=m.tcp_hop_s,
                 remote_net=max(copy, 1 / link), remote_reduce=max(reduce, 1 / link))


@dataclass
class Counts:
    """What the busiest rank moves (bytes, of which remote_*: to or from another host) and the
    hops on the critical path (of which remote_hops between hosts), the handshake included."""
    hops: float = 0
    remote_hops: float = 0
    sent: float = 0
    received: float = 0
    reduced: float = 0
    copied: float = 0
    remote_sent: float = 0
    remote_received: float = 0
    remote_reduced: float = 0
    streams: int = 1  # ranks of one host that cross its link at once


def tree_depth(P: int) -> int:
    return P.bit_length() - 1


def tree_hops(P: int, segments: int) -> int:
    """Critical path of the pipelined binary-tree all_reduce (reduce up, broadcast down; heap
    order, algorithms/tree.cc) in hops: 2 per segment at P=2; else 3 a segment (two children
    reduced in turn, one broadcast step), plus the pipeline's fill down the tree and back."""
    if P <= 1:
        return 0
    if P == 2:
        return 2 * segments
    d = tree_depth(P)
    return 3 * segments + 3 * d - 4 + (0 if P == 1 << d else 1)


def tree_neighbours(P: int, r: int):
    """(parent or -1, children) of rank r in the heap-ordered binary tree rooted at 0."""
    return ((r - 1) // 2 if r else -1), [c for c in (2 * r + 1, 2 * r + 2) if c < P]


class _Rank:
    __slots__ = ("sent", "received", "reduced", "remote_sent", "remote_received", "remote_reduced")

    def __init__(self):
        self.sent = self.received = self.reduced = 0.0
        self.remote_sent = self.remote_received = self.remote_reduced = 0.0

    def send(self, n, remote):
        self.sent += n
        self.remote_sent += n if remote else 0

    def receive(self, n, remote, reduce):
        if reduce:
            self.reduced += n
            self.remote_reduced += n if remote else 0
        else:
            self.received += n
            self.remote_received += n if remote else 0


def _ring_pass(me: _Rank, n: float, to_remote: bool, from_remote: bool, P: int):
    """A ring all_reduce of n bytes among P ranks: reduce-scatter then all-gather."""
    block = n * (P - 1) / P
    me.send(2 * block, to_remote)
    me.receive(block, from_remote, reduce=True)
    me.receive(block, from_remote, reduce=False)


def _tree_pass(me: _Rank, n: float, P: int, r: int, remote_to):
    """A tree all_reduce of n bytes among P ranks, as rank r: each child's data reduced in and
    the result sent down to it; this rank's sum sent up and the result received from above."""
    parent, children = tree_neighbours(P, r)
    for c in children:
        me.receive(n, remote_to(c), reduce=True)
        me.send(n, remote_to(c))
    if parent >= 0:
        me.send(n, remote_to(parent))
        me.receive(n, remote_to(parent), reduce=False)


def per_rank(algo: str, hosts: int, local: int, nbytes: float) -> list:
    """Every rank's bytes of each kind for an all_reduce of nbytes a rank (ranks host by host)."""
    P = hosts * local
    out = []
    for r in range(P):
        me = _Rank()
        h, j = divmod(r, local)
        if algo == "ring":
            _ring_pass(me, nbytes, (r + 1) % P // local != h, (r - 1) % P // local != h, P)
        elif algo == "tree":
            _tree_pass(me, nbytes, P, r, lambda q: q // local != h)
        elif algo in ("hier", "hier_tree"):
            # intra-host ring reduce-scatter and all-gather, then column j among the hosts' owners
            _ring_pass(me, nbytes, False, False, local)
            if hosts > 1:
                column = nbytes / local
                if algo == "hier":
                    _ring_pass(me, column, True, True, hosts)
                else:
                    _tree_pass(me, column, hosts, h, lambda g: True)
        else:
            raise ValueError(f"unknown algorithm {algo!r}; choose from {', '.join(ALGOS)}")
        out.append(me)
    return out


def link_weight(m: Machine) -> float:
    """How much a byte between hosts weighs against a local one (link_weights in pricing.cc)."""
    r = rates(m, m.l3_bytes, 1)
    return r.remote_net / r.net


def busiest(ranks: list, weight: float) -> _Rank:
    """The rank pricing.cc prices: the most bytes, a remote byte weighing `weight`; of two that
    tie, the one that reduces more, then the lower rank."""
    best, most, most_reduced = None, -1.0, -1.0
    for me in ranks:
        remote = me.remote_sent + me.remote_received + me.remote_reduced
        total = me.sent + me.received + me.reduced + (weight - 1) * remote
        if total > most or (total == most and me.reduced > most_reduced):
            best, most, most_reduced = me, total, me.reduced
    return best


def counts(algo: str, hosts: int, local: int, nbytes: float, m: Machine = Machine(),
           segment: int = TREE_SEGMENT) -> Counts:
    """The cost model's counts of an all_reduce of nbytes a rank on hosts x local ranks."""
    if hosts < 1 or local < 1:
        raise ValueError(f"hosts and local ranks must be at least 1, got {hosts} x {local}")
    if nbytes < 0:
        raise ValueError(f"nbytes must not be negative, got {nbytes}")
    P = hosts * local
    if P == 1 or nbytes == 0:
        return Counts()
    me = busiest(per_rank(algo, hosts, local, nbytes), link_weight(m))
    k = Counts(sent=me.sent, received=me.received, reduced=me.reduced, remote_sent=me.remote_sent,
               remote_received=me.remote_received, remote_reduced=me.remote_reduced)
    across = hosts > 1
    segments = lambda n: max(1, math.ceil(n / segment))  # noqa: E731
    if algo == "ring":
        k.hops, k.remote_hops = 2 * (P - 1), 2 * (P - 1) if across else 0
    elif algo == "tree":
        k.hops = tree_hops(P, segments(nbytes))
        k.remote_hops = k.hops if across else 0
        k.streams = max(1, max(sum(1 for j in range(local) if any(
            q // local != h for q in [tree_neighbours(P, h * local + j)[0], *tree_neighbours(P, h * local + j)[1]]
            if q >= 0)) for h in range(hosts)))
    else:
        inter = 2 * (hosts - 1) if algo == "hier" else tree_hops(hosts, segments(nbytes / local))
        k.hops, k.remote_hops = 2 * (local - 1) + inter, inter
        k.streams = local
    k.hops += 1  # the executor's fingerprint handshake with the next rank
    k.remote_hops += 1 if across else 0
    return k


def predict(algo: str, hosts: int, local: int, nbytes: float, m: Machine = Machine(), half: bool = False) -> float:
    """Predicted seconds of an all_reduce of nbytes a rank (pricing.cc's predict())."""
    if hosts * local == 1 or nbytes == 0:
        return m.call_s
    k = counts(algo, hosts, local, nbytes, m)
    r = rates(m, nbytes, local, k.streams, half)
    data = ((k.sent + k.received - k.remote_sent - k.remote_received) * r.net
            + (k.remote_sent + k.remote_received) * r.remote_net
            + (k.reduced - k.remote_reduced) * r.reduce + k.remote_reduced * r.remote_reduce + k.copied * r.copy)
    return r.call + (k.hops - k.remote_hops) * r.hop + k.remote_hops * r.remote_hop + data


def busbw(nbytes: float, seconds: float, P: int) -> float:
    """nccl-tests' all_reduce bus bandwidth in bytes/s: size / time x 2(P-1)/P."""
    return nbytes / seconds * 2 * (P - 1) / P if P > 1 else nbytes / seconds


def sweep(m: Machine, local: int, ranks: list, nbytes: float, algos=ALGOS) -> list:
    """Rows of {ranks, hosts, local, algo: {seconds, busbw}} for each rank count."""
    rows = []
    for P in ranks:
        if P % local:
            raise ValueError(f"{P} ranks do not fill hosts of {local} local ranks")
        hosts = P // local
        row = {"ranks": P, "hosts": hosts, "local": local}
        for a in algos:
            t = predict(a, hosts, local, nbytes, m)
            row[a] = {"seconds": t, "busbw": busbw(nbytes, t, P)}
        rows.append(row)
    return rows


def table(rows: list, algos, nbytes: float) -> str:
    head = f"# all_reduce of {nbytes / 2**20:g} MiB a rank: predicted time (us) and busbw (GB/s)"
    cols = "".join(f" {a + ' us':>11s} {a + ' GB/s':>14s}" for a in algos)
    lines = [head, f"{'ranks':>6s} {'hosts x local':>14s}{cols}  best"]
    for row in rows:
        cells = "".join(f" {row[a]['seconds'] * 1e6:11.1f} {row[a]['busbw'] / 1e9:14.2f}" for a in algos)
        best = min(algos, key=lambda a: row[a]["seconds"])
        lines.append(f"{row['ranks']:6d} {str(row['hosts']) + ' x ' + str(row['local']):>14s}{cells}  {best}")
    return "\n".join(lines)


def plot(rows: list, algos, nbytes: float, path: str, title: str = ""):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for a in algos:
        ax.plot([r["ranks"] for r in rows], [r[a]["busbw"] / 1e9 for r in rows], marker="o", label=a)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks (hosts x local ranks)")
    ax.set_ylabel("predicted busbw (GB/s)")
    ax.set_title(title or f"ringtree.simulate: all_reduce, {nbytes / 2**20:g} MiB a rank")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_size(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B")
    if t and t[-1] in units and t[-1] != "":
        return int(float(t[:-1]) * units[t[-1]])
    return int(float(t))


def measured_machine() -> dict:
    """This machine's figures from a one-rank communicator's probe (RINGTREE_TCP_* for TCP)."""
    from . import init
    comm = init(rank=0, size=1)
    try:
        return comm.machine_costs()
    finally:
        comm.close()


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m ringtree.simulate", description=__doc__.split("\n\n")[0])
    p.add_argument("--machine", action="store_true",
                   help="start from this machine's measured figures (Communicator.machine_costs())")
    p.add_argument("--costs-json", default=None, metavar="FILE", help="start from a saved machine_costs() dict")
    p.add_argument("--intra-hop-us", type=float, help="one message between ranks of a host (us)")
    p.add_argument("--intra-GBps", type=float, help="copy bandwidth inside a host (GB/s; in cache and from memory)")
    p.add_argument("--reduce-GBps", type=float, help="float32 sum bandwidth inside a host (GB/s)")
    p.add_argument("--inter-hop-us", type=float, help="one message between hosts (us)")
    p.add_argument("--inter-GBps", type=float, help="bandwidth between hosts (GB/s) a rank, or a host link with --nics-per-host")
    p.add_argument("--nics-per-host", type=int, default=None,
                   help="ranks of a host that can each use --inter-GBps at once (default: all, as the C++ model)")
    p.add_argument("--cores", type=int, default=None, help="cores per host (default: one per local rank)")
    p.add_argument("--local", type=int, default=8, help="ranks per host")
    p.add_argument("--ranks", default="8,16,32,64,128,256,512,1024,2048,4096", help="comma list of world sizes")
    p.add_argument("--size", default="64M", help="all_reduce bytes a rank (K/M/G)")
    p.add_argument("--algos", default=",".join(ALGOS), help="comma list of " + ", ".join(ALGOS))
    p.add_argument("--plot", default=None, metavar="FILE.png", help="draw predicted busbw against rank count")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = p.parse_args(argv)
    args.algos = [a for a in args.algos.split(",") if a]
    bad = [a for a in args.algos if a not in ALGOS]
    if bad:
        p.error(f"unknown algorithm {bad[0]!r}; choose from {', '.join(ALGOS)}")
    try:
        args.ranks = [int(x) for x in args.ranks.split(",") if x]
        args.nbytes = parse_size(args.size)
    except ValueError as exc:
        p.error(str(exc))
    if args.local < 1 or any(P < 1 or P % args.local for P in args.ranks):
        p.error(f"every --ranks value must be a positive multiple of --local {args.local}")
    for name in ("intra_hop_us", "intra_GBps", "reduce_GBps", "inter_hop_us", "inter_GBps", "nics_per_host", "cores"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    return args


def machine_from_args(args) -> Machine:
    if args.costs_json:
        m = Machine.from_costs(json.load(open(args.costs_json)))
    elif args.machine:
        m = Machine.from_costs(measured_machine())
    else:
        m = Machine()
    over = {}
    if args.intra_hop_us is not None:
        over["hop_s"] = args.intra_hop_us * 1e-6
    if args.intra_GBps is not None:
        over["copy_hot_Bps"] = over["copy_cold_Bps"] = args.intra_GBps * 1e9
    if args.reduce_GBps is not None:
        over["reduce_hot_Bps"] = over["reduce_cold_Bps"] = args.reduce_GBps * 1e9
    if args.inter_hop_us is not None:
        over["tcp_hop_s"] = args.inter_hop_us * 1e-6
    if args.inter_GBps is not None:
        over["tcp_Bps"] = args.inter_GBps * 1e9
    if args.nics_per_host is not None:
        over["nics"] = args.nics_per_host
    over["cores"] = args.cores or 0
    return replace(m, **over)


def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    m = machine_from_args(args)
    rows = sweep(m, args.local, args.ranks, args.nbytes, args.algos)
    if args.json:
        print(json.dumps({"machine": asdict(m), "nbytes": args.nbytes, "rows": rows}, indent=1))
    else:
        print(f"# machine: {', '.join(f'{k}={v:g}' for k, v in asdict(m).items())}")
        print(table(rows, args.algos, args.nbytes))
    if args.plot:
        plot(rows, args.algos, args.nbytes, args.plot)
        print(f"# plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
