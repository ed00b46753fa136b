"""Predicted time and bus bandwidth of all_reduce, reduce_scatter and all_gather beyond this
machine: flat ring, tree and the hierarchical algorithms on hosts x local ranks, from 8 to 4096 ranks::

    python -m ringtree.predict --inter-GBps 25 --inter-hop-us 5 --local 8 --size 256M
    python -m ringtree.predict --machine --plot busbw.png

The prices are the C++ cost model's (csrc/algorithms/pricing.cc), term for term::

    time = call + hops x hop + bytes of each kind x seconds per byte of that kind

with a hop and a byte priced by link (shared memory inside a host, TCP between hosts) and by the
working set (in cache or from memory), as rates_for() there prices them. The bytes across hosts
cost the larger of their CPU time and the link's time, and a link carries both directions at
once: it counts, step by step, the larger of what a step sends and receives across hosts. When a
host's ranks outnumber its cores (--cores), the data takes the longer of the busiest rank's work
and the host's whole work over its cores. What the C++ model counts
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
# The algorithms each collective has here (algorithms/build.cc and hier.cc): reduce_scatter and
# all_gather have no flat tree and no tree between hosts.
COLLECTIVES = {"all_reduce": ALGOS, "reduce_scatter": ("ring", "hier"), "all_gather": ("ring", "hier")}
TREE_SEGMENT = 128 << 10  # bytes; RINGTREE_TREE_SEGMENT_BYTES's default (algorithms/build.cc)


@dataclass(frozen=True)
class Machine:
    """The cost model's figures (MachineCosts in algorithms/pricing.h), in seconds and bytes/s.

    Parameters
    ----------
    call_s, hop_s, switch_s, tcp_hop_s : float
        The attribute of that name, in seconds.
    tcp_Bps, copy_hot_Bps, copy_cold_Bps, reduce_hot_Bps, reduce_cold_Bps : float
        The attribute of that name, in bytes/s.
    l2_bytes, l3_bytes : float
        The attribute of that name, in bytes.
    cores, nics : int
        The attribute of that name.
    """

    call_s: float = 2.5e-6
    """Seconds of one call's fixed cost."""
    hop_s: float = 0.6e-6
    """Seconds of one hop through shared memory on a host."""
    switch_s: float = 8e-6
    """Seconds of a switch between processes; a hop costs two when local ranks outnumber cores."""
    tcp_hop_s: float = 40e-6
    """Seconds of one hop over TCP between hosts."""
    tcp_Bps: float = 2e9
    """Bytes/s of one rank's TCP link between hosts."""
    copy_hot_Bps: float = 20e9
    """Bytes/s of a copy whose data is in cache."""
    copy_cold_Bps: float = 8e9
    """Bytes/s of a copy from memory."""
    reduce_hot_Bps: float = 12e9
    """Bytes/s of a reduction whose data is in cache."""
    reduce_cold_Bps: float = 6e9
    """Bytes/s of a reduction from memory."""
    l2_bytes: float = 1 << 20
    """Size of a core's L2 cache in bytes."""
    l3_bytes: float = 32 << 20
    """Size of the shared L3 cache in bytes."""
    cores: int = 0  # cores per host; 0: one per local rank (no oversubscription)
    """Cores per host; 0 means one per local rank (no oversubscription)."""
    nics: int = 0  # ranks of a host that each get the full tcp_Bps at once; 0: every rank (the C++ model)
    """Ranks of a host that each get the full tcp_Bps at once; 0 means every rank (the C++ model)."""

    @classmethod
    def from_costs(cls, m: dict, **overrides) -> Machine:
        """From Communicator.status().machine.

        Parameters
        ----------
        m : dict
            The `machine` figures of a Status (call_us, hop_us, ..., l2_KiB, l3_KiB, cores).
        **overrides
            Attributes to set instead of the status's figures, e.g. nics=1.

        Returns
        -------
        Machine
            The figures in seconds and bytes/s.
        """
        made = cls(
            call_s=m["call_us"] * 1e-6,
            hop_s=m["hop_us"] * 1e-6,
            switch_s=m["switch_us"] * 1e-6,
            tcp_hop_s=m["tcp_hop_us"] * 1e-6,
            tcp_Bps=m["tcp_GBps"] * 1e9,
            copy_hot_Bps=m["copy_hot_GBps"] * 1e9,
            copy_cold_Bps=m["copy_cold_GBps"] * 1e9,
            reduce_hot_Bps=m["reduce_hot_GBps"] * 1e9,
            reduce_cold_Bps=m["reduce_cold_GBps"] * 1e9,
            l2_bytes=m["l2_KiB"] * 1024,
            l3_bytes=m["l3_KiB"] * 1024,
            cores=int(m["cores"]),
        )
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
    link: float  # a byte one way over the link between hosts


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
    return Rates(
        call=m.call_s * share,
        hop=2 * share * m.switch_s if local_ranks > cores else m.hop_s,
        net=copy,
        reduce=reduce,
        copy=copy,
        remote_hop=m.tcp_hop_s,
        link=1 / link,
    )


@dataclass
class Counts:
    """What the busiest rank moves (bytes, of which remote_*: to or from another host) and the
    hops on the critical path (of which remote_hops between hosts), the executor's handshake
    included where the schedule needs one."""

    hops: float = 0
    remote_hops: float = 0
    sent: float = 0
    received: float = 0
    reduced: float = 0
    copied: float = 0
    remote_sent: float = 0
    remote_received: float = 0
    remote_reduced: float = 0
    link: float = 0  # bytes one way over the host link (per step the larger direction)
    # the busiest host's ranks together, inside the host: sent + received, reduced, copied (pricing.h)
    host_net: float = 0
    host_reduced: float = 0
    host_copied: float = 0
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
    __slots__ = ("sent", "received", "reduced", "copied", "remote_sent", "remote_received", "remote_reduced", "link")

    def __init__(self):
        self.sent = self.received = self.reduced = self.copied = 0.0
        self.remote_sent = self.remote_received = self.remote_reduced = 0.0
        self.link = 0.0  # one way over the host link: per step, the larger of out and in (full duplex)

    def step(
        self,
        out: float = 0,
        out_remote: bool = False,
        into: float = 0,
        in_remote: bool = False,
        reduce: bool = False,
        times: float = 1,
    ):
        """`times` steps that each send `out` bytes and receive `into` (reducing them or not)."""
        self.sent += times * out
        self.remote_sent += times * out if out_remote else 0
        if reduce:
            self.reduced += times * into
            self.remote_reduced += times * into if in_remote else 0
        else:
            self.received += times * into
            self.remote_received += times * into if in_remote else 0
        self.link += times * max(out if out_remote else 0, into if in_remote else 0)


def _ring_pass(me: _Rank, n: float, to_remote: bool, from_remote: bool, P: int):
    """A ring all_reduce of n bytes among P ranks: reduce-scatter then all-gather, n/P a step."""
    _ring_steps(me, n / P, to_remote, from_remote, P, reduce=True)
    _ring_steps(me, n / P, to_remote, from_remote, P, reduce=False)


def _ring_steps(me: _Rank, block: float, to_remote: bool, from_remote: bool, P: int, reduce: bool):
    """P-1 ring steps of `block` bytes: each sends one and receives (and reduces) one at once."""
    me.step(block, to_remote, block, from_remote, reduce, times=P - 1)


def _shifted(a: float, b: float, n: float, segment: float) -> float:
    """Link bytes of a pipelined tree phase over n bytes in segments: step t moves segment t one
    way (weight b: 1 if across hosts) and segment t-1 the other (weight a), then a drain step
    moves the last segment (weight a); each step costs its larger direction."""
    S = max(1, math.ceil(n / segment)) if segment else 1
    last = n - (S - 1) * segment if S > 1 else n
    if S == 1:
        return b * last + a * last
    seg = segment
    middle = (S - 2) * max(a, b) * seg
    return b * seg + middle + max(a * seg, b * last) + a * last


def _tree_pass(me: _Rank, n: float, P: int, r: int, remote_to, segment: float = 0):
    """A tree all_reduce of n bytes among P ranks, as rank r (algorithms/tree.cc): the reduce phase
    receives the first child's segment t while forwarding segment t-1 up, then the second
    child's in its own step; the broadcast phase receives segment t from the parent while
    sending segment t-1 on to the children."""
    parent, children = tree_neighbours(P, r)
    up = 1 if parent >= 0 and remote_to(parent) else 0
    down = [1 if remote_to(c) else 0 for c in children]
    # reduce phase
    for i, _child in enumerate(children):
        me.reduced += n
        me.remote_reduced += n * down[i]
    if parent >= 0:
        me.sent += n
        me.remote_sent += n * up
    me.link += _shifted(up, down[0] if children else 0, n, segment) + n * sum(down[1:])
    # broadcast phase
    me.sent += n * len(children)
    me.remote_sent += n * sum(down)
    if parent >= 0:
        me.received += n
        me.remote_received += n * up
    me.link += _shifted(sum(down), up, n, segment)


def per_rank(
    algo: str, hosts: int, local: int, nbytes: float, collective: str = "all_reduce", segment: float = 0
) -> list:
    """Every rank's bytes of each kind for a call of nbytes a rank (ranks host by host): all_reduce's
    buffer, or one rank's block of reduce_scatter and all_gather (the bench's count column);
    segment: the trees' pipeline segment (0: one segment)."""
    _check_algo(collective, algo)
    P = hosts * local
    out = []
    for r in range(P):
        me = _Rank()
        h, j = divmod(r, local)
        to_remote, from_remote = (r + 1) % P // local != h, (r - 1) % P // local != h
        if collective == "all_reduce":
            if algo == "ring":
                _ring_pass(me, nbytes, to_remote, from_remote, P)
            elif algo == "tree":
                _tree_pass(me, nbytes, P, r, lambda q: q // local != h, segment)
            else:
                # intra-host ring reduce-scatter and all-gather, then column j among the hosts' owners
                _ring_pass(me, nbytes, False, False, local)
                me.copied += nbytes if local == 1 else 0  # the intra-host reduce-scatter is a copy alone
                if hosts > 1:
                    column = nbytes / local
                    if algo == "hier":
                        _ring_pass(me, column, True, True, hosts)
                    else:
                        _tree_pass(me, column, hosts, h, lambda g: True, segment)
        elif algo == "ring":  # reduce_scatter / all_gather: P-1 steps of one block
            _ring_steps(me, nbytes, to_remote, from_remote, P, reduce=collective == "reduce_scatter")
            me.copied += nbytes if collective == "all_gather" else 0
        elif collective == "reduce_scatter":
            # pack, intra-host ring reduce-scatter of the P blocks (local pieces of hosts blocks),
            # then column j's ring reduce-scatter among the hosts' owners (hosts-1 steps of a
            # block), and the owner's block into its output
            me.copied += nbytes * (P + 1)
            _ring_steps(me, nbytes * hosts, False, False, local, reduce=True)
            _ring_steps(me, nbytes, True, True, hosts, reduce=True)
        else:  # all_gather: the reverse (the own block into the packed buffer, and unpacked)
            me.copied += nbytes * (P + 1)
            _ring_steps(me, nbytes, True, True, hosts, reduce=False)
            _ring_steps(me, nbytes * hosts, False, False, local, reduce=False)
        out.append(me)
    return out


def _check_algo(collective: str, algo: str):
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; choose from {', '.join(COLLECTIVES)}")
    if algo not in COLLECTIVES[collective]:
        raise ValueError(
            f"unknown algorithm {algo!r} for {collective}; choose from {', '.join(COLLECTIVES[collective])}"
        )


def link_weight(m: Machine) -> float:
    """How much a byte between hosts weighs against a local one (link_weights in pricing.cc)."""
    r = rates(m, m.l3_bytes, 1)
    return max(1.0, r.link / r.net)


def busiest(ranks: list, weight: float) -> _Rank:
    """The rank pricing.cc prices: the most bytes, a byte over the host link weighing `weight`
    (and a link carrying both directions at once); of two that tie, the one that reduces more,
    then the lower rank."""
    best, most, most_reduced = None, -1.0, -1.0
    for me in ranks:
        remote = me.remote_sent + me.remote_received + me.remote_reduced
        total = me.sent + me.received + me.reduced + me.copied - remote + max(remote, weight * me.link)
        if total > most or (total == most and me.reduced > most_reduced):
            best, most, most_reduced = me, total, me.reduced
    return best


def counts(
    algo: str,
    hosts: int,
    local: int,
    nbytes: float,
    m: Machine = Machine(),
    segment: int = TREE_SEGMENT,
    collective: str = "all_reduce",
) -> Counts:
    """The cost model's counts of a call of nbytes a rank on hosts x local ranks."""
    if hosts < 1 or local < 1:
        raise ValueError(f"hosts and local ranks must be at least 1, got {hosts} x {local}")
    if nbytes < 0:
        raise ValueError(f"nbytes must not be negative, got {nbytes}")
    _check_algo(collective, algo)
    P = hosts * local
    if P == 1 or nbytes == 0:
        return Counts()
    ranks = per_rank(algo, hosts, local, nbytes, collective, segment)
    me = busiest(ranks, link_weight(m))
    host = max(
        (ranks[h * local : (h + 1) * local] for h in range(hosts)),
        key=lambda rs: sum(q.sent + q.received + q.reduced + q.copied for q in rs),
    )
    k = Counts(
        host_net=sum(q.sent + q.received - q.remote_sent - q.remote_received for q in host),
        host_reduced=sum(q.reduced - q.remote_reduced for q in host),
        host_copied=sum(q.copied for q in host),
        sent=me.sent,
        received=me.received,
        reduced=me.reduced,
        copied=me.copied,
        remote_sent=me.remote_sent,
        remote_received=me.remote_received,
        remote_reduced=me.remote_reduced,
        link=me.link,
    )
    across = hosts > 1
    segments = lambda n: max(1, math.ceil(n / segment))  # noqa: E731
    passes = 2 if collective == "all_reduce" else 1  # a ring all_reduce is reduce-scatter + all-gather
    if algo == "ring":
        k.hops, k.remote_hops = passes * (P - 1), passes * (P - 1) if across else 0
    elif algo == "tree":
        k.hops = tree_hops(P, segments(nbytes))
        k.remote_hops = k.hops if across else 0
        k.streams = max(
            1,
            max(
                sum(
                    1
                    for j in range(local)
                    if any(
                        q // local != h
                        for q in [tree_neighbours(P, h * local + j)[0], *tree_neighbours(P, h * local + j)[1]]
                        if q >= 0
                    )
                )
                for h in range(hosts)
            ),
        )
    else:
        inter = passes * (hosts - 1) if algo == "hier" else tree_hops(hosts, segments(nbytes / local))
        k.hops, k.remote_hops = passes * (local - 1) + inter, inter
        k.streams = local
    if algo != "ring":  # the ring's first step meets both neighbours and stands in for the handshake
        k.hops += 1  # the executor's fingerprint handshake with the next rank
        k.remote_hops += 1 if across else 0
    return k


def predict(
    algo: str,
    hosts: int,
    local: int,
    nbytes: float,
    m: Machine = Machine(),
    half: bool = False,
    collective: str = "all_reduce",
) -> float:
    """Predicted seconds of a call of nbytes a rank (pricing.cc's predict()).

    Parameters
    ----------
    algo : str
        The algorithm's name ("ring", "tree", ...).
    hosts : int
        Number of hosts.
    local : int
        Ranks per host.
    nbytes : float
        One rank's block in bytes, as Communicator.choose_algo counts it.
    m : Machine
        The figures to price with.
    half : bool
        Whether the dtype is 2 bytes wide (float16, bfloat16): a reduced byte costs twice.
    collective : str
        "all_reduce", "reduce_scatter" or "all_gather".

    Returns
    -------
    float
        Seconds; the call cost alone for one rank or 0 bytes.
    """
    if hosts * local == 1 or nbytes == 0:
        return m.call_s
    k = counts(algo, hosts, local, nbytes, m, collective=collective)
    r = rates(m, buffer_bytes(collective, nbytes, hosts * local), local, k.streams, half)
    remote = max((k.remote_sent + k.remote_received) * r.net + k.remote_reduced * r.reduce, k.link * r.link)
    local_data = (
        (k.sent + k.received - k.remote_sent - k.remote_received) * r.net
        + (k.reduced - k.remote_reduced) * r.reduce
        + k.copied * r.copy
    )
    cores = m.cores or local
    if local > cores:  # ranks share the cores: the busiest rank's work, or the host's over its cores
        share = local / cores
        host_data = (k.host_net * r.net + k.host_reduced * r.reduce + k.host_copied * r.copy) / cores
        local_data = max(local_data, host_data) / share
    data = local_data + remote
    return r.call + (k.hops - k.remote_hops) * r.hop + k.remote_hops * r.remote_hop + data


def buffer_bytes(collective: str, nbytes: float, P: int) -> float:
    """The larger of a rank's buffers (the working set pricing.cc blends cache figures by)."""
    return nbytes if collective == "all_reduce" else nbytes * P


def busbw(size: float, seconds: float, P: int, collective: str = "all_reduce") -> float:
    """nccl-tests' bus bandwidth: size / time x 2(P-1)/P for all_reduce, (P-1)/P for
    reduce_scatter and all_gather.

    Parameters
    ----------
    size : float
        The larger buffer in bytes: all_reduce's buffer, the P blocks of reduce_scatter's input
        or all_gather's output.
    seconds : float
        The call's time.
    P : int
        Number of ranks.
    collective : str
        "all_reduce", "reduce_scatter" or "all_gather".

    Returns
    -------
    float
        Bytes/s; size / seconds for one rank.
    """
    if P <= 1:
        return size / seconds
    return size / seconds * (2 if collective == "all_reduce" else 1) * (P - 1) / P


def sweep(m: Machine, local: int, ranks: list, size: float, algos=ALGOS, collective: str = "all_reduce") -> list:
    """Predictions over rank counts, as nccl-tests would measure them.

    Parameters
    ----------
    m : Machine
        The figures to price with.
    local : int
        Ranks per host.
    ranks : list of int
        Total rank counts, each a multiple of `local`.
    size : float
        As in nccl-tests, the larger buffer in bytes (reduce_scatter and all_gather: P blocks of
        size / P).
    algos : iterable of str
        The algorithms to price.
    collective : str
        "all_reduce", "reduce_scatter" or "all_gather".

    Returns
    -------
    list of dict
        One row per rank count: {ranks, hosts, local, algo: {seconds, busbw}}.

    Raises
    ------
    ValueError
        A rank count is not a multiple of `local`.
    """
    rows = []
    for P in ranks:
        if P % local:
            raise ValueError(f"{P} ranks do not fill hosts of {local} local ranks")
        hosts = P // local
        row = {"ranks": P, "hosts": hosts, "local": local}
        block = size if collective == "all_reduce" else size / P
        for a in algos:
            t = predict(a, hosts, local, block, m, collective=collective)
            row[a] = {"seconds": t, "busbw": busbw(size, t, P, collective)}
        rows.append(row)
    return rows


def _what(collective: str, size: float) -> str:
    return f"{collective}, {size / 2**20:g} MiB (nccl-tests size)"


def table(rows: list, algos, nbytes: float, collective: str = "all_reduce") -> str:
    head = f"# {_what(collective, nbytes)}: predicted time (us) and busbw (GB/s)"
    cols = "".join(f" {a + ' us':>11s} {a + ' GB/s':>14s}" for a in algos)
    lines = [head, f"{'ranks':>6s} {'hosts x local':>14s}{cols}  best"]
    for row in rows:
        cells = "".join(f" {row[a]['seconds'] * 1e6:11.1f} {row[a]['busbw'] / 1e9:14.2f}" for a in algos)
        best = min(algos, key=lambda a: row[a]["seconds"])
        lines.append(f"{row['ranks']:6d} {str(row['hosts']) + ' x ' + str(row['local']):>14s}{cells}  {best}")
    return "\n".join(lines)


def plot(panels: list, path: str, title: str = ""):
    """panels: (collective, nbytes, rows, algos) each, one panel each, busbw against ranks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (collective, nbytes, rows, algos) in zip(axes[0], panels):
        for a in algos:
            ax.plot([r["ranks"] for r in rows], [r[a]["busbw"] / 1e9 for r in rows], marker="o", label=a)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks (hosts x local ranks)")
        ax.set_ylabel("predicted busbw (GB/s)")
        ax.set_title(f"{_what(collective, nbytes)}", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
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
    from ._world import init

    comm = init(rank=0, size=1)
    try:
        return comm.status().machine
    finally:
        comm.close()


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m ringtree.predict", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--machine",
        action="store_true",
        help="start from this machine's measured figures (Communicator.status().machine)",
    )
    p.add_argument(
        "--costs-json", default=None, metavar="FILE", help="start from a saved Communicator.status().machine dict"
    )
    p.add_argument("--intra-hop-us", type=float, help="one message between ranks of a host (us)")
    p.add_argument("--intra-GBps", type=float, help="copy bandwidth inside a host (GB/s; in cache and from memory)")
    p.add_argument("--reduce-GBps", type=float, help="float32 sum bandwidth inside a host (GB/s)")
    p.add_argument("--inter-hop-us", type=float, help="one message between hosts (us)")
    p.add_argument(
        "--inter-GBps", type=float, help="bandwidth between hosts (GB/s) a rank, or a host link with --nics-per-host"
    )
    p.add_argument(
        "--nics-per-host",
        type=int,
        default=None,
        help="ranks of a host that can each use --inter-GBps at once (default: all, as the C++ model)",
    )
    p.add_argument("--cores", type=int, default=None, help="cores per host (default: one per local rank)")
    p.add_argument("--local", type=int, default=8, help="ranks per host")
    p.add_argument("--ranks", default="8,16,32,64,128,256,512,1024,2048,4096", help="comma list of world sizes")
    p.add_argument(
        "--size",
        default="64M",
        help="bytes (K/M/G) as nccl-tests' size column: the larger buffer of a rank (all_reduce's "
        "buffer; reduce_scatter's input and all_gather's output, P blocks)",
    )
    p.add_argument(
        "--collective",
        default="all_reduce",
        help="comma list of " + ", ".join(COLLECTIVES) + " (one table and one plot panel each)",
    )
    p.add_argument(
        "--algos",
        default=",".join(ALGOS),
        help="comma list of " + ", ".join(ALGOS) + " (each collective takes those it has)",
    )
    p.add_argument("--plot", default=None, metavar="FILE.png", help="draw predicted busbw against rank count")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = p.parse_args(argv)
    args.algos = [a for a in args.algos.split(",") if a]
    bad = [a for a in args.algos if a not in ALGOS]
    if bad:
        p.error(f"unknown algorithm {bad[0]!r}; choose from {', '.join(ALGOS)}")
    args.collectives = [c for c in args.collective.split(",") if c]
    bad = [c for c in args.collectives if c not in COLLECTIVES]
    if bad or not args.collectives:
        p.error(f"unknown collective {(bad or [''])[0]!r}; choose from {', '.join(COLLECTIVES)}")
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
    panels = []
    for coll in args.collectives:
        algos = [a for a in args.algos if a in COLLECTIVES[coll]]
        panels.append((coll, args.nbytes, sweep(m, args.local, args.ranks, args.nbytes, algos, coll), algos))
    if args.json:
        print(
            json.dumps(
                {
                    "machine": asdict(m),
                    "nbytes": args.nbytes,
                    **({"rows": panels[0][2]} if len(panels) == 1 else {}),
                    "collectives": {c: rows for c, _, rows, _ in panels},
                },
                indent=1,
            )
        )
    else:
        print(f"# machine: {', '.join(f'{k}={v:g}' for k, v in asdict(m).items())}")
        print("\n".join(table(rows, algos, n, c) for c, n, rows, algos in panels))
    if args.plot:
        plot(panels, args.plot)
        print(f"# plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
